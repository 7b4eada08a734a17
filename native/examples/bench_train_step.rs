//! Training throughput of `TransformerLm` next to PyTorch at the same shape, in one run,
//! with a per-primitive breakdown of our step and the peak memory.
//!
//!     cargo run --release -p rusting_brain --example bench_train_step -- 8 256 cpu [--moe]
//!     cargo run --release -p rusting_brain --example bench_train_step --features cuda -- 4 1024 cuda
//!     cargo run --release -p rusting_brain --example bench_train_step --features gpu -- 4 64 gpu [--moe]
//!
//! On `gpu` the model (the shape below, or its mixture-of-experts twin) trains through wgpu
//! on the default adapter (`RB_GPU_SOFTWARE=1`: the software one, lavapipe) beside the same
//! model on the CPU backend in the same run; it prints tokens/s, the ratio, what one
//! steady-state step asks of the device (dispatches, submissions, objects created) and the
//! step's breakdown by primitive on the device.
//!
//! On `cuda` the model is the 101.7M configuration (d_model 768, 16 layers, heads 12/4/64,
//! d_ff 1408, vocab 32000) in mixed precision (BF16 GEMMs and attention, FP32 master
//! weights), beside `torch_lm.py --device cuda --compile --bf16` at the same shape; it also
//! prints the step's breakdown by primitive (each fenced with a device synchronize) and the
//! MFU against the BF16 GEMM peak measured on the same device (see `cuda` below).
//!
//! Shape: d_model 256, 6 layers, heads 8/2/32, d_ff 704, vocab 4096, batch x seq from the
//! arguments. PyTorch runs `bench/torch_lm.py` (or `$RB_TORCH_LM`) through
//! `$RB_PYTHON` (default `python3`), eager and with `--compile`; where that fails only our
//! side is printed. Both report the median of 10 steps after 3 warm-up steps.
//!
//! `--moe` adds the mixture-of-experts model with the dense model's active parameters:
//! every layer 8 experts of width 352, top-2 (2 x 352 = 704 = the dense d_ff), so a token
//! does the same multiply-adds (plus a 256 x 8 router); PyTorch's side is
//! `bench/torch_moe.py` (a Mixtral-style expert loop), eager. The per-primitive breakdown
//! is then the MoE model's.

use std::process::Command;
use std::time::Instant;

use rusting_brain::core::backend::OperandPrecision;
use rusting_brain::core::models::transformer::{TokenBatch, TransformerConfig, TransformerModel};
use rusting_brain::core::Rng;
use rusting_brain::cpu::CpuBackend;
use rusting_brain::profile::Profiled;
use rusting_brain::{Backend, Optimizer, TransformerLm};

#[path = "common/rss.rs"]
mod rss;
use rss::peak_rss_mib;
use rusting_brain_core::backend::Memory;

fn torch(
    python: &str, script: &str, batch: usize, seq: usize, threads: usize, extra: &[&str],
) -> Option<(f64, String)> {
    let mut cmd = Command::new(python);
    cmd.args([
        script,
        "--batch",
        &batch.to_string(),
        "--seq",
        &seq.to_string(),
        "--threads",
        &threads.to_string(),
    ]);
    cmd.args(extra);
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    let line = String::from_utf8_lossy(&out.stdout).lines().last()?.to_string();
    let v: serde_json::Value = serde_json::from_str(&line).ok()?;
    Some((v["train_tokens_per_s"].as_f64()?, format!("{} {}", v["framework"].as_str()?, v["mode"].as_str()?)))
}

/// Median training tokens/s over 10 steps after 3 warm-up steps.
fn measure(model: &mut TransformerLm, seqs: &[Vec<u32>]) -> Result<f64, Box<dyn std::error::Error>> {
    for _ in 0..3 {
        model.train_step(seqs)?;
    }
    let mut times = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        model.train_step(seqs)?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok((seqs.len() * (seqs[0].len() - 1)) as f64 / times[times.len() / 2])
}

