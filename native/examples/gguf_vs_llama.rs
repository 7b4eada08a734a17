//! Our reading of a GGUF file against llama.cpp's reading of the same file: llama.cpp's
//! `llama-perplexity` runs each file over a text and saves its next-token distributions
//! (`--kl-divergence-base`: the tokens, then per window the second half's log-probabilities
//! in 16 bits); `TransformerLm::from_gguf_at` reads the same file and runs the same tokens,
//! window by window; printed per file and precision: the mean KL divergence from
//! llama.cpp's distributions to ours in nats a token (as `llama-perplexity --kl-divergence`
//! computes it: base probabilities under e^-16 left out), its 99th percentile, how often the
//! top token agrees, and each side's load time (ours: `from_gguf_at`; llama.cpp's: from its
//! start to its model and context being ready) and peak resident memory (ours: the load's,
//! in a process of its own; llama.cpp's: its whole run's).
//!
//! ```text
//! bash bench/setup_llama_cpp.sh      # llama.cpp from the llama-cpp-python sdist, outside the repository
//! RB_LLAMA_DIR=/var/tmp/rb-llama cargo run --release -p rusting_brain --example gguf_vs_llama -- \
//!     TEXT_FILE FILE.gguf [FILE.gguf ...] [--window 512] [--chunks N] [--precisions f32,q8]
//! ```
//!
//! What "ours" computes is what the file holds, decoded exactly (the `gguf` package's
//! bits); llama.cpp multiplies a quantized file's blocks against activations it rounds to
//! 8 bits itself (Q8_0/Q8_K), so the two differ by that rounding, and by float summation
//! order at F32.

#[path = "common/bench.rs"]
mod common;
#[path = "common/rss.rs"]
mod rss;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rusting_brain::cpu::CpuBackend;
use rusting_brain::{Precision, TokenBatch, TransformerLm};

type R<T> = Result<T, Box<dyn std::error::Error>>;

/// llama.cpp's saved distributions: the window, the vocabulary, the tokens of every window
/// and, per window, the scored positions' 16-bit log-probabilities with their scale and
/// minimum (`nv` u16 a row: two f32 then the values).
struct Base {
    window: usize,
    vocab: usize,
    tokens: Vec<u32>,
    rows: Vec<u16>,
    nv: usize,
}

impl Base {
    fn read(path: &Path) -> R<Base> {
        let bytes = std::fs::read(path)?;
        let u32_at = |at: usize| -> R<u32> {
            Ok(u32::from_le_bytes(bytes.get(at..at + 4).ok_or("the logits file ends early")?.try_into()?))
        };
        if bytes.get(..8) != Some(b"_logits_".as_slice()) {
            return Err(format!("{}: not llama-perplexity's logits file", path.display()).into());
        }
        let (window, vocab, chunks) = (u32_at(8)? as usize, u32_at(12)? as usize, u32_at(16)? as usize);
        let tokens: Vec<u32> = (0..window * chunks).map(|i| u32_at(20 + 4 * i)).collect::<R<_>>()?;
        let nv = 2 * vocab.div_ceil(2) + 4;
        let at = 20 + 4 * window * chunks;
        let scored = window - 1 - window / 2;
        let want = chunks * scored * nv * 2;
        let data = bytes.get(at..at + want).ok_or("the logits file ends before its rows")?;
        let rows = data.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        Ok(Base { window, vocab, tokens, rows, nv })
    }

    fn chunks(&self) -> usize {
        self.tokens.len() / self.window
    }

    /// Row `r` of window `c`: its scale, minimum and 16-bit values.
    fn row(&self, c: usize, r: usize) -> (f32, f32, &[u16]) {
        let scored = self.window - 1 - self.window / 2;
        let row = &self.rows[(c * scored + r) * self.nv..(c * scored + r + 1) * self.nv];
        let f = |i: usize| f32::from_bits(row[2 * i] as u32 | (row[2 * i + 1] as u32) << 16);
        (f(0), f(1), &row[4..4 + self.vocab])
    }
}

