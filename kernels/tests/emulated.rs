//! Every CUDA kernel against `rusting_brain_core`'s own reference op, with no GPU: the
//! kernel files run on the CPU emulator (`emulate/driver.cpp` over `emulate/cuda_shim.h`,
//! one CPU thread per CUDA thread, warp barriers for shuffles), launched as the CUDA
//! backend launches them (`native/src/backend/cuda`: the same argument order, grid and block
//! sizes), and what they write is compared here with core's op on the same inputs. The
//! C++ side only moves bytes; the oracle is the Rust reference the CPU and wgpu backends
//! are tested against.
//!
//! Sizes are awkward on purpose: lengths that are not multiples of 32, 256 or 4, rows of
//! one element, more rows than one block's threads.
//!
//! Tolerances: 0 (bit for bit) where the kernel computes what the reference computes in
//! the same order (int8 products and rounding, bf16 rounding, fills, bias, scaling,
//! embedding lookups); otherwise a relative bound on the worst element, scaled by the
//! largest reference magnitude, that covers f32 evaluation against the reference's f64
//! accumulators (1e-5 for the element-wise and row kernels, 3e-5 for RoPE's large angles, 1e-4 for the f32 attention
//! kernels' online softmax, 2e-2 for BF16 flash attention: q, k, v and the probabilities
//! are rounded to 8 mantissa bits before the tensor-core products, so the bound is on the
//! scale of the O(1) inputs even where a gradient is near zero).
//!
//! Needs a C++20 compiler (`$CXX`, else `c++`); without one the test says so and passes,
//! unless `RB_REQUIRE_CXX=1` (CI).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use rusting_brain_core::ops::attention::{attention_backward, attention_forward, AttentionSpec};
use rusting_brain_core::ops::optim::{AdamConstants, AdamParams, SgdParams};
use rusting_brain_core::ops::rope::{RopeScaling, RopeSpec};
use rusting_brain_core::ops::{self, q8};
use rusting_brain_core::{Activation, Loss, Rng};
use rusting_brain_test_support::assert_close;

const THREADS: u32 = 256;