/// The step's time by primitive: the same step on `backend` wrapped in `Profiled` (which
/// fences each primitive with `synchronize`, so on a device the times are the kernels').
fn print_breakdown<B: Backend>(
    backend: B, config: &TransformerConfig, seqs: &[Vec<u32>], precision: OperandPrecision,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut pm = TransformerModel::new(Profiled::new(backend), config.clone(), 0)?;
    pm.precision = precision;
    let tb = TokenBatch::new(seqs)?;
    let opt = Optimizer::adam(3e-4).weight_decay(0.1);
    for _ in 0..2 {
        pm.zero_grad()?;
        pm.accumulate(&tb)?;
        pm.step(&opt, 1.0)?;
    }
    pm.backend.synchronize()?;
    pm.backend.reset();
    let steps = 3;
    let t = Instant::now();
    for _ in 0..steps {
        pm.zero_grad()?;
        pm.accumulate(&tb)?;
        pm.step(&opt, 1.0)?;
    }
    pm.backend.synchronize()?;
    let wall = t.elapsed().as_secs_f64() / steps as f64;
    println!("\nper step, by primitive ({steps} steps, {:.1} ms a step):", wall * 1e3);
    print!("{}", pm.backend.breakdown(steps, wall, false));
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let moe = args.iter().any(|a| a == "--moe");
    let args: Vec<&String> = args.iter().filter(|a| *a != "--moe").collect();
    let batch: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(8);
    let seq: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let device = args.get(2).map_or("cpu", |s| s.as_str());
    match device {
        "cpu" => {}
        #[cfg(feature = "cuda-backend")]
        "cuda" => return cuda::run(batch, seq, moe),
        #[cfg(not(feature = "cuda-backend"))]
        "cuda" => return Err("device `cuda`: build with --features cuda".into()),
        #[cfg(feature = "gpu")]
        "gpu" => return gpu::run(batch, seq, moe),
        #[cfg(not(feature = "gpu"))]
        "gpu" => return Err("device `gpu`: build with --features gpu".into()),
        other => return Err(format!("device `{other}`: expected cpu, gpu or cuda").into()),
    }
    let base = || {
        TransformerLm::builder()
            .vocab_size(4096)
            .d_model(256)
            .n_layers(6)
            .heads(8, 2, 32)
            .d_ff(704)
            .max_seq_len(seq)
            .optimizer(Optimizer::adam(3e-4).weight_decay(0.1))
            .seed(0)
    };
    let mut rng = Rng::new(1);
    let seqs: Vec<Vec<u32>> =
        (0..batch).map(|_| (0..=seq).map(|_| rng.below(4096) as u32).collect()).collect();
    // The sparse model runs first: it is the larger, so the peak memory read after it is
    // its own (the dense model is dropped-in later and smaller).
    let mut sparse = None;
    let mut rss = None;
    if moe {
        let mut m = base().experts(8, 2).expert_d_ff(352).build()?;
        let tps = measure(&mut m, &seqs)?;
        rss = peak_rss_mib();
        sparse = Some((m.config().clone(), m.parameter_counts(), tps));
    }
    let mut model = base().build()?;
    let ours = measure(&mut model, &seqs)?;
    let dense_flops = 6.0 * model.config().forward_macs_per_token(seq);
    // The model the memory count and the breakdown describe.
    let (config, counts): (TransformerConfig, _) = match &sparse {
        Some((c, counts, _)) => (c.clone(), *counts),
        None => {
            rss = peak_rss_mib();
            (model.config().clone(), model.parameter_counts())
        }
    };
    // Mixed precision (BF16 GEMM operands, f32 master weights): vdpbf16ps where the CPU
    // has AVX512_BF16, else the same rounding through the f32 GEMM. After the peak memory
    // was read: a second model alive beside the first would double it.
    let mut mixed = base().build()?;
    mixed.set_mixed_precision(true);
    let ours_bf16 = measure(&mut mixed, &seqs)?;
    drop(mixed);

    let threads = rayon::current_num_threads();
    let python = std::env::var("RB_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = std::env::var("RB_TORCH_LM")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/torch_lm.py").to_string());
    let moe_script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/torch_moe.py");
    let eager = torch(&python, &script, batch, seq, threads, &[]);
    let compiled = torch(&python, &script, batch, seq, threads, &["--compile"]);

    println!(
        "bench_train_step: {}; d_model 256, 6 layers, heads 8/2/32, d_ff 704, vocab 4096; batch {batch} x {seq}; {threads} threads",
        model.parameter_counts()
    );
    println!("{:<34} {:>12} {:>10} {:>9}", "", "tokens/s", "GFLOP/s", "ratio");
    let row = |name: &str, tps: f64, flops: f64, ratio: String| {
        println!("{name:<34} {tps:>12.0} {:>10.1} {ratio:>9}", tps * flops / 1e9);
    };
    row("rusting_brain (cpu, f32)", ours, dense_flops, "1.00x".into());
    row(
        if rusting_brain::cpu::bf16::available() {
            "rusting_brain (cpu, bf16 vdpbf16ps)"
        } else {
            "rusting_brain (cpu, bf16 rounded)"
        },
        ours_bf16,
        dense_flops,
        format!("{:.2}x", ours_bf16 / ours),
    );
    for (r, fallback) in [(eager, "PyTorch eager"), (compiled, "PyTorch compile")] {
        match r {
            Some((tps, name)) => row(&name, tps, dense_flops, format!("{:.2}x", ours / tps)),
            None => {
                println!("{fallback:<34} not run ({python} {script} failed; set RB_PYTHON / RB_TORCH_LM)")
            }
        }
    }
    if let Some((c, counts, tps)) = &sparse {
        let flops = 6.0 * c.forward_macs_per_token(seq);
        println!(
            "\nmixture of experts, same active parameters: {counts}; 8 experts of width 352, top-2, every layer"
        );
        row("rusting_brain moe (cpu, f32)", *tps, flops, "1.00x".into());
        row("rusting_brain dense (above)", ours, dense_flops, format!("{:.2}x", tps / ours));
        let extra = ["--experts", "8", "--top-k", "2", "--expert-d-ff", "352"];
        match torch(&python, moe_script, batch, seq, threads, &extra) {
            Some((t, name)) => row(&name, t, flops, format!("{:.2}x", tps / t)),
            None => println!("{:<34} not run ({python} {moe_script} failed)", "PyTorch eager moe"),
        }
    }

    // Memory: parameters, gradients and two Adam moments (4 x P floats) plus the arena.
    let p = counts.total as f64;
    let arena = config.activation_floats(batch, seq) as f64;
    let expected = (4.0 * p + arena) * 4.0 / (1024.0 * 1024.0);
    match rss {
        Some(r) => println!(
            "peak resident memory {r:.0} MiB; counted {expected:.0} MiB ({:.0} MiB weights+grads+moments, {:.0} MiB activations): {:.2}x",
            16.0 * p / 1048576.0,
            4.0 * arena / 1048576.0,
            r / expected
        ),
        None => println!("peak resident memory: /proc/self/status not readable here"),
    }

    // Where the time goes: the same step through a timing wrapper around the CPU backend.
    print_breakdown(CpuBackend::new(), &config, &seqs, OperandPrecision::F32)?;
    Ok(())
}

