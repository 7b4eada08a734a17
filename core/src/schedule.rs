//! Learning-rate schedules: a pure function of the step, read each step by the caller.

/// Linear warmup to `peak` over `warmup` steps, then a cosine decay to `floor * peak` at
/// step `total` (and flat after it).
///
/// ```
/// use rusting_brain_core::Schedule;
/// let s = Schedule::warmup_cosine(3e-4, 2_000, 100_000);
/// assert!((s.rate(1_999) - 3e-4).abs() < 1e-10);     // end of warmup: the peak
/// assert!((s.rate(100_000) - 3e-5).abs() < 1e-10);   // the end: a tenth of it
/// assert!(s.floor(0.0).rate(100_000).abs() < 1e-10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// The highest rate, reached at the end of warmup.
    pub peak: f32,
    /// Steps of the linear warmup.
    pub warmup: u64,
    /// Steps in all; the cosine reaches the floor there.
    pub total: u64,
    /// The final rate as a fraction of the peak (default 0.1).
    pub floor: f32,
}

impl Schedule {
    /// Linear warmup to `peak` over `warmup` steps, then a cosine down to a tenth of it at `total`.
    pub fn warmup_cosine(peak: f32, warmup: u64, total: u64) -> Schedule {
        Schedule { peak, warmup, total, floor: 0.1 }
    }
    /// Sets the final rate to `fraction * peak`.
    pub fn floor(mut self, fraction: f32) -> Schedule {
        self.floor = fraction;
        self
    }
    /// The learning rate at `step` (counted from 0). Step `warmup - 1` is the peak.
    pub fn rate(&self, step: u64) -> f32 {
        let peak = self.peak as f64;
        if step < self.warmup {
            return (peak * (step + 1) as f64 / self.warmup as f64) as f32;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = ((step - self.warmup) as f64 / span).min(1.0);
        let low = peak * self.floor as f64;
        (low + (peak - low) * 0.5 * (1.0 + libm::cos(core::f64::consts::PI * progress))) as f32
    }
}