/// KL(base || ours) of one position as llama.cpp sums it, and whether the top tokens agree.
fn kl(scale: f32, min: f32, base: &[u16], logits: &[f32]) -> (f64, bool) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let sum_exp: f64 = logits.iter().map(|&v| ((v - max) as f64).exp()).sum();
    let lse = max as f64 + sum_exp.ln();
    let (mut sum, mut top_base, mut top_ours) = (0.0f64, (0, f32::NEG_INFINITY), (0, f32::NEG_INFINITY));
    for (i, (&q, &v)) in base.iter().zip(logits).enumerate() {
        let p_log = scale * q as f32 + min;
        if p_log > top_base.1 {
            top_base = (i, p_log);
        }
        if v > top_ours.1 {
            top_ours = (i, v);
        }
        if p_log > -16.0 {
            sum += (p_log as f64).exp() * (p_log as f64 - (v as f64 - lse));
        }
    }
    (sum, top_base.0 == top_ours.0)
}

/// One file at one precision against llama.cpp's saved distributions, in a process of its
/// own so the peak resident memory is this load's: prints `load seconds, peak MiB, mean
/// KL, KL p99, same-top fraction` on one line.
fn child(file: &str, precision: Precision, base_path: &Path) -> R<()> {
    let t = Instant::now();
    let mut model = TransformerLm::from_gguf_at(file, precision)?;
    let load = t.elapsed().as_secs_f64();
    let peak = rss::peak_rss_mib().unwrap_or(f64::NAN);
    let base = Base::read(base_path)?;
    let window = base.window;
    if model.config().max_seq_len < window {
        return Err(format!("{file}: its context is under the window {window}").into());
    }
    model.set_max_seq_len(window)?;
    if model.config().vocab_size != base.vocab {
        return Err(format!(
            "{file}: {} tokens here, {} in llama.cpp's run",
            model.config().vocab_size,
            base.vocab
        )
        .into());
    }
    let (mut kls, mut same) = (Vec::new(), 0usize);
    for c in 0..base.chunks() {
        let ids = &base.tokens[c * window..(c + 1) * window];
        // Inputs the window's first window - 1 tokens, every position's logits.
        let logits = model.forward_batch(&TokenBatch::new([ids.to_vec()])?)?;
        let vocab = base.vocab;
        for (r, pos) in (window / 2..window - 1).enumerate() {
            let (scale, min, row) = base.row(c, r);
            let (k, top) = kl(scale, min, row, &logits[pos * vocab..(pos + 1) * vocab]);
            kls.push(k);
            same += top as usize;
        }
    }
    let mean = kls.iter().sum::<f64>() / kls.len().max(1) as f64;
    kls.sort_by(f64::total_cmp);
    let p99 = kls.get(kls.len() * 99 / 100).copied().unwrap_or(0.0);
    println!("{load} {peak} {mean} {p99} {}", same as f64 / kls.len().max(1) as f64);
    Ok(())
}

fn precision_of(p: &str) -> R<Precision> {
    match p {
        "f32" => Ok(Precision::F32),
        "q8" => Ok(Precision::Q8),
        "q4" => Ok(Precision::Q4),
        other => Err(format!("{other} is not f32, q8 or q4").into()),
    }
}