/// The `gpu` device: the benchmark's model through wgpu beside the CPU backend.
#[cfg(feature = "gpu")]
mod gpu {
    use super::*;
    use rusting_brain::gpu::{Gpu, GpuOptions, WgpuBackend};

    pub fn run(batch: usize, seq: usize, moe: bool) -> Result<(), Box<dyn std::error::Error>> {
        let options = GpuOptions {
            software: std::env::var("RB_GPU_SOFTWARE").as_deref() == Ok("1"),
            high_performance: true,
            ..Default::default()
        };
        let build = || {
            let b = TransformerLm::builder()
                .vocab_size(4096)
                .d_model(256)
                .n_layers(6)
                .heads(8, 2, 32)
                .d_ff(704)
                .max_seq_len(seq)
                .optimizer(Optimizer::adam(3e-4).weight_decay(0.1))
                .seed(0);
            if moe {
                b.experts(8, 2).expert_d_ff(352).build()
            } else {
                b.build()
            }
        };
        let mut rng = Rng::new(1);
        let seqs: Vec<Vec<u32>> =
            (0..batch).map(|_| (0..=seq).map(|_| rng.below(4096) as u32).collect()).collect();
        let mut on_gpu = build()?;
        on_gpu.to_gpu_with(&options)?;
        let adapter = on_gpu.device().unwrap_or_default();
        let gpu_tps = measure(&mut on_gpu, &seqs)?;
        let mut on_cpu = build()?;
        let cpu_tps = measure(&mut on_cpu, &seqs)?;
        let config = on_cpu.config().clone();
        let flops = 6.0 * config.forward_macs_per_token(seq);
        println!(
            "bench_train_step gpu: {}{}; batch {batch} x {seq}; f32; adapter {adapter}; CPU {} threads",
            on_cpu.parameter_counts(),
            if moe { ", 8 experts of width 352, top-2" } else { "" },
            rayon::current_num_threads()
        );
        println!("{:<34} {:>12} {:>10} {:>9}", "", "tokens/s", "GFLOP/s", "ratio");
        for (name, tps) in [("rusting_brain (wgpu, f32)", gpu_tps), ("rusting_brain (cpu, f32)", cpu_tps)] {
            println!("{name:<34} {tps:>12.0} {:>10.1} {:>8.2}x", tps * flops / 1e9, tps / cpu_tps);
        }
        // What a steady-state step asks of the device, counted on core's model directly.
        let backend = WgpuBackend::new(std::sync::Arc::new(Gpu::new_blocking(&options)?));
        let mut m = TransformerModel::new(backend.clone(), config.clone(), 0)?;
        let tb = TokenBatch::new(&seqs)?;
        let opt = Optimizer::adam(3e-4).weight_decay(0.1);
        let mut cost = None;
        for _ in 0..3 {
            let before = backend.counters();
            m.zero_grad()?;
            m.accumulate(&tb)?;
            m.step(&opt, 1.0)?;
            backend.synchronize()?;
            cost = Some(backend.counters() - before);
        }
        if let Some(c) = cost {
            println!(
                "one step (the third): {} dispatches, {} submissions, {} buffers and {} bind groups created",
                c.dispatches, c.submits, c.buffers, c.bind_groups
            );
        }
        print_breakdown(backend, &config, &seqs, OperandPrecision::F32)
    }
}

