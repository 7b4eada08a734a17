//! GEMM throughput on a CUDA device at the shapes of the 101.7M model's training step, next
//! to the largest square GEMM (the peak the MFU of `bench_train_step` is measured against).
//!
//!     cargo run --release -p rusting_brain --example cuda_benchmark --features cuda -- [batch seq]
//!
//! Every product runs through the backend's own `matmul` (cuBLASLt), BF16 operands with
//! FP32 accumulation and then FP32 (TF32 off), each the best of 20 after a warm-up.

use std::time::Instant;

use rusting_brain::core::backend::{MatmulSpec, OperandPrecision};
use rusting_brain::cuda::CudaBackend;
use rusting_brain_core::backend::MatmulOps;
use rusting_brain_core::backend::Memory;

fn time(b: &CudaBackend, spec: &MatmulSpec) -> Result<f64, Box<dyn std::error::Error>> {
    // A transpose changes the layout, not the element count.
    let (la, lb) = (spec.m * spec.k, spec.k * spec.n);
    let a = b.upload(&vec![0.01f32; la])?;
    let w = b.upload(&vec![0.01f32; lb])?;
    let mut c = b.zeros(spec.m * spec.n)?;
    b.matmul(&mut c, &a, &w, spec)?;
    b.synchronize()?;
    let mut best = f64::MAX;
    for _ in 0..20 {
        let t = Instant::now();
        b.matmul(&mut c, &a, &w, spec)?;
        b.synchronize()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(spec.flops() / best / 1e12)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let tokens = args.first().copied().unwrap_or(4) * args.get(1).copied().unwrap_or(1024);
    let b = CudaBackend::new(0, 16_000)?;
    println!(
        "cuda_benchmark on {} (sm_{}{}), {tokens} tokens a step; TFLOP/s, best of 20",
        b.device_name(),
        b.compute_capability().0,
        b.compute_capability().1
    );
    let (d, kv, ff, vocab) = (768, 256, 1408, 32_000);
    // (name, m, n, k, trans_a, trans_b): forward x W^T, backward dx = dy W, dW += dy^T x.
    let shapes: Vec<(&str, usize, usize, usize, bool, bool)> = vec![
        ("q/o proj fwd", tokens, d, d, false, true),
        ("k/v proj fwd", tokens, kv, d, false, true),
        ("gate/up fwd", tokens, ff, d, false, true),
        ("down fwd", tokens, d, ff, false, true),
        ("lm head fwd", tokens, vocab, d, false, true),
        ("gate/up dx", tokens, d, ff, false, false),
        ("gate/up dW", ff, d, tokens, true, false),
        ("lm head dx", tokens, d, vocab, false, false),
        ("lm head dW", vocab, d, tokens, true, false),
    ];
    println!("{:<16} {:>24} {:>10} {:>10} {:>9}", "product", "m x n x k", "BF16", "FP32", "of peak");
    let peak = time(&b, &MatmulSpec::new(8192, 8192, 8192).trans_b(true).precision(OperandPrecision::Bf16))?;
    let peak32 = time(&b, &MatmulSpec::new(8192, 8192, 8192).trans_b(true))?;
    for (name, m, n, k, ta, tb) in shapes {
        let spec = MatmulSpec::new(m, n, k).trans_a(ta).trans_b(tb);
        let bf = time(&b, &spec.precision(OperandPrecision::Bf16))?;
        let f = time(&b, &spec)?;
        println!(
            "{name:<16} {:>24} {bf:>10.1} {f:>10.1} {:>8.0}%",
            format!("{m} x {n} x {k}"),
            100.0 * bf / peak
        );
    }
    println!("{:<16} {:>24} {peak:>10.1} {peak32:>10.1} {:>8.0}%", "square", "8192 x 8192 x 8192", 100.0);
    Ok(())
}
