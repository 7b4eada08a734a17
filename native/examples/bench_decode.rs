//! Decode throughput at batch 1 (greedy, KV-cached) next to PyTorch, with the bytes each
//! token reads and the share of this machine's measured read bandwidth that is.
//!
//!     cargo run --release -p rusting_brain --example bench_decode -- [PROMPT_LEN] [NEW_TOKENS] [readme]
//!
//! Shape: the training benchmark's (d_model 256, 6 layers, heads 8/2/32, d_ff 704, vocab
//! 4096), or with `readme` the README's 38.9M model (d_model 512, 8 layers, heads 8/2/64,
//! d_ff 1408, vocab 32000). Rows: f32, int8, and int8 mixture of experts with the same
//! active size; the int8 decode repeated five times for its spread; prompt processing
//! (prefill) at 16, 128 and 512 tokens; then where a Q8 step's time goes and where a
//! 128-token prefill's does (`RB_PREFILL_TOKENS=16` for another length); last, the int8
//! checkpoint loaded and decoded by a fresh process, its peak resident memory beside the
//! bytes the model counts (int8 weights and scales, f32 norms, the KV cache).
//!
//! With `--from-pretrained DIR [--gguf FILE] [--precision q8|q4]`, a published model's
//! folder beside llama.cpp on the GGUF of the same weights, and decode steps over 1..16
//! sequences at once beside `llama-batched-bench` (`--batched`: that table alone).
//!
//! Beside it in the same run:
//! - PyTorch eager, f32 and with dynamic int8 `Linear`s: `bench/torch_lm.py` (or
//!   `$RB_TORCH_LM`) through `$RB_PYTHON`; its decode prompt is 16 tokens whatever
//!   PROMPT_LEN is.
//! - llama.cpp: `llama-bench -p 16,128,512 -n NEW_TOKENS` on a Q8_0 GGUF of a random Llama
//!   of the same shape and the same thread count, from `$RB_LLAMA_DIR` (default
//!   `/var/tmp/rb-llama`), which `bench/setup_llama_cpp.sh` fills.

use std::process::Command;
use std::time::Instant;

#[path = "common/bench.rs"]
mod common;
#[path = "common/rss.rs"]
mod rss;

use rayon::prelude::*;
use rusting_brain::core::models::transformer::{QuantFormat, TransformerConfig, TransformerModel};
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
    model: &mut TransformerLm, prompt: &[u32], new: usize,
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

