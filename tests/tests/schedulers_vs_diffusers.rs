//! DDIM, Euler, Euler ancestral and DPM-Solver++ 2M against diffusers
//! (`tests/fixtures/gen_schedulers.py`): each configuration read as a
//! `scheduler_config.json`, its timesteps and sigmas, and the deterministic loop of
//! diffusers' own scheduler tests (a fixed sample, the dummy model `x * t / (t + 1)`, 10 or
//! 20 steps) with the noise of the ancestral and eta > 0 runs drawn from PyTorch's
//! generator for seed 0. The published goldens of diffusers' tests are checked too: DDIM
//! sum 172.0067, DPM++ 2M mean 0.3301 (0.2251 with v-prediction), and Euler's 10.0807 and
//! Euler ancestral's 152.3192 with those tests' loop (which steps from the scaled input).
//!
//! Tolerance: timesteps exactly; sigmas 2e-7 relative (f32 values computed in f64 here
//! and f32 there); the final samples rtol 1e-5 + 1e-5 * rms (ten steps of f32 rounding on
//! each side).

use rusting_brain::scheduler::{scheduler_config, SchedulerConfig};
use rusting_brain_core::diffusion::discrete::DiscreteSampler;
use rusting_brain_core::diffusion::torch_randn::TorchGenerator;
use rusting_brain_tests::*;
use serde_json::Value;

