//! f32 GEMM throughput on this machine: the CPU backend next to the `gemm` crate called
//! directly (same threads, and one thread) and to the reference loops, plus the decode
//! shapes (m = 1) where the backend uses its own GEMV.
//!
//!     cargo run --release -p rusting_brain --example bench_gemm
//!
//! Prints one table; GFLOP/s = 2 m n k / best time over the repetitions.

use std::time::Instant;

use rusting_brain::cpu::CpuBackend;
use rusting_brain_core::backend::MatmulOps;
use rusting_brain_core::backend::Q8Ops;
use rusting_brain_core::backend::{MatmulSpec, OperandPrecision};
use rusting_brain_core::{ReferenceBackend, Rng};

/// Best times of several contenders measured in rotating turns (a b c, b c a, ...), so a slow
/// patch of the machine (another process, frequency change) hits all of them alike.
fn best_in_turns(reps: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    for f in fs.iter_mut() {
        f(); // warm-up: page faults, thread pool start, packing buffers
    }
    let mut best = vec![f64::INFINITY; fs.len()];
    let n = fs.len();
    for rep in 0..reps {
        // Rotate who goes first: the first call after a single-threaded one pays for
        // waking rayon's sleeping workers.
        for j in 0..n {
            let i = (rep + j) % n;
            let t = Instant::now();
            fs[i]();
            best[i] = best[i].min(t.elapsed().as_secs_f64());
        }
    }
    best
}

