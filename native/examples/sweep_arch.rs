//! Training tokens/s on a CUDA device over a grid of widths and depths (mixed precision,
//! heads of 64, GQA 3:1, SwiGLU width ~1.83 d, vocab 32000), to see where the GPU fills up.
//!
//!     cargo run --release -p rusting_brain --example sweep_arch --features cuda -- [batch seq]

use std::time::Instant;

use rusting_brain::core::Rng;
use rusting_brain::{Optimizer, TransformerLm};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (batch, seq) = (args.first().copied().unwrap_or(8), args.get(1).copied().unwrap_or(512));
    let vocab = 32_000;
    let mut rng = Rng::new(1);
    let seqs: Vec<Vec<u32>> =
        (0..batch).map(|_| (0..=seq).map(|_| rng.below(vocab as u64) as u32).collect()).collect();
    println!("sweep_arch: batch {batch} x {seq}, BF16 mixed precision; median of 5 steps after 2");
    println!("{:>8} {:>7} {:>12} {:>12} {:>10}", "d_model", "layers", "parameters", "tokens/s", "TFLOP/s");
    for d in [512usize, 768, 1024, 1536] {
        for layers in [4usize, 8, 16] {
            let heads = d / 64;
            let kv = (heads / 3).max(1);
            let heads = kv * (heads / kv);
            let ff = (d * 11 / 6).div_ceil(64) * 64;
            let mut model = TransformerLm::builder()
                .vocab_size(vocab)
                .d_model(d)
                .n_layers(layers)
                .heads(heads, kv, 64)
                .d_ff(ff)
                .max_seq_len(seq)
                .optimizer(Optimizer::adam(3e-4).weight_decay(0.1))
                .build()?;
            model.set_mixed_precision(true);
            model.to_cuda(0, 60_000)?;
            for _ in 0..2 {
                model.train_step(&seqs)?;
            }
            let mut times = Vec::new();
            for _ in 0..5 {
                let t = Instant::now();
                model.train_step(&seqs)?;
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(|a, b| a.total_cmp(b));
            let tps = (batch * seq) as f64 / times[2];
            let flops = 6.0 * model.config().forward_macs_per_token(seq);
            println!(
                "{d:>8} {layers:>7} {:>12} {tps:>12.0} {:>10.1}",
                model.parameter_counts().total,
                tps * flops / 1e12
            );
        }
    }
    Ok(())
}