/// A kernel argument as the backend passes it.
enum Arg {
    F32(Vec<f32>),
    U32(Vec<u32>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    U16(usize),
    Null,
    I32(i32),
    I64(i64),
    Float(f32),
    /// A struct by value, in its C layout.
    Raw(Vec<u8>),
}

/// The driver executable of one group of kernel files, compiled once per test run; `None`
/// when there is no C++ compiler and `RB_REQUIRE_CXX` is not set.
fn driver(group: u32) -> Option<&'static Path> {
    static BUILT: [OnceLock<Option<PathBuf>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    BUILT[group as usize - 1]
        .get_or_init(|| {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
            let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
            let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rb_driver_{group}"));
            let build = Command::new(&cxx)
                .args(["-std=c++20", "-O2", "-pthread", "-DRB_HOST_EMULATION"])
                .arg(format!("-DRB_GROUP={group}"))
                .arg("-I")
                .arg(dir.join("cu"))
                .arg(dir.join("emulate/driver.cpp"))
                .arg("-o")
                .arg(&exe)
                .output();
            match build {
                Ok(b) => {
                    assert!(
                        b.status.success(),
                        "compiling the emulator driver (group {group}) failed:\n{}",
                        String::from_utf8_lossy(&b.stderr)
                    );
                    Some(exe)
                }
                Err(e) if std::env::var("RB_REQUIRE_CXX").as_deref() != Ok("1") => {
                    eprintln!("SKIPPED, no C++ compiler `{cxx}` here: {e}");
                    None
                }
                Err(e) => panic!("RB_REQUIRE_CXX=1 but `{cxx}` does not run: {e}"),
            }
        })
        .as_deref()
}

/// A launch: `grid` blocks of `threads`, the arguments in the kernel's order. Returns the
/// pointer arguments' bytes after the launch, in order (null ones left out).
fn launch(group: u32, name: &str, grid: (u32, u32, u32), threads: u32, args: &[Arg]) -> Option<Vec<Vec<u8>>> {
    let exe = driver(group)?;
    let mut req = Vec::new();
    req.extend_from_slice(&(name.len() as u32).to_le_bytes());
    req.extend_from_slice(name.as_bytes());
    for v in [grid.0, grid.1, grid.2, threads] {
        req.extend_from_slice(&v.to_le_bytes());
    }
    let blob = |req: &mut Vec<u8>, bytes: &[u8]| {
        req.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        req.extend_from_slice(bytes);
    };
    for a in args {
        match a {
            Arg::F32(v) => blob(&mut req, &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>()),
            Arg::U32(v) => blob(&mut req, &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>()),
            Arg::I8(v) => blob(&mut req, &v.iter().map(|&x| x as u8).collect::<Vec<_>>()),
            Arg::U8(v) => blob(&mut req, v),
            Arg::U16(n) => blob(&mut req, &vec![0xffu8; 2 * n]),
            Arg::Null => req.extend_from_slice(&u64::MAX.to_le_bytes()),
            Arg::I32(x) => req.extend_from_slice(&x.to_le_bytes()),
            Arg::I64(x) => req.extend_from_slice(&x.to_le_bytes()),
            Arg::Float(x) => req.extend_from_slice(&x.to_le_bytes()),
            Arg::Raw(b) => req.extend_from_slice(b),
        }
    }
    let mut child = Command::new(exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the emulator driver");
    child.stdin.take().unwrap().write_all(&req).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{name}: the driver failed: {}", String::from_utf8_lossy(&out.stderr));
    let (mut bufs, mut at) = (Vec::new(), 0);
    while at < out.stdout.len() {
        let n = u64::from_le_bytes(out.stdout[at..at + 8].try_into().unwrap()) as usize;
        bufs.push(out.stdout[at + 8..at + 8 + n].to_vec());
        at += 8 + n;
    }
    Some(bufs)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The backend's `grid(n)`: grid-stride kernels, at most 65,535 blocks of 256.
fn grid(n: usize) -> (u32, u32, u32) {
    (n.div_ceil(THREADS as usize).clamp(1, 65_535) as u32, 1, 1)
}

/// `warps_cfg(rows)`: a warp a row, 8 warps a block.
fn warps(rows: usize) -> (u32, u32, u32) {
    (rows.div_ceil(8).max(1) as u32, 1, 1)
}

/// Fails on NaN or a length mismatch; reports the worst element relative to the largest
/// reference magnitude.
fn close(what: &str, got: &[f32], want: &[f32], rel: f64) {
    close_floor(what, got, want, rel, 1e-30)
}

/// [`close`] with the scale at least `floor`: for outputs that may be all (near) zero
/// while the error comes from inputs of size `floor` (BF16 rounding of O(1) inputs).
/// The bound is absolute, `rel` times the scale, through the workspace's one comparison.
fn close_floor(what: &str, got: &[f32], want: &[f32], rel: f64, floor: f64) {
    let scale = want.iter().fold(floor, |m, &w| m.max((w as f64).abs()));
    assert_close(what, got, want, 0.0, rel * scale);
}

fn exact(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what}: element {i}: {g} vs {w}");
    }
}

fn randn(rng: &mut Rng, n: usize, s: f32) -> Vec<f32> {
    (0..n).map(|_| rng.uniform(-1.0, 1.0) as f32 * s).collect()
}

macro_rules! run {
    ($e:expr) => {
        match $e {
            Some(b) => b,
            None => return,
        }
    };
}

#[test]
fn elementwise_kernels_match_core() {
    let mut rng = Rng::new(1);
    for n in [1usize, 7, 300, 1000] {
        let mut x = randn(&mut rng, n, 3.0);
        // bf16 ties to even (1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6), a subnormal, 65504
        // rounding up to 65536, zero.
        for (i, v) in [1.0 + 1.0 / 256.0f32, 1.0 + 3.0 / 256.0, 1e-40, 65504.0, 0.0, -3.3]
            .into_iter()
            .enumerate()
            .take(n)
        {
            x[i] = v;
        }
        let y0 = randn(&mut rng, n, 1.0);
        // fill
        let b = run!(launch(
            1,
            "fill",
            grid(n),
            THREADS,
            &[Arg::F32(vec![f32::NAN; n]), Arg::Float(0.25), Arg::I64(n as i64)]
        ));
        exact("fill", &f32s(&b[0]), &vec![0.25; n]);
        // axpy
        let b = run!(launch(
            1,
            "axpy",
            grid(n),
            THREADS,
            &[Arg::F32(y0.clone()), Arg::Float(-0.7), Arg::F32(x.clone()), Arg::I64(n as i64)]
        ));
        let mut want = y0.clone();
        ops::elementwise::axpy(&mut want, -0.7, &x).unwrap();
        close(&format!("axpy n={n}"), &f32s(&b[0]), &want, 1e-6);
        // scale
        let b = run!(launch(
            1,
            "scale",
            grid(n),
            THREADS,
            &[Arg::F32(x.clone()), Arg::Float(1.5), Arg::I64(n as i64)]
        ));
        let mut want = x.clone();
        ops::elementwise::scale(&mut want, 1.5);
        exact(&format!("scale n={n}"), &f32s(&b[0]), &want);
        // to_bf16: the rounding core's mixed precision uses, to the bit
        let b = run!(launch(
            1,
            "to_bf16",
            grid(n),
            THREADS,
            &[Arg::U16(n), Arg::F32(x.clone()), Arg::I64(n as i64)]
        ));
        let got: Vec<f32> = b[0]
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect();
        let want: Vec<f32> = x.iter().map(|&v| ops::matmul::round_bf16(v)).collect();
        exact(&format!("to_bf16 n={n}"), &got, &want);
        // swiglu
        let (g, u, dout) = (randn(&mut rng, n, 4.0), randn(&mut rng, n, 2.0), randn(&mut rng, n, 1.0));
        let b = run!(launch(
            1,
            "swiglu_forward",
            grid(n),
            THREADS,
            &[Arg::F32(vec![f32::NAN; n]), Arg::F32(g.clone()), Arg::F32(u.clone()), Arg::I64(n as i64)]
        ));
        let mut want = vec![0.0; n];
        ops::swiglu::swiglu_forward(&mut want, &g, &u).unwrap();
        close(&format!("swiglu_forward n={n}"), &f32s(&b[0]), &want, 1e-5);
        let b = run!(launch(
            1,
            "swiglu_backward",
            grid(n),
            THREADS,
            &[
                Arg::F32(vec![f32::NAN; n]),
                Arg::F32(vec![f32::NAN; n]),
                Arg::F32(dout.clone()),
                Arg::F32(g.clone()),
                Arg::F32(u.clone()),
                Arg::I64(n as i64)
            ]
        ));
        let (mut dg, mut du) = (vec![0.0; n], vec![0.0; n]);
        ops::swiglu::swiglu_backward(&mut dg, &mut du, &dout, &g, &u).unwrap();
        close(&format!("swiglu_backward dgate n={n}"), &f32s(&b[0]), &dg, 1e-5);
        close(&format!("swiglu_backward dup n={n}"), &f32s(&b[1]), &du, 1e-5);
    }
}

#[test]
fn activations_bias_and_losses_match_core() {
    let mut rng = Rng::new(2);
    let acts = [
        (Activation::Identity, 0, 0.0),
        (Activation::Relu, 1, 0.0),
        (Activation::LeakyRelu(0.01), 2, 0.01),
        (Activation::Sigmoid, 3, 0.0),
        (Activation::Tanh, 4, 0.0),
    ];
    for (rows, cols) in [(1usize, 1usize), (3, 7), (5, 200)] {
        let n = rows * cols;
        let mut x = randn(&mut rng, n, 6.0);
        // Far tails: sigmoid(-95) must stay positive, as core's e / (1 + e) does.
        x[0] = -95.0;
        if n > 1 {
            x[1] = 95.0;
        }
        let dy = randn(&mut rng, n, 1.0);
        for (act, code, alpha) in acts {
            let b = run!(launch(
                1,
                "activation_forward",
                grid(n),
                THREADS,
                &[
                    Arg::F32(vec![f32::NAN; n]),
                    Arg::F32(x.clone()),
                    Arg::I64(n as i64),
                    Arg::I32(code),
                    Arg::Float(alpha)
                ]
            ));
            let mut y = vec![0.0; n];
            ops::activation::activation_forward(act, &mut y, &x, rows, cols).unwrap();
            close(&format!("{act:?} forward {rows}x{cols}"), &f32s(&b[0]), &y, 1e-6);
            let b = run!(launch(
                1,
                "activation_backward",
                grid(n),
                THREADS,
                &[
                    Arg::F32(vec![f32::NAN; n]),
                    Arg::F32(dy.clone()),
                    Arg::F32(x.clone()),
                    Arg::F32(y.clone()),
                    Arg::I64(n as i64),
                    Arg::I32(code),
                    Arg::Float(alpha)
                ]
            ));
            let mut dx = vec![0.0; n];
            ops::activation::activation_backward(act, &mut dx, &dy, &x, &y, rows, cols).unwrap();
            close(&format!("{act:?} backward {rows}x{cols}"), &f32s(&b[0]), &dx, 1e-6);
        }
        // add_bias
        let bias = randn(&mut rng, cols, 1.0);
        let b = run!(launch(
            1,
            "add_bias",
            grid(n),
            THREADS,
            &[Arg::F32(x.clone()), Arg::F32(bias.clone()), Arg::I64(n as i64), Arg::I32(cols as i32)]
        ));
        let mut want = x.clone();
        ops::elementwise::add_bias(&mut want, &bias, rows, cols).unwrap();
        exact(&format!("add_bias {rows}x{cols}"), &f32s(&b[0]), &want);
        // losses: the per-element terms summed in blocks (loss_terms, partial_sums), and
        // the gradients; targets in (0, 1) so every loss is defined.
        let pred: Vec<f32> = (0..n).map(|_| rng.uniform(0.05, 0.95) as f32).collect();
        let target: Vec<f32> = (0..n).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
        for (loss, code) in
            [(Loss::MeanSquaredError, 0), (Loss::BinaryCrossEntropy, 1), (Loss::CategoricalCrossEntropy, 2)]
        {
            let b = run!(launch(
                1,
                "loss_terms",
                grid(n),
                THREADS,
                &[
                    Arg::F32(vec![f32::NAN; n]),
                    Arg::F32(pred.clone()),
                    Arg::F32(target.clone()),
                    Arg::I64(n as i64),
                    Arg::I32(code)
                ]
            ));
            let terms = f32s(&b[0]);
            let blocks = n.div_ceil(THREADS as usize).clamp(1, 1024);
            let b = run!(launch(
                1,
                "partial_sums",
                (blocks as u32, 1, 1),
                THREADS,
                &[Arg::F32(vec![f32::NAN; 1024]), Arg::F32(terms), Arg::I64(n as i64)]
            ));
            let total: f64 = f32s(&b[0])[..blocks].iter().map(|&v| v as f64).sum();
            let got = total / loss.divisor(rows, cols) as f64;
            let want = ops::loss::loss_forward(loss, &pred, &target, rows, cols).unwrap();
            close(&format!("{loss:?} value {rows}x{cols}"), &[got as f32], &[want as f32], 1e-5);
            let inv = 1.0f32 / loss.divisor(rows, cols) as f32;
            let b = run!(launch(
                1,
                "loss_backward",
                grid(n),
                THREADS,
                &[
                    Arg::F32(vec![f32::NAN; n]),
                    Arg::F32(pred.clone()),
                    Arg::F32(target.clone()),
                    Arg::I64(n as i64),
                    Arg::I32(code),
                    Arg::Float(inv)
                ]
            ));
            let mut want = vec![0.0; n];
            ops::loss::loss_backward(loss, &mut want, &pred, &target, rows, cols).unwrap();
            close(&format!("{loss:?} gradient {rows}x{cols}"), &f32s(&b[0]), &want, 1e-5);
        }
        // The fused softmax/sigmoid + cross-entropy gradient (code 3).
        let inv = 1.0f32 / Loss::CategoricalCrossEntropy.divisor(rows, cols) as f32;
        let b = run!(launch(
            1,
            "loss_backward",
            grid(n),
            THREADS,
            &[
                Arg::F32(vec![f32::NAN; n]),
                Arg::F32(pred.clone()),
                Arg::F32(target.clone()),
                Arg::I64(n as i64),
                Arg::I32(3),
                Arg::Float(inv)
            ]
        ));
        let mut want = vec![0.0; n];
        ops::loss::fused_output_backward(
            Loss::CategoricalCrossEntropy,
            &mut want,
            &pred,
            &target,
            rows,
            cols,
        )
        .unwrap();
        close(&format!("fused output gradient {rows}x{cols}"), &f32s(&b[0]), &want, 1e-5);
    }
}

#[test]
fn row_kernels_match_core() {
    let mut rng = Rng::new(3);
    // 70 rows of 5: more rows than a block's warps, narrower than a warp.
    for (rows, dim) in [(1usize, 1usize), (3, 33), (2, 300), (70, 5)] {
        let n = rows * dim;
        let x = randn(&mut rng, n, 3.0);
        let w = randn(&mut rng, dim, 1.0);
        let dout = randn(&mut rng, n, 1.0);
        let rg = (rows as u32, 1, 1);
        // softmax
        let b = run!(launch(
            1,
            "softmax_forward",
            rg,
            256,
            &[Arg::F32(vec![f32::NAN; n]), Arg::F32(x.clone()), Arg::I32(rows as i32), Arg::I32(dim as i32)]
        ));
        let mut y = vec![0.0; n];
        ops::softmax::softmax_forward(&mut y, &x, rows, dim).unwrap();
        close(&format!("softmax_forward {rows}x{dim}"), &f32s(&b[0]), &y, 1e-5);
        let b = run!(launch(
            1,
            "softmax_backward",
            rg,
            256,
            &[
                Arg::F32(vec![f32::NAN; n]),
                Arg::F32(dout.clone()),
                Arg::F32(y.clone()),
                Arg::I32(rows as i32),
                Arg::I32(dim as i32)
            ]
        ));
        let mut want = vec![0.0; n];
        ops::softmax::softmax_backward(&mut want, &dout, &y, rows, dim).unwrap();
        close(&format!("softmax_backward {rows}x{dim}"), &f32s(&b[0]), &want, 1e-5);
        // RMSNorm forward, and the backward with its two-stage column sum for the weight
        let b = run!(launch(
            1,
            "rmsnorm_forward",
            rg,
            256,
            &[
                Arg::F32(vec![f32::NAN; n]),
                Arg::F32(vec![f32::NAN; rows]),
                Arg::F32(x.clone()),
                Arg::F32(w.clone()),
                Arg::I32(rows as i32),
                Arg::I32(dim as i32),
                Arg::Float(1e-5)
            ]
        ));
        let (mut y, mut rstd) = (vec![0.0; n], vec![0.0; rows]);
        ops::rmsnorm::rmsnorm_forward(&mut y, &mut rstd, &x, &w, rows, dim, 1e-5).unwrap();
        close(&format!("rmsnorm_forward out {rows}x{dim}"), &f32s(&b[0]), &y, 1e-5);
        close(&format!("rmsnorm_forward rstd {rows}x{dim}"), &f32s(&b[1]), &rstd, 1e-5);
        let b = run!(launch(
            1,
            "rmsnorm_backward",
            rg,
            256,
            &[
                Arg::F32(vec![f32::NAN; n]),
                Arg::F32(vec![f32::NAN; n]),
                Arg::F32(dout.clone()),
                Arg::F32(x.clone()),
                Arg::F32(w.clone()),
                Arg::F32(rstd.clone()),
                Arg::I32(rows as i32),
                Arg::I32(dim as i32)
            ]
        ));
        let (dx, rows_dw) = (f32s(&b[0]), f32s(&b[1]));
        let dw0 = randn(&mut rng, dim, 1.0);
        let chunk_rows = rows.div_ceil(65_535).max(256);
        let chunks = rows.div_ceil(chunk_rows);
        let col_blocks = dim.div_ceil(THREADS as usize) as u32;
        let b = run!(launch(
            1,
            "column_sum_chunks",
            (col_blocks, chunks as u32, 1),
            THREADS,
            &[
                Arg::F32(vec![f32::NAN; chunks * dim]),
                Arg::F32(rows_dw),
                Arg::I32(rows as i32),
                Arg::I32(dim as i32),
                Arg::I32(chunk_rows as i32)
            ]
        ));
        let b = run!(launch(
            1,
            "column_sum",
            (col_blocks, 1, 1),
            THREADS,
            &[Arg::F32(dw0.clone()), Arg::F32(f32s(&b[0])), Arg::I32(chunks as i32), Arg::I32(dim as i32)]
        ));
        let (mut want_dx, mut want_dw) = (vec![0.0; n], dw0.clone());
        ops::rmsnorm::rmsnorm_backward(&mut want_dx, &mut want_dw, &dout, &x, &w, &rstd, rows, dim).unwrap();
        close(&format!("rmsnorm_backward dinp {rows}x{dim}"), &dx, &want_dx, 1e-5);
        close(&format!("rmsnorm_backward dweight {rows}x{dim}"), &f32s(&b[0]), &want_dw, 1e-5);
        // cross-entropy with a mask, loss and gradient
        let targets: Vec<u32> = (0..rows).map(|r| (r * 7 % dim) as u32).collect();
        let mask: Vec<bool> = (0..rows).map(|r| r % 3 != 1).collect();
        let b = run!(launch(
            1,
            "cross_entropy",
            rg,
            256,
            &[
                Arg::F32(x.clone()),
                Arg::F32(vec![f32::NAN; rows]),
                Arg::U32(targets.clone()),
                Arg::U8(mask.iter().map(|&m| m as u8).collect()),
                Arg::I32(rows as i32),
                Arg::I32(dim as i32),
                Arg::I32(1),
                Arg::Float(0.5)
            ]
        ));
        let mut logits = x.clone();
        let sum = ops::cross_entropy::cross_entropy(&mut logits, &targets, Some(&mask), rows, dim, Some(0.5))
            .unwrap();
        let got: f64 = f32s(&b[1]).iter().map(|&l| l as f64).sum();
        close(&format!("cross_entropy loss {rows}x{dim}"), &[got as f32], &[sum.loss_sum as f32], 1e-5);
        close(&format!("cross_entropy gradient {rows}x{dim}"), &f32s(&b[0]), &logits, 1e-5);
    }
}

#[test]
fn rope_matches_core_with_each_scaling() {
    let mut rng = Rng::new(4);
    let scalings = [
        RopeScaling::None,
        RopeScaling::Linear { factor: 4.0 },
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position: 64,
        },
    ];
    for scaling in scalings {
        for (batch, seq, heads, head_dim, pos_offset) in
            [(1usize, 1usize, 1usize, 2usize, 0usize), (2, 5, 3, 10, 7), (1, 40, 2, 64, 100)]
        {
            let spec = RopeSpec { batch, seq, heads, head_dim, pos_offset, theta: 10_000.0, scaling };
            let n = batch * seq * heads * head_dim;
            let x = randn(&mut rng, n, 1.0);
            let (kind, k) = scaling.kernel_constants();
            for (name, forward) in [("rope_forward", true), ("rope_backward", false)] {
                let mut args = vec![Arg::F32(x.clone())];
                for d in [batch, seq, heads, head_dim, pos_offset] {
                    args.push(Arg::I32(d as i32));
                }
                args.push(Arg::Float(spec.theta));
                args.push(Arg::I32(kind));
                args.extend(k.iter().map(|&c| Arg::Float(c)));
                let b = run!(launch(1, name, grid(n / 2), THREADS, &args));
                let mut want = x.clone();
                if forward {
                    ops::rope::rope_forward(&mut want, &spec).unwrap();
                } else {
                    ops::rope::rope_backward(&mut want, &spec).unwrap();
                }
                // Angles reach ~140 rad: f32 sin/cos of an f32 angle against the reference's
                // (same formula, other library) differ by a few 1e-6.
                close(
                    &format!("{name} {scaling:?} {batch}x{seq}x{heads}x{head_dim}+{pos_offset}"),
                    &f32s(&b[0]),
                    &want,
                    3e-5,
                );
            }
        }
    }
}

