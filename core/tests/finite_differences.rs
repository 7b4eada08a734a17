//! Every backward pass of the reference math against central finite differences, in f64.
//!
//! Each test builds a scalar `L = sum(w * f(x))` with random weights `w` (so `dout = w`),
//! runs the analytic backward, and compares each input's gradient with
//! `(L(x + h) - L(x - h)) / 2h`. In f64 with h = 1e-5 the truncation error is ~h^2 times the
//! third derivative and the rounding error ~1e-16 / h, both near 1e-10 on these O(1)
//! functions, so a tolerance of 1e-6 (relative to the largest gradient) is two orders of
//! magnitude above the noise and far below any real mistake (which shows up at O(1)).

use rusting_brain_core::ops::{
    activation::*, attention::*, cross_entropy::*, elementwise::*, embedding::*, loss::*, matmul::*,
    rmsnorm::*, rope::*, softmax::*, swiglu::*,
};
use rusting_brain_core::{Activation, Loss, Rng};

const H: f64 = 1e-5;
const TOL: f64 = 1e-6;

fn randn(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.normal()).collect()
}

fn weighted(out: &[f64], w: &[f64]) -> f64 {
    out.iter().zip(w).map(|(a, b)| a * b).sum()
}

/// Compares `analytic` with the central difference of `loss` around `x`.
fn check(name: &str, x: &[f64], analytic: &[f64], loss: impl Fn(&[f64]) -> f64) {
    assert_eq!(x.len(), analytic.len(), "{name}: gradient length");
    let scale = analytic.iter().fold(1e-3f64, |m, g| m.max(g.abs()));
    let mut xp = x.to_vec();
    let mut worst = (0.0f64, 0usize, 0.0, 0.0);
    for i in 0..x.len() {
        xp[i] = x[i] + H;
        let lp = loss(&xp);
        xp[i] = x[i] - H;
        let lm = loss(&xp);
        xp[i] = x[i];
        let numeric = (lp - lm) / (2.0 * H);
        let err = (numeric - analytic[i]).abs() / scale;
        if err > worst.0 {
            worst = (err, i, numeric, analytic[i]);
        }
    }
    assert!(
        worst.0 < TOL,
        "{name}: gradient differs from finite differences at index {}: numeric {} vs analytic {} (relative error {:.2e})",
        worst.1,
        worst.2,
        worst.3,
        worst.0
    );
}

#[test]
fn matmul_gradients_match_finite_differences_for_every_transpose() {
    let mut rng = Rng::new(1);
    let (m, n, k) = (3, 5, 4);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = randn(&mut rng, m * k);
        let b = randn(&mut rng, k * n);
        let w = randn(&mut rng, m * n);
        let spec = MatmulSpec::new(m, n, k).trans_a(ta).trans_b(tb);
        let f = |a: &[f64], b: &[f64]| {
            let mut c = vec![0.0; m * n];
            matmul(&mut c, a, b, &spec).unwrap();
            weighted(&c, &w)
        };
        // dA = dC B^T (as stored: (m,k), or (k,m) when trans_a, i.e. B dC^T).
        let mut da = vec![0.0; m * k];
        if ta {
            matmul(&mut da, &b, &w, &MatmulSpec::new(k, m, n).trans_a(tb).trans_b(true)).unwrap();
        } else {
            matmul(&mut da, &w, &b, &MatmulSpec::new(m, k, n).trans_b(!tb)).unwrap();
        }
        let mut db = vec![0.0; k * n];
        if tb {
            matmul(&mut db, &w, &a, &MatmulSpec::new(n, k, m).trans_a(true).trans_b(ta)).unwrap();
        } else {
            matmul(&mut db, &a, &w, &MatmulSpec::new(k, n, m).trans_a(!ta)).unwrap();
        }
        check(&format!("matmul dA ta={ta} tb={tb}"), &a, &da, |x| f(x, &b));
        check(&format!("matmul dB ta={ta} tb={tb}"), &b, &db, |x| f(&a, x));
    }
}

#[test]
fn matmul_alpha_beta_and_batch_follow_the_definition() {
    let a = [1.0, 2.0, 3.0, 4.0, /* batch 2 */ 0.0, 1.0, 1.0, 0.0];
    let b = [5.0, 6.0, 7.0, 8.0, /* batch 2 */ 1.0, 2.0, 3.0, 4.0];
    let mut c = [1.0f64; 8];
    let spec = MatmulSpec::new(2, 2, 2).alpha(2.0).beta(0.5).batch(2);
    matmul(&mut c, &a, &b, &spec).unwrap();
    // batch 1: [[19, 22], [43, 50]] * 2 + 0.5; batch 2: [[3, 4], [1, 2]] * 2 + 0.5
    assert_eq!(c, [38.5, 44.5, 86.5, 100.5, 6.5, 8.5, 2.5, 4.5]);
    // beta = 0 never reads C, so NaN there does not leak.
    let mut c = [f64::NAN; 4];
    matmul(&mut c, &a[..4], &b[..4], &MatmulSpec::new(2, 2, 2)).unwrap();
    assert_eq!(c, [19.0, 22.0, 43.0, 50.0]);
}

