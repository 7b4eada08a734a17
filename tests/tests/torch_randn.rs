//! `torch_randn` against PyTorch's CPU `torch.randn` (`tests/fixtures/gen_torch_randn.py`):
//! three seeds (one past 32 bits) and lengths on both sides of PyTorch's 16-value switch,
//! with and without a partial last block.
//!
//! Tolerance: 2e-6 absolute (PyTorch's vectorized log/sin/cos and libm's can differ in the
//! last f32 bit: a few ulps of values of size ~1 to 4); a wrong draw order or layout is off
//! by whole units.

use rusting_brain_core::diffusion::torch_randn::{torch_randn, TorchGenerator};
use serde_json::Value;

#[test]
fn seeds_give_torchs_noise() {
    let path = rusting_brain_tests::fixture_path("torch_randn.json");
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 24);
    let mut worst = 0.0f64;
    for c in cases {
        let (seed, n) = (c["seed"].as_u64().unwrap(), c["n"].as_u64().unwrap() as usize);
        let want = rusting_brain_tests::json_floats(&c["values"]);
        let got = torch_randn(seed, n);
        assert_eq!(got.len(), want.len());
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            let d = (g as f64 - w).abs();
            assert!(d <= 2e-6, "seed {seed}, n {n}: value {i} is {g}, torch {w}");
            worst = worst.max(d);
        }
    }
    println!("worst difference from torch.randn: {worst:.1e}");
}

#[test]
fn successive_draws_continue_the_generator() {
    let path = rusting_brain_tests::fixture_path("torch_randn.json");
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let sequences = v["sequences"].as_array().unwrap();
    assert_eq!(sequences.len(), 2);
    for s in sequences {
        let mut g = TorchGenerator::new(s["seed"].as_u64().unwrap());
        for (call, want) in s["values"].as_array().unwrap().iter().enumerate() {
            let want = rusting_brain_tests::json_floats(want);
            let got = g.randn(want.len());
            assert_eq!(got.len(), want.len());
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!((g as f64 - w).abs() <= 2e-6, "call {call}, value {i}: {g}, torch {w}");
            }
        }
    }
}
