//! The process's resident memory from Linux's /proc/self/status, for the benchmarks that
//! set peak memory beside the bytes they count.

#![allow(dead_code)]

/// A `VmXxx:` line of /proc/self/status in MiB (`VmHWM`: the peak resident set; `VmRSS`:
/// the current one), or None where there is no such file.
pub fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The peak resident set so far, in MiB.
pub fn peak_rss_mib() -> Option<f64> {
    status_mib("VmHWM")
}
