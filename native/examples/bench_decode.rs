//! Decode throughput at batch 1 (greedy, KV-cached) next to PyTorch, with the bytes each
//! token reads and the share of this machine's measured read bandwidth that is.
//!
//!     cargo run --release -p rusting_brain --example bench_decode -- [PROMPT_LEN] [NEW_TOKENS] [readme]
//!
//! Shape: the training benchmark's (d_model 256, 6 layers, heads 8/2/32, d_ff 704, vocab
//! 4096), or with `readme` the README's 38.9M model (d_model 512, 8 layers, heads 8/2/64,
//! d_ff 1408, vocab 32000). Rows: f32, int8, and int8 mixture of experts with the same
//! active size; then where a Q8 step's time goes. PyTorch: `../shared/bench/torch_lm.py --decode N` (or `$RB_TORCH_LM`) through
//! `$RB_PYTHON`; its prompt is 16 tokens whatever PROMPT_LEN is.

use std::process::Command;
use std::time::Instant;

use rayon::prelude::*;
use rusting_brain::core::models::transformer::{TransformerConfig, TransformerModel};
use rusting_brain::core::Rng;
use rusting_brain::cpu::{simd, CpuBackend};
use rusting_brain::profile::Profiled;
use rusting_brain::{Sampler, TransformerLm};

/// Read bandwidth over a buffer of `bytes`: the best of several parallel SIMD passes (the
/// same kernels the decode path runs), after one pass to bring it in.
fn read_bandwidth_gb_s(bytes: usize) -> f64 {
    let data = vec![1.0f32; bytes / 4];
    let reps = ((2usize << 30) / bytes).clamp(5, 200);
    let mut best = f64::INFINITY;
    let mut sink = 0.0f32;
    for _ in 0..=reps {
        let t = Instant::now();
        sink += data.par_chunks(1 << 14).map(simd::sum_sq).sum::<f32>();
        best = best.min(t.elapsed().as_secs_f64());
    }
    assert!(sink > 0.0);
    (data.len() * 4) as f64 / best / 1e9
}