#[test]
fn optimizer_and_norm_kernels_match_core() {
    let mut rng = Rng::new(5);
    for n in [1usize, 33, 1000] {
        let (p, g) = (randn(&mut rng, n, 1.0), randn(&mut rng, n, 0.1));
        let (m, v) =
            (randn(&mut rng, n, 0.01), randn(&mut rng, n, 0.001).iter().map(|x| x.abs()).collect::<Vec<_>>());
        for decoupled in [true, false] {
            let hp = AdamParams {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
                decoupled,
                grad_scale: 0.5,
            };
            let step = 3;
            let c = AdamConstants::<f32>::new(&hp, step);
            let b = run!(launch(
                1,
                "adam_update",
                grid(n),
                THREADS,
                &[
                    Arg::F32(p.clone()),
                    Arg::F32(g.clone()),
                    Arg::F32(m.clone()),
                    Arg::F32(v.clone()),
                    Arg::I64(n as i64),
                    Arg::Float(hp.lr),
                    Arg::Float(hp.beta1),
                    Arg::Float(hp.beta2),
                    Arg::Float(c.one_minus_beta1),
                    Arg::Float(c.one_minus_beta2),
                    Arg::Float(hp.eps),
                    Arg::Float(hp.weight_decay),
                    Arg::I32(decoupled as i32),
                    Arg::Float(hp.grad_scale),
                    Arg::Null,
                    Arg::Float(c.step_size),
                    Arg::Float(c.bias_correction2_sqrt)
                ]
            ));
            let (mut wp, mut wm, mut wv) = (p.clone(), m.clone(), v.clone());
            ops::optim::adam_update(&mut wp, &g, &mut wm, &mut wv, &hp, step).unwrap();
            close(&format!("adam param n={n} decoupled={decoupled}"), &f32s(&b[0]), &wp, 1e-6);
            // Every pointer comes back, the gradient (b[1]) too.
            close(&format!("adam m n={n}"), &f32s(&b[2]), &wm, 1e-6);
            close(&format!("adam v n={n}"), &f32s(&b[3]), &wv, 1e-6);
        }
        for (momentum, nesterov) in [(0.0f32, false), (0.9, false), (0.9, true)] {
            let hp = SgdParams { lr: 0.1, momentum, nesterov, weight_decay: 0.01, grad_scale: 2.0 };
            let with_velocity = momentum > 0.0;
            let vel = randn(&mut rng, n, 0.1);
            let b = run!(launch(
                1,
                "sgd_update",
                grid(n),
                THREADS,
                &[
                    Arg::F32(p.clone()),
                    Arg::F32(g.clone()),
                    if with_velocity { Arg::F32(vel.clone()) } else { Arg::Null },
                    Arg::I64(n as i64),
                    Arg::Float(hp.lr),
                    Arg::Float(momentum),
                    Arg::Float(hp.weight_decay),
                    Arg::Float(hp.grad_scale),
                    Arg::I32(nesterov as i32)
                ]
            ));
            let (mut wp, mut wvel) = (p.clone(), vel.clone());
            ops::optim::sgd_update(&mut wp, &g, with_velocity.then_some(&mut wvel[..]), &hp).unwrap();
            close(
                &format!("sgd param n={n} momentum={momentum} nesterov={nesterov}"),
                &f32s(&b[0]),
                &wp,
                1e-6,
            );
            if with_velocity {
                close(&format!("sgd velocity n={n}"), &f32s(&b[2]), &wvel, 1e-6);
            }
        }
        // The sum of squares behind the global gradient norm: block partials, summed on
        // the host as the backend does.
        let blocks = n.div_ceil(THREADS as usize).clamp(1, 1024);
        // The kernel adds into its slots; the backend clears them first.
        let b = run!(launch(
            1,
            "sum_of_squares",
            (blocks as u32, 1, 1),
            THREADS,
            &[Arg::F32(vec![0.0; 1024]), Arg::F32(p.clone()), Arg::I64(n as i64)]
        ));
        let got: f64 = f32s(&b[0])[..blocks].iter().map(|&v| v as f64).sum();
        let want = ops::l2norm::sum_of_squares(&p);
        close(&format!("sum_of_squares n={n}"), &[got as f32], &[want as f32], 1e-6);
    }
}

