//! `WgpuBackend` against `ReferenceBackend`, primitive by primitive: the same calls on
//! awkward shapes (1, 3, 7, 33, 127, 1000 rows; widths not multiples of the 8x8 tile or
//! the 64-wide workgroup), the GPU's outputs poisoned with NaN first.
//!
//! Tolerance 1e-5 of the output's scale (1e-4 for the products with k up to 300): the
//! GPU sums in the same order as the reference but may fuse multiply-adds, and its exp,
//! tanh and sqrt are specified to a few ULP. The worst measured values are printed.

mod common;
use common::gpu;

use rusting_brain_core::backend::ActivationOps;
use rusting_brain_core::backend::AttentionOps;
use rusting_brain_core::backend::CrossEntropyOps;
use rusting_brain_core::backend::ElementwiseOps;
use rusting_brain_core::backend::EmbeddingOps;
use rusting_brain_core::backend::L2normOps;
use rusting_brain_core::backend::LoraOps;
use rusting_brain_core::backend::LossOps;
use rusting_brain_core::backend::MatmulOps;
use rusting_brain_core::backend::Memory;
use rusting_brain_core::backend::MoeOps;
use rusting_brain_core::backend::OptimOps;
use rusting_brain_core::backend::RmsnormOps;
use rusting_brain_core::backend::SwigluOps;
use rusting_brain_core::backend::{AdamParams, MatmulSpec, SgdParams};
use rusting_brain_core::{Activation, Loss, ReferenceBackend, Rng};
use rusting_brain_test_support::rel_to_scale;

/// Runs the same calls on the GPU and the reference over the same inputs; gives each
/// output buffer's (gpu, reference) contents. Outputs whose starting value is all zeros
/// are poisoned with NaN on the GPU (they are written, not read).
macro_rules! on_both {
    ($g:expr, $r:expr, |$b:ident, $ins:ident, $outs:ident| $body:expr, $inputs:expr, $init:expr) => {{
        let inputs: Vec<Vec<f32>> = $inputs.into_iter().collect();
        let init: Vec<Vec<f32>> = $init.into_iter().collect();
        let gi: Vec<_> = inputs.iter().map(|v: &Vec<f32>| $g.upload(v).unwrap()).collect();
        let mut go: Vec<_> = init
            .iter()
            .map(|v: &Vec<f32>| {
                let mut b = $g.upload(v).unwrap();
                if v.iter().all(|x| *x == 0.0) {
                    // Outputs that are overwritten start as NaN so a skipped element shows.
                    $g.fill(&mut b, f32::NAN).unwrap();
                }
                b
            })
            .collect();
        {
            let $b = &$g;
            let $ins = &gi;
            let $outs = &mut go;
            $body;
        }
        let ri: Vec<_> = inputs.iter().map(|v: &Vec<f32>| $r.upload(v).unwrap()).collect();
        let mut ro: Vec<_> = init.iter().map(|v: &Vec<f32>| $r.upload(v).unwrap()).collect();
        {
            let $b = &$r;
            let $ins = &ri;
            let $outs = &mut ro;
            $body;
        }
        go.iter()
            .zip(&ro)
            .map(|(a, b)| ($g.download(a).unwrap(), $r.download(b).unwrap()))
            .collect::<Vec<_>>()
    }};
}

const ROWS: [usize; 6] = [1, 3, 7, 33, 127, 1000];

