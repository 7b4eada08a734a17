//! What the image benchmarks share: best-of-N timing, the machine and commit a table is
//! dated by, and a counting allocator for the memory one call allocates.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Counts live heap bytes and their peak, to measure what one call allocates.
pub struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator unchanged; the counters only observe.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: the caller's layout contract is passed through as is.
        unsafe { System.alloc(l) }
    }
    // Forwarded, not left to the default (alloc, then write zeros): the system's zeroed
    // allocation maps fresh pages that stay out of the resident set until written, which
    // the zero-filling default would touch (an f32 model's zeroed gradients and moments
    // then counted 1.5 GB of resident memory for SmolLM2-135M).
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` above with this layout.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Heap bytes live now.
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The most `f` allocates beyond what is live when it starts, in bytes, and its result.
pub fn peak_extra<T>(f: impl FnOnce() -> T) -> (usize, T) {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (PEAK.load(Ordering::Relaxed) - before, out)
}

/// The best of `reps` timed runs of `f`, after one untimed warm-up, in seconds.
pub fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The CPU's model name from /proc/cpuinfo.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The checkout's short commit hash, with "-dirty" when tracked files differ from it (a
/// figure measured on uncommitted code must not pass for the commit's).
pub fn commit() -> String {
    Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=7"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The Python the PyTorch side runs under: `$RB_PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("RB_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs `python script args..` and reads the last line it prints as JSON; `None` where it
/// could not start, failed, or printed no JSON (the caller prints that the side did not run).
pub fn python_json(python: &str, script: &str, args: &[String]) -> Option<serde_json::Value> {
    let out = Command::new(python).arg(script).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last()?).ok()
}

/// The line that names the PyTorch (and diffusers, where given) a table was measured
/// beside, or why that side did not run.
pub fn print_torch_line(torch: Option<&serde_json::Value>, python: &str, script: &str) {
    match torch {
        Some(t) => {
            let diffusers = t["diffusers"].as_str().map_or(String::new(), |v| format!(", diffusers {v}"));
            println!(
                "PyTorch {}{diffusers} (float32, {} threads)",
                t["version"].as_str().unwrap_or("?"),
                t["threads"]
            )
        }
        None => println!(
            "PyTorch: not run ({python} {script} failed; set RB_PYTHON to a Python with torch and diffusers)"
        ),
    }
}

/// The image benchmarks' PyTorch call: `script --threads T --reps R --cases CASES`.
pub fn torch_cases(
    python: &str, script: &str, threads: usize, reps: usize, cases: &serde_json::Value,
) -> Option<serde_json::Value> {
    let args = [
        "--threads".to_string(),
        threads.to_string(),
        "--reps".to_string(),
        reps.to_string(),
        "--cases".to_string(),
        cases.to_string(),
    ];
    python_json(python, script, &args)
}

/// Our side of one benchmark case: its parameters, f32, mixed-precision and (where timed)
/// `Precision::Q8` + mixed-precision seconds, and the heap's peak in bytes.
pub struct Ours {
    pub params: usize,
    pub f32_s: f64,
    pub bf16_s: f64,
    /// At `Precision::Q8` (int8 matrices, W8A8) in mixed precision: the fastest path.
    pub q8_s: Option<f64>,
    pub peak_bytes: usize,
}

/// One benchmark case's row for [`print_precision_table`]: its name, our side, and
/// PyTorch's run of the case (one process a case).
pub struct PrecisionRow<'a> {
    pub name: &'a str,
    pub ours: &'a Ours,
    pub torch: Option<&'a serde_json::Value>,
}

/// The table's rows: each case's name, our side and PyTorch's run, in order.
pub fn precision_rows<'a>(
    names: impl IntoIterator<Item = &'a str>, ours: &'a [Ours], torch: &'a [Option<serde_json::Value>],
) -> Vec<PrecisionRow<'a>> {
    names
        .into_iter()
        .zip(ours)
        .zip(torch)
        .map(|((name, ours), t)| PrecisionRow { name, ours, torch: t.as_ref() })
        .collect()
}