#[test]
fn embedding_and_moe_kernels_match_core() {
    let mut rng = Rng::new(6);
    for (vocab, dim, ids) in [
        (5usize, 1usize, vec![0u32]),
        (11, 33, vec![3, 3, 0, 10, 3, 7, 0]),
        (300, 8, (0..500).map(|i| (i * 37 % 300) as u32).collect()),
    ] {
        let table = randn(&mut rng, vocab * dim, 1.0);
        let rows = ids.len();
        let b = run!(launch(
            1,
            "embedding_forward",
            grid(rows * dim),
            THREADS,
            &[
                Arg::F32(vec![f32::NAN; rows * dim]),
                Arg::F32(table.clone()),
                Arg::U32(ids.clone()),
                Arg::I32(rows as i32),
                Arg::I32(dim as i32)
            ]
        ));
        let mut want = vec![0.0; rows * dim];
        ops::embedding::embedding_forward(&mut want, &table, &ids, vocab, dim).unwrap();
        exact(&format!("embedding_forward vocab={vocab} dim={dim}"), &f32s(&b[0]), &want);
        // The backward, rows grouped by id on the host as the backend groups them.
        let dout = randn(&mut rng, rows * dim, 1.0);
        let mut order: Vec<u32> = (0..rows as u32).collect();
        order.sort_by_key(|&r| ids[r as usize]);
        let (mut uniq, mut offsets) = (Vec::new(), Vec::new());
        for (p, &r) in order.iter().enumerate() {
            if uniq.last() != Some(&ids[r as usize]) {
                uniq.push(ids[r as usize]);
                offsets.push(p as u32);
            }
        }
        offsets.push(rows as u32);
        let dt0 = randn(&mut rng, vocab * dim, 0.1);
        let b = run!(launch(
            1,
            "embedding_backward",
            grid(uniq.len() * dim),
            THREADS,
            &[
                Arg::F32(dt0.clone()),
                Arg::F32(dout.clone()),
                Arg::U32(uniq.clone()),
                Arg::U32(offsets),
                Arg::U32(order),
                Arg::I32(uniq.len() as i32),
                Arg::I32(dim as i32)
            ]
        ));
        let mut want = dt0.clone();
        ops::embedding::embedding_backward(&mut want, &dout, &ids, vocab, dim).unwrap();
        close(&format!("embedding_backward vocab={vocab} dim={dim}"), &f32s(&b[0]), &want, 1e-6);
    }
    for (n, top_k, dim) in [(1usize, 1usize, 1usize), (5, 2, 33), (40, 3, 300)] {
        let slots = n * top_k;
        let y = randn(&mut rng, slots * dim, 1.0);
        // Slots sorted by expert in the backend: any permutation of the rows of y.
        let row_of_slot: Vec<u32> = (0..slots).map(|s| ((s * 7 + 3) % slots) as u32).collect();
        let weight: Vec<f32> = (0..slots).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
        // The combine adds into out (the shared expert's output is already there).
        let out0 = randn(&mut rng, n * dim, 1.0);
        let b = run!(launch(
            1,
            "moe_combine",
            grid(n * dim),
            THREADS,
            &[
                Arg::F32(out0.clone()),
                Arg::F32(y.clone()),
                Arg::U32(row_of_slot.clone()),
                Arg::F32(weight.clone()),
                Arg::I32(n as i32),
                Arg::I32(top_k as i32),
                Arg::I32(dim as i32)
            ]
        ));
        let mut want = out0;
        ops::moe::moe_combine(&mut want, &y, &row_of_slot, &weight, top_k, dim).unwrap();
        close(&format!("moe_combine n={n} k={top_k} dim={dim}"), &f32s(&b[0]), &want, 1e-6);
        let dout = randn(&mut rng, n * dim, 1.0);
        let b = run!(launch(
            1,
            "moe_combine_backward",
            (slots as u32, 1, 1),
            128,
            &[
                Arg::F32(vec![f32::NAN; slots * dim]),
                Arg::F32(vec![f32::NAN; slots]),
                Arg::F32(dout.clone()),
                Arg::F32(y.clone()),
                Arg::U32(row_of_slot.clone()),
                Arg::F32(weight.clone()),
                Arg::I32(slots as i32),
                Arg::I32(top_k as i32),
                Arg::I32(dim as i32)
            ]
        ));
        let mut dy = vec![0.0; slots * dim];
        let dw =
            ops::moe::moe_combine_backward(&mut dy, &dout, &y, &row_of_slot, &weight, top_k, dim).unwrap();
        close(&format!("moe_combine_backward dy n={n}"), &f32s(&b[0]), &dy, 1e-6);
        close(&format!("moe_combine_backward dweight n={n}"), &f32s(&b[1]), &dw, 1e-5);
    }
}