#[test]
fn matmul_with_transposes_batches_windows_and_beta() {
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(1);
    let mut worst = 0.0f32;
    for (&m, (n, k)) in ROWS.iter().zip([(1usize, 1usize), (5, 9), (13, 300), (33, 17), (10, 64), (3, 7)]) {
        for (ta, tb, beta, batch) in
            [(false, false, 0.0, 1), (true, false, 1.0, 1), (false, true, 0.5, 2), (true, true, 0.0, 3)]
        {
            let spec = MatmulSpec::new(m, n, k).trans_a(ta).trans_b(tb).alpha(0.75).beta(beta).batch(batch);
            let a = rng.normal_vec(batch * m * k, 1.0);
            let b = rng.normal_vec(batch * k * n, 1.0);
            let c = if beta == 0.0 { vec![0.0; batch * m * n] } else { rng.normal_vec(batch * m * n, 1.0) };
            let out = on_both!(
                g,
                r,
                |be, ins, outs| be.matmul(&mut outs[0], &ins[0], &ins[1], &spec).unwrap(),
                [a, b],
                [c]
            );
            let e = rel_to_scale("matmul with transposes batches windows and beta", &out[0].0, &out[0].1);
            assert!(e < 1e-4, "{spec:?}: {e}");
            worst = worst.max(e);
        }
    }
    // A window: C's rows 2.. of a larger buffer from A's and B's offsets.
    let spec = MatmulSpec::new(3, 4, 5).window(7, 3, 8);
    let (a, b, c) = (rng.normal_vec(30, 1.0), rng.normal_vec(30, 1.0), rng.normal_vec(24, 1.0));
    let out = on_both!(
        g,
        r,
        |be, ins, outs| be.matmul(&mut outs[0], &ins[0], &ins[1], &spec).unwrap(),
        [a, b],
        [c]
    );
    assert!(rel_to_scale("matmul with transposes batches windows and beta", &out[0].0, &out[0].1) < 1e-5);
    // Wrong sizes are errors.
    let (x, mut y) = (g.zeros(5).unwrap(), g.zeros(6).unwrap());
    assert!(g.matmul(&mut y, &x, &x, &MatmulSpec::new(2, 3, 2)).is_err());
    eprintln!("matmul worst relative error {worst:e}");
}

#[test]
fn dense_layer_primitives_match_the_reference() {
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(2);
    let mut worst = 0.0f32;
    let acts = Activation::every(0.1);
    for (&rows, cols) in ROWS.iter().zip([1usize, 7, 33, 5, 65, 3]) {
        let n = rows * cols;
        let x = rng.normal_vec(n, 3.0);
        let bias = rng.normal_vec(cols, 1.0);
        let dout = rng.normal_vec(n, 1.0);
        let base = rng.normal_vec(n, 1.0);
        let out = on_both!(
            g,
            r,
            |be, ins, outs| be.add_bias(&mut outs[0], &ins[0], rows, cols).unwrap(),
            [bias.clone()],
            [base.clone()]
        );
        worst = worst.max(rel_to_scale("dense layer primitives match the reference", &out[0].0, &out[0].1));
        let db0 = rng.normal_vec(cols, 1.0);
        let out = on_both!(
            g,
            r,
            |be, ins, outs| be.bias_backward(&mut outs[0], &ins[0], rows, cols).unwrap(),
            [dout.clone()],
            [db0]
        );
        let e = rel_to_scale("dense layer primitives match the reference", &out[0].0, &out[0].1);
        assert!(e < 1e-4, "bias_backward ({rows}, {cols}): {e}");
        for act in acts {
            let out = on_both!(
                g,
                r,
                |be, ins, outs| {
                    be.activation_forward(act, &mut outs[0], &ins[0], rows, cols).unwrap();
                    let y = be.download(&outs[0]).unwrap();
                    let y = be.upload(&y).unwrap();
                    be.activation_backward(act, &mut outs[1], &ins[1], &ins[0], &y, rows, cols).unwrap();
                },
                [x.clone(), dout.clone()],
                [vec![0.0; n], vec![0.0; n]]
            );
            for (i, (a, b)) in out.iter().enumerate() {
                let e = rel_to_scale("dense layer primitives match the reference", a, b);
                assert!(e < 1e-5, "{act:?} {} ({rows}, {cols}): {e}", ["forward", "backward"][i]);
                worst = worst.max(e);
            }
        }
        // Losses on predictions in (0, 1) (the cross-entropies' domain).
        let pred: Vec<f32> = rng.normal_vec(n, 1.0).iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
        let target: Vec<f32> =
            rng.normal_vec(n, 1.0).iter().map(|v| if *v > 0.0 { 1.0 } else { 0.0 }).collect();
        for loss in [Loss::MeanSquaredError, Loss::BinaryCrossEntropy, Loss::CategoricalCrossEntropy] {
            let out = on_both!(
                g,
                r,
                |be, ins, outs| {
                    be.loss_backward(loss, &mut outs[0], &ins[0], &ins[1], rows, cols).unwrap();
                    be.fused_output_backward(loss, &mut outs[1], &ins[0], &ins[1], rows, cols).unwrap();
                },
                [pred.clone(), target.clone()],
                [vec![0.0; n], vec![0.0; n]]
            );
            for (a, b) in &out {
                let e = rel_to_scale("dense layer primitives match the reference", a, b);
                assert!(e < 1e-5, "{loss:?} ({rows}, {cols}): {e}");
                worst = worst.max(e);
            }
            let (gp, gt) = (g.upload(&pred).unwrap(), g.upload(&target).unwrap());
            let (rp, rt) = (r.upload(&pred).unwrap(), r.upload(&target).unwrap());
            // The wgpu backend evaluates the loss with core's f32 formula on the read-back
            // values; the reference backend computes in f64.
            let (lg, lr) = (
                g.loss_forward(loss, &gp, &gt, rows, cols).unwrap(),
                r.loss_forward(loss, &rp, &rt, rows, cols).unwrap(),
            );
            assert!((lg - lr).abs() <= 1e-6 * lr.abs().max(1.0), "{loss:?}: {lg} vs {lr}");
        }
        // fill, scale, axpy, sum of squares.
        let out = on_both!(
            g,
            r,
            |be, ins, outs| {
                be.scale(&mut outs[0], -1.5).unwrap();
                be.axpy(&mut outs[0], 0.25, &ins[0]).unwrap();
                be.fill(&mut outs[1], 3.0).unwrap();
            },
            [x.clone()],
            [base.clone(), base.clone()]
        );
        for (a, b) in &out {
            assert!(rel_to_scale("dense layer primitives match the reference", a, b) < 1e-6);
        }
    }
    eprintln!("dense primitives worst relative error {worst:e}");
}

