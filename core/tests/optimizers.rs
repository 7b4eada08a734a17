//! Optimizer updates and the gradient norm against values worked out by hand.

use rusting_brain_core::ops::l2norm::{global_l2_norm, sum_of_squares};
use rusting_brain_core::ops::optim::*;

#[test]
fn adam_first_step_moves_each_weight_by_lr_times_sign() {
    // After one step m_hat = g and v_hat = g^2, so the update is lr * g / (|g| + eps).
    let mut p = vec![1.0f64, -2.0, 0.5];
    let g = vec![0.3, -4.0, 1e-3];
    let (mut m, mut v) = (vec![0.0; 3], vec![0.0; 3]);
    let hp = AdamParams { lr: 0.01, eps: 1e-8, ..AdamParams::default() };
    adam_update(&mut p, &g, &mut m, &mut v, &hp, 1).unwrap();
    for (i, (&pi, &gi)) in [1.0f64, -2.0, 0.5].iter().zip(&g).enumerate() {
        let expect = pi - 0.01f32 as f64 * gi / (gi.abs() + 1e-8f32 as f64);
        assert!((p[i] - expect).abs() < 1e-12, "{i}: {} vs {expect}", p[i]);
    }
}

#[test]
fn adam_second_step_matches_the_formula() {
    let hp = AdamParams {
        lr: 0.1,
        beta1: 0.5,
        beta2: 0.75,
        eps: 1e-3,
        weight_decay: 0.0,
        decoupled: true,
        grad_scale: 2.0,
    };
    let mut p = vec![1.0f64];
    let (mut m, mut v) = (vec![0.0], vec![0.0]);
    adam_update(&mut p, &[0.5], &mut m, &mut v, &hp, 1).unwrap(); // g = 1 after scaling
    adam_update(&mut p, &[-0.25], &mut m, &mut v, &hp, 2).unwrap(); // g = -0.5
                                                                    // m: 0.5 -> 0.5*0.5 + 0.5*(-0.5) = 0; v: 0.25 -> 0.75*0.25 + 0.25*0.25 = 0.25
    assert!((m[0] - 0.0).abs() < 1e-15 && (v[0] - 0.25).abs() < 1e-15);
    // step 1: p = 1 - 0.1 * (0.5/0.5) / (sqrt(0.25)/sqrt(0.25) + 1e-3)
    let p1 = 1.0 - 0.1f32 as f64 / (1.0 + 1e-3f32 as f64);
    // step 2: m = 0, so no move.
    assert!((p[0] - p1).abs() < 1e-12, "{} vs {p1}", p[0]);
}

#[test]
fn adamw_decays_weights_and_adam_l2_adds_to_the_gradient() {
    let base = AdamParams { lr: 0.1, weight_decay: 0.5, ..AdamParams::default() };
    let mut p = vec![2.0f64];
    let (mut m, mut v) = (vec![0.0], vec![0.0]);
    adam_update(&mut p, &[0.0], &mut m, &mut v, &base, 1).unwrap();
    // decoupled: p *= 1 - 0.1*0.5, zero gradient moves nothing else.
    assert!((p[0] - 2.0 * (1.0 - 0.1f32 as f64 * 0.5)).abs() < 1e-9);
    let l2 = AdamParams { decoupled: false, ..base };
    let mut p = vec![2.0f64];
    let (mut m, mut v) = (vec![0.0], vec![0.0]);
    adam_update(&mut p, &[0.0], &mut m, &mut v, &l2, 1).unwrap();
    // coupled: g = 0.5 * 2 = 1, so a full lr-sized step.
    assert!((p[0] - (2.0 - 0.1f32 as f64 / (1.0 + 1e-8))).abs() < 1e-7);
}

#[test]
fn adam_rejects_bad_hyperparameters_and_step_zero() {
    let mut p = vec![0.0f32];
    let (mut m, mut v) = (vec![0.0], vec![0.0]);
    for hp in [
        AdamParams { beta1: 1.0, ..AdamParams::default() },
        AdamParams { lr: -1.0, ..AdamParams::default() },
        AdamParams { eps: 0.0, ..AdamParams::default() },
        AdamParams { lr: f32::NAN, ..AdamParams::default() },
    ] {
        assert!(adam_update(&mut p, &[1.0], &mut m, &mut v, &hp, 1).is_err(), "{hp:?}");
    }
    assert!(adam_update(&mut p, &[1.0], &mut m, &mut v, &AdamParams::default(), 0).is_err());
    assert!(adam_update(&mut p, &[1.0, 2.0], &mut m, &mut v, &AdamParams::default(), 1).is_err());
}

#[test]
fn sgd_with_momentum_and_nesterov_follow_pytorch() {
    let mut p = vec![1.0f64];
    let mut buf = vec![0.0];
    let hp = SgdParams { lr: 0.1, momentum: 0.9, nesterov: false, weight_decay: 0.0, grad_scale: 1.0 };
    sgd_update(&mut p, &[1.0], Some(&mut buf), &hp).unwrap(); // buf 1, p 0.9
    sgd_update(&mut p, &[1.0], Some(&mut buf), &hp).unwrap(); // buf 1.9, p 0.71
    assert!((p[0] - 0.71).abs() < 1e-7 && (buf[0] - 1.9).abs() < 1e-7);
    let mut p = vec![1.0f64];
    let mut buf = vec![0.0];
    let nes = SgdParams { nesterov: true, ..hp };
    sgd_update(&mut p, &[1.0], Some(&mut buf), &nes).unwrap(); // d = 1 + 0.9*1 = 1.9
    assert!((p[0] - (1.0 - 0.1f32 as f64 * 1.9)).abs() < 1e-7);
    let mut p = vec![1.0f64];
    sgd_update(&mut p, &[2.0], None, &SgdParams { weight_decay: 0.5, ..SgdParams::new(0.25) }).unwrap();
    assert!((p[0] - (1.0 - 0.25 * 2.5)).abs() < 1e-12);
    assert!(sgd_update(&mut p, &[2.0], None, &hp).is_err(), "momentum without a buffer");
}

#[test]
fn global_norm_is_the_norm_of_the_concatenation() {
    assert_eq!(sum_of_squares(&[3.0f32, 4.0]), 25.0);
    assert_eq!(global_l2_norm::<f32>(&[&[3.0, 4.0], &[12.0]]), 13.0);
    assert!(global_l2_norm::<f32>(&[&[1.0], &[f32::NAN]]).is_nan());
}