#[test]
fn int8_kernels_match_core_to_the_bit() {
    let mut rng = Rng::new(7);
    // Per-row weights (int8 checkpoints before blocks) and blocks of 32 (a partial last one
    // at k = 67 and 300, more than 32 blocks a row at k = 1100).
    let shapes = [(1usize, 1usize, 1usize), (3, 5, 7), (2, 40, 67), (9, 3, 300), (2, 3, 1100)];
    for ((m, n, k), blocked) in shapes.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let w = randn(&mut rng, n * k, 1.0);
        let (packed, scales) =
            if blocked { q8::quantize_blocks(&w, n, k) } else { q8::quantize_rows(&w, n, k) }.unwrap();
        let block = q8::q8_block("test", n, k, scales.len()).unwrap();
        let nb = k.div_ceil(block);
        let mut x = randn(&mut rng, m * k, 2.0);
        x[0] = 0.5 * 2.0 / 127.0; // a tie for the rounding
        let words = q8::packed_cols(k);
        // Blocked weights: 13-bit activations as shorts (two bytes each).
        let width = if nb > 1 { 2 } else { 1 };
        let b = run!(launch(
            1,
            if nb > 1 { "quantize_activations_wide" } else { "quantize_activations" },
            ((m * nb) as u32, 1, 1),
            256,
            &[
                Arg::I8(vec![7; m * words * 4 * width]),
                Arg::F32(vec![f32::NAN; m * nb]),
                Arg::F32(x.clone()),
                Arg::I32(m as i32),
                Arg::I32(k as i32),
                Arg::I32((words * 4) as i32),
                Arg::I32(block as i32)
            ]
        ));
        let (xq, xs) = (b[0].clone(), f32s(&b[1]));
        for r in 0..m {
            let row = &xq[r * words * 4 * width..(r + 1) * words * 4 * width];
            let (got, want_q, want_s): (Vec<i32>, Vec<i32>, Vec<f32>) = if nb > 1 {
                let (q, s) = q8::quantize_activations_wide(&x[r * k..(r + 1) * k], block);
                let got = row.chunks(2).map(|b| i16::from_le_bytes([b[0], b[1]]) as i32).collect();
                (got, q.iter().map(|&v| v as i32).collect(), s)
            } else {
                let (q, s) = q8::quantize_activations(&x[r * k..(r + 1) * k]);
                (
                    row.iter().map(|&b| b as i8 as i32).collect(),
                    q.iter().map(|&v| v as i32).collect(),
                    vec![s],
                )
            };
            assert_eq!(&got[..k], want_q, "quantize_activations row {r} of {m}x{k}, blocks of {block}");
            assert!(got[k..].iter().all(|&b| b == 0), "padding of row {r} of {m}x{k}");
            let got_s: Vec<u32> = xs[r * nb..(r + 1) * nb].iter().map(|v| v.to_bits()).collect();
            assert_eq!(got_s, want_s.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "scales row {r}");
        }
        // beta 0 overwrites (a NaN already there must not leak), beta 0.5 accumulates.
        for (beta, out0) in [(0.0f32, vec![f32::NAN; m * n]), (0.5, randn(&mut rng, m * n, 1.0))] {
            let b = run!(launch(
                1,
                "q8_matmul",
                warps(m * n),
                256,
                &[
                    Arg::F32(out0.clone()),
                    Arg::I8(xq.iter().map(|&b| b as i8).collect()),
                    Arg::F32(xs.clone()),
                    Arg::F32(packed.clone()),
                    Arg::F32(scales.clone()),
                    Arg::I32(m as i32),
                    Arg::I32(n as i32),
                    Arg::I32(words as i32),
                    Arg::Float(beta),
                    Arg::I32(nb as i32),
                    Arg::I32(block as i32)
                ]
            ));
            let mut want = out0.clone();
            q8::q8_matmul(&mut want, &x, &packed, &scales, m, n, k, beta).unwrap();
            exact(&format!("q8_matmul {m}x{n}x{k} blocks of {block} beta {beta}"), &f32s(&b[0]), &want);
        }
        // int8 embedding rows
        let ids: Vec<u32> = (0..m).map(|i| (i * 3 % n) as u32).collect();
        let b = run!(launch(
            1,
            "q8_embedding",
            grid(m * k),
            THREADS,
            &[
                Arg::F32(vec![f32::NAN; m * k]),
                Arg::F32(packed.clone()),
                Arg::F32(scales.clone()),
                Arg::U32(ids.clone()),
                Arg::I32(m as i32),
                Arg::I32(k as i32),
                Arg::I32(words as i32),
                Arg::I32(nb as i32),
                Arg::I32(block as i32)
            ]
        ));
        let mut want = vec![0.0; m * k];
        q8::q8_embedding(&mut want, &packed, &scales, &ids, n, k).unwrap();
        exact(&format!("q8_embedding {m} rows of {n}x{k}"), &f32s(&b[0]), &want);
    }
}