#[test]
fn optimizer_steps_match_the_reference() {
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(3);
    for n in [1usize, 7, 33, 1000, 64 * 1100 + 3] {
        let p = rng.normal_vec(n, 1.0);
        let grads: Vec<Vec<f32>> = (0..3).map(|_| rng.normal_vec(n, 0.1)).collect();
        for (decoupled, wd) in [(false, 0.0), (true, 0.01), (false, 0.01)] {
            let hp = AdamParams {
                lr: 1e-2,
                weight_decay: wd,
                decoupled,
                grad_scale: 0.5,
                ..AdamParams::default()
            };
            let out = on_both!(
                g,
                r,
                |be, ins, outs| {
                    let [p, m, v] = &mut outs[..] else { unreachable!() };
                    for (step, gr) in ins.iter().enumerate() {
                        be.adam_update(p, gr, m, v, &hp, step as u64 + 1).unwrap();
                    }
                },
                grads.clone(),
                [p.clone(), vec![0.5; n], vec![0.5; n]]
            );
            for (a, b) in &out {
                let e = rel_to_scale("optimizer steps match the reference", a, b);
                assert!(e < 1e-5, "adam n {n} {hp:?}: {e}");
            }
        }
        for (momentum, nesterov) in [(0.0, false), (0.9, false), (0.9, true)] {
            let hp = SgdParams { momentum, nesterov, weight_decay: 1e-3, ..SgdParams::new(0.1) };
            let out = on_both!(
                g,
                r,
                |be, ins, outs| {
                    let [p, vel] = &mut outs[..] else { unreachable!() };
                    for gr in ins.iter() {
                        be.sgd_update(p, gr, if momentum > 0.0 { Some(&mut *vel) } else { None }, &hp)
                            .unwrap();
                    }
                },
                grads.clone(),
                [p.clone(), vec![0.5; n]]
            );
            for (a, b) in &out {
                assert!(rel_to_scale("optimizer steps match the reference", a, b) < 1e-5, "sgd n {n} {hp:?}");
            }
        }
    }
}

// ----- the transformer's primitives: forward and backward -----

