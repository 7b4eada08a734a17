//! How fast `TransformerLm::from_pretrained` reads a Hugging Face directory, against the
//! disk it reads from and against transformers, in one run:
//!
//!     python3 bench/hf_load_model.py /tmp/rb-qwen2-0.5b        # 494M parameters, BF16, 3 shards
//!     cargo run --release -p rusting_brain --example bench_load -- /tmp/rb-qwen2-0.5b
//!
//! Each row loads in a child process of its own, so its peak resident memory (VmHWM) is
//! that load's alone. Before every row the shards are dropped
//! from the page cache (`posix_fadvise(DONTNEED)`), so "cold" rows read the disk; the
//! "warm" rows read the same files again with the pages cached. GB/s is the checkpoint's
//! bytes over the wall time. The model's bytes are what it holds once loaded: 4 per
//! parameter in f32; in int8, 1 per matrix entry plus an f32 scale per row, with norms and
//! biases in f32. The transformers row (`AutoModelForCausalLM.from_pretrained(dir,
//! dtype=float32)`) runs when `RB_PYTHON` (default `python3`) imports transformers.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rusting_brain::core::models::transformer::TensorKind;
use rusting_brain::{Precision, TransformerLm};

type Error = Box<dyn std::error::Error + Send + Sync>;

fn shards(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    out.sort();
    if out.is_empty() {
        return Err(format!("{}: no .safetensors files", dir.display()).into());
    }
    Ok(out)
}

/// Asks the kernel to drop the files' cached pages (they are clean, so it can).
fn evict(files: &[PathBuf]) -> Result<(), Error> {
    for f in files {
        let file = std::fs::File::open(f)?;
        file.sync_all()?;
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor for the call's duration; the advice only affects the
        // page cache.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(format!("posix_fadvise on {}: error {rc}", f.display()).into());
        }
    }
    Ok(())
}

/// Reads the files start to end in 16 MiB pieces; returns seconds.
fn read_all(files: &[PathBuf]) -> Result<f64, Error> {
    let mut buf = vec![0u8; 16 << 20];
    let t = Instant::now();
    for f in files {
        let mut file = std::fs::File::open(f)?;
        while file.read(&mut buf)? > 0 {}
    }
    Ok(t.elapsed().as_secs_f64())
}

fn status_kb(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1).map(|m| m.trim().to_string()))
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The child: one load, then a JSON line with its seconds, peak RSS and the model's bytes.
fn child(mode: &str, dir: &Path) -> Result<(), Error> {
    let t = Instant::now();
    let model = match mode {
        "f32" => TransformerLm::from_pretrained(dir)?,
        _ => TransformerLm::from_pretrained_at(dir, Precision::Q8)?,
    };
    let secs = t.elapsed().as_secs_f64();
    let mut bytes = 0usize;
    for (_, t) in model.config().layout().into_named() {
        bytes += match (mode, t.kind) {
            ("q8", TensorKind::Matrix) => t.len() + 4 * t.rows_cols().0,
            _ => 4 * t.len(),
        };
    }
    println!(
        "{{\"seconds\":{secs},\"peak_rss\":{},\"model_bytes\":{bytes},\"parameters\":{}}}",
        status_kb("VmHWM:") * 1024,
        model.parameter_counts().total
    );
    Ok(())
}

struct Row {
    seconds: f64,
    peak_rss: f64,
    model_bytes: f64,
}

fn parse_row(out: &std::process::Output, what: &str) -> Result<Row, Error> {
    if !out.status.success() {
        return Err(format!("{what} failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
    let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| format!("{what}: `{line}`: {e}"))?;
    let num = |k: &str| v[k].as_f64().ok_or_else(|| format!("{what}: no {k} in `{line}`"));
    Ok(Row { seconds: num("seconds")?, peak_rss: num("peak_rss")?, model_bytes: num("model_bytes")? })
}

const TRANSFORMERS: &str = r#"
import json, sys, time
import torch, transformers
t = time.time()
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
s = time.time() - t
n = sum(p.numel() for p in m.parameters())
# VmHWM, not ru_maxrss: that carries the high-water mark of the process that started this
# one across fork and exec on Linux.
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps(dict(seconds=s, peak_rss=hwm * 1024, model_bytes=4 * n, version=transformers.__version__)))
"#;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        let (mode, dir) = (args.get(1).ok_or("--child MODE DIR")?, args.get(2).ok_or("--child MODE DIR")?);
        return child(mode, Path::new(dir));
    }
    let dir = PathBuf::from(args.first().ok_or("usage: bench_load DIR (see bench/hf_load_model.py)")?);
    let files = shards(&dir)?;
    let file_bytes: u64 = files.iter().map(|f| f.metadata().map_or(0, |m| m.len())).sum();
    let gb = file_bytes as f64 / 1e9;

    evict(&files)?;
    let cold_read = read_all(&files)?;
    let warm_read = read_all(&files)?;
    let exe = std::env::current_exe()?;
    let mut rows: Vec<(String, Row, bool)> = Vec::new();
    for mode in ["f32", "q8"] {
        for cold in [true, false] {
            if cold {
                evict(&files)?;
            } else {
                // Warm: the pages the previous cold run left, plus a full read to be sure.
                read_all(&files)?;
            }
            let out = Command::new(&exe).args(["--child", mode]).arg(&dir).output()?;
            rows.push((format!("rusting_brain {mode}"), parse_row(&out, mode)?, cold));
        }
    }
    let python = std::env::var("RB_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut torch_note = String::new();
    for cold in [true, false] {
        if cold {
            evict(&files)?;
        } else {
            read_all(&files)?;
        }
        match Command::new(&python).args(["-c", TRANSFORMERS]).arg(&dir).output() {
            Ok(out) if out.status.success() => {
                let line =
                    String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    torch_note = format!("transformers {}", v["version"].as_str().unwrap_or("?"));
                }
                rows.push(("transformers f32".into(), parse_row(&out, "transformers")?, cold));
            }
            _ => {
                torch_note = format!("transformers: not run ({python} cannot import it; set RB_PYTHON)");
                break;
            }
        }
    }

    println!(
        "bench_load: {} ({} files, {:.3} GB on disk); {}; {} threads",
        dir.display(),
        files.len(),
        gb,
        cpu_model(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "disk read: {:.2} GB/s cold (pages dropped), {:.2} GB/s warm (page cache)",
        gb / cold_read,
        gb / warm_read
    );
    println!(
        "{:<20} {:>5} {:>9} {:>8} {:>10} {:>11} {:>12} {:>10}",
        "", "cache", "seconds", "GB/s", "of read", "peak RSS GB", "model GB", "RSS/model"
    );
    for (name, r, cold) in &rows {
        let read = if *cold { cold_read } else { warm_read };
        println!(
            "{:<20} {:>5} {:>9.2} {:>8.2} {:>9.0}% {:>11.2} {:>12.2} {:>10.2}",
            name,
            if *cold { "cold" } else { "warm" },
            r.seconds,
            gb / r.seconds,
            100.0 * read / r.seconds,
            r.peak_rss / 1e9,
            r.model_bytes / 1e9,
            r.peak_rss / r.model_bytes
        );
    }
    println!("{torch_note}");
    Ok(())
}