fn main() -> R<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [mode, file, precision, base] = args.as_slice() {
        if mode == "--child" {
            return child(file, precision_of(precision)?, Path::new(base));
        }
    }
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let mut positional = Vec::new();
    let mut skip = false;
    for a in &args {
        if skip {
            skip = false;
        } else if a.starts_with("--") {
            skip = true;
        } else {
            positional.push(a.clone());
        }
    }
    let [text, files @ ..] = positional.as_slice() else {
        return Err(
            "usage: gguf_vs_llama TEXT_FILE FILE.gguf [FILE.gguf ...] [--window N] [--chunks N]".into()
        );
    };
    let window: usize = flag("--window").map_or(Ok(512), |v| v.parse())?;
    let chunks: Option<usize> = flag("--chunks").map(|v| v.parse()).transpose()?;
    let precisions = flag("--precisions").unwrap_or_else(|| "f32,q8".into());
    let precisions: Vec<&str> = precisions.split(',').collect();
    for p in &precisions {
        precision_of(p)?;
    }
    let dir = PathBuf::from(std::env::var("RB_LLAMA_DIR").unwrap_or_else(|_| "/var/tmp/rb-llama".into()));
    let perplexity = dir.join("build/bin/llama-perplexity");
    if !perplexity.exists() {
        return Err(format!("{} is missing: run bench/setup_llama_cpp.sh", perplexity.display()).into());
    }
    println!("{} ({}), commit {}", common::cpu_model(), CpuBackend::new().isa(), common::commit());
    println!("text {text}, windows of {window} tokens, each window's second half scored\n");
    println!(
        "{:<26} {:<4} {:>11} {:>8} {:>9} {:>10} {:>9} {:>11} {:>9}",
        "file", "ours", "KL (nats)", "KL p99", "same top", "our load", "our peak", "llama load", "llama pk"
    );
    let me = std::env::current_exe()?;
    for file in files {
        let base_path = std::env::temp_dir().join(format!("rb_gguf_vs_llama_{}.kld", std::process::id()));
        let mut cmd = Command::new("/usr/bin/time");
        cmd.arg("-v").arg(&perplexity).arg("-m").arg(file);
        cmd.args(["-f", text, "-c", &window.to_string(), "-b", &window.to_string()]);
        if let Some(n) = chunks {
            cmd.args(["--chunks", &n.to_string()]);
        }
        let out = cmd.arg("--kl-divergence-base").arg(&base_path).output()?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            return Err(format!(
                "llama-perplexity on {file} failed:\n{}",
                &log[log.len().saturating_sub(2000)..]
            )
            .into());
        }
        // llama.cpp's load: the time stamp (minutes.seconds.ms.us since its start) of the
        // line it prints once the model and context are ready; its whole run's peak
        // resident memory (GNU time).
        let llama_load = log
            .lines()
            .find(|l| l.contains("perplexity: tokenizing the input"))
            .and_then(|l| {
                let p: Vec<f64> =
                    l.split_whitespace().next()?.split('.').map(|x| x.parse().ok()).collect::<Option<_>>()?;
                let [m, s, ms, us] = p[..] else { return None };
                Some(60.0 * m + s + ms / 1e3 + us / 1e6)
            })
            .map_or("?".to_string(), |t| format!("{t:.2} s"));
        let llama_mb = log
            .lines()
            .find_map(|l| l.trim().strip_prefix("Maximum resident set size (kbytes):"))
            .and_then(|s| s.trim().parse::<f64>().ok())
            .map_or("?".to_string(), |kb| format!("{:.0} MiB", kb / 1024.0));
        let name = Path::new(file).file_name().map_or(file.clone(), |n| n.to_string_lossy().into_owned());
        for p in &precisions {
            let out = Command::new(&me).arg("--child").arg(file).arg(p).arg(&base_path).output()?;
            let line = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                return Err(format!("{name} at {p}: {}", String::from_utf8_lossy(&out.stderr)).into());
            }
            let v: Vec<f64> = line.split_whitespace().map(|x| x.parse().unwrap_or(f64::NAN)).collect();
            let [load, peak, mean, p99, same] = v[..] else { return Err(format!("{name}: {line}").into()) };
            println!(
                "{name:<26} {p:<4} {mean:>11.6} {p99:>8.4} {:>8.1}% {load:>8.2} s {peak:>5.0} MiB {llama_load:>11} {llama_mb:>9}",
                100.0 * same
            );
        }
        let _ = std::fs::remove_file(&base_path);
    }
    Ok(())
}