#[test]
fn rmsnorm_backward_matches_the_reference() {
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(11);
    let mut worst = 0.0f32;
    for (&rows, dim) in ROWS.iter().zip([1usize, 5, 64, 65, 300, 33]) {
        let x = rng.normal_vec(rows * dim, 1.0);
        let w = rng.normal_vec(dim, 1.0);
        let dy = rng.normal_vec(rows * dim, 1.0);
        let mut rstd = vec![0.0; rows];
        let mut h = vec![0.0; rows * dim];
        rusting_brain_core::ops::rmsnorm::rmsnorm_forward(&mut h, &mut rstd, &x, &w, rows, dim, 1e-5)
            .unwrap();
        let dw0 = rng.normal_vec(dim, 1.0);
        let out = on_both!(
            g,
            r,
            |be, ins, outs| {
                let (a, b) = outs.split_at_mut(1);
                be.rmsnorm_backward(&mut a[0], &mut b[0], &ins[0], &ins[1], &ins[2], &ins[3], rows, dim)
                    .unwrap()
            },
            [dy.clone(), x, w.clone(), rstd.clone()],
            [vec![0.0; rows * dim], dw0]
        );
        // dinp = rstd (w dy - xhat mean) cancels to nearly nothing when dim is 1: its error
        // is measured against the size of the terms, rstd |w dy|, not of the difference.
        let mut terms = 0.0f32;
        for i in 0..rows * dim {
            let t = (rstd[i / dim] * w[i % dim] * dy[i]).abs();
            assert!(t.is_finite(), "term {i} is {t}");
            terms = terms.max(t);
        }
        let (a, b) = &out[0];
        let e = rel_to_scale("rmsnorm backward matches the reference", a, b)
            * b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30)
            / terms;
        assert!(e < 1e-5, "dinp ({rows}, {dim}): {e}");
        worst = worst.max(e);
        let e = rel_to_scale("rmsnorm backward matches the reference", &out[1].0, &out[1].1);
        assert!(e < 1e-5, "dweight ({rows}, {dim}): {e}");
        worst = worst.max(e);
    }
    eprintln!("rmsnorm_backward worst relative error {worst:e}");
}

#[test]
fn swiglu_backward_matches_the_reference() {
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(12);
    for len in [1usize, 63, 65, 1000] {
        // Gates past +-20 take the sigmoid's two branches far out.
        let gate: Vec<f32> = rng.normal_vec(len, 8.0);
        let (up, dout) = (rng.normal_vec(len, 1.0), rng.normal_vec(len, 1.0));
        let out = on_both!(
            g,
            r,
            |be, ins, outs| {
                let (a, b) = outs.split_at_mut(1);
                be.swiglu_backward(&mut a[0], &mut b[0], &ins[0], &ins[1], &ins[2]).unwrap()
            },
            [dout, gate, up],
            [vec![0.0; len], vec![0.0; len]]
        );
        for (name, (a, b)) in ["dgate", "dup"].iter().zip(&out) {
            assert!(
                rel_to_scale("swiglu backward matches the reference", a, b) < 1e-5,
                "{name} {len}: {}",
                rel_to_scale("swiglu backward matches the reference", a, b)
            );
        }
    }
}

#[test]
fn attention_backward_matches_the_reference() {
    use rusting_brain_core::backend::AttentionSpec;
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(13);
    let mut worst = 0.0f32;
    // (batch, q_len, kv_len, kv_capacity, q_heads, kv_heads, head_dim): one position; GQA;
    // a query block after cached keys with spare capacity; more than one 64-key tile; a
    // head size over 64 and over 128 (each thread holds several dimensions).
    for (batch, q_len, kv_len, kv_capacity, q_heads, kv_heads, head_dim) in [
        (1, 1, 1, 1, 1, 1, 1),
        (2, 7, 7, 7, 4, 2, 8),
        (1, 3, 10, 12, 3, 1, 5),
        (1, 70, 70, 70, 2, 2, 16),
        (2, 5, 9, 9, 2, 1, 130),
        (1, 4, 4, 4, 2, 2, 200),
    ] {
        let spec = AttentionSpec { batch, q_len, kv_len, kv_capacity, q_heads, kv_heads, head_dim };
        let (nq, nkv, nl) = spec.check("test").unwrap();
        let q = rng.normal_vec(nq, 1.0);
        let k = rng.normal_vec(nkv, 1.0);
        let v = rng.normal_vec(nkv, 1.0);
        let dout = rng.normal_vec(nq, 1.0);
        let (mut o, mut lse) = (vec![0.0; nq], vec![0.0; nl]);
        rusting_brain_core::ops::attention::attention_forward(&mut o, &mut lse, &q, &k, &v, &spec).unwrap();
        let out = on_both!(
            g,
            r,
            |be, ins, outs| {
                let (a, rest) = outs.split_at_mut(1);
                let (b, c) = rest.split_at_mut(1);
                be.attention_backward(
                    &mut a[0], &mut b[0], &mut c[0], &ins[0], &ins[1], &ins[2], &ins[3], &ins[4], &ins[5],
                    &spec,
                )
                .unwrap()
            },
            [dout, q, k, v, o, lse],
            [vec![0.0; nq], vec![0.0; nkv], vec![0.0; nkv]]
        );
        for (name, (a, b)) in ["dq", "dk", "dv"].iter().zip(&out) {
            let e = rel_to_scale("attention backward matches the reference", a, b);
            assert!(e < 1e-5, "{name} {spec:?}: {e}");
            worst = worst.max(e);
        }
    }
    eprintln!("attention_backward worst relative error {worst:e}");
}

