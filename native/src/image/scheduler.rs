//! A pipeline's `scheduler/scheduler_config.json`, read into the sampler it names:
//! `FlowMatchEulerDiscreteScheduler` for the transformers; `DDIMScheduler`,
//! `EulerDiscreteScheduler`, `EulerAncestralDiscreteScheduler` or
//! `DPMSolverMultistepScheduler` (as DPM++ 2M) for the UNets; `PNDMScheduler`, which the
//! Stable Diffusion 1.x folders name, starts DDIM on its betas and spacing. The options
//! these samplers do not compute (Karras sigmas, thresholding, other DPM orders, ...) are
//! refused by key.

use std::path::Path;

use rusting_brain_core::diffusion::discrete::{BetaSchedule, DiscreteConfig, Prediction, Solver, Spacing};
use rusting_brain_core::diffusion::flow_match::{FlowMatchConfig, TimeShift};

use crate::io::config::Config;
use crate::Result;

/// The sampler a scheduler configuration describes.
#[derive(Debug, Clone, PartialEq)]
pub enum SchedulerConfig {
    /// Flow matching (FLUX, SD3): Euler steps along the velocity.
    FlowMatch(FlowMatchConfig),
    /// A discrete-time diffusion schedule (SD 1.x/2.x, SDXL) and its solver.
    Discrete(Solver, DiscreteConfig),
}

/// Reads `path` (a `scheduler_config.json`).
pub fn scheduler_config(path: &Path) -> Result<SchedulerConfig> {
    let c = Config::read_python(path)?;
    let class = c.str("_class_name").unwrap_or("").to_string();
    let solver = match class.as_str() {
        "FlowMatchEulerDiscreteScheduler" => return flow_match(&c).map(SchedulerConfig::FlowMatch),
        "DDIMScheduler" | "PNDMScheduler" => Solver::Ddim,
        "EulerDiscreteScheduler" => Solver::Euler,
        "EulerAncestralDiscreteScheduler" => Solver::EulerAncestral,
        "DPMSolverMultistepScheduler" => Solver::DpmPlusPlus2M,
        other => {
            return Err(c.err(
                "_class_name",
                format!(
                    "{other:?}: this library samples with FlowMatchEulerDiscreteScheduler, DDIMScheduler, \
                     EulerDiscreteScheduler, EulerAncestralDiscreteScheduler and DPMSolverMultistepScheduler"
                ),
            ))
        }
    };
    Ok(SchedulerConfig::Discrete(solver, discrete(&c, solver)?))
}

/// The discrete schedule of the `scheduler_config.json` at `path` as `solver` reads it,
/// whichever scheduler the file names: what diffusers' `Solver.from_config(config)` gives,
/// the keys the file lacks taking that solver's defaults (DDIM clips its predicted sample
/// and spaces steps "leading" unless told otherwise; Euler and DPM space "linspace").
pub fn discrete_config_for(path: &Path, solver: Solver) -> Result<DiscreteConfig> {
    let c = Config::read_python(path)?;
    discrete(&c, solver)
}