/// The attention kernels' `Shape` structs in their C layout.
fn shape_bytes(s: &AttentionSpec, with_head_dim: bool) -> Vec<u8> {
    let mut f = vec![s.batch, s.q_len, s.kv_len, s.kv_capacity, s.q_heads, s.kv_heads];
    if with_head_dim {
        f.push(s.head_dim);
    }
    f.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()
}

fn attention_cases() -> Vec<AttentionSpec> {
    let spec = |batch, q_len, kv_len, kv_capacity, q_heads, kv_heads, head_dim| AttentionSpec {
        batch,
        q_len,
        kv_len,
        kv_capacity,
        q_heads,
        kv_heads,
        head_dim,
    };
    vec![
        spec(1, 1, 1, 1, 1, 1, 8),
        spec(2, 7, 7, 7, 4, 2, 20),
        spec(1, 3, 40, 45, 2, 1, 64),
        spec(1, 33, 33, 33, 2, 2, 33),
    ]
}

/// Reference attention: out, lse, and the gradients for `dout`.
fn reference(s: &AttentionSpec, q: &[f32], k: &[f32], v: &[f32], dout: &[f32]) -> [Vec<f32>; 5] {
    let (nq, nkv, nl) = s.check("emulated attention").unwrap();
    let (mut out, mut lse) = (vec![0.0; nq], vec![0.0; nl]);
    attention_forward(&mut out, &mut lse, q, k, v, s).unwrap();
    let (mut dq, mut dk, mut dv) = (vec![0.0; nq], vec![0.0; nkv], vec![0.0; nkv]);
    attention_backward(&mut dq, &mut dk, &mut dv, dout, q, k, v, &out, &lse, s).unwrap();
    [out, lse, dq, dk, dv]
}

