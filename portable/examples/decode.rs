//! Greedy decode of an `.rbw` language model on the portable backend: the browser's CPU
//! path without the browser. Built for wasm32-wasip1 it runs under Node's WASI with the
//! same SIMD128 kernels the page runs, so a kernel change can be timed (and profiled with
//! `node --cpu-prof`) in seconds; built natively it runs the same code on this CPU.
//!
//! ```text
//! cargo run --release -p rusting_brain_portable --example decode --target wasm32-wasip1 -- www/models/model.rbw
//! cargo run --release -p rusting_brain_portable --example decode -- www/models/model.rbw [tokens] [runs]
//! ```
//!
//! Each run clears the cache, feeds a four-token prompt and draws `tokens` (120) greedy
//! ids; the first run is also the engine's warm-up. Prints tokens/s per run and the median.

use std::error::Error;
use std::time::Instant;

use rusting_brain_core::checkpoint::read_model;
use rusting_brain_core::Sampler;
use rusting_brain_portable::PortableBackend;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        return Err("usage: decode <model.rbw> [tokens (120)] [runs (6)]".into());
    };
    let number = |i: usize, default: usize| -> Result<usize, Box<dyn Error>> {
        match args.get(i) {
            Some(s) => s.parse().map_err(|_| format!("not a count: {s:?}").into()),
            None => Ok(default),
        }
    };
    let (tokens, runs) = (number(1, 120)?, number(2, 6)?.max(1));
    let bytes = std::fs::read(path).map_err(|e| format!("reading {path}: {e}"))?;
    let mut model = read_model(&bytes, PortableBackend)?;
    model.quantize()?;
    let vocab = model.config.vocab_size;
    let prompt: Vec<u32> = (1..5).map(|i| i % vocab as u32).collect();
    let room = model.config.max_seq_len.saturating_sub(prompt.len());
    if tokens > room {
        return Err(format!(
            "{tokens} tokens after a 4-token prompt do not fit the model's {} positions",
            model.config.max_seq_len
        )
        .into());
    }
    let mut cache = model.new_kv_caches()?;
    let mut greedy = Sampler::greedy();
    let mut rates = Vec::new();
    let mut first_ids = Vec::new();
    for run in 0..runs {
        cache.clear();
        let mut logits = model.forward_cached(&prompt, &mut cache)?;
        let t = Instant::now();
        let mut ids = Vec::with_capacity(tokens);
        let mut context = prompt.clone();
        for _ in 0..tokens {
            // Core's greedy draw, as the page's engine makes it.
            let id = greedy.sample(&logits, &context)?;
            ids.push(id);
            context.push(id);
            logits = model.forward_cached(&[id], &mut cache)?;
        }
        let rate = tokens as f64 / t.elapsed().as_secs_f64();
        println!("run {run}: {rate:.0} tokens/s");
        rates.push(rate);
        if run == 0 {
            first_ids = ids;
        } else if ids != first_ids {
            return Err(format!("run {run} drew other ids than run 0").into());
        }
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "{} ({}), {tokens} greedy tokens: median {:.0} tokens/s over {runs} runs; ids {:?}...",
        path,
        std::env::consts::ARCH,
        rates[rates.len() / 2],
        &first_ids[..first_ids.len().min(8)]
    );
    Ok(())
}