fn discrete(c: &Config<'_>, solver: Solver) -> Result<DiscreteConfig> {
    for key in [
        "thresholding",
        "rescale_betas_zero_snr",
        "use_karras_sigmas",
        "use_exponential_sigmas",
        "use_beta_sigmas",
        "use_lu_lambdas",
        "use_flow_sigmas",
    ] {
        if c.flag(key, false)? {
            return Err(c.err(key, "true: this option of the scheduler is not computed"));
        }
    }
    if c.get("trained_betas").is_some() {
        return Err(c.err("trained_betas", "given betas are not read; use beta_schedule"));
    }
    let beta_schedule = match c.str("beta_schedule").unwrap_or("linear") {
        "linear" => BetaSchedule::Linear,
        "scaled_linear" => BetaSchedule::ScaledLinear,
        "squaredcos_cap_v2" => BetaSchedule::SquaredCosCapV2,
        other => {
            return Err(c.err(
                "beta_schedule",
                format!("{other:?} is not linear, scaled_linear or squaredcos_cap_v2"),
            ))
        }
    };
    let prediction = match c.str("prediction_type").unwrap_or("epsilon") {
        "epsilon" => Prediction::Epsilon,
        "v_prediction" => Prediction::VPrediction,
        "sample" | "original_sample" => Prediction::Sample,
        other => {
            return Err(c.err("prediction_type", format!("{other:?} is not epsilon, v_prediction or sample")))
        }
    };
    let default_spacing = match solver {
        Solver::Ddim => "leading",
        _ => "linspace",
    };
    let spacing = match c.str("timestep_spacing").unwrap_or(default_spacing) {
        "leading" => Spacing::Leading,
        "trailing" => Spacing::Trailing,
        "linspace" => Spacing::Linspace,
        other => {
            return Err(c.err("timestep_spacing", format!("{other:?} is not leading, trailing or linspace")))
        }
    };
    match solver {
        Solver::Euler => {
            if let Some(v) = c.str("interpolation_type").filter(|v| *v != "linear") {
                return Err(c.err("interpolation_type", format!("{v:?}: only linear is computed")));
            }
            if let Some(v) = c.str("timestep_type").filter(|v| *v != "discrete") {
                return Err(c.err("timestep_type", format!("{v:?}: only discrete is computed")));
            }
            for key in ["sigma_min", "sigma_max"] {
                if c.get(key).is_some() {
                    return Err(c.err(key, "set: not computed"));
                }
            }
        }
        Solver::DpmPlusPlus2M => {
            if c.count("solver_order", Some(2))? != 2 {
                return Err(c.err("solver_order", "only 2 (DPM++ 2M) is computed"));
            }
            for (key, want) in [("algorithm_type", "dpmsolver++"), ("solver_type", "midpoint")] {
                if let Some(v) = c.str(key).filter(|v| *v != want) {
                    return Err(c.err(key, format!("{v:?}: only {want:?} is computed")));
                }
            }
            if let Some(v) = c.get("lambda_min_clipped").and_then(|v| v.as_f64()) {
                if v.is_finite() {
                    return Err(c.err("lambda_min_clipped", "a finite clip is not computed"));
                }
            }
            if c.get("variance_type").is_some() {
                return Err(c.err("variance_type", "learned variances are not computed"));
            }
        }
        _ => {}
    }
    let final_sigma_zero = match c.str("final_sigmas_type").unwrap_or("zero") {
        "zero" => true,
        "sigma_min" => false,
        other => return Err(c.err("final_sigmas_type", format!("{other:?} is not zero or sigma_min"))),
    };
    let d = DiscreteConfig::default();
    let config = DiscreteConfig {
        num_train_timesteps: c.count("num_train_timesteps", Some(1000))?,
        beta_start: c.float("beta_start", 0.0001)? as f64,
        beta_end: c.float("beta_end", 0.02)? as f64,
        beta_schedule,
        prediction,
        spacing,
        steps_offset: c.count("steps_offset", Some(0))?,
        // DDIM's default, whatever class wrote the file (as `from_config` fills it in).
        clip_sample: c.flag("clip_sample", true)?,
        clip_sample_range: c.float("clip_sample_range", 1.0)? as f64,
        set_alpha_to_one: c.flag("set_alpha_to_one", true)?,
        final_sigma_zero,
        lower_order_final: c.flag("lower_order_final", true)?,
        euler_at_final: c.flag("euler_at_final", false)?,
        eta: d.eta,
    };
    // The f32 values of the file are what diffusers reads too (as Python floats: the
    // JSON's own digits), so the betas are re-read at full precision.
    let config = DiscreteConfig {
        beta_start: c.get("beta_start").and_then(|v| v.as_f64()).unwrap_or(config.beta_start),
        beta_end: c.get("beta_end").and_then(|v| v.as_f64()).unwrap_or(config.beta_end),
        ..config
    };
    config.validate().map_err(|e| c.err("config", e.to_string()))?;
    Ok(config)
}

fn flow_match(c: &Config<'_>) -> Result<FlowMatchConfig> {
    for key in [
        "use_karras_sigmas",
        "use_exponential_sigmas",
        "use_beta_sigmas",
        "invert_sigmas",
        "stochastic_sampling",
    ] {
        if c.flag(key, false)? {
            return Err(c.err(key, "true: this option of the scheduler is not computed"));
        }
    }
    let d = FlowMatchConfig::default();
    let shift_terminal = match c.float("shift_terminal", 0.0)? {
        t if t > 0.0 => Some(t as f64),
        _ => None,
    };
    let time_shift = match c.str("time_shift_type").unwrap_or("exponential") {
        "exponential" => TimeShift::Exponential,
        "linear" => TimeShift::Linear,
        other => return Err(c.err("time_shift_type", format!("{other:?} is not exponential or linear"))),
    };
    let config = FlowMatchConfig {
        num_train_timesteps: c.count("num_train_timesteps", Some(d.num_train_timesteps))?,
        shift: c.float("shift", d.shift as f32)? as f64,
        use_dynamic_shifting: c.flag("use_dynamic_shifting", false)?,
        base_shift: c.float("base_shift", d.base_shift as f32)? as f64,
        max_shift: c.float("max_shift", d.max_shift as f32)? as f64,
        base_image_seq_len: c.count("base_image_seq_len", Some(d.base_image_seq_len))?,
        max_image_seq_len: c.count("max_image_seq_len", Some(d.max_image_seq_len))?,
        shift_terminal,
        time_shift,
    };
    config.validate().map_err(|e| c.err("config", e.to_string()))?;
    Ok(config)
}