#[test]
fn attention_forward_matches_the_reference_on_training_shapes() {
    use rusting_brain_core::backend::AttentionSpec;
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(14);
    for spec in [AttentionSpec::causal(3, 7, 4, 2, 8), AttentionSpec::causal(1, 70, 2, 1, 130)] {
        let (nq, nkv, nl) = spec.check("test").unwrap();
        let out = on_both!(
            g,
            r,
            |be, ins, outs| {
                let (a, b) = outs.split_at_mut(1);
                be.attention_forward(&mut a[0], &mut b[0], &ins[0], &ins[1], &ins[2], &spec).unwrap()
            },
            [rng.normal_vec(nq, 1.0), rng.normal_vec(nkv, 1.0), rng.normal_vec(nkv, 1.0)],
            [vec![0.0; nq], vec![0.0; nl]]
        );
        for (name, (a, b)) in ["out", "lse"].iter().zip(&out) {
            assert!(
                rel_to_scale("attention forward matches the reference on training shapes", a, b) < 1e-5,
                "{name} {spec:?}: {}",
                rel_to_scale("attention forward matches the reference on training shapes", a, b)
            );
        }
    }
}

#[test]
fn embedding_forward_and_backward_match_the_reference() {
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(15);
    for (vocab, dim, ids) in [
        (1usize, 1usize, vec![0u32]),
        (7, 33, vec![3, 0, 3, 6, 3, 1]),
        (50, 65, (0..130).map(|i| (i * 7 % 50) as u32).collect()),
    ] {
        let table = rng.normal_vec(vocab * dim, 1.0);
        let out = on_both!(
            g,
            r,
            |be, ins, outs| be.embedding_forward(&mut outs[0], &ins[0], &ids, vocab, dim).unwrap(),
            [table],
            [vec![0.0; ids.len() * dim]]
        );
        assert_eq!(out[0].0, out[0].1, "a lookup copies");
        let dout = rng.normal_vec(ids.len() * dim, 1.0);
        let dtable = rng.normal_vec(vocab * dim, 1.0);
        let out = on_both!(
            g,
            r,
            |be, ins, outs| be.embedding_backward(&mut outs[0], &ins[0], &ids, vocab, dim).unwrap(),
            [dout],
            [dtable]
        );
        // Each id's rows are added in position order, as the reference adds them.
        assert!(
            rel_to_scale("embedding forward and backward match the reference", &out[0].0, &out[0].1) < 1e-6,
            "embedding_backward {vocab} x {dim}"
        );
    }
    let mut t = g.upload(&[0.0; 4]).unwrap();
    let x = g.upload(&[0.0; 2]).unwrap();
    let e = g.embedding_backward(&mut t, &x, &[2], 2, 2).unwrap_err().to_string();
    assert!(e.contains('2'), "{e}");
}