fn cases() -> Vec<Value> {
    let v: Value = serde_json::from_slice(&std::fs::read(fixture_path("schedulers.json")).unwrap()).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn tensor(v: &Value) -> Tensor {
    let data = json_floats(v);
    Tensor { shape: vec![data.len()], data }
}

/// The case's scheduler, read through the loader from its config.
fn sampler(case: &Value, dir: &std::path::Path) -> DiscreteSampler {
    let mut config = case["config"].clone();
    config["_class_name"] = case["class"].clone();
    let path = dir.join(format!("{}.json", case["name"].as_str().unwrap()));
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    let SchedulerConfig::Discrete(solver, mut c) = scheduler_config(&path).unwrap() else {
        panic!("not a discrete scheduler")
    };
    c.eta = case["eta"].as_f64().unwrap();
    DiscreteSampler::new(solver, c, case["steps"].as_u64().unwrap() as usize).unwrap()
}

/// diffusers' test loop; `scaled_state` steps from the scaled input as those tests do.
fn run(s: &mut DiscreteSampler, sample: &[f32], scaled_state: bool) -> Vec<f32> {
    let k = s.init_noise_sigma() as f32;
    let mut x: Vec<f32> = sample.iter().map(|v| v * k).collect();
    let mut g = TorchGenerator::new(0);
    for i in 0..s.steps() {
        let t = s.timesteps[i] as f32;
        let input = s.scale_model_input(i, &x);
        let out: Vec<f32> = input.iter().map(|v| v * t / (t + 1.0)).collect();
        if scaled_state {
            x = input;
        }
        let noise = s.needs_noise().then(|| g.randn(x.len()));
        s.step(i, &mut x, &out, noise.as_deref()).unwrap();
    }
    x
}

#[test]
fn schedules_and_loops_match_diffusers() {
    let t = rusting_brain_test_support::TempDir::new("schedulers");
    let all = cases();
    assert_eq!(all.len(), 15);
    for case in &all {
        let name = case["name"].as_str().unwrap();
        let mut s = sampler(case, t.path());
        assert_eq!(s.timesteps, json_floats(&case["timesteps"]), "{name}: timesteps");
        let want_sigmas = json_floats(&case["sigmas"]);
        assert_eq!(s.sigmas.len(), want_sigmas.len(), "{name}: sigmas");
        for (a, b) in s.sigmas.iter().zip(&want_sigmas) {
            assert!((a - b).abs() <= 2e-7 * b.abs().max(1e-3), "{name}: sigma {a} vs {b}");
        }
        let init = case["init_noise_sigma"].as_f64().unwrap();
        assert!((s.init_noise_sigma() - init).abs() <= 1e-6 * init, "{name}: init_noise_sigma");
        let sample: Vec<f32> = json_floats(&case["sample"]).iter().map(|&v| v as f32).collect();
        let got = run(&mut s, &sample, false);
        assert_close_rms(&format!("{name} loop"), &got, &tensor(&case["result"]), 1e-5);
    }
}

#[test]
fn diffusers_published_goldens() {
    let t = rusting_brain_test_support::TempDir::new("scheduler-goldens");
    let all = cases();
    let find = |n: &str| all.iter().find(|c| c["name"] == n).unwrap();
    let stats = |x: &[f32]| {
        let sum: f64 = x.iter().map(|v| v.abs() as f64).sum();
        (sum, sum / x.len() as f64)
    };
    let sample = |c: &Value| -> Vec<f32> { json_floats(&c["sample"]).iter().map(|&v| v as f32).collect() };
    // (case, the tests' loop, want sum, want mean, tolerance on sum and mean as they use)
    for (name, scaled, sum, mean) in [
        ("ddim", false, Some(172.0067), 0.223967),
        ("dpm", false, None, 0.3301),
        ("dpm_v", false, None, 0.2251),
        ("euler", true, Some(10.0807), 0.0131),
        ("euler_ancestral", true, Some(152.3192), 0.1983),
    ] {
        let c = find(name);
        let mut s = sampler(c, t.path());
        let (got_sum, got_mean) = stats(&run(&mut s, &sample(c), scaled));
        println!("{name:<16} sum {got_sum:.4} mean {got_mean:.6}");
        if let Some(want) = sum {
            assert!((got_sum - want).abs() < 1e-2, "{name}: sum {got_sum}, diffusers' test {want}");
        }
        assert!((got_mean - mean).abs() < 1e-3, "{name}: mean {got_mean}, diffusers' test {mean}");
    }
}

#[test]
fn bad_configs_and_steps_are_errors() {
    let t = rusting_brain_test_support::TempDir::new("scheduler-bad");
    let write = |text: &str| {
        let p = t.path().join("scheduler_config.json");
        std::fs::write(&p, text).unwrap();
        p
    };
    for (text, key) in [
        (r#"{"_class_name": "LCMScheduler"}"#, "LCMScheduler"),
        (r#"{"_class_name": "EulerDiscreteScheduler", "use_karras_sigmas": true}"#, "use_karras_sigmas"),
        (r#"{"_class_name": "DPMSolverMultistepScheduler", "solver_order": 3}"#, "solver_order"),
        (
            r#"{"_class_name": "DPMSolverMultistepScheduler", "algorithm_type": "sde-dpmsolver++"}"#,
            "algorithm_type",
        ),
        (r#"{"_class_name": "DDIMScheduler", "beta_schedule": "sigmoid"}"#, "beta_schedule"),
        (r#"{"_class_name": "DDIMScheduler", "beta_start": 2.0}"#, "betas"),
        (r#"{"_class_name": "DDIMScheduler", "thresholding": true}"#, "thresholding"),
    ] {
        let e = scheduler_config(&write(text)).err().unwrap_or_else(|| panic!("{text}: accepted"));
        assert!(e.to_string().contains(key), "{text}: {e}");
    }
    let SchedulerConfig::Discrete(solver, c) =
        scheduler_config(&write(r#"{"_class_name": "DDIMScheduler"}"#)).unwrap()
    else {
        panic!()
    };
    assert!(DiscreteSampler::new(solver, c, 0).is_err());
    assert!(DiscreteSampler::new(solver, c, 5000).is_err());
    let mut s = DiscreteSampler::new(solver, c, 4).unwrap();
    let mut x = vec![0.0f32; 8];
    assert!(s.step(0, &mut x, &[0.0; 7], None).is_err(), "short output");
    assert!(s.step(4, &mut x, &[0.0; 8], None).is_err(), "past the end");
}
