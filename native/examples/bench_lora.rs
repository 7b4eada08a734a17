//! LoRA against full fine-tuning at the README's 38.9M shape on the CPU, beside PyTorch +
//! PEFT doing the same: training tokens/s (median of 3 steps after one warm-up step, 4 x 256
//! tokens, AdamW), and memory: the bytes the allocator handed out at the peak (counted by a
//! wrapping global allocator) and the peak RSS, each mode in a process of its own, with the
//! "four weight-sized buffers become one" expectation beside them.
//!
//!     cargo run --release -p rusting_brain --example bench_lora
//!
//! The PyTorch side is `bench/peft_lora_step.py` (transformers' LlamaForCausalLM of the same
//! shape, PEFT rank 16 on the same 7 projections), run with `RB_PYTHON` (default `python3`)
//! at as many threads as this machine has cores; without torch/peft it says so and the
//! table keeps our columns.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Instant;

use rusting_brain::{LoraConfig, Optimizer, TokenBatch, TransformerLm};

struct Counting;
static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; the counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = NOW.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        NOW.fetch_sub(l.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static A: Counting = Counting;

type Error = Box<dyn std::error::Error>;

fn peak_rss_kib() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn model() -> Result<TransformerLm, Error> {
    Ok(TransformerLm::builder()
        .vocab_size(32_000)
        .d_model(512)
        .n_layers(8)
        .heads(8, 2, 64)
        .d_ff(1408)
        .max_seq_len(1024)
        .optimizer(Optimizer::adam(3e-4).betas(0.9, 0.95).weight_decay(0.1))
        .seed(42)
        .build()?)
}

const BATCH: usize = 4;
const SEQ: usize = 256;
const STEPS: usize = 3;

/// One mode in this process: prints `tokens_per_s bytes_peak rss_peak_kib trainable`.
fn run(mode: &str) -> Result<(), Error> {
    let mut m = model()?;
    if mode == "lora" {
        m.add_lora(LoraConfig::new(16).alpha(32.0))?;
    }
    let mut rng = rusting_brain::core::Rng::new(1);
    let rows: Vec<Vec<u32>> =
        (0..BATCH).map(|_| (0..=SEQ).map(|_| rng.below(32_000) as u32).collect()).collect();
    let tb = TokenBatch::new(&rows)?;
    let mut times = Vec::new();
    for i in 0..=STEPS {
        let t = Instant::now();
        m.train_step_batch(&tb)?;
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let tps = (BATCH * SEQ) as f64 / times[times.len() / 2];
    println!("{tps} {} {} {}", PEAK.load(Ordering::Relaxed), peak_rss_kib(), m.trainable_parameters());
    Ok(())
}

/// PyTorch's tokens/s and peak RSS (KiB) for `mode`, or why it did not run.
fn torch(mode: &str, threads: usize) -> Result<(f64, f64), String> {
    let python = std::env::var("RB_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/peft_lora_step.py");
    let out = std::process::Command::new(&python)
        .args([script, "--mode", mode, "--threads", &threads.to_string()])
        .args(["--batch", &BATCH.to_string(), "--seq", &SEQ.to_string(), "--steps", &STEPS.to_string()])
        .output()
        .map_err(|e| format!("{python}: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with('{'));
    let v: serde_json::Value = line.and_then(|l| serde_json::from_str(l).ok()).ok_or_else(|| {
        format!("{python} {script} failed (set RB_PYTHON to a Python with torch, transformers and peft)")
    })?;
    Ok((v["tokens_per_s"].as_f64().unwrap_or(0.0), v["peak_rss_kib"].as_f64().unwrap_or(0.0)))
}

fn main() -> Result<(), Error> {
    if let Some(mode) = std::env::args().nth(1) {
        return run(&mode);
    }
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let total = model()?.parameter_counts().total;
    println!(
        "bench_lora on {cpu} ({threads} threads): README 38.9M shape, AdamW steps of {BATCH} x {SEQ} tokens, f32"
    );
    let exe = std::env::current_exe()?;
    let mut got = Vec::new();
    for mode in ["full", "lora"] {
        let out = std::process::Command::new(&exe).arg(mode).output()?;
        if !out.status.success() {
            return Err(format!("{mode}: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        let v: Vec<f64> =
            String::from_utf8(out.stdout)?.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        got.push((mode, v[0], v[1] as usize, v[2] as usize, v[3] as usize, torch(mode, threads)));
    }
    let mib = |b: f64| b / (1u64 << 20) as f64;
    println!(
        "{:<24} {:>10} {:>10} {:>7} {:>11} {:>10} {:>10} {:>10}",
        "mode", "tokens/s", "PyTorch", "ratio", "alloc MiB", "RSS MiB", "PT RSS", "trainable"
    );
    for (mode, tps, bytes, rss, trainable, pt) in &got {
        let name = if *mode == "full" { "full fine-tuning" } else { "LoRA r=16, 7 proj." };
        let (pt_tps, pt_rss, ratio) = match pt {
            Ok((t, r)) => (format!("{t:.0}"), format!("{:.0}", r / 1024.0), format!("{:.2}x", tps / t)),
            Err(_) => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "{name:<24} {tps:>10.0} {pt_tps:>10} {ratio:>7} {:>11.1} {:>10.1} {pt_rss:>10} {trainable:>10}",
            mib(*bytes as f64),
            *rss as f64 / 1024.0
        );
    }
    if let Some((_, _, _, _, _, Err(e))) = got.iter().find(|g| g.5.is_err()) {
        println!("PyTorch: not run: {e}");
    }
    let (full, lora) = (&got[0], &got[1]);
    // The claim: weights, gradients and two moments (4 x 4 bytes per weight) become the
    // weights once plus the adapters four times; activations are the same in both.
    let state_full = 16 * total;
    let state_lora = 4 * total + 16 * lora.4;
    println!(
        "weights+grads+moments: {:.1} MiB -> {:.1} MiB expected ({:.2}x); counted peak {:.2}x, peak RSS {:.2}x (both include the activations of {} tokens); LoRA step {:.2}x the full step's speed",
        mib(state_full as f64),
        mib(state_lora as f64),
        state_full as f64 / state_lora as f64,
        full.2 as f64 / lora.2 as f64,
        full.3 as f64 / lora.3 as f64,
        BATCH * SEQ,
        lora.1 / full.1
    );
    Ok(())
}