#[test]
fn cross_entropy_matches_the_reference_with_masks_and_gradients() {
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(16);
    for (&rows, vocab) in ROWS[..5].iter().zip([1usize, 5, 64, 65, 1000]) {
        let logits = rng.normal_vec(rows * vocab, 3.0);
        let targets: Vec<u32> = (0..rows).map(|i| (i * 13 % vocab) as u32).collect();
        let mask: Vec<bool> = (0..rows).map(|i| i % 3 != 1).collect();
        for (grad, mask) in [(None, None), (Some(0.25f32), Some(&mask[..])), (Some(1.0), None)] {
            let mut sums = Vec::new();
            let out = on_both!(
                g,
                r,
                |be, _ins, outs| sums
                    .push(be.cross_entropy(&mut outs[0], &targets, mask, rows, vocab, grad).unwrap()),
                Vec::<Vec<f32>>::new(),
                [logits.clone()]
            );
            let (a, b) = (sums[0], sums[1]);
            assert_eq!(a.count, b.count);
            assert!(
                (a.loss_sum - b.loss_sum).abs() <= 1e-5 * b.loss_sum.abs().max(1.0),
                "loss ({rows}, {vocab}): {} vs {}",
                a.loss_sum,
                b.loss_sum
            );
            assert!(
                rel_to_scale(
                    "cross entropy matches the reference with masks and gradients",
                    &out[0].0,
                    &out[0].1
                ) < 1e-5,
                "gradient ({rows}, {vocab})"
            );
        }
    }
    let mut l = g.upload(&[0.0; 4]).unwrap();
    let e = g.cross_entropy(&mut l, &[0, 9], None, 2, 2, None).unwrap_err().to_string();
    assert!(e.contains('9'), "{e}");
}

#[test]
fn moe_combine_and_backward_match_the_reference() {
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(17);
    for (n, top_k, dim) in [(1usize, 1usize, 1usize), (5, 2, 33), (70, 3, 65)] {
        let slots = n * top_k;
        // A permutation of the rows, as grouping by expert makes one.
        let mut row_of_slot: Vec<u32> = (0..slots as u32).collect();
        for i in (1..slots).rev() {
            row_of_slot.swap(i, (i * 7 + 3) % (i + 1));
        }
        let weight: Vec<f32> = rng.normal_vec(slots, 1.0);
        let y = rng.normal_vec(slots * dim, 1.0);
        let out0 = rng.normal_vec(n * dim, 1.0);
        let out = on_both!(
            g,
            r,
            |be, ins, outs| be.moe_combine(&mut outs[0], &ins[0], &row_of_slot, &weight, top_k, dim).unwrap(),
            [y.clone()],
            [out0]
        );
        assert!(
            rel_to_scale("moe combine and backward match the reference", &out[0].0, &out[0].1) < 1e-6,
            "moe_combine ({n}, {top_k}, {dim})"
        );
        let dout = rng.normal_vec(n * dim, 1.0);
        let mut dweights = Vec::new();
        let out = on_both!(
            g,
            r,
            |be, ins, outs| dweights.push(
                be.moe_combine_backward(&mut outs[0], &ins[0], &ins[1], &row_of_slot, &weight, top_k, dim)
                    .unwrap()
            ),
            [dout, y],
            [vec![0.0; slots * dim]]
        );
        assert!(
            rel_to_scale("moe combine and backward match the reference", &out[0].0, &out[0].1) < 1e-6,
            "dy ({n}, {top_k}, {dim})"
        );
        assert!(
            rel_to_scale("moe combine and backward match the reference", &dweights[0], &dweights[1]) < 1e-5,
            "dweight ({n}, {top_k}, {dim})"
        );
    }
}

#[test]
fn sum_of_squares_over_many_buffers_reads_back_once() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(18);
    let host: Vec<Vec<f32>> =
        [1usize, 4095, 4096, 4097, 10_000].iter().map(|&n| rng.normal_vec(n, 1.0)).collect();
    let bufs: Vec<_> = host.iter().map(|v| g.upload(v).unwrap()).collect();
    let want: f64 = host.iter().flatten().map(|&v| v as f64 * v as f64).sum();
    let before = g.counters();
    let got = g.sum_of_squares_many(&bufs.iter().collect::<Vec<_>>()).unwrap();
    let spent = g.counters() - before;
    assert!((got - want).abs() <= 1e-6 * want, "{got} vs {want}");
    // One submission for the reductions, one for the read-back of the partial sums.
    assert_eq!(spent.submits, 2, "{spent:?}");
    let mut nan = host[2].clone();
    nan[17] = f32::NAN;
    let b = g.upload(&nan).unwrap();
    assert!(g.sum_of_squares(&b).unwrap().is_nan());
}