/// `gemm::gemm` on row-major A (m, k) and B given by its (row, column) strides.
#[allow(clippy::too_many_arguments)]
fn gemm_direct(
    c: &mut [f32], a: &[f32], b: &[f32], m: usize, n: usize, k: usize, b_rs: isize, b_cs: isize,
    threads: usize,
) {
    let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    // SAFETY: a is m*k, b is k*n (either layout), c is m*n, all contiguous; the strides
    // address exactly those elements, and c is borrowed uniquely.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            b_cs,
            b_rs,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

fn main() {
    let cpu = CpuBackend::new();
    let threads = cpu.threads();
    println!(
        "bench_gemm: {} logical cores, rayon threads {threads}, SIMD {} ({})",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        cpu.isa(),
        std::env::consts::ARCH
    );
    println!();
    if std::env::args().any(|a| a == "int8") {
        return int8(&cpu);
    }
    if std::env::args().any(|a| a == "w8a8") {
        return w8a8(&cpu);
    }
    println!(
        "{:<26} {:>12} {:>14} {:>14} {:>12} {:>10}",
        "shape (m x n x k)", "backend", "gemm crate", "gemm 1 thread", "reference", "ratio"
    );
    println!(
        "{:<26} {:>12} {:>14} {:>14} {:>12} {:>10}",
        "", "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s", "bk/crate"
    );
    let mut rng = Rng::new(7);
    let shapes: &[(usize, usize, usize, &str)] = &[
        (256, 256, 256, ""),
        (1024, 1024, 1024, ""),
        (2048, 2048, 2048, ""),
        (2048, 704, 256, " (LM FFN)"),
        (1, 2048, 2048, " (decode)"),
        (1, 4096, 1024, " (decode)"),
        (1, 1024, 4096, " (decode, W^T)"),
    ];
    for &(m, n, k, label) in shapes {
        let a = rng.normal_vec(m * k, 1.0);
        let b = rng.normal_vec(k * n, 1.0);
        let mut c = vec![0.0f32; m * n];
        let flops = 2.0 * (m * n * k) as f64;
        let reps = ((8e9 / flops) as usize).clamp(5, 300);
        let trans_b = label.contains("W^T");
        let spec = MatmulSpec::new(m, n, k).trans_b(trans_b);
        let (mut c1, mut c2, mut c3) = (c.clone(), c.clone(), c.clone());
        let (b_rs, b_cs) = (if trans_b { 1 } else { n as isize }, if trans_b { k as isize } else { 1 });
        let times = best_in_turns(
            reps,
            &mut [
                &mut || cpu.matmul(&mut c1, &a, &b, &spec).unwrap(),
                &mut || gemm_direct(&mut c2, &a, &b, m, n, k, b_rs, b_cs, threads),
                &mut || gemm_direct(&mut c3, &a, &b, m, n, k, b_rs, b_cs, 1),
            ],
        );
        let (t_backend, t_crate, t_single) = (times[0], times[1], times[2]);
        // The reference is a triple loop; past ~1 GFLOP it takes minutes, so it is skipped.
        let reference = if flops <= 2.0 * 1024f64.powi(3) {
            let t =
                best_in_turns(1, &mut [&mut || ReferenceBackend.matmul(&mut c, &a, &b, &spec).unwrap()])[0];
            format!("{:.2}", flops / t / 1e9)
        } else {
            "skipped".to_string()
        };
        println!(
            "{:<26} {:>12.1} {:>14.1} {:>14.1} {:>12} {:>9.2}x",
            format!("{m}x{n}x{k}{label}"),
            flops / t_backend / 1e9,
            flops / t_crate / 1e9,
            flops / t_single / 1e9,
            reference,
            t_crate / t_backend
        );
    }
    // Mixed precision: operands rounded to bf16, f32 accumulation (see cpu::matmul), on
    // vdpbf16ps where the CPU has AVX512_BF16; the shapes of the 5.3M training step
    // (batch 8 x 256 tokens, d_model 256, d_ff 704): the forward x W^T, the input gradient
    // dY W and the weight gradient dY^T X.
    println!(
        "\nBF16 products ({}), against the f32 backend in the same turns:",
        if rusting_brain::cpu::bf16::available() {
            "vdpbf16ps, AVX512_BF16"
        } else {
            "no AVX512_BF16 here: rounded operands through the f32 GEMM"
        }
    );
    println!("{:<34} {:>12} {:>12} {:>9}", "shape (m x n x k)", "f32 GFLOP/s", "bf16 GFLOP/s", "bf16/f32");
    let bf16_shapes: &[(usize, usize, usize, bool, bool, &str)] = &[
        (1024, 1024, 1024, false, false, ""),
        (2048, 704, 256, false, true, " forward x W^T"),
        (2048, 256, 704, false, false, " input grad dY W"),
        (704, 256, 2048, true, false, " weight grad dY^T X"),
        (2048, 4096, 256, false, true, " LM head"),
        (8192, 2560, 320, false, true, " SD 1.5 GEGLU in"),
        (1536, 27648, 3072, false, true, " FLUX.2 single in"),
        (1536, 3072, 12288, false, true, " FLUX.2 single out"),
    ];
    for &(m, n, k, ta, tb, label) in bf16_shapes {
        let a = rng.normal_vec(m * k, 1.0);
        let b = rng.normal_vec(k * n, 1.0);
        let (mut c1, mut c2) = (vec![0.0f32; m * n], vec![0.0f32; m * n]);
        let spec = MatmulSpec::new(m, n, k).trans_a(ta).trans_b(tb);
        let spec16 = spec.precision(OperandPrecision::Bf16);
        let flops = 2.0 * (m * n * k) as f64;
        let reps = ((8e9 / flops) as usize).clamp(5, 300);
        let t = best_in_turns(
            reps,
            &mut [&mut || cpu.matmul(&mut c1, &a, &b, &spec).unwrap(), &mut || {
                cpu.matmul(&mut c2, &a, &b, &spec16).unwrap()
            }],
        );
        println!(
            "{:<34} {:>12.1} {:>12.1} {:>8.2}x",
            format!("{m}x{n}x{k}{label}"),
            flops / t[0] / 1e9,
            flops / t[1] / 1e9,
            t[0] / t[1]
        );
    }
}

/// The quantized products at SmolLM2-135M's shapes (d_model 576, d_ff 1536, vocabulary
/// 49152): decode (one row; the weights' bytes per second is what bounds it) and prompt
/// processing (16, 128 and 512 rows), int8 in blocks of 32 and 4 bits (`Precision::Q4`'s
/// layout) beside f32, in the same turns. `bench_gemm int8` runs this table alone.
fn int8(cpu: &CpuBackend) {
    use rusting_brain::core::ops::{q4, q8};
    println!("quantized products (13-bit activations): int8 in blocks of 32 and 4 bits, against f32:");
    println!(
        "{:<30} {:>10} {:>10} {:>10} {:>9} {:>10} {:>10}",
        "shape (m x n x k)", "f32 us", "int8 us", "4-bit us", "4b/int8", "int8 GB/s", "4-bit GB/s"
    );
    let mut rng = Rng::new(8);
    let shapes: &[(usize, usize, usize, &str)] = &[
        (1, 49152, 576, " head"),
        (1, 1536, 576, " gate/up"),
        (1, 576, 1536, " down"),
        (1, 576, 576, " q/o"),
        // A server's decode step over 2..16 requests.
        (2, 1536, 576, " gate/up"),
        (4, 1536, 576, " gate/up"),
        (8, 1536, 576, " gate/up"),
        (16, 1536, 576, " gate/up"),
        (16, 576, 1536, " down"),
        (16, 49152, 576, " head"),
        (128, 1536, 576, " gate/up"),
        (512, 1536, 576, " gate/up"),
        (512, 576, 1536, " down"),
    ];
    for &(m, n, k, label) in shapes {
        let w = rng.normal_vec(n * k, 0.05);
        let x = rng.normal_vec(m * k, 1.0);
        let (pb, sb) = q8::quantize_blocks(&w, n, k).unwrap();
        let (p4, s4) = q4::quantize_q4(&w, n, k).unwrap();
        let spec = MatmulSpec::new(m, n, k).trans_b(true);
        let (mut c1, mut c2, mut c3) = (vec![0.0f32; m * n], vec![0.0f32; m * n], vec![0.0f32; m * n]);
        let reps = ((4e9 / (2.0 * (m * n * k) as f64)) as usize).clamp(5, 400);
        let t = best_in_turns(
            reps,
            &mut [
                &mut || cpu.matmul(&mut c1, &x, &w, &spec).unwrap(),
                &mut || cpu.q8_matmul(&mut c2, &x, &pb, &sb, &spec).unwrap(),
                &mut || cpu.q8_matmul(&mut c3, &x, &p4, &s4, &spec).unwrap(),
            ],
        );
        let (b8, b4) = (4.0 * (pb.len() + sb.len()) as f64, 4.0 * (p4.len() + s4.len()) as f64);
        println!(
            "{:<30} {:>10.1} {:>10.1} {:>10.1} {:>8.2}x {:>10.1} {:>10.1}",
            format!("{m}x{n}x{k}{label}"),
            t[0] * 1e6,
            t[1] * 1e6,
            t[2] * 1e6,
            t[2] / t[1],
            b8 / t[1] / 1e9,
            b4 / t[2] / 1e9
        );
    }
}

/// An image model's products at `Precision::Q8` (int8 weights with one scale a row, each
/// activation row rounded to int8: the VNNI GEMM) beside f32, BF16 and int8 in blocks of
/// 32, at SD 1.5's and FLUX.2-klein's shapes, in the same turns. `bench_gemm w8a8`.
fn w8a8(cpu: &CpuBackend) {
    use rusting_brain::core::ops::q8;
    println!(
        "image products: int8 one scale a row (W8A8{}) beside f32, bf16 and int8 in blocks of 32:",
        if rusting_brain::cpu::int8_gemm::available() { ", VNNI GEMM" } else { ": no VNNI here" }
    );
    println!(
        "{:<34} {:>9} {:>9} {:>11} {:>9} {:>9} {:>11}",
        "shape (m x n x k), GFLOP/s or GOP/s", "f32", "bf16", "int8 blocks", "W8A8", "W8A8/f32", "W8A8/bf16"
    );
    let mut rng = Rng::new(9);
    let shapes: &[(usize, usize, usize, &str)] = &[
        (8192, 320, 320, " SD 1.5 attn 64x64"),
        (8192, 2560, 320, " SD 1.5 GEGLU in"),
        (8192, 320, 1280, " SD 1.5 GEGLU out"),
        (512, 2560, 1280, " SD 1.5 GEGLU in 16x16"),
        (1536, 9216, 3072, " FLUX.2 qkv"),
        (1536, 27648, 3072, " FLUX.2 single in"),
        (1536, 3072, 12288, " FLUX.2 single out"),
    ];
    for &(m, n, k, label) in shapes {
        let w = rng.normal_vec(n * k, 0.05);
        let x = rng.normal_vec(m * k, 1.0);
        let (pb, sb) = q8::quantize_blocks(&w, n, k).unwrap();
        let (pr, sr) = q8::quantize_rows(&w, n, k).unwrap();
        let spec = MatmulSpec::new(m, n, k).trans_b(true);
        let spec16 = spec.precision(OperandPrecision::Bf16);
        let mut c = [vec![0.0f32; m * n], vec![0.0f32; m * n], vec![0.0f32; m * n], vec![0.0f32; m * n]];
        let [c0, c1, c2, c3] = &mut c;
        let flops = 2.0 * (m * n * k) as f64;
        let reps = ((4e9 / flops) as usize).clamp(3, 100);
        let t = best_in_turns(
            reps,
            &mut [
                &mut || cpu.matmul(c0, &x, &w, &spec).unwrap(),
                &mut || cpu.matmul(c1, &x, &w, &spec16).unwrap(),
                &mut || cpu.q8_matmul(c2, &x, &pb, &sb, &spec).unwrap(),
                &mut || cpu.q8_matmul(c3, &x, &pr, &sr, &spec).unwrap(),
            ],
        );
        println!(
            "{:<34} {:>9.1} {:>9.1} {:>11.1} {:>9.1} {:>8.2}x {:>10.2}x",
            format!("{m}x{n}x{k}{label}"),
            flops / t[0] / 1e9,
            flops / t[1] / 1e9,
            flops / t[2] / 1e9,
            flops / t[3] / 1e9,
            t[0] / t[3],
            t[1] / t[3]
        );
    }
    // SD 1.5's 3x3 convolutions at 512 x 512 with guidance (batch 2): f32 (im2col or
    // Winograd), bf16 and int8 rows (`conv2d_q8`: the implicit GEMM over a channels-last
    // copy), GOP/s of the direct convolution's 2 * out * k multiply-adds.
    use rusting_brain::core::backend::{Conv2dSpec, ConvOps};
    for &(c, hw) in &[(320usize, 64usize), (640, 32), (1280, 16)] {
        let spec = Conv2dSpec::new(2, c, c, hw, hw, 3).padding(1);
        let (ni, nw, no, _) = spec.check().unwrap();
        let k = c * 9;
        let w = rng.normal_vec(nw, 0.05);
        let x = rng.normal_vec(ni, 1.0);
        let (pr, sr) = q8::quantize_rows(&w, c, k).unwrap();
        let pr = rusting_brain::core::ops::conv::q8_weight_channels_last(&pr, &spec).unwrap();
        let spec16 = spec.precision(OperandPrecision::Bf16);
        let mut o = [vec![0.0f32; no], vec![0.0f32; no], vec![0.0f32; no]];
        let [o0, o1, o2] = &mut o;
        let flops = 2.0 * (no * k) as f64;
        let reps = ((4e9 / flops) as usize).clamp(3, 100);
        let (w, x) = (w.to_vec(), x.to_vec());
        let t = best_in_turns(
            reps,
            &mut [
                &mut || cpu.conv2d(o0, &x, &w, None, &spec).unwrap(),
                &mut || cpu.conv2d(o1, &x, &w, None, &spec16).unwrap(),
                &mut || cpu.conv2d_q8(o2, &x, &pr, &sr, None, &spec).unwrap(),
            ],
        );
        println!(
            "{:<34} {:>9.1} {:>9.1} {:>11} {:>9.1} {:>8.2}x {:>10.2}x",
            format!("conv 3x3 {c}ch {hw}x{hw} b2"),
            flops / t[0] / 1e9,
            flops / t[1] / 1e9,
            "-",
            flops / t[2] / 1e9,
            t[0] / t[2],
            t[1] / t[2]
        );
    }
}
