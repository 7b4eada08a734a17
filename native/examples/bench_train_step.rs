//! Training throughput of `TransformerLm` next to PyTorch at the same shape, in one run,
//! with a per-primitive breakdown of our step and the peak memory.
//!
//!     cargo run --release -p rusting_brain --example bench_train_step -- 8 256 cpu
//!
//! Shape: d_model 256, 6 layers, heads 8/2/32, d_ff 704, vocab 4096, batch x seq from the
//! arguments. PyTorch runs `../shared/bench/torch_lm.py` (or `$RB_TORCH_LM`) through
//! `$RB_PYTHON` (default `python3`), eager and with `--compile`; where that fails only our
//! side is printed. Both report the median of 10 steps after 3 warm-up steps.

use std::process::Command;
use std::time::Instant;

use rusting_brain::core::models::transformer::{TokenBatch, TransformerConfig, TransformerModel};
use rusting_brain::core::Rng;
use rusting_brain::cpu::CpuBackend;
use rusting_brain::profile::Profiled;
use rusting_brain::{Optimizer, TransformerLm};

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn torch(
    python: &str,
    script: &str,
    batch: usize,
    seq: usize,
    threads: usize,
    compile: bool,
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
    if compile {
        cmd.arg("--compile");
    }
    let out = cmd.output().ok().filter(|o| o.status.success())?;
    let line = String::from_utf8_lossy(&out.stdout).lines().last()?.to_string();
    let v: serde_json::Value = serde_json::from_str(&line).ok()?;
    Some((
        v["train_tokens_per_s"].as_f64()?,
        format!("{} {}", v["framework"].as_str()?, v["mode"].as_str()?),
    ))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let batch: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(8);
    let seq: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(256);
    let device = args.get(2).map_or("cpu", String::as_str);
    if device != "cpu" {
        return Err(format!("device `{device}`: only `cpu` is built so far").into());
    }
    let mut model = TransformerLm::builder()
        .vocab_size(4096)
        .d_model(256)
        .n_layers(6)
        .heads(8, 2, 32)
        .d_ff(704)
        .max_seq_len(seq)
        .optimizer(Optimizer::adam(3e-4).weight_decay(0.1))
        .seed(0)
        .build()?;
    let config: TransformerConfig = model.config().clone();
    let mut rng = Rng::new(1);
    let seqs: Vec<Vec<u32>> = (0..batch)
        .map(|_| (0..=seq).map(|_| rng.below(4096) as u32).collect())
        .collect();
    let tokens = (batch * seq) as f64;

    for _ in 0..3 {
        model.train_step(&seqs)?;
    }
    let mut times = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        model.train_step(&seqs)?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.total_cmp(b));
    let median = times[times.len() / 2];
    let ours = tokens / median;
    let flops_per_token = 6.0 * config.forward_macs_per_token(seq);
    let rss = peak_rss_mib();

    let threads = rayon::current_num_threads();
    let python = std::env::var("RB_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = std::env::var("RB_TORCH_LM").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/bench/torch_lm.py").to_string()
    });
    let eager = torch(&python, &script, batch, seq, threads, false);
    let compiled = torch(&python, &script, batch, seq, threads, true);

    let counts = model.parameter_counts();
    println!(
        "bench_train_step: {counts}; d_model 256, 6 layers, heads 8/2/32, d_ff 704, vocab 4096; batch {batch} x {seq}; {threads} threads"
    );
    println!("{:<30} {:>12} {:>10} {:>9}", "", "tokens/s", "GFLOP/s", "ratio");
    println!(
        "{:<30} {:>12.0} {:>10.1} {:>9}",
        "rusting_brain (cpu, f32)",
        ours,
        ours * flops_per_token / 1e9,
        "1.00x"
    );
    for (r, fallback) in [(eager, "PyTorch eager"), (compiled, "PyTorch compile")] {
        match r {
            Some((tps, name)) => {
                println!(
                    "{:<30} {:>12.0} {:>10.1} {:>8.2}x",
                    name,
                    tps,
                    tps * flops_per_token / 1e9,
                    ours / tps
                )
            }
            None => {
                println!("{fallback:<30} not run ({python} {script} failed; set RB_PYTHON / RB_TORCH_LM)")
            }
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
    let profiled = Profiled::new(CpuBackend::new());
    let mut pm = TransformerModel::new(profiled, config, 0)?;
    let tb = TokenBatch::new(&seqs)?;
    let opt = Optimizer::adam(3e-4).weight_decay(0.1);
    for _ in 0..2 {
        pm.zero_grad()?;
        pm.accumulate(&tb)?;
        pm.step(&opt, 1.0)?;
    }
    pm.backend.reset();
    let steps = 3;
    let t = Instant::now();
    for _ in 0..steps {
        pm.zero_grad()?;
        pm.accumulate(&tb)?;
        pm.step(&opt, 1.0)?;
    }
    let wall = t.elapsed().as_secs_f64() / steps as f64;
    println!(
        "\nper step, by primitive ({steps} steps, {:.1} ms a step):",
        wall * 1e3
    );
    let mut covered = 0.0;
    for (op, calls, total) in pm.backend.report() {
        let ms = total.as_secs_f64() * 1e3 / steps as f64;
        covered += ms;
        println!(
            "  {op:<22} {:>6} calls {:>9.2} ms {:>6.1}%",
            calls / steps,
            ms,
            100.0 * ms / (wall * 1e3)
        );
    }
    println!(
        "  {:<22} {:>6}       {:>9.2} ms {:>6.1}%",
        "(outside primitives)",
        "",
        wall * 1e3 - covered,
        100.0 * (1.0 - covered / (wall * 1e3))
    );
    Ok(())
}
