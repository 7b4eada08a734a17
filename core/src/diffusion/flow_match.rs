//! `FlowMatchEulerDiscreteScheduler`: the Euler sampler of the rectified-flow models
//! (FLUX.1, FLUX.2, SD3). The model predicts a velocity `v`; a step is
//! `x <- x + (sigma_next - sigma) v`, from pure noise at sigma 1 down to the image at 0.
//!
//! The schedule is diffusers': N sigmas from 1 down (spaced evenly in the model's own
//! range, or given by the pipeline, as FLUX's `linspace(1, 1/N, N)`), shifted towards the
//! noisy end, statically (`s sigma / (1 + (s - 1) sigma)`, SD3's shift 3) or by an image-size
//! dependent `mu` (`e^mu / (e^mu + 1/sigma - 1)`, FLUX), optionally stretched to end at
//! `shift_terminal`, then a final 0. The arithmetic is done in f64 and rounded to f32 once,
//! where diffusers' numpy rounds each f32 step: the two agree to a few f32 ulps.

use alloc::format;
use alloc::vec::Vec;

use crate::{CoreError, Result};

/// How `mu` shifts the sigmas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeShift {
    /// `e^mu / (e^mu + 1/sigma - 1)` (diffusers' default, FLUX).
    Exponential,
    /// `mu / (mu + 1/sigma - 1)`.
    Linear,
}

/// The scheduler's `scheduler_config.json` keys that shape the schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowMatchConfig {
    /// Training timesteps (1000).
    pub num_train_timesteps: usize,
    /// The static shift (used when `use_dynamic_shifting` is off).
    pub shift: f64,
    /// Shift the sigmas by the image's size (FLUX) instead of `shift`.
    pub use_dynamic_shifting: bool,
    /// The dynamic shift's `mu` at `base_image_seq_len` tokens.
    pub base_shift: f64,
    /// The dynamic shift's `mu` at `max_image_seq_len` tokens.
    pub max_shift: f64,
    /// Tokens where `mu` is `base_shift`.
    pub base_image_seq_len: usize,
    /// Tokens where `mu` is `max_shift`.
    pub max_image_seq_len: usize,
    /// Stretch the shifted sigmas so the last one is this (SD3.5), when given.
    pub shift_terminal: Option<f64>,
    /// The shift's form (exponential or linear in `mu`).
    pub time_shift: TimeShift,
}

impl Default for FlowMatchConfig {
    /// diffusers' defaults.
    fn default() -> Self {
        FlowMatchConfig {
            num_train_timesteps: 1000,
            shift: 1.0,
            use_dynamic_shifting: false,
            base_shift: 0.5,
            max_shift: 1.15,
            base_image_seq_len: 256,
            max_image_seq_len: 4096,
            shift_terminal: None,
            time_shift: TimeShift::Exponential,
        }
    }
}

fn invalid(message: alloc::string::String) -> CoreError {
    CoreError::InvalidArgument { op: "flow-match schedule", message }
}

impl FlowMatchConfig {
    /// Checks the settings, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        if self.num_train_timesteps < 2 {
            return Err(invalid(format!("num_train_timesteps is {}", self.num_train_timesteps)));
        }
        if !(self.shift.is_finite() && self.shift > 0.0) {
            return Err(invalid(format!("shift is {}", self.shift)));
        }
        if self.max_image_seq_len <= self.base_image_seq_len {
            return Err(invalid(format!(
                "max_image_seq_len ({}) must be above base_image_seq_len ({})",
                self.max_image_seq_len, self.base_image_seq_len
            )));
        }
        if let Some(t) = self.shift_terminal {
            if !(t.is_finite() && (0.0..1.0).contains(&t)) {
                return Err(invalid(format!("shift_terminal is {t}; it must be in [0, 1)")));
            }
        }
        Ok(())
    }

    /// The static shift.
    fn shifted(&self, s: f64) -> f64 {
        self.shift * s / (1.0 + (self.shift - 1.0) * s)
    }

    /// FLUX.1's `calculate_shift`: `mu` linear in the packed image tokens, from
    /// `base_shift` at `base_image_seq_len` to `max_shift` at `max_image_seq_len`.
    pub fn flux1_mu(&self, image_seq_len: usize) -> f64 {
        let m =
            (self.max_shift - self.base_shift) / (self.max_image_seq_len - self.base_image_seq_len) as f64;
        let b = self.base_shift - m * self.base_image_seq_len as f64;
        image_seq_len as f64 * m + b
    }

    /// N sigmas (without the final 0) for `steps` steps. `sigmas`: the pipeline's own
    /// (FLUX passes `linspace(1, 1/N, N)`), else evenly spaced between the model's largest
    /// and smallest training sigma. `mu` is required with dynamic shifting.
    pub fn sigmas(&self, steps: usize, sigmas: Option<&[f64]>, mu: Option<f64>) -> Result<Vec<f32>> {
        self.validate()?;
        if steps == 0 {
            return Err(invalid("0 steps".into()));
        }
        let n_train = self.num_train_timesteps as f64;
        let base: Vec<f64> = match sigmas {
            Some(s) => {
                if s.len() != steps {
                    return Err(invalid(format!("{} sigmas given for {steps} steps", s.len())));
                }
                if let Some(bad) = s.iter().find(|v| !(v.is_finite() && **v > 0.0 && **v <= 1.0)) {
                    return Err(invalid(format!("sigma {bad} is outside (0, 1]")));
                }
                // diffusers rounds given sigmas to f32 first.
                s.iter().map(|&v| v as f32 as f64).collect()
            }
            None => {
                // The training range, shifted statically unless the shift is dynamic; its
                // ends as f32 values (diffusers takes them from an f32 tensor).
                let at = |s: f64| {
                    let s = s as f32 as f64;
                    let v = if self.use_dynamic_shifting { s } else { self.shifted(s) };
                    v as f32 as f64
                };
                let (hi, lo) = (at(1.0) * n_train, at(1.0 / n_train) * n_train);
                (0..steps)
                    .map(|i| {
                        let t = if steps == 1 { hi } else { hi + (lo - hi) * i as f64 / (steps - 1) as f64 };
                        t / n_train
                    })
                    .collect()
            }
        };
        let shifted: Vec<f64> = if self.use_dynamic_shifting {
            let mu = mu.ok_or_else(|| invalid("dynamic shifting needs mu (from the image size)".into()))?;
            if !mu.is_finite() {
                return Err(invalid(format!("mu is {mu}")));
            }
            base.iter()
                .map(|&s| match self.time_shift {
                    TimeShift::Exponential => libm::exp(mu) / (libm::exp(mu) + (1.0 / s - 1.0)),
                    TimeShift::Linear => mu / (mu + (1.0 / s - 1.0)),
                })
                .collect()
        } else {
            base.iter().map(|&s| self.shifted(s)).collect()
        };
        let stretched = match self.shift_terminal {
            Some(t) => {
                let last = 1.0 - shifted[shifted.len() - 1];
                let scale = last / (1.0 - t);
                shifted.iter().map(|&s| 1.0 - (1.0 - s) / scale).collect()
            }
            None => shifted,
        };
        Ok(stretched.iter().map(|&s| s as f32).collect())
    }
}

