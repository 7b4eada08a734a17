//! `FlowMatchEulerDiscreteScheduler` against diffusers (`tests/fixtures/gen_flow_match.py`):
//! the sigmas and timesteps of SD3's, FLUX.1's and FLUX.2-klein's schedules, a stretched and
//! a linear-shift schedule and the defaults, and the `mu` values the FLUX pipelines compute.
//!
//! Tolerance: sigmas within 1e-6 (diffusers rounds some intermediate steps to f32 where we
//! round once at the end: a few ulps of values at most 1), timesteps within 1e-3 (the same,
//! times 1000); `mu` within 1e-12 (the same f64 formulas).

use rusting_brain_core::diffusion::flow_match::{
    flux2_empirical_mu, FlowMatchConfig, FlowMatchEuler, TimeShift,
};
use rusting_brain_tests::json_floats;
use serde_json::Value;

fn fixture() -> Value {
    let path = rusting_brain_tests::fixture_path("flow_match.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn config(v: &Value) -> FlowMatchConfig {
    let d = FlowMatchConfig::default();
    let f = |k: &str, def: f64| v.get(k).and_then(Value::as_f64).unwrap_or(def);
    let n = |k: &str, def: usize| v.get(k).and_then(Value::as_u64).map_or(def, |x| x as usize);
    FlowMatchConfig {
        num_train_timesteps: n("num_train_timesteps", d.num_train_timesteps),
        shift: f("shift", d.shift),
        use_dynamic_shifting: v.get("use_dynamic_shifting").and_then(Value::as_bool).unwrap_or(false),
        base_shift: f("base_shift", d.base_shift),
        max_shift: f("max_shift", d.max_shift),
        base_image_seq_len: n("base_image_seq_len", d.base_image_seq_len),
        max_image_seq_len: n("max_image_seq_len", d.max_image_seq_len),
        shift_terminal: v.get("shift_terminal").and_then(Value::as_f64),
        time_shift: match v.get("time_shift_type").and_then(Value::as_str) {
            Some("linear") => TimeShift::Linear,
            _ => TimeShift::Exponential,
        },
    }
}

#[test]
fn schedules_match_diffusers() {
    let f = fixture();
    let cases = f["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 7);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let given = c["sigmas_in"].as_array().map(|_| json_floats(&c["sigmas_in"]));
        let steps = c["steps"].as_u64().unwrap() as usize;
        let s =
            FlowMatchEuler::new(&config(&c["config"]), steps, given.as_deref(), c["mu"].as_f64()).unwrap();
        let want = json_floats(&c["sigmas"]);
        assert_eq!(s.sigmas.len(), want.len(), "{name}: length");
        let mut worst = 0.0f64;
        for (i, (&got, &w)) in s.sigmas.iter().zip(&want).enumerate() {
            let d = (got as f64 - w).abs();
            assert!(d <= 1e-6, "{name}: sigma {i} is {got}, diffusers {w}");
            worst = worst.max(d);
        }
        for (i, w) in json_floats(&c["timesteps"]).iter().enumerate() {
            let got = s.timestep(i) as f64;
            assert!((got - w).abs() <= 1e-3, "{name}: timestep {i} is {got}, diffusers {w}");
        }
        println!("{name:<12} {steps:>3} steps, worst sigma difference {worst:.1e}");
    }
}

#[test]
fn mu_matches_the_flux_pipelines() {
    let f = fixture();
    let mu = &f["mu"];
    let c = FlowMatchConfig::default();
    let close = |got: f64, key: &str| {
        let want = mu[key].as_f64().unwrap();
        assert!((got - want).abs() < 1e-12, "{key}: {got} vs {want}");
    };
    close(c.flux1_mu(4096), "flux1_4096");
    close(c.flux1_mu(1024), "flux1_1024");
    close(flux2_empirical_mu(1024, 4), "klein_1024_4");
    close(flux2_empirical_mu(4096, 4), "klein_4096_4");
    close(flux2_empirical_mu(8192, 50), "klein_8192_50");
}

#[test]
fn steps_noise_and_strength() {
    let s = FlowMatchEuler::new(&FlowMatchConfig::default(), 4, Some(&[1.0, 0.75, 0.5, 0.25]), None).unwrap();
    assert_eq!(s.sigmas, [1.0, 0.75, 0.5, 0.25, 0.0]);
    // x <- x + (sigma_next - sigma) v, and the last step lands on x0 = x - sigma v.
    let mut x = vec![1.0f32, -2.0];
    s.step(0, &mut x, &[4.0, 8.0]).unwrap();
    assert_eq!(x, [0.0, -4.0]);
    let noised = s.scale_noise(1, &[2.0, 2.0], &[-2.0, 6.0]).unwrap();
    assert_eq!(noised, [0.75 * -2.0 + 0.25 * 2.0, 0.75 * 6.0 + 0.25 * 2.0]);
    // FLUX's img2img: int(N - N * strength).
    assert_eq!(s.start_for_strength(1.0).unwrap(), 0);
    assert_eq!(s.start_for_strength(0.6).unwrap(), 1);
    assert_eq!(s.start_for_strength(0.0).unwrap(), 4);
    let dynamic = FlowMatchConfig { use_dynamic_shifting: true, ..FlowMatchConfig::default() };
    let plain = FlowMatchConfig::default();
    for (e, want) in [
        (s.start_for_strength(1.5).unwrap_err(), "strength 1.5 is outside [0, 1]"),
        (s.step(4, &mut x, &[0.0, 0.0]).unwrap_err(), "step 4 of a 4-step schedule"),
        (s.step(0, &mut x, &[0.0]).unwrap_err(), "`v` has 1 elements"),
        (FlowMatchEuler::new(&dynamic, 4, None, None).unwrap_err(), "needs mu"),
        (FlowMatchEuler::new(&plain, 2, Some(&[1.0]), None).unwrap_err(), "1 sigmas given for 2 steps"),
        (FlowMatchEuler::new(&plain, 2, Some(&[1.0, 0.0]), None).unwrap_err(), "sigma 0 is outside (0, 1]"),
        (FlowMatchEuler::new(&plain, 0, None, None).unwrap_err(), "0 steps"),
    ] {
        assert!(e.to_string().contains(want), "`{e}` does not say `{want}`");
    }
}