/// The `cuda` device: the 101.7M model on GPU 0 against torch.compile on the same GPU.
#[cfg(feature = "cuda-backend")]
mod cuda {
    use std::time::Instant;

    use rusting_brain::core::backend::{MatmulOps, MatmulSpec, Memory, OperandPrecision};
    use rusting_brain::core::Rng;
    use rusting_brain::cuda::CudaBackend;
    use rusting_brain::{Optimizer, TransformerLm};

    /// The largest square BF16 GEMM's TFLOP/s on this device: the peak MFU is measured
    /// against (8192^3, best of 10 after a warm-up).
    pub fn gemm_peak(
        b: &CudaBackend, n: usize, precision: OperandPrecision,
    ) -> Result<f64, Box<dyn std::error::Error>> {
        let x = b.upload(&vec![0.01f32; n * n])?;
        let w = b.upload(&vec![0.01f32; n * n])?;
        let mut y = b.zeros(n * n)?;
        let spec = MatmulSpec::new(n, n, n).trans_b(true).precision(precision);
        b.matmul(&mut y, &x, &w, &spec)?;
        b.synchronize()?;
        let mut best = f64::MAX;
        for _ in 0..10 {
            let t = Instant::now();
            b.matmul(&mut y, &x, &w, &spec)?;
            b.synchronize()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(2.0 * (n as f64).powi(3) / best / 1e12)
    }

    pub fn run(batch: usize, seq: usize, moe: bool) -> Result<(), Box<dyn std::error::Error>> {
        let budget: usize =
            std::env::var("RB_CUDA_BUDGET_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(60_000);
        let (d, layers, hq, hkv, hd, ff, vocab) = (768, 16, 12, 4, 64, 1408, 32_000);
        let mut builder = TransformerLm::builder()
            .vocab_size(vocab)
            .d_model(d)
            .n_layers(layers)
            .heads(hq, hkv, hd)
            .d_ff(ff)
            .max_seq_len(seq)
            .optimizer(Optimizer::adam(3e-4).weight_decay(0.1))
            .seed(0);
        if moe {
            builder = builder.experts(8, 2).expert_d_ff(ff / 2);
        }
        let mut model = builder.build()?;
        model.set_mixed_precision(true);
        model.to_cuda(0, budget)?;
        let mut rng = Rng::new(1);
        let seqs: Vec<Vec<u32>> =
            (0..batch).map(|_| (0..=seq).map(|_| rng.below(vocab as u64) as u32).collect()).collect();
        for _ in 0..3 {
            model.train_step(&seqs)?;
        }
        let mut times = Vec::new();
        for _ in 0..10 {
            let t = Instant::now();
            // train_step ends with the step's loss on the host, so each step is complete.
            model.train_step(&seqs)?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let step_s = times[times.len() / 2];
        let tokens = (batch * seq) as f64;
        let ours = tokens / step_s;
        let flops_per_token = 6.0 * model.config().forward_macs_per_token(seq);

        let probe = CudaBackend::new(0, 4096)?;
        let peak = gemm_peak(&probe, 8192, OperandPrecision::Bf16)?;
        let mfu = ours * flops_per_token / (peak * 1e12);

        let python = std::env::var("RB_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = std::env::var("RB_TORCH_LM")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/torch_lm.py").to_string());
        let dims = [
            ("--d-model", d),
            ("--layers", layers),
            ("--heads", hq),
            ("--kv-heads", hkv),
            ("--head-dim", hd),
            ("--d-ff", ff),
            ("--vocab", vocab),
            ("--batch", batch),
            ("--seq", seq),
        ];
        let mut cmd = std::process::Command::new(&python);
        cmd.arg(&script);
        for (k, v) in dims {
            cmd.args([k, &v.to_string()]);
        }
        cmd.args(["--device", "cuda", "--compile", "--bf16"]);
        let torch = cmd.output().ok().filter(|o| o.status.success()).and_then(|o| {
            let line = String::from_utf8_lossy(&o.stdout).lines().last()?.to_string();
            let v: serde_json::Value = serde_json::from_str(&line).ok()?;
            v["train_tokens_per_s"].as_f64()
        });

        println!(
            "bench_train_step cuda: {} on {}; {}; batch {batch} x {seq}; BF16 GEMMs + attention, FP32 master weights; TF32 off",
            model.parameter_counts(),
            model.device().unwrap_or_default(),
            if moe { "8 experts of 704, top-2" } else { "dense" },
        );
        println!("{:<40} {:>12} {:>10} {:>9}", "", "tokens/s", "TFLOP/s", "ratio");
        println!(
            "{:<40} {ours:>12.0} {:>10.1} {:>9}",
            "rusting_brain (cuda, bf16)",
            ours * flops_per_token / 1e12,
            "1.00x"
        );
        match torch {
            Some(t) => println!(
                "{:<40} {t:>12.0} {:>10.1} {:>9.2}x",
                "PyTorch compile bf16 (same GPU)",
                t * flops_per_token / 1e12,
                ours / t
            ),
            None => println!(
                "PyTorch compile bf16: not run ({python} {script} failed; set RB_PYTHON / RB_TORCH_LM)"
            ),
        }
        println!(
            "step {:.1} ms (median of 10); MFU {:.1}% of the measured BF16 GEMM peak {peak:.0} TFLOP/s (8192^3); FLOPs = 6 x forward multiply-adds per token",
            step_s * 1e3,
            mfu * 100.0
        );

        // The breakdown: the same step on a fenced (synchronize after each op) backend;
        // fencing adds the launch gaps a queued step hides.
        let fenced = CudaBackend::new(0, budget)?;
        fenced.set_bf16_attention(true);
        super::print_breakdown(fenced, model.config(), &seqs, OperandPrecision::Bf16)?;
        Ok(())
    }
}