#[test]
fn rmsnorm_gradients_match_finite_differences() {
    let mut rng = Rng::new(2);
    let (rows, dim) = (3, 7);
    let x = randn(&mut rng, rows * dim);
    let g: Vec<f64> = randn(&mut rng, dim).iter().map(|v| 1.0 + 0.3 * v).collect();
    let w = randn(&mut rng, rows * dim);
    let f = |x: &[f64], g: &[f64]| {
        let mut out = vec![0.0; rows * dim];
        let mut rstd = vec![0.0; rows];
        rmsnorm_forward(&mut out, &mut rstd, x, g, rows, dim, 1e-5).unwrap();
        weighted(&out, &w)
    };
    let mut out = vec![0.0; rows * dim];
    let mut rstd = vec![0.0; rows];
    rmsnorm_forward(&mut out, &mut rstd, &x, &g, rows, dim, 1e-5).unwrap();
    let mut dx = vec![f64::NAN; rows * dim];
    let mut dg = vec![0.0; dim];
    rmsnorm_backward(&mut dx, &mut dg, &w, &x, &g, &rstd, rows, dim).unwrap();
    check("rmsnorm dx", &x, &dx, |v| f(v, &g));
    check("rmsnorm dweight", &g, &dg, |v| f(&x, v));
}

#[test]
fn rmsnorm_forward_matches_hand_computed_values() {
    let mut out = [0.0f64; 2];
    let mut rstd = [0.0f64; 1];
    rmsnorm_forward(&mut out, &mut rstd, &[3.0, 4.0], &[1.0, 2.0], 1, 2, 0.0).unwrap();
    // mean square 12.5 -> rstd 1/sqrt(12.5)
    let r = 1.0 / 12.5f64.sqrt();
    assert!((rstd[0] - r).abs() < 1e-15);
    assert!((out[0] - 3.0 * r).abs() < 1e-15 && (out[1] - 8.0 * r).abs() < 1e-15);
}