#[test]
fn tiled_matmul_matches_the_reference_on_ragged_edges() {
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(19);
    let mut worst = 0.0f32;
    // From 16 columns on the register-tiled kernel runs: tiles of 32 with edges of 1..31.
    for (m, n, k) in [(16usize, 16usize, 1usize), (33, 47, 300), (127, 65, 7), (40, 200, 64)] {
        for (ta, tb, beta, batch) in
            [(false, false, 0.0, 1), (true, false, 1.0, 2), (false, true, 0.5, 1), (true, true, 0.0, 3)]
        {
            let spec = MatmulSpec::new(m, n, k).trans_a(ta).trans_b(tb).alpha(0.75).beta(beta).batch(batch);
            let c = if beta == 0.0 { vec![0.0; batch * m * n] } else { rng.normal_vec(batch * m * n, 1.0) };
            let out = on_both!(
                g,
                r,
                |be, ins, outs| be.matmul(&mut outs[0], &ins[0], &ins[1], &spec).unwrap(),
                [rng.normal_vec(batch * m * k, 1.0), rng.normal_vec(batch * k * n, 1.0)],
                [c]
            );
            let e = rel_to_scale("tiled matmul matches the reference on ragged edges", &out[0].0, &out[0].1);
            assert!(e < 1e-5, "{spec:?}: {e}");
            worst = worst.max(e);
        }
        // A window: the product of rows 3.. of A into rows 2.. of a larger C.
        let spec = MatmulSpec::new(m, n, k).trans_b(true).window(3 * k, 0, 2 * n);
        let out = on_both!(
            g,
            r,
            |be, ins, outs| be.matmul(&mut outs[0], &ins[0], &ins[1], &spec).unwrap(),
            [rng.normal_vec((m + 3) * k, 1.0), rng.normal_vec(n * k, 1.0)],
            [rng.normal_vec((m + 4) * n, 1.0)]
        );
        let e = rel_to_scale("tiled matmul matches the reference on ragged edges", &out[0].0, &out[0].1);
        assert!(e < 1e-5, "window ({m}, {n}, {k}): {e}");
        worst = worst.max(e);
    }
    eprintln!("tiled matmul worst relative error {worst:e}");
}

#[test]
fn bf16_matmul_rounds_its_operands_as_the_reference() {
    use rusting_brain_core::backend::OperandPrecision;
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(23);
    // Both kernels (n under and over the tiled kernel's threshold), transposes and beta.
    for (m, n, k, ta, tb, beta) in [
        (3usize, 5usize, 70usize, false, true, 0.0),
        (33, 47, 300, true, false, 0.5),
        (9, 200, 64, false, false, 1.0),
    ] {
        let spec = MatmulSpec::new(m, n, k).trans_a(ta).trans_b(tb).beta(beta);
        let bf = spec.precision(OperandPrecision::Bf16);
        let (a, b, c) = (rng.normal_vec(m * k, 1.0), rng.normal_vec(k * n, 1.0), rng.normal_vec(m * n, 1.0));
        let out = on_both!(
            g,
            r,
            |be, ins, outs| {
                be.matmul(&mut outs[0], &ins[0], &ins[1], &bf).unwrap();
                be.matmul(&mut outs[1], &ins[0], &ins[1], &spec).unwrap();
            },
            [a, b],
            [c.clone(), c]
        );
        // The same rounded operands summed in the same order in f32: f32 rounding apart.
        let e = rel_to_scale("bf16 matmul rounds its operands as the reference", &out[0].0, &out[0].1);
        assert!(e < 1e-5, "bf16 ({m}, {n}, {k}): {e}");
        // And the rounding happened: bf16 keeps 8 bits of mantissa, so the products move
        // by about 2^-9 of their size against f32's.
        let moved = rel_to_scale("bf16 matmul rounds its operands as the reference", &out[0].0, &out[1].1);
        assert!(moved > 1e-4, "bf16 ({m}, {n}, {k}) equals the f32 product: {moved}");
    }
}

