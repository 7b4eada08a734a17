//! Memory of full fine-tuning against LoRA (rank 16 on every projection) at the README's
//! 38.9M shape on the CPU: the bytes the allocator handed out at the peak (counted by a
//! wrapping global allocator) and the process's peak RSS, each mode in a process of its
//! own, two training steps of 4 x 256 tokens, with the ratios and the "four weight-sized
//! buffers become one" expectation beside them.
//!
//!     cargo run --release -p rusting_brain --example bench_lora_memory

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

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

/// One mode in this process: prints `bytes_peak rss_peak_kib trainable`.
fn run(mode: &str) -> Result<(), Error> {
    let mut m = model()?;
    if mode == "lora" {
        m.add_lora(LoraConfig::new(16).alpha(32.0))?;
    }
    let mut rng = rusting_brain::core::Rng::new(1);
    let rows: Vec<Vec<u32>> = (0..4)
        .map(|_| (0..257).map(|_| rng.below(32_000) as u32).collect())
        .collect();
    let tb = TokenBatch::new(&rows)?;
    for _ in 0..2 {
        m.train_step_batch(&tb)?;
    }
    println!(
        "{} {} {}",
        PEAK.load(Ordering::Relaxed),
        peak_rss_kib(),
        m.trainable_parameters()
    );
    Ok(())
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
    let total = model()?.parameter_counts().total;
    println!("bench_lora_memory on {cpu}: README 38.9M shape, 2 steps of 4 x 256 tokens, f32");
    let exe = std::env::current_exe()?;
    let mut got = Vec::new();
    for mode in ["full", "lora"] {
        let out = std::process::Command::new(&exe).arg(mode).output()?;
        if !out.status.success() {
            return Err(format!("{mode}: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        let v: Vec<usize> = String::from_utf8(out.stdout)?
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        got.push((mode, v[0], v[1], v[2]));
    }
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!(
        "{:<26} {:>14} {:>14} {:>12}",
        "mode", "allocated MiB", "peak RSS MiB", "trainable"
    );
    for (mode, bytes, rss, trainable) in &got {
        let name = if *mode == "full" {
            "full fine-tuning"
        } else {
            "LoRA r=16 (all 7 proj.)"
        };
        println!(
            "{name:<26} {:>14.1} {:>14.1} {:>12}",
            mib(*bytes),
            *rss as f64 / 1024.0,
            trainable
        );
    }
    let (full, lora) = (&got[0], &got[1]);
    // The claim: weights, gradients and two moments (4 x 4 bytes per weight) become the
    // weights once plus the adapters four times; activations are the same in both.
    let state_full = 16 * total;
    let state_lora = 4 * total + 16 * lora.3;
    println!(
        "weights+grads+moments: {:.1} MiB -> {:.1} MiB expected ({:.2}x); counted peak {:.2}x, peak RSS {:.2}x (both include the activations of 4 x 256 tokens)",
        mib(state_full),
        mib(state_lora),
        state_full as f64 / state_lora as f64,
        full.1 as f64 / lora.1 as f64,
        full.2 as f64 / lora.2 as f64
    );
    Ok(())
}