#[test]
fn f32_attention_kernels_match_core() {
    let mut rng = Rng::new(8);
    for s in attention_cases() {
        let (nq, nkv, nl) = s.check("case").unwrap();
        let (q, k, v, dout) = (
            randn(&mut rng, nq, 1.0),
            randn(&mut rng, nkv, 1.0),
            randn(&mut rng, nkv, 1.0),
            randn(&mut rng, nq, 1.0),
        );
        let [out, lse, dq, dk, dv] = reference(&s, &q, &k, &v, &dout);
        let shape = shape_bytes(&s, true);
        let q_rows = s.batch * s.q_len * s.q_heads;
        let b = run!(launch(
            2,
            "attention_forward",
            warps(q_rows),
            256,
            &[
                Arg::F32(vec![f32::NAN; nq]),
                Arg::F32(vec![f32::NAN; nl]),
                Arg::F32(q.clone()),
                Arg::F32(k.clone()),
                Arg::F32(v.clone()),
                Arg::Raw(shape.clone())
            ]
        ));
        close(&format!("attention_forward out {s:?}"), &f32s(&b[0]), &out, 1e-4);
        close(&format!("attention_forward lse {s:?}"), &f32s(&b[1]), &lse, 1e-4);
        let b = run!(launch(
            2,
            "attention_backward_dq",
            warps(q_rows),
            256,
            &[
                Arg::F32(vec![f32::NAN; nq]),
                Arg::F32(dout.clone()),
                Arg::F32(q.clone()),
                Arg::F32(k.clone()),
                Arg::F32(v.clone()),
                Arg::F32(out.clone()),
                Arg::F32(lse.clone()),
                Arg::Raw(shape.clone())
            ]
        ));
        close(&format!("attention_backward dq {s:?}"), &f32s(&b[0]), &dq, 1e-4);
        let kv_rows = s.batch * s.kv_capacity * s.kv_heads;
        let b = run!(launch(
            2,
            "attention_backward_dkv",
            warps(kv_rows),
            256,
            &[
                Arg::F32(vec![f32::NAN; nkv]),
                Arg::F32(vec![f32::NAN; nkv]),
                Arg::F32(dout.clone()),
                Arg::F32(q.clone()),
                Arg::F32(k.clone()),
                Arg::F32(v.clone()),
                Arg::F32(out.clone()),
                Arg::F32(lse.clone()),
                Arg::Raw(shape)
            ]
        ));
        // Cache rows past kv_len are no key's: the reference leaves them zero.
        close(&format!("attention_backward dk {s:?}"), &f32s(&b[0]), &dk, 1e-4);
        close(&format!("attention_backward dv {s:?}"), &f32s(&b[1]), &dv, 1e-4);
    }
}