/// One warm-up generation, then a timed prefill and `new` single-token greedy steps;
/// returns (prefill seconds, decode tokens/s).
fn decode_run(
    model: &mut TransformerLm,
    prompt: &[u32],
    new: usize,
) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    model.generate(prompt, 8.min(new), &mut Sampler::greedy())?;
    let mut decoder = model.decoder();
    let t = Instant::now();
    decoder.feed(prompt)?;
    let prefill = t.elapsed().as_secs_f64();
    let mut greedy = Sampler::greedy();
    let t = Instant::now();
    for _ in 0..new {
        decoder.next(&mut greedy)?;
    }
    Ok((prefill, new as f64 / t.elapsed().as_secs_f64()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<usize> = words.iter().filter_map(|a| a.parse().ok()).collect();
    let prompt_len = args.first().copied().unwrap_or(16).max(1);
    let new_tokens = args.get(1).copied().unwrap_or(128).max(1);
    // `readme`: the README's 38.9M configuration, where the bytes outweigh the ~90 calls
    // of a step; by default the training benchmark's 5.3M one.
    let large = words.iter().any(|w| w == "readme");
    let (vocab, d_model, layers, q_heads, kv_heads, head_dim, d_ff) = if large {
        (32_000, 512, 8, 8, 2, 64, 1408)
    } else {
        (4096, 256, 6, 8, 2, 32, 704)
    };
    let shape = || {
        TransformerLm::builder()
            .vocab_size(vocab)
            .d_model(d_model)
            .n_layers(layers)
            .heads(q_heads, kv_heads, head_dim)
            .d_ff(d_ff)
            .max_seq_len(prompt_len + new_tokens + 1)
            .seed(0)
    };
    let mut model = shape().build()?;
    let config = model.config().clone();
    let mut rng = Rng::new(3);
    let prompt: Vec<u32> = (0..prompt_len).map(|_| rng.below(vocab as u64) as u32).collect();

    let (prefill, tps) = decode_run(&mut model, &prompt, new_tokens)?;
    let mut q8 = shape().build()?;
    q8.quantize()?;
    let (_, tps_q8) = decode_run(&mut q8, &prompt, new_tokens)?;
    // The mixture of experts with the same active size (8 experts of width d_ff / 2, top-2):
    // a token reads its two experts' weights, the router and everything else.
    let mut moe = shape().experts(8, 2).expert_d_ff(d_ff / 2).build()?;
    moe.quantize()?;
    let (_, tps_moe) = decode_run(&mut moe, &prompt, new_tokens)?;
    let moe_counts = moe.parameter_counts();

    // Bytes per decoded token: every weight once (the tied embedding is read as the head)
    // plus the keys and values of the positions so far (their mean over the run).
    let weights = model.parameter_counts().total as f64 * 4.0;
    let mean_pos = prompt_len as f64 + new_tokens as f64 / 2.0;
    let kv = 2.0 * config.n_layers as f64 * mean_pos * config.kv_dim() as f64 * 4.0;
    let per_token = weights + kv;
    // Q8: one byte a weight plus a 4-byte scale a row (norms stay f32, negligible).
    let per_token_q8 = weights / 4.0 + kv;
    // The bound that matters is the read bandwidth at each working set's size (the weights
    // may sit in the last-level cache); DRAM's is printed beside it.
    let bw = read_bandwidth_gb_s(per_token as usize);
    let bw_q8 = read_bandwidth_gb_s(per_token_q8 as usize);
    let dram = read_bandwidth_gb_s(512 << 20);

    let python = std::env::var("RB_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = std::env::var("RB_TORCH_LM").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/bench/torch_lm.py").to_string()
    });
    let threads = rayon::current_num_threads();
    let torch = Command::new(&python)
        .args([
            &script,
            "--decode",
            &new_tokens.to_string(),
            "--steps",
            "1",
            "--batch",
            "1",
            "--seq",
            "16",
        ])
        .args(["--threads", &threads.to_string()])
        .args(["--vocab", &vocab.to_string(), "--d-model", &d_model.to_string()])
        .args(["--layers", &layers.to_string(), "--heads", &q_heads.to_string()])
        .args([
            "--kv-heads",
            &kv_heads.to_string(),
            "--head-dim",
            &head_dim.to_string(),
        ])
        .args(["--d-ff", &d_ff.to_string()])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            let line = String::from_utf8_lossy(&o.stdout).lines().last()?.to_string();
            let v: serde_json::Value = serde_json::from_str(&line).ok()?;
            Some((
                v["decode_tokens_per_s"].as_f64()?,
                v["framework"].as_str()?.to_string(),
            ))
        });

    println!(
        "bench_decode: {}; prompt {prompt_len}, {new_tokens} new tokens, batch 1, greedy, {threads} threads",
        model.parameter_counts()
    );
    println!(
        "prefill {:.1} ms ({:.0} tokens/s)",
        prefill * 1e3,
        prompt_len as f64 / prefill
    );
    println!(
        "{:<28} {:>10} {:>14} {:>12} {:>9}",
        "", "tokens/s", "MB read/token", "GB/s", "of peak"
    );
    println!(
        "{:<28} {:>10.1} {:>14.2} {:>12.1} {:>8.0}%",
        "rusting_brain (cpu, f32)",
        tps,
        per_token / 1e6,
        tps * per_token / 1e9,
        100.0 * tps * per_token / 1e9 / bw
    );
    println!(
        "{:<28} {:>10.1} {:>14.2} {:>12.1} {:>8.0}%   ({:.2}x f32)",
        "rusting_brain (cpu, q8)",
        tps_q8,
        per_token_q8 / 1e6,
        tps_q8 * per_token_q8 / 1e9,
        100.0 * tps_q8 * per_token_q8 / 1e9 / bw_q8,
        tps_q8 / tps
    );
    let per_token_moe = moe_counts.active as f64 + kv;
    println!(
        "{:<28} {:>10.1} {:>14.2} {:>12.1} {:>8.0}%   ({} experts, int8)",
        "rusting_brain moe (cpu, q8)",
        tps_moe,
        per_token_moe / 1e6,
        tps_moe * per_token_moe / 1e9,
        100.0 * tps_moe * per_token_moe / 1e9 / bw_q8,
        moe_counts
    );
    #[cfg(feature = "gpu")]
    if words.iter().any(|w| w == "gpu") {
        gpu_row(&shape, &prompt, new_tokens, per_token_q8, tps_q8)?;
    }
    #[cfg(not(feature = "gpu"))]
    if words.iter().any(|w| w == "gpu") {
        println!("gpu: this build has no GPU support; run with --features gpu");
    }
    println!(
        "measured read bandwidth (\"of peak\" is against the row's working set): {bw:.1} GB/s over {:.0} MB (f32), {bw_q8:.1} GB/s over {:.0} MB (int8), {dram:.1} GB/s over 512 MiB",
        per_token / 1e6,
        per_token_q8 / 1e6
    );
    match torch {
        Some((t, name)) => println!(
            "{name} eager decode: {t:.1} tokens/s; ratio rusting_brain / PyTorch {:.2}x",
            tps / t
        ),
        None => println!("PyTorch: not run ({python} {script} failed; set RB_PYTHON / RB_TORCH_LM)"),
    }

    // Where a decode step goes, f32 and Q8: the same model through a timing wrapper.
    for quantized in [false, true] {
        breakdown(&config, &prompt, new_tokens, quantized)?;
    }
    Ok(())
}