/// Prompt processing: tokens/s of feeding `len` tokens into an empty cache, best of 3
/// after a warm-up.
fn prefill_rate(
    model: &mut TransformerLm, len: usize, vocab: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut rng = Rng::new(11);
    let prompt: Vec<u32> = (0..len).map(|_| rng.below(vocab as u64) as u32).collect();
    let mut best = f64::INFINITY;
    for _ in 0..4 {
        let mut decoder = model.decoder();
        let t = Instant::now();
        decoder.feed(&prompt)?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(len as f64 / best)
}

/// llama.cpp's `llama-bench` at the same shape and threads: `(test, tokens/s, stddev)` for
/// `pp16`, `pp128`, `pp512` and `tgN`, or why it did not run.
fn llama_cpp(large: bool, threads: usize, new: usize) -> Result<Vec<(String, f64, f64)>, String> {
    let dir = std::env::var("RB_LLAMA_DIR").unwrap_or_else(|_| "/var/tmp/rb-llama".into());
    llama_bench(&format!("{dir}/{}-q8_0.gguf", if large { "readme" } else { "small" }), threads, new)
}

/// `llama-bench` on `gguf` (pp16, pp128, pp512 and tgN at `threads`), as [`llama_cpp`].
fn llama_bench(gguf: &str, threads: usize, new: usize) -> Result<Vec<(String, f64, f64)>, String> {
    let dir = std::env::var("RB_LLAMA_DIR").unwrap_or_else(|_| "/var/tmp/rb-llama".into());
    let bin = format!("{dir}/build/bin/llama-bench");
    let gguf = gguf.to_string();
    for f in [&bin, &gguf] {
        if !std::path::Path::new(f).exists() {
            return Err(format!("{f} is missing; run bench/setup_llama_cpp.sh"));
        }
    }
    let out = Command::new(&bin)
        .args(["-m", &gguf, "-t", &threads.to_string(), "-p", "16,128,512"])
        .args(["-n", &new.to_string(), "-r", "5", "-o", "json"])
        .output()
        .map_err(|e| format!("{bin}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{bin} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let runs: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("llama-bench's JSON: {e}"))?;
    let rows = runs
        .as_array()
        .ok_or("llama-bench's JSON is not a list")?
        .iter()
        .filter_map(|r| {
            let (p, g) = (r["n_prompt"].as_u64()?, r["n_gen"].as_u64()?);
            let test = if g == 0 { format!("pp{p}") } else { format!("tg{g}") };
            Some((test, r["avg_ts"].as_f64()?, r["stddev_ts"].as_f64().unwrap_or(0.0)))
        })
        .collect::<Vec<_>>();
    if rows.is_empty() {
        return Err("llama-bench printed no results".into());
    }
    Ok(rows)
}

/// Prompt lengths of the prefill rows, as llama-bench's `-p 16,128,512`.
const PREFILL: &[usize] = &[16, 128, 512];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let words: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = words.iter().position(|w| w == "--decode-memory") {
        return decode_memory(&words[at + 1..]);
    }
    let args: Vec<usize> = words.iter().filter_map(|a| a.parse().ok()).collect();
    let prompt_len = args.first().copied().unwrap_or(16).max(1);
    let new_tokens = args.get(1).copied().unwrap_or(128).max(1);
    if let Some(at) = words.iter().position(|w| w == "--from-pretrained") {
        let dir = words.get(at + 1).ok_or("--from-pretrained needs a model folder")?;
        let gguf = words.iter().position(|w| w == "--gguf").and_then(|i| words.get(i + 1));
        let precision = match words.iter().position(|w| w == "--precision").and_then(|i| words.get(i + 1)) {
            None => rusting_brain::Precision::Q8,
            Some(p) if p == "q8" => rusting_brain::Precision::Q8,
            Some(p) if p == "q4" => rusting_brain::Precision::Q4,
            Some(p) => return Err(format!("--precision {p}: q8 or q4").into()),
        };
        if words.iter().any(|w| w == "--batched") {
            // The steps over several sequences alone.
            let mut model = TransformerLm::from_pretrained_at(dir, precision)?;
            println!("{} at commit {}, {dir} at {precision:?}", common::cpu_model(), common::commit());
            batched_steps(&mut model, gguf.map(String::as_str), rayon::current_num_threads())?;
            if std::env::var("RB_BREAKDOWN").is_ok() {
                breakdown(model.config(), &[1; 16], 32, precision.format())?;
            }
            return Ok(());
        }
        return real_model(dir, gguf.map(String::as_str), precision, prompt_len, new_tokens);
    }
    // `readme`: the README's 38.9M configuration, where the bytes outweigh the ~90 calls
    // of a step; by default the training benchmark's 5.3M one.
    let large = words.iter().any(|w| w == "readme");
    let (vocab, d_model, layers, q_heads, kv_heads, head_dim, d_ff) =
        if large { (32_000, 512, 8, 8, 2, 64, 1408) } else { (4096, 256, 6, 8, 2, 32, 704) };
    // Room for the longest prefill measured.
    let max_seq = (prompt_len + new_tokens).max(PREFILL[PREFILL.len() - 1]) + 1;
    let shape = || {
        TransformerLm::builder()
            .vocab_size(vocab)
            .d_model(d_model)
            .n_layers(layers)
            .heads(q_heads, kv_heads, head_dim)
            .d_ff(d_ff)
            .max_seq_len(max_seq)
            .seed(0)
    };
    let mut model = shape().build()?;
    let config = model.config().clone();
    let mut rng = Rng::new(3);
    let prompt: Vec<u32> = (0..prompt_len).map(|_| rng.below(vocab as u64) as u32).collect();

    let (prefill, tps) = decode_run(&mut model, &prompt, new_tokens)?;
    let mut q8 = shape().build()?;
    q8.quantize()?;
    // Five runs of the int8 decode: the median is the row's figure, the spread is reported.
    let mut q8_runs = Vec::new();
    for _ in 0..5 {
        q8_runs.push(decode_run(&mut q8, &prompt, new_tokens)?.1);
    }
    q8_runs.sort_by(f64::total_cmp);
    let tps_q8 = q8_runs[2];
    let mut prefills = Vec::new();
    for &len in PREFILL {
        prefills.push((len, prefill_rate(&mut model, len, vocab)?, prefill_rate(&mut q8, len, vocab)?));
    }
    // The mixture of experts with the same active size (8 experts of width d_ff / 2, top-2):
    // a token reads its two experts' weights, the router and everything else.
    let mut moe = shape().experts(8, 2).expert_d_ff(d_ff / 2).build()?;
    moe.quantize()?;
    let (_, tps_moe) = decode_run(&mut moe, &prompt, new_tokens)?;
    let moe_counts = moe.parameter_counts();
    drop(moe);

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

    let python = common::python();
    let script = std::env::var("RB_TORCH_LM")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/torch_lm.py").to_string());
    let threads = rayon::current_num_threads();
    let torch_shape: Vec<String> = [
        ("--threads", threads),
        ("--vocab", vocab),
        ("--d-model", d_model),
        ("--layers", layers),
        ("--heads", q_heads),
        ("--kv-heads", kv_heads),
        ("--head-dim", head_dim),
        ("--d-ff", d_ff),
        ("--decode", new_tokens),
        ("--steps", 0),
    ]
    .iter()
    .flat_map(|(k, v)| [k.to_string(), v.to_string()])
    .collect();
    let lengths = PREFILL.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(",");
    let torch_args = |extra: &[&str]| {
        let mut args = torch_shape.clone();
        args.extend(["--prefill", &lengths].iter().chain(extra).map(|s| s.to_string()));
        args
    };
    let torch = common::python_json(&python, &script, &torch_args(&[]));
    let torch_int8 = common::python_json(&python, &script, &torch_args(&["--int8"]));
    let llama = llama_cpp(large, threads, new_tokens);

    println!(
        "bench_decode: {}; prompt {prompt_len}, {new_tokens} new tokens, batch 1, greedy, {threads} threads",
        model.parameter_counts()
    );
    println!("{} at commit {}", common::cpu_model(), common::commit());
    println!(
        "f32 prefill of the {prompt_len}-token prompt {:.1} ms ({:.0} tokens/s)",
        prefill * 1e3,
        prompt_len as f64 / prefill
    );
    println!("{:<28} {:>10} {:>14} {:>12} {:>9}", "", "tokens/s", "MB read/token", "GB/s", "of peak");
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
    println!(
        "q8 decode over 5 runs: {:.1} .. {:.1} tokens/s (median {:.1}; spread {:.0}% of the best)",
        q8_runs[0],
        q8_runs[4],
        q8_runs[2],
        100.0 * (q8_runs[4] - q8_runs[0]) / q8_runs[4]
    );
    let torch_rate = |v: &Option<serde_json::Value>, key: &str| v.as_ref().and_then(|v| v[key].as_f64());
    match &torch {
        Some(v) => println!(
            "{} eager decode: {:.1} tokens/s f32, {} int8 (dynamic); ratio rusting_brain f32 / PyTorch f32 {:.2}x",
            v["framework"].as_str().unwrap_or("torch"),
            torch_rate(&torch, "decode_tokens_per_s").unwrap_or(f64::NAN),
            torch_rate(&torch_int8, "decode_tokens_per_s")
                .map_or("not run".to_string(), |t| format!("{t:.1} tokens/s")),
            tps / torch_rate(&torch, "decode_tokens_per_s").unwrap_or(f64::NAN)
        ),
        None => println!("PyTorch: not run ({python} {script} failed; set RB_PYTHON / RB_TORCH_LM)"),
    }

    // Prompt processing and decode beside llama.cpp and PyTorch, tokens/s.
    let llama_rate = |test: &str| {
        llama.as_ref().ok().and_then(|rows| rows.iter().find(|r| r.0 == test)).map(|r| (r.1, r.2))
    };
    println!(
        "\n{:<8} {:>10} {:>10} {:>14} {:>12} {:>14} {:>12}",
        "test", "ours f32", "ours q8", "llama.cpp q8", "q8 / llama", "torch int8", "torch f32"
    );
    let cell = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let mut rows: Vec<(String, f64, f64)> =
        prefills.iter().map(|&(len, f, q)| (format!("pp{len}"), f, q)).collect();
    rows.push((format!("tg{new_tokens}"), tps, tps_q8));
    for (test, f, q) in &rows {
        let llama = llama_rate(test);
        let key = match test.strip_prefix("pp") {
            Some(len) => format!("prefill{len}_tokens_per_s"),
            None => "decode_tokens_per_s".to_string(),
        };
        println!(
            "{test:<8} {f:>10.1} {q:>10.1} {:>14} {:>12} {:>14} {:>12}",
            llama.map_or("-".to_string(), |(v, sd)| format!("{v:.1}±{sd:.0}")),
            llama.map_or("-".to_string(), |(v, _)| format!("{:.2}x", q / v)),
            cell(torch_rate(&torch_int8, &key)),
            cell(torch_rate(&torch, &key)),
        );
    }
    if let Err(why) = &llama {
        println!("llama.cpp: not run ({why})");
    }
    println!("(tg: our q8 is the median of 5 runs, llama.cpp's the mean of its 5; the decode prompt is {prompt_len} tokens, PyTorch's 16)");

    // Where a decode step goes, f32 and Q8: the same model through a timing wrapper.
    for format in [None, Some(QuantFormat::Q8)] {
        breakdown(&config, &prompt, new_tokens, format)?;
    }

    // Memory: the int8 checkpoint decoded by a fresh process, which holds nothing else.
    let file = std::env::temp_dir().join(format!("rb_bench_decode_{}.rbw", std::process::id()));
    q8.save_bin(&file, rusting_brain::Precision::Q8)?;
    let child = Command::new(std::env::current_exe()?)
        .arg("--decode-memory")
        .arg(&file)
        .args([prompt_len.to_string(), new_tokens.to_string()])
        .output();
    let _ = std::fs::remove_file(&file);
    let child = child?;
    let line = String::from_utf8_lossy(&child.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim()).map_err(|e| {
        format!("the memory run printed {line:?} ({e}); stderr: {}", String::from_utf8_lossy(&child.stderr))
    })?;
    let f = |key: &str| v[key].as_f64().unwrap_or(f64::NAN);
    let mib = |key: &str| f(key) / (1 << 20) as f64;
    println!(
        "\ndecode memory, the int8 file loaded and decoded by a fresh process (prompt {prompt_len} + {new_tokens} tokens), MiB:"
    );
    println!(
        "  counted: weights {:.1} (int8 matrices, their scales, f32 norms), KV cache {:.1} ({} positions)",
        mib("weight_bytes"),
        mib("kv_bytes"),
        config.max_seq_len
    );
    println!(
        "  heap: {:.1} held after loading ({:.2}x the weights; the load's own peak {:.1}, file bytes and model at once), {:.1} more while decoding ({:.2}x the KV cache)",
        mib("held_heap"),
        f("held_heap") / f("weight_bytes"),
        mib("load_heap"),
        mib("decode_heap"),
        f("decode_heap") / f("kv_bytes")
    );
    let resident = f("peak_rss_mib") - f("start_rss_mib");
    println!(
        "  resident: peak {resident:.1} above the {:.1} before loading, {:.2}x weights + KV cache",
        f("start_rss_mib"),
        resident / (mib("weight_bytes") + mib("kv_bytes"))
    );
    Ok(())
}

/// The memory row's child process: loads the int8 checkpoint at `args[0]`, decodes
/// `args[2]` tokens after a prompt of `args[1]`, and prints one JSON line: resident memory
/// before loading and at its peak (MiB); from the counting allocator (bytes), the load's
/// heap peak, the heap the loaded model holds and the most decoding adds; and the bytes
/// the model counts.
fn decode_memory(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let file = args.first().ok_or("--decode-memory FILE PROMPT_LEN NEW_TOKENS")?;
    let prompt_len: usize = args.get(1).ok_or("missing PROMPT_LEN")?.parse()?;
    let new_tokens: usize = args.get(2).ok_or("missing NEW_TOKENS")?.parse()?;
    let start = rss::status_mib("VmRSS").ok_or("no /proc/self/status here")?;
    let live = common::live_bytes();
    let (load_heap, model) = common::peak_extra(|| TransformerLm::load_bin(file));
    let mut model = model?;
    let held_heap = common::live_bytes() - live;
    let c = model.config().clone();
    let prompt: Vec<u32> = (0..prompt_len).map(|i| (i * 7 % c.vocab_size) as u32).collect();
    let (decode_heap, ids) =
        common::peak_extra(|| model.generate(&prompt, new_tokens, &mut Sampler::greedy()));
    ids?;
    // One set of caches: n_layers x (keys, values) x max_seq_len x kv_dim f32 values.
    let kv = 2 * c.n_layers * c.max_seq_len * c.kv_dim() * 4;
    let peak = rss::peak_rss_mib().ok_or("no /proc/self/status here")?;
    println!(
        "{{\"start_rss_mib\":{start},\"peak_rss_mib\":{peak},\"load_heap\":{load_heap},\"held_heap\":{held_heap},\"decode_heap\":{decode_heap},\"weight_bytes\":{},\"kv_bytes\":{kv}}}",
        model.weight_bytes()
    );
    Ok(())
}

fn breakdown(
    config: &TransformerConfig, prompt: &[u32], new_tokens: usize, format: Option<QuantFormat>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut pm = TransformerModel::new(Profiled::new(CpuBackend::new()), config.clone(), 0)?;
    let quantized = format.is_some();
    let name = match format {
        None => "f32",
        Some(QuantFormat::Q8) => "Q8",
        Some(QuantFormat::Q8Rows) => "Q8 (one scale a row)",
        Some(QuantFormat::Q4) => "Q4",
    };
    if let Some(f) = format {
        pm.quantize_as(f)?;
    }
    let mut cache = pm.new_kv_caches()?;
    let mut logits = pm.forward_cached(prompt, &mut cache)?;
    pm.backend.reset();
    let steps = new_tokens.min(config.max_seq_len - prompt.len());
    let t = Instant::now();
    for _ in 0..steps {
        let next = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i as u32);
        logits = pm.forward_cached(&[next], &mut cache)?;
    }
    let wall = t.elapsed().as_secs_f64() / steps as f64;
    println!("\nper {name} decode step, by primitive ({steps} steps, {:.1} us a step):", wall * 1e6);
    print!("{}", pm.backend.breakdown(steps, wall, true));
    if quantized {
        // And a prompt of 128 tokens (`RB_PREFILL_TOKENS`) into an empty cache, after one
        // untimed.
        let mut rng = Rng::new(11);
        let tokens = std::env::var("RB_PREFILL_TOKENS").ok().and_then(|v| v.parse().ok()).unwrap_or(128usize);
        let long: Vec<u32> = (0..tokens.clamp(1, config.max_seq_len))
            .map(|_| rng.below(config.vocab_size as u64) as u32)
            .collect();
        pm.forward_cached(&long, &mut pm.new_kv_caches()?)?;
        pm.backend.reset();
        let t = Instant::now();
        pm.forward_cached(&long, &mut pm.new_kv_caches()?)?;
        let wall = t.elapsed().as_secs_f64();
        println!("\n{name} prefill of {} tokens, by primitive ({:.1} ms):", long.len(), wall * 1e3);
        print!("{}", pm.backend.breakdown(1, wall, true));
        // And a step over 16 sequences (a server's step under 16 clients), each after a
        // prompt of its own.
        let b = BATCHES[BATCHES.len() - 1];
        let mut caches = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..b {
            let mut c = pm.new_kv_caches()?;
            let p: Vec<u32> = (0..BATCH_PROMPT).map(|_| rng.below(config.vocab_size as u64) as u32).collect();
            pm.forward_cached(&p, &mut c)?;
            caches.push(c);
            ids.push(rng.below(config.vocab_size as u64) as u32);
        }
        let steps = BATCH_NEW.min(config.max_seq_len - BATCH_PROMPT);
        pm.forward_cached_rows(&ids, &mut caches.iter_mut().collect::<Vec<_>>())?;
        pm.backend.reset();
        let t = Instant::now();
        for _ in 1..steps {
            pm.forward_cached_rows(&ids, &mut caches.iter_mut().collect::<Vec<_>>())?;
        }
        let wall = t.elapsed().as_secs_f64() / (steps - 1) as f64;
        println!("\nper {name} step over {b} sequences, by primitive ({:.1} ms a step):", wall * 1e3);
        print!("{}", pm.backend.breakdown(steps - 1, wall, true));
    }
    Ok(())
}

/// The int8 model on the default adapter (`RB_GPU_SOFTWARE=1` asks for the fallback one):
/// tokens/s, bytes per token, and the fraction of the adapter's copy bandwidth measured
/// over a buffer of the int8 working set's size in the same run.
#[cfg(feature = "gpu")]
fn gpu_row(
    shape: &dyn Fn() -> rusting_brain::TransformerLmBuilder, prompt: &[u32], new_tokens: usize,
    per_token_q8: f64, tps_cpu_q8: f64,
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

/// Sequences decoded together, as a server's steps run them: this many at once.
const BATCHES: &[usize] = &[1, 2, 4, 8, 16];

/// Prompt and new tokens of each sequence in [`batched_steps`] (llama-batched-bench's
/// `-npp` and `-ntg`).
const BATCH_PROMPT: usize = 32;
const BATCH_NEW: usize = 32;

/// Decode steps over several sequences at once (`forward_cached_rows`, what the server's
/// continuous batching runs a step): each of `b` sequences gets a different 32-token
/// prompt, then 32 greedy steps of all `b` together are timed (the best of 5 rounds);
/// beside llama.cpp's `llama-batched-bench` on the GGUF at the same threads (its `S_TG`,
/// `-npp 32 -ntg 32`, one run).
fn batched_steps(
    model: &mut TransformerLm, gguf: Option<&str>, threads: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let vocab = model.config().vocab_size;
    // `RB_BATCHES=16` (a comma list) for some of the rows.
    let batches: Vec<usize> = match std::env::var("RB_BATCHES") {
        Ok(v) => v.split(',').filter_map(|b| b.trim().parse().ok()).filter(|&b| b > 0).collect(),
        Err(_) => BATCHES.to_vec(),
    };
    let mut ours = Vec::new();
    for &b in &batches {
        let mut best = f64::INFINITY;
        for round in 0..5 {
            let mut rng = Rng::new(17 + round);
            let mut caches: Vec<_> = (0..b).map(|_| model.new_kv_caches()).collect();
            let mut ids = Vec::with_capacity(b);
            for c in caches.iter_mut() {
                let prompt: Vec<u32> = (0..BATCH_PROMPT).map(|_| rng.below(vocab as u64) as u32).collect();
                let logits = model.forward_cached(&prompt, c)?;
                ids.push(argmax(&logits));
            }
            let t = Instant::now();
            for _ in 0..BATCH_NEW {
                let mut rows: Vec<&mut _> = caches.iter_mut().collect();
                let logits = model.forward_cached_rows(&ids, &mut rows)?;
                ids = logits.chunks(vocab).map(argmax).collect();
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        ours.push((b, best / BATCH_NEW as f64));
    }
    let llama = match gguf {
        Some(g) => llama_batched_bench(g, threads),
        None => Err("no --gguf given".to_string()),
    };
    println!(
        "\ndecode steps over several sequences ({BATCH_PROMPT}-token prompts, {BATCH_NEW} steps; ours the best of 5):"
    );
    println!(
        "{:>9} {:>10} {:>10} {:>12} {:>12} {:>11}",
        "sequences", "ours ms", "ours tok/s", "llama.cpp ms", "llama tok/s", "ours/llama"
    );
    for (b, step) in ours {
        let tps = b as f64 / step;
        match llama.as_ref().ok().and_then(|rows| rows.iter().find(|r| r.0 == b)) {
            Some(&(_, l)) => println!(
                "{b:>9} {:>10.1} {tps:>10.1} {:>12.1} {l:>12.1} {:>10.2}x",
                step * 1e3,
                b as f64 / l * 1e3,
                tps / l
            ),
            None => println!("{b:>9} {:>10.1} {tps:>10.1} {:>12} {:>12} {:>11}", step * 1e3, "-", "-", "-"),
        }
    }
    if let Err(why) = llama {
        println!("llama-batched-bench: not run ({why})");
    }
    Ok(())
}

fn argmax(logits: &[f32]) -> u32 {
    logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i as u32)
}

/// `llama-batched-bench` on `gguf` at `threads`: `(sequences, decode tokens/s)` for each of
/// [`BATCHES`], or why it did not run.
fn llama_batched_bench(gguf: &str, threads: usize) -> Result<Vec<(usize, f64)>, String> {
    let dir = std::env::var("RB_LLAMA_DIR").unwrap_or_else(|_| "/var/tmp/rb-llama".into());
    let bin = format!("{dir}/build/bin/llama-batched-bench");
    for f in [&bin, gguf] {
        if !std::path::Path::new(f).exists() {
            return Err(format!("{f} is missing; run bench/setup_llama_cpp.sh"));
        }
    }
    let npl = BATCHES.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
    let ctx = (BATCHES[BATCHES.len() - 1] * (BATCH_PROMPT + BATCH_NEW)).to_string();
    let out = Command::new(&bin)
        .args(["-m", gguf, "-t", &threads.to_string(), "-c", &ctx, "-b", "2048", "-ub", "512"])
        .args(["-npp", &BATCH_PROMPT.to_string(), "-ntg", &BATCH_NEW.to_string(), "-npl", &npl])
        .args(["--output-format", "jsonl"])
        .output()
        .map_err(|e| format!("{bin}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{bin} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let rows: Vec<(usize, f64)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|r| Some((r["pl"].as_u64()? as usize, r["speed_tg"].as_f64()?)))
        .collect();
    if rows.is_empty() {
        return Err("llama-batched-bench printed no results".into());
    }
    Ok(rows)
}

/// A published model's folder at int8 (`from_pretrained_at(DIR, Q8)`) beside llama.cpp's
/// Q8_0 of the same weights (`--gguf`, e.g. `llama-quantize` of `bench/smollm2_folder.py
/// --f32-gguf`): prompt processing at 16, 128 and 512 tokens and the decode of
/// `new` tokens after a `prompt_len`-token prompt, every row from this run, same threads;
/// then where a decode step's and a 128-token prompt's time goes, by primitive.
fn real_model(
    dir: &str, gguf: Option<&str>, precision: rusting_brain::Precision, prompt_len: usize, new: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut model = TransformerLm::from_pretrained_at(dir, precision)?;
    model.set_max_seq_len(prompt_len.max(PREFILL[PREFILL.len() - 1]) + new + 1)?;
    let vocab = model.config().vocab_size;
    let threads = rayon::current_num_threads();
    let ours_name = format!("ours {precision:?}");
    let theirs_name = match gguf {
        Some(g) => {
            format!("llama.cpp {}", std::path::Path::new(g).file_stem().and_then(|f| f.to_str()).unwrap_or(g))
        }
        None => "llama.cpp".to_string(),
    };
    println!(
        "bench_decode: {dir} at {precision:?} ({:.1} MB of weights), {threads} threads, prompt {prompt_len}, {new} new tokens",
        model.weight_bytes() as f64 / 1e6
    );
    println!("{} at commit {}", common::cpu_model(), common::commit());
    let mut rng = Rng::new(3);
    let prompt: Vec<u32> = (0..prompt_len).map(|_| rng.below(vocab as u64) as u32).collect();
    let mut runs = Vec::new();
    for _ in 0..5 {
        runs.push(decode_run(&mut model, &prompt, new)?.1);
    }
    runs.sort_by(f64::total_cmp);
    let mut ours: Vec<(String, f64)> = Vec::new();
    for &len in PREFILL {
        ours.push((format!("pp{len}"), prefill_rate(&mut model, len, vocab)?));
    }
    ours.push((format!("tg{new}"), runs[2]));
    let llama = match gguf {
        Some(g) => llama_bench(g, threads, new),
        None => Err("no --gguf given".to_string()),
    };
    println!("\n{:<8} {:>12} {:>24} {:>12}", "test", ours_name, theirs_name, "ours/llama");
    for (test, t) in &ours {
        let theirs = llama.as_ref().ok().and_then(|rows| rows.iter().find(|r| &r.0 == test));
        match theirs {
            Some((_, l, sd)) => {
                println!("{test:<8} {t:>12.1} {:>24} {:>11.2}x", format!("{l:.1} ± {sd:.1}"), t / l)
            }
            None => println!("{test:<8} {t:>12.1} {:>24} {:>12}", "-", "-"),
        }
    }
    if let Err(why) = llama {
        println!("llama.cpp: not run ({why})");
    }
    println!("(tg: ours the median of 5 runs, llama.cpp's the mean of its 5)");
    batched_steps(&mut model, gguf, threads)?;
    // Where a step's time goes, on a model of this shape (random weights: the same calls).
    breakdown(model.config(), &prompt, new, precision.format())
}
