//! Training throughput of a dense network (784-256-128-10, ReLU, softmax + cross-entropy,
//! Adam) next to the same network in PyTorch (`bench/torch_dense.py`), in one run. Each
//! side reports its best epoch.
//!
//!     cargo run --release -p rusting_brain --example bench_dense [-- BATCH SAMPLES EPOCHS]
//!
//! PyTorch runs through `$RB_PYTHON` (default `python3`); without torch there, only our
//! side is printed.

use std::process::Command;
use std::time::Instant;

use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let batch = args.first().copied().unwrap_or(64);
    let samples = args.get(1).copied().unwrap_or(8192);
    let epochs = args.get(2).copied().unwrap_or(3);
    let sizes = [784usize, 256, 128, 10];

    let mut rng = Rng::new(0);
    let inputs: Vec<Vec<f32>> =
        (0..samples).map(|_| (0..sizes[0]).map(|_| rng.next_f64() as f32).collect()).collect();
    let targets: Vec<Vec<f32>> = (0..samples)
        .map(|_| {
            let mut t = vec![0.0; sizes[3]];
            t[rng.below(sizes[3] as u64) as usize] = 1.0;
            t
        })
        .collect();
    let data = Dataset::new(inputs, targets)?;
    let mut model = Network::builder()
        .input_size(sizes[0])
        .dense(sizes[1], Activation::Relu)
        .dense(sizes[2], Activation::Relu)
        .dense(sizes[3], Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(1e-3))
        .seed(0)
        .build();
    let config = TrainConfig { epochs: 1, batch_size: batch, shuffle: true, seed: Some(0) };
    model.fit(&data, config)?; // warm-up: arenas, thread pool, page faults
                               // Best epoch of `epochs`: this shared VM's noise only ever slows a run down.
    let mut best = f64::INFINITY;
    for e in 0..epochs {
        let t = Instant::now();
        model.fit(&data, TrainConfig { seed: Some(e as u64 + 1), ..config })?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    let ours = samples as f64 / best;
    let macs = model.config()?.forward_macs() as f64;

    let python = std::env::var("RB_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/torch_dense.py");
    let threads = rayon::current_num_threads();
    let torch = Command::new(&python)
        .args([
            script,
            "--batch",
            &batch.to_string(),
            "--samples",
            &samples.to_string(),
            "--epochs",
            &epochs.to_string(),
        ])
        .args(["--threads", &threads.to_string()])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            let line = String::from_utf8_lossy(&o.stdout).lines().last()?.to_string();
            let v: serde_json::Value = serde_json::from_str(&line).ok()?;
            Some((v["samples_per_s"].as_f64()?, v["version"].as_str().unwrap_or("?").to_string()))
        });

    println!("bench_dense: {}-{}-{}-{} ReLU/softmax+CE, Adam, batch {batch}, {samples} samples, best of {epochs} epochs, {threads} threads", sizes[0], sizes[1], sizes[2], sizes[3]);
    println!("{:<24} {:>14} {:>16}", "", "samples/s", "GFLOP/s (6 x MACs)");
    println!("{:<24} {:>14.0} {:>16.1}", "rusting_brain (cpu)", ours, ours * 6.0 * macs / 1e9);
    match torch {
        Some((theirs, version)) => {
            println!(
                "{:<24} {:>14.0} {:>16.1}",
                format!("PyTorch {version} eager"),
                theirs,
                theirs * 6.0 * macs / 1e9
            );
            println!("ratio rusting_brain / PyTorch: {:.2}x", ours / theirs);
        }
        None => println!("PyTorch: not run ({python} {script} failed; set RB_PYTHON to a Python with torch)"),
    }
    Ok(())
}
