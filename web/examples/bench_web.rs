//! The browser engine's decode speed, natively: the CPU fallback (the portable backend,
//! what the wasm build runs) and the GPU path (the shaders crate, on whatever adapter wgpu
//! finds), on a `.rbw` file, beside nothing else; the page and Node print their own rates.
//!
//!     cargo run --release -p rusting_brain_web --example bench_web -- www/models/model.rbw [tokens] [cpu|webgpu]

use std::time::Instant;

use rusting_brain_core::Sampler;
use rusting_brain_shaders::block_on;
use rusting_brain_web::{DeviceChoice, Engine};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args.first().ok_or("usage: bench_web <model.rbw> [tokens]")?;
    let tokens: usize = args.get(1).map_or(Ok(64), |t| t.parse())?;
    let bytes = std::fs::read(path)?;
    println!("| device | tokens | first token ms | decode tokens/s |");
    println!("|---|---|---|---|");
    let choices = match args.get(2) {
        Some(d) => vec![DeviceChoice::parse(d)?],
        None => vec![DeviceChoice::Cpu, DeviceChoice::WebGpu],
    };
    for choice in choices {
        let mut e = match block_on(Engine::load(&bytes, choice)) {
            Ok(e) => e,
            Err(err) => {
                println!("| {choice:?} | skipped: {err} | | |");
                continue;
            }
        };
        let t0 = Instant::now();
        let mut first = None;
        let g = block_on(e.generate(
            &[1, 2, 3, 4],
            tokens,
            &mut Sampler::greedy(),
            None,
            |_| {
                first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
                true
            },
            || async {},
        ))?;
        let first = first.unwrap_or(0.0);
        let rate = (g.ids.len().saturating_sub(1)) as f64 / (t0.elapsed().as_secs_f64() - first);
        println!("| {} | {} | {:.1} | {:.1} |", e.device(), g.ids.len(), first * 1e3, rate);
    }
    Ok(())
}
