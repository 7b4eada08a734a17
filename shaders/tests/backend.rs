//! `WgpuBackend` against `ReferenceBackend`, primitive by primitive: the same calls on
//! awkward shapes (1, 3, 7, 33, 127, 1000 rows; widths not multiples of the 8x8 tile or
//! the 64-wide workgroup), the GPU's outputs poisoned with NaN first.
//!
//! Tolerance 1e-5 of the output's scale (1e-4 for the products with k up to 300): the
//! GPU sums in the same order as the reference but may fuse multiply-adds, and its exp,
//! tanh and sqrt are specified to a few ULP. The worst measured values are printed.

use std::sync::Arc;

use rusting_brain_core::backend::{AdamParams, MatmulSpec, SgdParams};
use rusting_brain_core::{Activation, Backend, Loss, ReferenceBackend, Rng};
use rusting_brain_shaders::{Gpu, GpuOptions, ShaderError, WgpuBackend};

fn gpu() -> Option<WgpuBackend> {
    match Gpu::new_blocking(&GpuOptions {
        software: true,
        ..Default::default()
    }) {
        Ok(g) => Some(WgpuBackend::new(Arc::new(g))),
        Err(e @ ShaderError::NoAdapter(_)) if std::env::var("RB_REQUIRE_GPU").as_deref() != Ok("1") => {
            eprintln!("SKIPPED, no GPU adapter here: {e}");
            None
        }
        Err(e) => panic!("the GPU did not open: {e}"),
    }
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(1e-30);
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            assert!(
                x.is_finite() || !y.is_finite(),
                "NaN poison left or non-finite: {x} vs {y}"
            );
            (x - y).abs() / scale
        })
        .fold(0.0, f32::max)
}

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
    for (&m, (n, k)) in ROWS
        .iter()
        .zip([(1usize, 1usize), (5, 9), (13, 300), (33, 17), (10, 64), (3, 7)])
    {
        for (ta, tb, beta, batch) in [
            (false, false, 0.0, 1),
            (true, false, 1.0, 1),
            (false, true, 0.5, 2),
            (true, true, 0.0, 3),
        ] {
            let spec = MatmulSpec::new(m, n, k)
                .trans_a(ta)
                .trans_b(tb)
                .alpha(0.75)
                .beta(beta)
                .batch(batch);
            let a = rng.normal_vec(batch * m * k, 1.0);
            let b = rng.normal_vec(batch * k * n, 1.0);
            let c = if beta == 0.0 {
                vec![0.0; batch * m * n]
            } else {
                rng.normal_vec(batch * m * n, 1.0)
            };
            let out = on_both!(
                g,
                r,
                |be, ins, outs| be.matmul(&mut outs[0], &ins[0], &ins[1], &spec).unwrap(),
                [a, b],
                [c]
            );
            let e = rel(&out[0].0, &out[0].1);
            assert!(e < 1e-4, "{spec:?}: {e}");
            worst = worst.max(e);
        }
    }
    // A window: C's rows 2.. of a larger buffer from A's and B's offsets.
    let spec = MatmulSpec::new(3, 4, 5).window(7, 3, 8);
    let (a, b, c) = (
        rng.normal_vec(30, 1.0),
        rng.normal_vec(30, 1.0),
        rng.normal_vec(24, 1.0),
    );
    let out = on_both!(
        g,
        r,
        |be, ins, outs| be.matmul(&mut outs[0], &ins[0], &ins[1], &spec).unwrap(),
        [a, b],
        [c]
    );
    assert!(rel(&out[0].0, &out[0].1) < 1e-5);
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
    let acts = [
        Activation::Identity,
        Activation::Relu,
        Activation::LeakyRelu(0.1),
        Activation::Sigmoid,
        Activation::Tanh,
        Activation::Softmax,
    ];
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
        worst = worst.max(rel(&out[0].0, &out[0].1));
        let db0 = rng.normal_vec(cols, 1.0);
        let out = on_both!(
            g,
            r,
            |be, ins, outs| be.bias_backward(&mut outs[0], &ins[0], rows, cols).unwrap(),
            [dout.clone()],
            [db0]
        );
        let e = rel(&out[0].0, &out[0].1);
        assert!(e < 1e-4, "bias_backward ({rows}, {cols}): {e}");
        for act in acts {
            let out = on_both!(
                g,
                r,
                |be, ins, outs| {
                    be.activation_forward(act, &mut outs[0], &ins[0], rows, cols)
                        .unwrap();
                    let y = be.download(&outs[0]).unwrap();
                    let y = be.upload(&y).unwrap();
                    be.activation_backward(act, &mut outs[1], &ins[1], &ins[0], &y, rows, cols)
                        .unwrap();
                },
                [x.clone(), dout.clone()],
                [vec![0.0; n], vec![0.0; n]]
            );
            for (i, (a, b)) in out.iter().enumerate() {
                let e = rel(a, b);
                assert!(
                    e < 1e-5,
                    "{act:?} {} ({rows}, {cols}): {e}",
                    ["forward", "backward"][i]
                );
                worst = worst.max(e);
            }
        }
        // Losses on predictions in (0, 1) (the cross-entropies' domain).
        let pred: Vec<f32> = rng
            .normal_vec(n, 1.0)
            .iter()
            .map(|v| 1.0 / (1.0 + (-v).exp()))
            .collect();
        let target: Vec<f32> = rng
            .normal_vec(n, 1.0)
            .iter()
            .map(|v| if *v > 0.0 { 1.0 } else { 0.0 })
            .collect();
        for loss in [
            Loss::MeanSquaredError,
            Loss::BinaryCrossEntropy,
            Loss::CategoricalCrossEntropy,
        ] {
            let out = on_both!(
                g,
                r,
                |be, ins, outs| {
                    be.loss_backward(loss, &mut outs[0], &ins[0], &ins[1], rows, cols)
                        .unwrap();
                    be.fused_output_backward(loss, &mut outs[1], &ins[0], &ins[1], rows, cols)
                        .unwrap();
                },
                [pred.clone(), target.clone()],
                [vec![0.0; n], vec![0.0; n]]
            );
            for (a, b) in &out {
                let e = rel(a, b);
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
            assert!(
                (lg - lr).abs() <= 1e-6 * lr.abs().max(1.0),
                "{loss:?}: {lg} vs {lr}"
            );
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
            assert!(rel(a, b) < 1e-6);
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
                let e = rel(a, b);
                assert!(e < 1e-5, "adam n {n} {hp:?}: {e}");
            }
        }
        for (momentum, nesterov) in [(0.0, false), (0.9, false), (0.9, true)] {
            let hp = SgdParams {
                momentum,
                nesterov,
                weight_decay: 1e-3,
                ..SgdParams::new(0.1)
            };
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
                assert!(rel(a, b) < 1e-5, "sgd n {n} {hp:?}");
            }
        }
    }
}