/// The f32 / mixed-precision table both image benchmarks print: speed-ups are diffusers'
/// time over ours (above 1: ours is faster); our memory is the heap's peak from the weights
/// on (model and steps), PyTorch's its process's peak resident set, the Python runtime and
/// libraries included (about 0.4 GB).
pub fn print_precision_table(first: &str, rows: &[PrecisionRow]) {
    let w = rows.iter().map(|r| r.name.len()).chain([first.len()]).max().unwrap_or(0);
    let line = |c: [&str; 11]| {
        println!(
            "{:<w$} {:>11} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10]
        )
    };
    line([
        first,
        "parameters",
        "ours f32",
        "ours bf16",
        "torch f32",
        "torch bf16",
        "f32",
        "bf16/f32",
        "bf16",
        "ours MB",
        "torch MB",
    ]);
    line(["", "", "ms", "ms", "ms", "autocast", "speed-up", "speed-up", "speed-up", "peak", "peak"]);
    let ms = |t: Option<f64>| t.map_or("-".into(), |t| format!("{:.1}", t * 1e3));
    let ratio = |a: Option<f64>, b: f64| a.map_or("-".into(), |a| format!("{:.2}x", a / b));
    for r in rows {
        let (theirs, theirs16) =
            (r.torch.and_then(|v| v["step"][0].as_f64()), r.torch.and_then(|v| v["step_bf16"][0].as_f64()));
        let rss = r
            .torch
            .and_then(|v| v["peak_mib"][0].as_f64())
            .map_or("-".into(), |m| format!("{:.0}", m * 1.048576));
        line([
            r.name,
            &r.ours.params.to_string(),
            &ms(Some(r.ours.f32_s)),
            &ms(Some(r.ours.bf16_s)),
            &ms(theirs),
            &ms(theirs16),
            &ratio(theirs, r.ours.f32_s),
            &ratio(theirs, r.ours.bf16_s),
            &ratio(theirs16, r.ours.bf16_s),
            &format!("{:.0}", r.ours.peak_bytes as f64 / 1e6),
            &rss,
        ]);
    }
    if rows.iter().all(|r| r.ours.q8_s.is_none()) {
        return;
    }
    // The fastest path: the denoiser's matrices int8 (one scale a row, activation rows
    // rounded to int8: the VNNI GEMM) and the rest in mixed precision.
    println!("\nQ8 + mixed precision (int8 matrices W8A8 and a UNet's convolutions; bf16 attention):");
    println!("{:<w$} {:>9} {:>12} {:>12} {:>12}", first, "ours Q8", "over ours", "over torch", "over torch");
    println!("{:<w$} {:>9} {:>12} {:>12} {:>12}", "", "ms", "bf16", "f32", "bf16");
    for r in rows {
        let Some(q8) = r.ours.q8_s else { continue };
        let (theirs, theirs16) =
            (r.torch.and_then(|v| v["step"][0].as_f64()), r.torch.and_then(|v| v["step_bf16"][0].as_f64()));
        println!(
            "{:<w$} {:>9} {:>12} {:>12} {:>12}",
            r.name,
            ms(Some(q8)),
            ratio(Some(r.ours.bf16_s), q8),
            ratio(theirs, q8),
            ratio(theirs16, q8)
        );
    }
}

/// `weights` with every matrix (`.weight` of two dimensions, as the loaders pick them at
/// `Precision::Q8`), and with `convs` every convolution's weight (a UNet's at Q8), moved
/// into the second map as int8 with one scale a row.
#[allow(clippy::type_complexity)]
pub fn int8_rows(
    weights: std::collections::BTreeMap<String, Vec<f32>>,
    layout: &rusting_brain_core::models::image::blocks::Layout, convs: bool,
) -> (std::collections::BTreeMap<String, Vec<f32>>, std::collections::BTreeMap<String, (Vec<f32>, Vec<f32>)>)
{
    use rayon::prelude::*;
    let shapes: std::collections::HashMap<&str, &[usize]> =
        layout.tensors.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
    let (matrices, rest): (Vec<_>, Vec<_>) = weights.into_iter().partition(|(n, _)| {
        n.ends_with(".weight")
            && shapes.get(n.as_str()).is_some_and(|s| s.len() == 2 || (convs && s.len() == 4))
    });
    let q8 = matrices
        .into_par_iter()
        .map(|(n, w)| {
            let s = shapes[n.as_str()];
            let q = rusting_brain_core::ops::q8::quantize_rows(&w, s[0], s[1..].iter().product())
                .expect("finite weights");
            (n, q)
        })
        .collect();
    (rest.into_iter().collect(), q8)
}