#[test]
fn rope_backward_matches_finite_differences_and_preserves_norms() {
    let mut rng = Rng::new(3);
    let spec = RopeSpec::unscaled(2, 5, 3, 6, 4, 10_000.0);
    let n = 2 * 5 * 3 * 6;
    let x = randn(&mut rng, n);
    let w = randn(&mut rng, n);
    let f = |x: &[f64]| {
        let mut y = x.to_vec();
        rope_forward(&mut y, &spec).unwrap();
        weighted(&y, &w)
    };
    let mut dx = w.clone();
    rope_backward(&mut dx, &spec).unwrap();
    check("rope dx", &x, &dx, f);
    let mut y = x.clone();
    rope_forward(&mut y, &spec).unwrap();
    let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>();
    assert!((norm(&x) - norm(&y)).abs() < 1e-9 * norm(&x), "a rotation keeps the norm");
    // Position 0 is the identity.
    let spec0 = RopeSpec::unscaled(1, 1, 1, 4, 0, 500_000.0);
    let mut z = vec![1.0, 2.0, 3.0, 4.0];
    rope_forward(&mut z, &spec0).unwrap();
    assert_eq!(z, vec![1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn rope_rejects_odd_head_dim_and_bad_theta() {
    let mut x = vec![0.0f32; 3];
    let spec = RopeSpec::unscaled(1, 1, 1, 3, 0, 10_000.0);
    assert!(rope_forward(&mut x, &spec).is_err());
    let mut x = vec![0.0f32; 4];
    let spec = RopeSpec { head_dim: 4, theta: f32::NAN, ..spec };
    assert!(rope_forward(&mut x, &spec).is_err());
}

#[test]
fn softmax_gradients_match_finite_differences() {
    let mut rng = Rng::new(4);
    let (rows, cols) = (4, 9);
    let x = randn(&mut rng, rows * cols);
    let w = randn(&mut rng, rows * cols);
    let f = |x: &[f64]| {
        let mut y = vec![0.0; rows * cols];
        softmax_forward(&mut y, x, rows, cols).unwrap();
        weighted(&y, &w)
    };
    let mut y = vec![0.0; rows * cols];
    softmax_forward(&mut y, &x, rows, cols).unwrap();
    let mut dx = vec![f64::NAN; rows * cols];
    softmax_backward(&mut dx, &w, &y, rows, cols).unwrap();
    check("softmax dx", &x, &dx, f);
    // Large logits do not overflow.
    let mut y = vec![0.0; 2];
    softmax_forward(&mut y, &[1000.0, 1000.0], 1, 2).unwrap();
    assert_eq!(y, vec![0.5, 0.5]);
}

#[test]
fn silu_and_swiglu_gradients_match_finite_differences() {
    let mut rng = Rng::new(5);
    let n = 17;
    let gate: Vec<f64> = randn(&mut rng, n).iter().map(|v| v * 3.0).collect();
    let up = randn(&mut rng, n);
    let w = randn(&mut rng, n);
    let mut dx = vec![0.0; n];
    silu_backward(&mut dx, &w, &gate).unwrap();
    check("silu dx", &gate, &dx, |x| {
        let mut y = vec![0.0; n];
        silu_forward(&mut y, x).unwrap();
        weighted(&y, &w)
    });
    let f = |g: &[f64], u: &[f64]| {
        let mut y = vec![0.0; n];
        swiglu_forward(&mut y, g, u).unwrap();
        weighted(&y, &w)
    };
    let mut dg = vec![0.0; n];
    let mut du = vec![0.0; n];
    swiglu_backward(&mut dg, &mut du, &w, &gate, &up).unwrap();
    check("swiglu dgate", &gate, &dg, |x| f(x, &up));
    check("swiglu dup", &up, &du, |x| f(&gate, x));
    assert_eq!(silu(-1000.0f64), 0.0);
    assert_eq!(silu(1000.0f64), 1000.0);
}

fn attention_case(spec: AttentionSpec, seed: u64) {
    let mut rng = Rng::new(seed);
    let (nq, nkv, nl) = spec.check("test").unwrap();
    let q = randn(&mut rng, nq);
    let k = randn(&mut rng, nkv);
    let v = randn(&mut rng, nkv);
    let w = randn(&mut rng, nq);
    let f = |q: &[f64], k: &[f64], v: &[f64]| {
        let mut out = vec![0.0; nq];
        let mut lse = vec![0.0; nl];
        attention_forward(&mut out, &mut lse, q, k, v, &spec).unwrap();
        weighted(&out, &w)
    };
    let mut out = vec![f64::NAN; nq];
    let mut lse = vec![f64::NAN; nl];
    attention_forward(&mut out, &mut lse, &q, &k, &v, &spec).unwrap();
    let (mut dq, mut dk, mut dv) = (vec![f64::NAN; nq], vec![f64::NAN; nkv], vec![f64::NAN; nkv]);
    attention_backward(&mut dq, &mut dk, &mut dv, &w, &q, &k, &v, &out, &lse, &spec).unwrap();
    let tag = format!("{spec:?}");
    check(&format!("attention dq {tag}"), &q, &dq, |x| f(x, &k, &v));
    check(&format!("attention dk {tag}"), &k, &dk, |x| f(&q, x, &v));
    check(&format!("attention dv {tag}"), &v, &dv, |x| f(&q, &k, x));
}

#[test]
fn attention_gradients_match_finite_differences_with_gqa() {
    attention_case(AttentionSpec::causal(2, 5, 4, 2, 3), 6);
    attention_case(AttentionSpec::causal(1, 4, 3, 3, 4), 7);
    attention_case(AttentionSpec::causal(1, 3, 2, 1, 2), 8);
}

#[test]
fn attention_gradients_match_finite_differences_with_a_partly_filled_cache() {
    // Two new queries after three cached positions, in a cache of capacity 7.
    attention_case(
        AttentionSpec { batch: 2, q_len: 2, kv_len: 5, kv_capacity: 7, q_heads: 4, kv_heads: 2, head_dim: 3 },
        9,
    );
}

#[test]
fn kv_cache_decode_matches_full_forward() {
    let mut rng = Rng::new(10);
    let (b, t, hq, hkv, d) = (2, 6, 4, 2, 5);
    let full = AttentionSpec::causal(b, t, hq, hkv, d);
    let (nq, nkv, nl) = full.check("test").unwrap();
    let q = randn(&mut rng, nq);
    let k = randn(&mut rng, nkv);
    let v = randn(&mut rng, nkv);
    let mut out = vec![0.0; nq];
    let mut lse = vec![0.0; nl];
    attention_forward(&mut out, &mut lse, &q, &k, &v, &full).unwrap();
    // Decode one position at a time against a cache of capacity t holding 0..=pos.
    for pos in 0..t {
        let step = AttentionSpec {
            batch: b,
            q_len: 1,
            kv_len: pos + 1,
            kv_capacity: t,
            q_heads: hq,
            kv_heads: hkv,
            head_dim: d,
        };
        let mut q1 = vec![0.0; b * hq * d];
        for bi in 0..b {
            let src = full.q_index(bi, pos, 0);
            q1[bi * hq * d..(bi + 1) * hq * d].copy_from_slice(&q[src..src + hq * d]);
        }
        let mut o1 = vec![0.0; b * hq * d];
        let mut l1 = vec![0.0; b * hq];
        attention_forward(&mut o1, &mut l1, &q1, &k, &v, &step).unwrap();
        for bi in 0..b {
            let src = full.q_index(bi, pos, 0);
            for i in 0..hq * d {
                assert!((o1[bi * hq * d + i] - out[src + i]).abs() < 1e-12, "decode at {pos} differs");
            }
        }
    }
}

#[test]
fn attention_rejects_inconsistent_heads_and_lengths() {
    let z = vec![0.0f32; 64];
    let mut o = vec![0.0f32; 64];
    let mut l = vec![0.0f32; 64];
    let bad_heads = AttentionSpec::causal(1, 2, 3, 2, 4);
    assert!(attention_forward(&mut o, &mut l, &z, &z, &z, &bad_heads).is_err());
    let bad_len =
        AttentionSpec { batch: 1, q_len: 3, kv_len: 2, kv_capacity: 2, q_heads: 1, kv_heads: 1, head_dim: 4 };
    assert!(attention_forward(&mut o, &mut l, &z, &z, &z, &bad_len).is_err());
    let spec = AttentionSpec::causal(1, 2, 2, 1, 4);
    let err = attention_forward(&mut o, &mut l, &z[..15], &z, &z, &spec).unwrap_err();
    assert!(err.to_string().contains("`q` has 15 elements"), "{err}");
}

#[test]
fn embedding_gradient_matches_finite_differences_and_sums_repeats() {
    let mut rng = Rng::new(11);
    let (vocab, dim) = (5, 3);
    let ids = [4u32, 1, 4, 0];
    let table = randn(&mut rng, vocab * dim);
    let w = randn(&mut rng, ids.len() * dim);
    let mut dt = vec![0.0; vocab * dim];
    embedding_backward(&mut dt, &w, &ids, vocab, dim).unwrap();
    check("embedding dtable", &table, &dt, |t| {
        let mut out = vec![0.0; ids.len() * dim];
        embedding_forward(&mut out, t, &ids, vocab, dim).unwrap();
        weighted(&out, &w)
    });
    let mut out = vec![0.0f32; 2 * dim];
    let err = embedding_forward(&mut out, &vec![0.0f32; vocab * dim], &[1, 5], vocab, dim).unwrap_err();
    assert_eq!(err.to_string(), "embedding_forward: id 5 at position 1 is outside the vocabulary (5)");
}

#[test]
fn cross_entropy_gradient_matches_finite_differences_with_ignore_mask() {
    let mut rng = Rng::new(12);
    let (rows, vocab) = (5, 7);
    let logits: Vec<f64> = randn(&mut rng, rows * vocab).iter().map(|v| 2.0 * v).collect();
    let targets = [3u32, 0, 6, 99, 2]; // row 3 is ignored, so its out-of-range id is never read
    let mask = [true, true, false, false, true];
    let mean = |x: &[f64]| {
        let mut l = x.to_vec();
        cross_entropy(&mut l, &targets, Some(&mask), rows, vocab, None).unwrap().mean()
    };
    let mut g = logits.clone();
    let sum = cross_entropy(&mut g, &targets, Some(&mask), rows, vocab, Some(1.0 / 3.0)).unwrap();
    assert_eq!(sum.count, 3);
    assert!((sum.mean() - mean(&logits)).abs() < 1e-15);
    check("cross_entropy dlogits", &logits, &g, mean);
    assert!(g[2 * vocab..4 * vocab].iter().all(|&v| v == 0.0), "ignored rows get zero gradient");
    // Uniform logits: loss = ln(vocab).
    let mut u = vec![0.0f64; vocab];
    let s = cross_entropy(&mut u, &[1], None, 1, vocab, None).unwrap();
    assert!((s.loss_sum - (vocab as f64).ln()).abs() < 1e-14);
    // A counted out-of-range target and a NaN logit are errors.
    let mut x = vec![0.0f32; vocab];
    assert!(cross_entropy(&mut x, &[7], None, 1, vocab, None).is_err());
    let mut x = vec![f32::NAN; vocab];
    assert!(cross_entropy(&mut x, &[1], None, 1, vocab, None).is_err());
}

#[test]
fn activation_gradients_match_finite_differences() {
    let mut rng = Rng::new(13);
    let (rows, cols) = (3, 5);
    // Keep inputs away from ReLU's kink at 0, where the derivative is not defined.
    let x: Vec<f64> =
        randn(&mut rng, rows * cols).iter().map(|v| if v.abs() < 0.05 { v + 0.2 } else { *v }).collect();
    let w = randn(&mut rng, rows * cols);
    for act in Activation::every(0.1) {
        let f = |x: &[f64]| {
            let mut y = vec![0.0; rows * cols];
            activation_forward(act, &mut y, x, rows, cols).unwrap();
            weighted(&y, &w)
        };
        let mut y = vec![0.0; rows * cols];
        activation_forward(act, &mut y, &x, rows, cols).unwrap();
        let mut dx = vec![f64::NAN; rows * cols];
        activation_backward(act, &mut dx, &w, &x, &y, rows, cols).unwrap();
        check(&format!("{act:?} dx"), &x, &dx, f);
    }
}

#[test]
fn loss_gradients_match_finite_differences_and_fused_pairs_agree() {
    let mut rng = Rng::new(14);
    let (rows, cols) = (4, 3);
    let logits = randn(&mut rng, rows * cols);
    let mut probs = vec![0.0; rows * cols];
    activation_forward(Activation::Sigmoid, &mut probs, &logits, rows, cols).unwrap();
    let mut onehot = vec![0.0; rows * cols];
    for r in 0..rows {
        onehot[r * cols + (r % cols)] = 1.0;
    }
    let soft: Vec<f64> = (0..rows * cols).map(|_| rng.uniform(0.0, 1.0)).collect();
    for (loss, target) in [
        (Loss::MeanSquaredError, &soft),
        (Loss::BinaryCrossEntropy, &soft),
        (Loss::CategoricalCrossEntropy, &onehot),
    ] {
        let mut d = vec![0.0; rows * cols];
        loss_backward(loss, &mut d, &probs, target, rows, cols).unwrap();
        check(&format!("{loss:?} dpred"), &probs, &d, |p| loss_forward(loss, p, target, rows, cols).unwrap());
    }
    for (loss, act, target) in [
        (Loss::BinaryCrossEntropy, Activation::Sigmoid, &soft),
        (Loss::CategoricalCrossEntropy, Activation::Softmax, &onehot),
    ] {
        assert!(loss.fuses_with(act));
        let through = |z: &[f64]| {
            let mut p = vec![0.0; rows * cols];
            activation_forward(act, &mut p, z, rows, cols).unwrap();
            loss_forward(loss, &p, target, rows, cols).unwrap()
        };
        let mut p = vec![0.0; rows * cols];
        activation_forward(act, &mut p, &logits, rows, cols).unwrap();
        let mut dz = vec![0.0; rows * cols];
        fused_output_backward(loss, &mut dz, &p, target, rows, cols).unwrap();
        check(&format!("fused {loss:?}+{act:?} dlogits"), &logits, &dz, through);
    }
    // Hand values: MSE of (1, 3) against (0, 0) is 5; BCE of 0.5 is ln 2.
    assert_eq!(loss_forward(Loss::MeanSquaredError, &[1.0f64, 3.0], &[0.0, 0.0], 1, 2).unwrap(), 5.0);
    let bce = loss_forward(Loss::BinaryCrossEntropy, &[0.5f64], &[1.0], 1, 1).unwrap();
    assert!((bce - 2f64.ln()).abs() < 1e-15);
    // A saturated prediction is clamped, not infinite.
    let sat = loss_forward(Loss::BinaryCrossEntropy, &[0.0f64], &[1.0], 1, 1).unwrap();
    assert_eq!(sat, 100.0);
}

#[test]
fn bias_gradient_matches_finite_differences() {
    let mut rng = Rng::new(15);
    let (rows, cols) = (3, 4);
    let base = randn(&mut rng, rows * cols);
    let bias = randn(&mut rng, cols);
    let w = randn(&mut rng, rows * cols);
    let mut db = vec![0.0; cols];
    bias_backward(&mut db, &w, rows, cols).unwrap();
    check("bias dbias", &bias, &db, |b| {
        let mut y = base.clone();
        add_bias(&mut y, b, rows, cols).unwrap();
        weighted(&y, &w)
    });
}