#[test]
fn bf16_flash_attention_kernels_match_core() {
    let mut rng = Rng::new(9);
    let spec = |batch, q_len, kv_len, kv_capacity, q_heads, kv_heads, head_dim| AttentionSpec {
        batch,
        q_len,
        kv_len,
        kv_capacity,
        q_heads,
        kv_heads,
        head_dim,
    };
    // Tiles cut by the lengths, grouped heads, decoding rows (kv_len > q_len) with spare
    // cache capacity, both head sizes.
    let cases = [
        spec(1, 1, 1, 1, 1, 1, 64),
        spec(2, 7, 7, 7, 4, 2, 64),
        spec(1, 65, 97, 100, 2, 1, 64),
        spec(1, 70, 70, 70, 2, 1, 128),
        spec(1, 1, 300, 301, 2, 1, 128),
    ];
    for s in cases {
        let (nq, nkv, nl) = s.check("case").unwrap();
        let (q, k, v, dout) = (
            randn(&mut rng, nq, 1.0),
            randn(&mut rng, nkv, 1.0),
            randn(&mut rng, nkv, 1.0),
            randn(&mut rng, nq, 1.0),
        );
        let [out, lse, dq, dk, dv] = reference(&s, &q, &k, &v, &dout);
        let shape = shape_bytes(&s, false);
        let d = s.head_dim;
        let q_grid = (s.q_len.div_ceil(64) as u32, s.q_heads as u32, s.batch as u32);
        let kv_grid = (s.kv_capacity.div_ceil(64) as u32, s.kv_heads as u32, s.batch as u32);
        let b = run!(launch(
            3,
            &format!("flash_forward_{d}"),
            q_grid,
            128,
            &[
                Arg::F32(vec![f32::NAN; nq]),
                Arg::F32(vec![f32::NAN; nl]),
                Arg::F32(q.clone()),
                Arg::F32(k.clone()),
                Arg::F32(v.clone()),
                Arg::Raw(shape.clone())
            ]
        ));
        close_floor(&format!("flash_forward out {s:?}"), &f32s(&b[0]), &out, 2e-2, 1.0);
        close_floor(&format!("flash_forward lse {s:?}"), &f32s(&b[1]), &lse, 2e-2, 1.0);
        let b = run!(launch(
            3,
            "flash_delta",
            warps(nl),
            256,
            &[
                Arg::F32(vec![f32::NAN; nl]),
                Arg::F32(dout.clone()),
                Arg::F32(out.clone()),
                Arg::I64(nl as i64),
                Arg::I32(d as i32)
            ]
        ));
        let delta = f32s(&b[0]);
        let want_delta: Vec<f32> = (0..nl)
            .map(|r| (0..d).map(|i| dout[r * d + i] as f64 * out[r * d + i] as f64).sum::<f64>() as f32)
            .collect();
        close(&format!("flash_delta {s:?}"), &delta, &want_delta, 1e-5);
        let b = run!(launch(
            3,
            &format!("flash_backward_kv_{d}"),
            kv_grid,
            128,
            &[
                Arg::F32(vec![f32::NAN; nkv]),
                Arg::F32(vec![f32::NAN; nkv]),
                Arg::F32(dout.clone()),
                Arg::F32(q.clone()),
                Arg::F32(k.clone()),
                Arg::F32(v.clone()),
                Arg::F32(lse.clone()),
                Arg::F32(delta.clone()),
                Arg::Raw(shape.clone())
            ]
        ));
        close_floor(&format!("flash_backward dk {s:?}"), &f32s(&b[0]), &dk, 2e-2, 1.0);
        close_floor(&format!("flash_backward dv {s:?}"), &f32s(&b[1]), &dv, 2e-2, 1.0);
        let b = run!(launch(
            3,
            &format!("flash_backward_q_{d}"),
            q_grid,
            128,
            &[
                Arg::F32(vec![f32::NAN; nq]),
                Arg::F32(dout.clone()),
                Arg::F32(q.clone()),
                Arg::F32(k.clone()),
                Arg::F32(v.clone()),
                Arg::F32(lse.clone()),
                Arg::F32(delta),
                Arg::Raw(shape)
            ]
        ));
        close_floor(&format!("flash_backward dq {s:?}"), &f32s(&b[0]), &dq, 2e-2, 1.0);
    }
}