fn breakdown(
    config: &TransformerConfig,
    prompt: &[u32],
    new_tokens: usize,
    quantized: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut pm = TransformerModel::new(Profiled::new(CpuBackend::new()), config.clone(), 0)?;
    if quantized {
        pm.quantize()?;
    }
    let mut cache = pm.new_kv_caches()?;
    let mut logits = pm.forward_cached(prompt, &mut cache)?;
    pm.backend.reset();
    let steps = new_tokens.min(config.max_seq_len - prompt.len());
    let t = Instant::now();
    for _ in 0..steps {
        let next = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i as u32);
        logits = pm.forward_cached(&[next], &mut cache)?;
    }
    let wall = t.elapsed().as_secs_f64() / steps as f64;
    println!(
        "\nper {} decode step, by primitive ({steps} steps, {:.1} us a step):",
        if quantized { "Q8" } else { "f32" },
        wall * 1e6
    );
    print!("{}", pm.backend.breakdown(steps, wall, true));
    Ok(())
}

/// The int8 model on the default adapter (`RB_GPU_SOFTWARE=1` asks for the fallback one):
/// tokens/s, bytes per token, and the fraction of the adapter's copy bandwidth measured
/// over a buffer of the int8 working set's size in the same run.
#[cfg(feature = "gpu")]
fn gpu_row(
    shape: &dyn Fn() -> rusting_brain::TransformerLmBuilder,
    prompt: &[u32],
    new_tokens: usize,
    per_token_q8: f64,
    tps_cpu_q8: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut m = shape().build()?;
    m.quantize()?;
    m.to_gpu_with(&rusting_brain::GpuOptions {
        software: std::env::var("RB_GPU_SOFTWARE").as_deref() == Ok("1"),
        high_performance: true,
        ..Default::default()
    })?;
    let (_, tps) = decode_run(&mut m, prompt, new_tokens)?;
    // What one step asks of the device, counted over a second decode of the same length
    // from its third token on (the first two make the single-row pass's buffers).
    let mut decoder = m.decoder();
    decoder.feed(prompt)?;
    let mut greedy = Sampler::greedy();
    decoder.next(&mut greedy)?;
    decoder.next(&mut greedy)?;
    let before = decoder.model().gpu_counters().unwrap_or_default();
    for _ in 2..new_tokens {
        decoder.next(&mut greedy)?;
    }
    let steps = new_tokens.saturating_sub(2).max(1) as f64;
    let per = decoder.model().gpu_counters().unwrap_or_default() - before;
    drop(decoder);
    let bw = m.device_bandwidth(per_token_q8 as usize)?.unwrap_or(f64::NAN);
    println!(
        "{:<28} {:>10.1} {:>14.2} {:>12.1} {:>8.0}%   ({:.2}x cpu q8; {}, copy bandwidth {bw:.1} GB/s)",
        "rusting_brain (gpu, q8)",
        tps,
        per_token_q8 / 1e6,
        tps * per_token_q8 / 1e9,
        100.0 * tps * per_token_q8 / 1e9 / bw,
        tps / tps_cpu_q8,
        m.device().unwrap_or_default()
    );
    println!(
        "  per token on the device: {:.1} dispatches, {:.2} submits, {:.2} buffers and {:.2} bind groups created",
        per.dispatches as f64 / steps,
        per.submits as f64 / steps,
        per.buffers as f64 / steps,
        per.bind_groups as f64 / steps,
    );
    Ok(())
}