/// FLUX.2's `compute_empirical_mu`: fitted to image tokens and step count.
pub fn flux2_empirical_mu(image_seq_len: usize, steps: usize) -> f64 {
    let (a1, b1) = (8.73809524e-05, 1.89833333);
    let (a2, b2) = (0.00016927, 0.45666666);
    let l = image_seq_len as f64;
    if image_seq_len > 4300 {
        return a2 * l + b2;
    }
    let (m_200, m_10) = (a2 * l + b2, a1 * l + b1);
    let a = (m_200 - m_10) / 190.0;
    let b = m_200 - 200.0 * a;
    a * steps as f64 + b
}

/// A schedule ready to sample: N sigmas and the final 0.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowMatchEuler {
    /// `N + 1` values, the last 0.
    pub sigmas: Vec<f32>,
    /// Training timesteps (the model's time is `sigma * num_train_timesteps`).
    pub num_train_timesteps: usize,
}

impl FlowMatchEuler {
    /// The schedule of `steps` steps (or of the `sigmas` given), shifted by `mu` where the
    /// configuration shifts dynamically; the final 0 appended.
    pub fn new(
        config: &FlowMatchConfig, steps: usize, sigmas: Option<&[f64]>, mu: Option<f64>,
    ) -> Result<Self> {
        let mut s = config.sigmas(steps, sigmas, mu)?;
        s.push(0.0);
        Ok(FlowMatchEuler { sigmas: s, num_train_timesteps: config.num_train_timesteps })
    }

    /// Steps to run.
    pub fn steps(&self) -> usize {
        self.sigmas.len() - 1
    }

    /// The model's timestep input at step `i`: `sigma * num_train_timesteps`.
    pub fn timestep(&self, i: usize) -> f32 {
        self.sigmas[i] * self.num_train_timesteps as f32
    }

    /// `x <- x + (sigma_{i+1} - sigma_i) v`.
    pub fn step(&self, i: usize, x: &mut [f32], v: &[f32]) -> Result<()> {
        crate::error::check_len("flow-match step", "v", v.len(), x.len())?;
        if i >= self.steps() {
            return Err(invalid(format!("step {i} of a {}-step schedule", self.steps())));
        }
        let dt = self.sigmas[i + 1] - self.sigmas[i];
        for (x, &v) in x.iter_mut().zip(v) {
            *x += dt * v;
        }
        Ok(())
    }

    /// img2img: the first step to run for `strength` in [0, 1] (FLUX's rule: how far back up
    /// the schedule to start, `int(N - N * strength)`); `steps() - start` steps run.
    pub fn start_for_strength(&self, strength: f64) -> Result<usize> {
        if !(0.0..=1.0).contains(&strength) {
            return Err(invalid(format!("strength {strength} is outside [0, 1]")));
        }
        let n = self.steps() as f64;
        let init = (n * strength).min(n);
        Ok((n - init).max(0.0) as usize)
    }

    /// `x_t = sigma_i * noise + (1 - sigma_i) * x0`: the clean latent noised to step `i`.
    pub fn scale_noise(&self, i: usize, x0: &[f32], noise: &[f32]) -> Result<Vec<f32>> {
        crate::error::check_len("scale_noise", "noise", noise.len(), x0.len())?;
        let s = *self
            .sigmas
            .get(i)
            .ok_or_else(|| invalid(format!("step {i} of a {}-step schedule", self.steps())))?;
        Ok(x0.iter().zip(noise).map(|(&x, &n)| s * n + (1.0 - s) * x).collect())
    }
}