/// The adapter pair: `lora.wgsl`'s one pass (ranks up to 32) and the two GEMMs past it and
/// in the backward pass, on row windows (an expert's run of rows) of longer buffers. The
/// outputs start from random values on both sides, so an element written outside its
/// window, or one left unwritten inside it, differs.
#[test]
fn lora_pair_matches_the_reference_on_windows() {
    use rusting_brain_core::backend::LoraSpec;
    let Some(g) = gpu() else { return };
    let r = ReferenceBackend;
    let mut rng = Rng::new(19);
    for (rows, d_in, d_out, rank, (xo, yo, to)) in [
        (1, 1, 1, 1, (0, 0, 0)),
        (1, 896, 128, 8, (0, 0, 0)),
        (3, 65, 7, 32, (65, 14, 32)),
        (33, 127, 200, 16, (0, 400, 16)),
        (7, 40, 33, 33, (40, 0, 33)),
        (1000, 33, 64, 4, (33, 64, 8)),
    ] {
        let s = LoraSpec::new(rows, d_in, d_out, rank, 1.25).offsets(xo, yo, to);
        let (lx, ly, lt) = (xo + rows * d_in + 3, yo + rows * d_out + 5, to + rows * rank + 2);
        let (x, a, b, dy) = (
            rng.normal_vec(lx, 1.0),
            rng.normal_vec(rank * d_in, 0.3),
            rng.normal_vec(d_out * rank, 0.3),
            rng.normal_vec(ly, 1.0),
        );
        let (y0, t0) = (rng.normal_vec(ly, 1.0), rng.normal_vec(lt, 1.0));
        let out = on_both!(
            g,
            r,
            |be, ins, outs| {
                let (y, t) = outs.split_at_mut(1);
                be.lora_forward(&mut y[0], &mut t[0], &ins[0], &ins[1], &ins[2], &s).unwrap()
            },
            [x.clone(), a.clone(), b.clone()],
            [y0.clone(), t0.clone()]
        );
        let tag = format!("lora {rows}x{d_in}->{d_out} r{rank}");
        for (name, (got, want)) in ["y", "t"].iter().zip(&out) {
            assert!(
                rel_to_scale("lora pair matches the reference on windows", got, want) < 1e-5,
                "{tag} {name}: {}",
                rel_to_scale("lora pair matches the reference on windows", got, want)
            );
        }
        let t = out[1].1.clone();
        let (dx0, da0, db0) =
            (rng.normal_vec(lx, 1.0), rng.normal_vec(rank * d_in, 1.0), rng.normal_vec(d_out * rank, 1.0));
        let back = on_both!(
            g,
            r,
            |be, ins, outs| {
                let (dx, rest) = outs.split_at_mut(1);
                let (da, rest) = rest.split_at_mut(1);
                let (db, dt) = rest.split_at_mut(1);
                be.lora_backward(
                    Some(&mut dx[0]),
                    &mut da[0],
                    &mut db[0],
                    &mut dt[0],
                    &ins[0],
                    &ins[1],
                    &ins[2],
                    &ins[3],
                    &ins[4],
                    &s,
                )
                .unwrap()
            },
            [dy.clone(), x.clone(), t.clone(), a.clone(), b.clone()],
            [dx0.clone(), da0.clone(), db0.clone(), t0.clone()]
        );
        for (name, (got, want)) in ["dx", "dA", "dB", "dt"].iter().zip(&back) {
            assert!(
                rel_to_scale("lora pair matches the reference on windows", got, want) < 1e-4,
                "{tag} {name}: {}",
                rel_to_scale("lora pair matches the reference on windows", got, want)
            );
        }
    }
}

/// The sweep every backend runs (rusting_brain_test_support::sweep). Tolerance 1e-4
/// (relative, plus 1e-4 of the output's rms): lavapipe passes at 1e-5; hardware GPUs'
/// exp, tanh and sqrt are specified to a few ULP and their sums may fuse differently.
#[test]
fn the_shared_backend_sweep_passes_on_wgpu() {
    let Some(g) = gpu() else { return };
    rusting_brain_test_support::backend_sweep(&g, 1e-4);
}
