//! One sweep of every `Backend` primitive against `ReferenceBackend`, generic over the
//! backend, so the CPU, wgpu and CUDA tests run the same calls on the same awkward shapes
//! (1, 3, 7, 33, 127 wide; every transpose; grouped heads; a decoding cache). Outputs a
//! primitive overwrites start as NaN on the backend under test, so an element it forgets
//! stays NaN and fails; outputs that accumulate start from the same random values on both.
//!
//! Every comparison is `assert_close(.., rtol = tol, atol = tol * rms(reference))`: the
//! reference sums in f64 and rounds once, so the distance is the backend's own f32 error
//! (summation order, fused multiply-adds, its exp), relative to the size of the values;
//! each backend's test states its `tol` and why. Int8 products are compared at the same
//! bound (their integer sums are exact; the float scaling is the only rounding).

use rusting_brain_core::backend::*;
use rusting_brain_core::ops::q8;
use rusting_brain_core::ops::spatial::PatchOrder;
use rusting_brain_core::{Activation, Backend, Loss, ReferenceBackend, Rng, RopeScaling};

use crate::{assert_close, poisoned};

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len().max(1) as f64).sqrt()
}

#[track_caller]
fn close(what: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_close(what, got, want, tol, tol * rms(want) + 1e-30);
}

/// Runs `$body` on `$be` and on the reference: `$i` holds the uploaded `$inputs`, `$o`
/// the outputs uploaded from `$init`; gives `((outputs, value), (outputs, value))`,
/// the backend's first, where `value` is what `$body` returned (unwrapped).
macro_rules! both {
    ($be:expr, $inputs:expr, $init:expr, |$b:ident, $i:ident, $o:ident| $body:expr) => {{
        let inputs: Vec<Vec<f32>> = $inputs;
        let init: Vec<Vec<f32>> = $init;
        let got = {
            let $b = $be;
            let $i: Vec<_> = inputs.iter().map(|x| $b.upload(x).unwrap()).collect();
            #[allow(unused_mut)]
            let mut $o: Vec<_> = init.iter().map(|x| $b.upload(x).unwrap()).collect();
            let value = ($body).unwrap_or_else(|e| panic!("{}: {e}", $b.name()));
            let outs: Vec<Vec<f32>> = $o.iter().map(|x| $b.download(x).unwrap()).collect();
            (outs, value)
        };
        let want = {
            let $b = &ReferenceBackend;
            let $i: Vec<_> = inputs.iter().map(|x| $b.upload(x).unwrap()).collect();
            #[allow(unused_mut)]
            let mut $o: Vec<_> = init.iter().map(|x| $b.upload(x).unwrap()).collect();
            let value = ($body).unwrap();
            let outs: Vec<Vec<f32>> = $o.iter().map(|x| $b.download(x).unwrap()).collect();
            (outs, value)
        };
        (got, want)
    }};
}

/// Every primitive, in the order below; `tol` as the module says.
pub fn backend_sweep<B: Backend>(be: &B, tol: f64) {
    matmul(be, tol);
    dense(be, tol);
    transformer(be, tol);
    attention(be, tol);
    lookups_and_losses(be, tol);
    int8(be, tol);
    optimizers(be, tol);
    image(be, tol);
}

pub fn matmul<B: Backend>(be: &B, tol: f64) {
    let mut rng = Rng::new(200);
    for (m, n, k) in [(1, 1, 1), (3, 7, 33), (33, 5, 127), (64, 64, 64)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for (alpha, beta) in [(1.0, 0.0), (0.5, 1.0)] {
                let spec = MatmulSpec::new(m, n, k).trans_a(ta).trans_b(tb).alpha(alpha).beta(beta);
                let init = if beta == 0.0 { poisoned(m * n) } else { rng.normal_vec(m * n, 1.0) };
                let (got, want) = both!(
                    be,
                    vec![rng.normal_vec(m * k, 1.0), rng.normal_vec(k * n, 1.0)],
                    vec![init],
                    |b, i, o| b.matmul(&mut o[0], &i[0], &i[1], &spec)
                );
                close(
                    &format!("{} matmul {m}x{n}x{k} ta={ta} tb={tb} beta={beta}", be.name()),
                    &got.0[0],
                    &want.0[0],
                    tol,
                );
            }
        }
    }
    let (m, n, k, batch) = (7, 33, 3, 3);
    let spec = MatmulSpec::new(m, n, k).trans_b(true).batch(batch);
    let (got, want) = both!(
        be,
        vec![rng.normal_vec(batch * m * k, 1.0), rng.normal_vec(batch * k * n, 1.0)],
        vec![poisoned(batch * m * n)],
        |b, i, o| b.matmul(&mut o[0], &i[0], &i[1], &spec)
    );
    close(&format!("{} batched matmul", be.name()), &got.0[0], &want.0[0], tol);
}

pub fn dense<B: Backend>(be: &B, tol: f64) {
    let mut rng = Rng::new(201);
    for (rows, cols) in [(1, 1), (3, 7), (33, 127)] {
        let n = rows * cols;
        let x = rng.normal_vec(n, 3.0);
        let (got, want) = both!(be, vec![rng.normal_vec(cols, 1.0)], vec![x.clone()], |b, i, o| b
            .add_bias(&mut o[0], &i[0], rows, cols));
        close(&format!("{} add_bias {rows}x{cols}", be.name()), &got.0[0], &want.0[0], tol);
        let (got, want) =
            both!(be, vec![rng.normal_vec(n, 1.0)], vec![rng.normal_vec(cols, 1.0)], |b, i, o| b
                .bias_backward(&mut o[0], &i[0], rows, cols));
        close(&format!("{} bias_backward {rows}x{cols}", be.name()), &got.0[0], &want.0[0], tol);
        for act in Activation::every(0.01) {
            let (got, want) = both!(be, vec![x.clone()], vec![poisoned(n)], |b, i, o| b
                .activation_forward(act, &mut o[0], &i[0], rows, cols));
            close(&format!("{} {act:?} forward {rows}x{cols}", be.name()), &got.0[0], &want.0[0], tol);
            let y = want.0[0].clone();
            let (got, want) =
                both!(be, vec![rng.normal_vec(n, 1.0), x.clone(), y], vec![poisoned(n)], |b, i, o| b
                    .activation_backward(act, &mut o[0], &i[0], &i[1], &i[2], rows, cols));
            close(&format!("{} {act:?} backward {rows}x{cols}", be.name()), &got.0[0], &want.0[0], tol);
        }
        let pred: Vec<f32> = (0..n).map(|_| rng.uniform(0.05, 0.95) as f32).collect();
        let target: Vec<f32> = (0..n).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
        for loss in [Loss::MeanSquaredError, Loss::BinaryCrossEntropy, Loss::CategoricalCrossEntropy] {
            let (got, want) = both!(be, vec![pred.clone(), target.clone()], vec![poisoned(n)], |b, i, o| {
                let value = b.loss_forward(loss, &i[0], &i[1], rows, cols);
                b.loss_backward(loss, &mut o[0], &i[0], &i[1], rows, cols).and(value)
            });
            close(
                &format!("{} {loss:?} value {rows}x{cols}", be.name()),
                &[got.1 as f32],
                &[want.1 as f32],
                tol,
            );
            close(&format!("{} {loss:?} gradient {rows}x{cols}", be.name()), &got.0[0], &want.0[0], tol);
            let (got, want) = both!(be, vec![pred.clone(), target.clone()], vec![poisoned(n)], |b, i, o| b
                .fused_output_backward(loss, &mut o[0], &i[0], &i[1], rows, cols));
            close(
                &format!("{} {loss:?} fused gradient {rows}x{cols}", be.name()),
                &got.0[0],
                &want.0[0],
                tol,
            );
        }
    }
}

pub fn transformer<B: Backend>(be: &B, tol: f64) {
    let mut rng = Rng::new(202);
    for (rows, dim) in [(1, 1), (3, 7), (33, 127)] {
        let n = rows * dim;
        let (x, w, dy) = (rng.normal_vec(n, 1.0), rng.normal_vec(dim, 1.0), rng.normal_vec(n, 1.0));
        let (got, want) =
            both!(be, vec![x.clone(), w.clone()], vec![poisoned(n), poisoned(rows)], |b, i, o| {
                let (y, r) = o.split_at_mut(1);
                b.rmsnorm_forward(&mut y[0], &mut r[0], &i[0], &i[1], rows, dim, 1e-5)
            });
        close(&format!("{} rmsnorm out {rows}x{dim}", be.name()), &got.0[0], &want.0[0], tol);
        close(&format!("{} rmsnorm rstd {rows}x{dim}", be.name()), &got.0[1], &want.0[1], tol);
        let rstd = want.0[1].clone();
        // dim 1 cancels (w * eps / (x^2 + eps) as a difference of O(w) terms): compare
        // the input gradient on the scale of those terms.
        let (got, want) = both!(
            be,
            vec![dy.clone(), x.clone(), w.clone(), rstd],
            vec![poisoned(n), rng.normal_vec(dim, 1.0)],
            |b, i, o| {
                let (dx, dw) = o.split_at_mut(1);
                b.rmsnorm_backward(&mut dx[0], &mut dw[0], &i[0], &i[1], &i[2], &i[3], rows, dim)
            }
        );
        let scale = rms(&dy) * rms(&w) + rms(&want.0[0]);
        assert_close(
            &format!("{} rmsnorm dinp {rows}x{dim}", be.name()),
            &got.0[0],
            &want.0[0],
            tol,
            tol * scale,
        );
        close(&format!("{} rmsnorm dweight {rows}x{dim}", be.name()), &got.0[1], &want.0[1], tol);
        let (got, want) = both!(be, vec![x.clone()], vec![poisoned(n)], |b, i, o| b
            .softmax_forward(&mut o[0], &i[0], rows, dim));
        close(&format!("{} softmax {rows}x{dim}", be.name()), &got.0[0], &want.0[0], tol);
        let y = want.0[0].clone();
        let (got, want) = both!(be, vec![dy.clone(), y], vec![poisoned(n)], |b, i, o| b
            .softmax_backward(&mut o[0], &i[0], &i[1], rows, dim));
        close(&format!("{} softmax backward {rows}x{dim}", be.name()), &got.0[0], &want.0[0], tol);
        let (g, u) = (rng.normal_vec(n, 2.0), rng.normal_vec(n, 1.0));
        let (got, want) = both!(be, vec![g.clone(), u.clone()], vec![poisoned(n)], |b, i, o| b
            .swiglu_forward(&mut o[0], &i[0], &i[1]));
        close(&format!("{} swiglu {n}", be.name()), &got.0[0], &want.0[0], tol);
        let (got, want) = both!(be, vec![dy.clone(), g, u], vec![poisoned(n), poisoned(n)], |b, i, o| {
            let (dg, du) = o.split_at_mut(1);
            b.swiglu_backward(&mut dg[0], &mut du[0], &i[0], &i[1], &i[2])
        });
        close(&format!("{} swiglu dgate {n}", be.name()), &got.0[0], &want.0[0], tol);
        close(&format!("{} swiglu dup {n}", be.name()), &got.0[1], &want.0[1], tol);
    }
    let llama3 = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 64,
    };
    for scaling in [RopeScaling::None, RopeScaling::Linear { factor: 4.0 }, llama3] {
        for (batch, seq, heads, head_dim, pos_offset) in
            [(1, 1, 1, 2, 0), (2, 5, 3, 10, 7), (1, 9, 2, 64, 50)]
        {
            let spec = RopeSpec { batch, seq, heads, head_dim, pos_offset, theta: 10_000.0, scaling };
            let x = rng.normal_vec(batch * seq * heads * head_dim, 1.0);
            let (got, want) = both!(be, vec![], vec![x.clone()], |b, _i, o| b.rope_forward(&mut o[0], &spec));
            close(&format!("{} rope {spec:?}", be.name()), &got.0[0], &want.0[0], tol);
            let (got, want) = both!(be, vec![], vec![x], |b, _i, o| b.rope_backward(&mut o[0], &spec));
            close(&format!("{} rope backward {spec:?}", be.name()), &got.0[0], &want.0[0], tol);
        }
    }
}

pub fn attention<B: Backend>(be: &B, tol: f64) {
    let mut rng = Rng::new(203);
    let spec = |batch, q_len, kv_len, kv_capacity, q_heads, kv_heads, head_dim| AttentionSpec {
        batch,
        q_len,
        kv_len,
        kv_capacity,
        q_heads,
        kv_heads,
        head_dim,
    };
    // Several sequences' query rows over their own caches (a decode step over several
    // requests): two caches of spare capacity, one sequence with two rows.
    {
        let rs = spec(1, 1, 1, 6, 4, 2, 16);
        let (qd, kvd) = (4 * 16, 2 * 16);
        let rows = [(0, 2), (1, 5), (0, 4)];
        let inputs = vec![
            rng.normal_vec(3 * qd, 1.0),
            rng.normal_vec(6 * kvd, 1.0),
            rng.normal_vec(6 * kvd, 1.0),
            rng.normal_vec(6 * kvd, 1.0),
            rng.normal_vec(6 * kvd, 1.0),
        ];
        let (got, want) =
            both!(be, inputs, vec![poisoned(3 * qd), poisoned(qd), poisoned(qd), poisoned(4)], |b, i, o| {
                let (out, rest) = o.split_at_mut(1);
                let (q1, rest) = rest.split_at_mut(1);
                let (att, lse) = rest.split_at_mut(1);
                let caches = [(&i[1], &i[2]), (&i[3], &i[4])];
                b.attention_rows(AttentionRows {
                    out: &mut out[0],
                    q: &i[0],
                    caches: &caches,
                    rows: &rows,
                    spec: rs,
                    scratch: [&mut q1[0], &mut att[0], &mut lse[0]],
                })
            });
        close(&format!("{} attention_rows", be.name()), &got.0[0], &want.0[0], tol);
    }
    // Training shapes, grouped heads, a head size not a multiple of 32, decoding rows over
    // a cache with spare capacity.
    for s in [
        spec(1, 1, 1, 1, 1, 1, 8),
        spec(2, 7, 7, 7, 4, 2, 16),
        spec(1, 33, 33, 33, 2, 2, 33),
        spec(1, 3, 20, 24, 2, 1, 32),
    ] {
        let (nq, nkv, nl) = s.check("sweep").unwrap();
        let (q, k, v) = (rng.normal_vec(nq, 1.0), rng.normal_vec(nkv, 1.0), rng.normal_vec(nkv, 1.0));
        let (got, want) =
            both!(be, vec![q.clone(), k.clone(), v.clone()], vec![poisoned(nq), poisoned(nl)], |b, i, o| {
                let (out, lse) = o.split_at_mut(1);
                b.attention_forward(&mut out[0], &mut lse[0], &i[0], &i[1], &i[2], &s)
            });
        close(&format!("{} attention out {s:?}", be.name()), &got.0[0], &want.0[0], tol);
        close(&format!("{} attention lse {s:?}", be.name()), &got.0[1], &want.0[1], tol);
        let (out, lse) = (want.0[0].clone(), want.0[1].clone());
        let (got, want) = both!(
            be,
            vec![rng.normal_vec(nq, 1.0), q, k, v, out, lse],
            vec![poisoned(nq), poisoned(nkv), poisoned(nkv)],
            |b, i, o| {
                let (dq, rest) = o.split_at_mut(1);
                let (dk, dv) = rest.split_at_mut(1);
                b.attention_backward(
                    &mut dq[0], &mut dk[0], &mut dv[0], &i[0], &i[1], &i[2], &i[3], &i[4], &i[5], &s,
                )
            }
        );
        // A gradient is a difference of O(1) terms (unit-normal inputs) that cancel
        // exactly for a single key: bound it on the scale of those terms.
        for (j, name) in ["dq", "dk", "dv"].iter().enumerate() {
            let (g, w) = (&got.0[j], &want.0[j]);
            assert_close(&format!("{} attention {name} {s:?}", be.name()), g, w, tol, tol * (rms(w) + 1.0));
        }
    }
}

pub fn lookups_and_losses<B: Backend>(be: &B, tol: f64) {
    let mut rng = Rng::new(204);
    for (vocab, dim, ids) in [(5usize, 1usize, vec![0u32]), (11, 33, vec![3, 3, 0, 10, 3, 7, 0])] {
        let rows = ids.len();
        let (got, want) =
            both!(be, vec![rng.normal_vec(vocab * dim, 1.0)], vec![poisoned(rows * dim)], |b, i, o| b
                .embedding_forward(&mut o[0], &i[0], &ids, vocab, dim));
        close(&format!("{} embedding {vocab}x{dim}", be.name()), &got.0[0], &want.0[0], tol);
        let (got, want) = both!(
            be,
            vec![rng.normal_vec(rows * dim, 1.0)],
            vec![rng.normal_vec(vocab * dim, 1.0)],
            |b, i, o| b.embedding_backward(&mut o[0], &i[0], &ids, vocab, dim)
        );
        close(&format!("{} embedding backward {vocab}x{dim}", be.name()), &got.0[0], &want.0[0], tol);
    }
    for (rows, vocab) in [(1, 1), (5, 33), (7, 300)] {
        let targets: Vec<u32> = (0..rows).map(|r| (r * 7 % vocab) as u32).collect();
        let mask: Vec<bool> = (0..rows).map(|r| r % 3 != 1).collect();
        let (got, want) = both!(be, vec![], vec![rng.normal_vec(rows * vocab, 3.0)], |b, _i, o| b
            .cross_entropy(&mut o[0], &targets, Some(&mask), rows, vocab, Some(0.5)));
        close(
            &format!("{} cross_entropy loss {rows}x{vocab}", be.name()),
            &[got.1.loss_sum as f32],
            &[want.1.loss_sum as f32],
            tol,
        );
        assert_eq!(got.1.count, want.1.count, "{} cross_entropy count", be.name());
        close(&format!("{} cross_entropy gradient {rows}x{vocab}", be.name()), &got.0[0], &want.0[0], tol);
    }
    for (n, top_k, dim) in [(1usize, 1usize, 1usize), (5, 2, 33)] {
        let slots = n * top_k;
        let row_of_slot: Vec<u32> = (0..slots).map(|s| ((s * 7 + 3) % slots) as u32).collect();
        let weight: Vec<f32> = (0..slots).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
        let y = rng.normal_vec(slots * dim, 1.0);
        let (got, want) = both!(be, vec![y.clone()], vec![rng.normal_vec(n * dim, 1.0)], |b, i, o| b
            .moe_combine(&mut o[0], &i[0], &row_of_slot, &weight, top_k, dim));
        close(&format!("{} moe_combine {n}x{top_k}x{dim}", be.name()), &got.0[0], &want.0[0], tol);
        let (got, want) =
            both!(be, vec![rng.normal_vec(n * dim, 1.0), y], vec![poisoned(slots * dim)], |b, i, o| b
                .moe_combine_backward(&mut o[0], &i[0], &i[1], &row_of_slot, &weight, top_k, dim));
        close(&format!("{} moe_combine dy {n}x{top_k}x{dim}", be.name()), &got.0[0], &want.0[0], tol);
        close(&format!("{} moe_combine dweight {n}x{top_k}x{dim}", be.name()), &got.1, &want.1, tol);
    }
}

pub fn int8<B: Backend>(be: &B, tol: f64) {
    let mut rng = Rng::new(205);
    // Per-row weights (int8 files before blocks) and blocks of 32: a partial last block
    // (k = 67), whole 64-byte steps (k = 128), a step and a half (k = 96), decode and
    // batches, sixteen-row passes and their tails.
    let shapes = [(1usize, 1usize, 1usize), (3, 5, 7), (9, 40, 67), (1, 33, 96), (6, 17, 128)];
    for ((m, n, k), blocked) in shapes.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        let w = rng.normal_vec(n * k, 1.0);
        let (packed, scales) =
            if blocked { q8::quantize_blocks(&w, n, k) } else { q8::quantize_rows(&w, n, k) }.unwrap();
        let spec = MatmulSpec::new(m, n, k).trans_b(true);
        let (got, want) = both!(
            be,
            vec![rng.normal_vec(m * k, 2.0), packed.clone(), scales.clone()],
            vec![poisoned(m * n)],
            |b, i, o| b.q8_matmul(&mut o[0], &i[0], &i[1], &i[2], &spec)
        );
        close(&format!("{} q8_matmul {m}x{n}x{k}", be.name()), &got.0[0], &want.0[0], tol);
        let ids: Vec<u32> = (0..m).map(|i| (i * 3 % n) as u32).collect();
        let (got, want) = both!(be, vec![packed, scales], vec![poisoned(m * k)], |b, i, o| b
            .q8_embedding(&mut o[0], &i[0], &i[1], &ids, n, k));
        close(&format!("{} q8_embedding {m}x{n}x{k}", be.name()), &got.0[0], &want.0[0], tol);
    }
}

pub fn optimizers<B: Backend>(be: &B, tol: f64) {
    let mut rng = Rng::new(206);
    for n in [1usize, 33, 1000] {
        let (p, g) = (rng.normal_vec(n, 1.0), rng.normal_vec(n, 0.1));
        let v: Vec<f32> = rng.normal_vec(n, 0.001).iter().map(|x| x.abs()).collect();
        for decoupled in [true, false] {
            let hp = AdamParams {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
                decoupled,
                grad_scale: 0.5,
            };
            let (got, want) =
                both!(be, vec![g.clone()], vec![p.clone(), rng.normal_vec(n, 0.01), v.clone()], |b, i, o| {
                    let (param, rest) = o.split_at_mut(1);
                    let (m, v) = rest.split_at_mut(1);
                    b.adam_update(&mut param[0], &i[0], &mut m[0], &mut v[0], &hp, 3)
                });
            for (j, name) in ["param", "m", "v"].iter().enumerate() {
                close(
                    &format!("{} adam {name} n={n} decoupled={decoupled}", be.name()),
                    &got.0[j],
                    &want.0[j],
                    tol,
                );
            }
        }
        for (momentum, nesterov) in [(0.0f32, false), (0.9, true)] {
            let hp = SgdParams { lr: 0.1, momentum, nesterov, weight_decay: 0.01, grad_scale: 2.0 };
            let (got, want) =
                both!(be, vec![g.clone()], vec![p.clone(), rng.normal_vec(n, 0.1)], |b, i, o| {
                    let (param, vel) = o.split_at_mut(1);
                    b.sgd_update(&mut param[0], &i[0], (momentum > 0.0).then_some(&mut vel[0]), &hp)
                });
            close(&format!("{} sgd param n={n} momentum={momentum}", be.name()), &got.0[0], &want.0[0], tol);
            close(
                &format!("{} sgd velocity n={n} momentum={momentum}", be.name()),
                &got.0[1],
                &want.0[1],
                tol,
            );
        }
        let (got, want) =
            both!(be, vec![p.clone(), g.clone()], vec![], |b, i, _o| b.sum_of_squares_many(&[&i[0], &i[1]]));
        close(&format!("{} sum_of_squares_many n={n}", be.name()), &[got.1 as f32], &[want.1 as f32], tol);
    }
}

/// The image models' and encoders' primitives (inference only). Shapes that cross each
/// CPU kernel's internal tiling: a convolution whose columns take several bands, attention
/// over several query blocks with a mask, a bias and grouped heads.
pub fn image<B: Backend>(be: &B, tol: f64) {
    let mut rng = Rng::new(207);
    let conv =
        |b, cin, cout, h, w, k: (usize, usize), s: (usize, usize), p: (usize, usize), d, g| Conv2dSpec {
            batch: b,
            in_channels: cin,
            out_channels: cout,
            height: h,
            width: w,
            kernel: k,
            stride: s,
            padding: p,
            pad_end: (0, 0),
            dilation: (d, d),
            groups: g,
            precision: OperandPrecision::F32,
        };
    // Each at f32 and in mixed precision (bf16 operands, f32 sums: the CPU's BF16 GEMM
    // where the CPU has AVX512_BF16).
    for precision in [OperandPrecision::F32, OperandPrecision::Bf16] {
        for (spec, bias) in [
            (conv(1, 1, 1, 1, 1, (1, 1), (1, 1), (0, 0), 1, 1), true),
            (conv(2, 3, 5, 7, 9, (3, 3), (1, 1), (1, 1), 1, 1), true),
            (conv(1, 6, 4, 13, 7, (3, 2), (2, 3), (1, 0), 1, 2), false),
            (conv(1, 5, 7, 8, 6, (1, 1), (1, 1), (0, 0), 1, 1), true),
            (conv(1, 4, 4, 9, 9, (3, 3), (1, 1), (2, 2), 2, 4), true),
            // The VAE's downsampler: F.pad(x, (0, 1, 0, 1)), then 3x3 with stride 2.
            (conv(2, 3, 4, 8, 6, (3, 3), (2, 2), (0, 0), 1, 1).pad_end(1), true),
            // 288 column rows of 96: the CPU builds them in three bands of output rows (at
            // f32 a 3x3 of padding 1 over this many pixels is Winograd's, so dilated here).
            (conv(1, 32, 8, 96, 96, (3, 3), (1, 1), (2, 2), 2, 1), true),
            (conv(1, 32, 8, 96, 96, (3, 3), (1, 1), (1, 1), 1, 1), true),
            // 3x3, stride 1, padding 1 over 264 tiles of 2 x 2 (odd sizes: tiles over the
            // edge): the CPU's Winograd F(2x2, 3x3) at f32.
            (conv(2, 5, 7, 23, 21, (3, 3), (1, 1), (1, 1), 1, 1), true),
        ] {
            let spec = spec.precision(precision);
            let (ni, nw, no, _) = spec.check().unwrap();
            let mut inputs = vec![rng.normal_vec(ni, 1.0), rng.normal_vec(nw, 0.2)];
            if bias {
                inputs.push(rng.normal_vec(spec.out_channels, 1.0));
            }
            let (got, want) = both!(be, inputs, vec![poisoned(no)], |b, i, o| b.conv2d(
                &mut o[0],
                &i[0],
                &i[1],
                i.get(2),
                &spec
            ));
            let what = format!("{} conv2d {spec:?}", be.name());
            // A backend may run a large 3x3 convolution of padding 1 as Winograd's F(2x2,
            // 3x3), which in mixed precision rounds the transformed tiles to bf16 rather
            // than the operands (the CPU does from 1024 tiles): near the definition, not its
            // bits. Measured there 4.8e-3 of the outputs' scale at worst (the CPU's
            // `winograd_in_mixed_precision_stays_near`); the definition's own distance from
            // f32 is 2e-3.
            let winograd = spec.kernel == (3, 3)
                && spec.stride == (1, 1)
                && spec.padding == (1, 1)
                && spec.dilation == (1, 1)
                && spec.groups == 1
                && spec.batch * spec.height.div_ceil(2) * spec.width.div_ceil(2) >= 1024;
            if precision == OperandPrecision::Bf16 && winograd {
                let e = crate::rel_to_scale(&what, &got.0[0], &want.0[0]);
                assert!(e <= 8e-3, "{what}: {e:e} of the outputs' scale (bound 8e-3)");
            } else {
                close(&what, &got.0[0], &want.0[0], tol);
            }
        }
    }
    // Int8 convolutions (a UNet at `Precision::Q8`): weights rounded to int8 rows and
    // reordered channels last, each pixel's patch rounded to int8. The CPU's VNNI GEMM
    // takes 32 pixels and more (the first, third and fourth), fewer go through its
    // per-row product.
    for (spec, bias) in [
        (conv(2, 3, 5, 7, 9, (3, 3), (1, 1), (1, 1), 1, 1), true),
        (conv(1, 6, 33, 13, 7, (3, 2), (2, 3), (1, 0), 1, 1), false),
        (conv(1, 5, 7, 8, 6, (1, 1), (1, 1), (0, 0), 1, 1), true),
        (conv(1, 4, 4, 9, 9, (3, 3), (1, 1), (2, 2), 2, 1), true),
        (conv(2, 3, 4, 8, 6, (3, 3), (2, 2), (0, 0), 1, 1).pad_end(1), true),
        (conv(1, 7, 3, 4, 5, (3, 3), (1, 1), (1, 1), 1, 1), true),
    ] {
        let (ni, nw, no, _) = spec.check().unwrap();
        let k = nw / spec.out_channels;
        let (packed, scales) = q8::quantize_rows(&rng.normal_vec(nw, 0.2), spec.out_channels, k).unwrap();
        let packed = rusting_brain_core::ops::conv::q8_weight_channels_last(&packed, &spec).unwrap();
        let mut inputs = vec![rng.normal_vec(ni, 1.0), packed, scales];
        if bias {
            inputs.push(rng.normal_vec(spec.out_channels, 1.0));
        }
        let (got, want) = both!(be, inputs, vec![poisoned(no)], |b, i, o| b.conv2d_q8(
            &mut o[0],
            &i[0],
            &i[1],
            &i[2],
            i.get(3),
            &spec
        ));
        close(&format!("{} conv2d_q8 {spec:?}", be.name()), &got.0[0], &want.0[0], tol);
    }
    // With the ResNets' fused activation too.
    for (batch, channels, spatial, groups, affine, act) in [
        (1, 1, 1, 1, true, None),
        (2, 6, 35, 3, true, Some(Unary::Silu)),
        (1, 64, 1023, 32, false, None),
        (1, 64, 1023, 32, true, Some(Unary::Silu)),
        (3, 8, 1, 2, true, Some(Unary::Gelu)),
    ] {
        let spec = GroupNormSpec { batch, channels, spatial, groups, eps: 1e-6, act };
        let n = batch * channels * spatial;
        let mut inputs = vec![rng.normal_vec(n, 2.0).iter().map(|v| v + 3.0).collect()];
        if affine {
            inputs.push(rng.normal_vec(channels, 1.0));
            inputs.push(rng.normal_vec(channels, 1.0));
        }
        let (got, want) = both!(be, inputs, vec![poisoned(n)], |b, i, o| b.group_norm(
            &mut o[0],
            &i[0],
            i.get(1),
            i.get(2),
            &spec
        ));
        close(&format!("{} group_norm {spec:?}", be.name()), &got.0[0], &want.0[0], tol);
    }
    for (rows, dim, affine) in [(1, 1, true), (7, 33, true), (5, 1280, false)] {
        let n = rows * dim;
        let mut inputs = vec![rng.normal_vec(n, 1.0)];
        if affine {
            inputs.push(rng.normal_vec(dim, 1.0));
            inputs.push(rng.normal_vec(dim, 1.0));
        }
        let (got, want) = both!(be, inputs, vec![poisoned(n)], |b, i, o| b.layer_norm(
            &mut o[0],
            &i[0],
            i.get(1),
            i.get(2),
            rows,
            dim,
            1e-5
        ));
        close(&format!("{} layer_norm ({rows}, {dim})", be.name()), &got.0[0], &want.0[0], tol);
    }
    for op in [Unary::Gelu, Unary::GeluTanh, Unary::QuickGelu, Unary::Silu] {
        for n in [1, 33, 40_000] {
            let (got, want) = both!(be, vec![rng.normal_vec(n, 4.0)], vec![poisoned(n)], |b, i, o| b
                .unary(op, &mut o[0], &i[0]));
            close(&format!("{} {op:?} {n}", be.name()), &got.0[0], &want.0[0], tol);
            let (gate, up) = (rng.normal_vec(n, 4.0), rng.normal_vec(n, 1.0));
            let (got, want) =
                both!(be, vec![gate, up], vec![poisoned(n)], |b, i, o| b.gated(op, &mut o[0], &i[0], &i[1]));
            close(&format!("{} gated {op:?} {n}", be.name()), &got.0[0], &want.0[0], tol);
        }
    }
    let sdpa = |batch, q_len, kv_len, heads, kv_heads, head_dim, causal| {
        SdpaSpec::new(batch, q_len, heads, head_dim).kv_len(kv_len).kv_heads(kv_heads).causal(causal)
    };
    // (spec, masked, biased): one query, cross-attention to 77 tokens over two query
    // blocks of the CPU's 256, three blocks with padding and a bias (T5), causal under a
    // mask (CLIP), grouped heads; heads of 80 and 129 (the CPU's AVX-512 value tiles of 64
    // columns, with tails of 16 and 1) over keys that end inside and at a 64-key panel.
    // At f32 and in mixed precision (the CPU's bf16 tiles where it has AVX512_BF16).
    for precision in [OperandPrecision::F32, OperandPrecision::Bf16] {
        for (spec, masked, biased) in [
            (sdpa(1, 1, 1, 1, 1, 8, false), false, false),
            (sdpa(2, 300, 77, 4, 4, 16, false), true, false),
            (sdpa(1, 530, 530, 2, 2, 33, false).scale(1.0), true, true),
            (sdpa(2, 77, 77, 3, 3, 8, true), true, false),
            (sdpa(1, 70, 40, 6, 2, 32, false), false, true),
            (sdpa(1, 19, 130, 4, 2, 80, false), true, false),
            (sdpa(2, 13, 64, 2, 2, 129, true), false, false),
        ] {
            let spec = spec.precision(precision);
            let nq = spec.batch * spec.q_len * spec.heads * spec.head_dim;
            let nkv = spec.batch * spec.kv_len * spec.kv_heads * spec.head_dim;
            let mut inputs =
                vec![rng.normal_vec(nq, 1.0), rng.normal_vec(nkv, 1.0), rng.normal_vec(nkv, 1.0)];
            if biased {
                inputs.push(rng.normal_vec(spec.heads * spec.q_len * spec.kv_len, 1.0));
            }
            // Each batch row after the first loses a different tail of its keys.
            let mask: Option<Vec<bool>> = masked.then(|| {
                (0..spec.batch * spec.kv_len)
                    .map(|i| i % spec.kv_len < spec.kv_len - (i / spec.kv_len) * 5)
                    .collect()
            });
            let (got, want) = both!(be, inputs, vec![poisoned(nq)], |b, i, o| b.sdpa(
                &mut o[0],
                &i[0],
                &i[1],
                &i[2],
                mask.as_deref(),
                i.get(3),
                &spec
            ));
            let what = format!("{} sdpa {spec:?}", be.name());
            if precision == OperandPrecision::F32 {
                close(&what, &got.0[0], &want.0[0], tol);
            } else {
                // The probabilities are rounded to bf16 on both sides, from exponentials
                // that differ in their last f32 bits (the backend's polynomial, the
                // reference's f64): now and then one lands on the other side of a bf16
                // rounding boundary, moving one key's weight by 1 part in 256 and an output
                // by up to 2^-8 p/sum |v|. Measured worst on these cases 4.4e-4 of the
                // outputs' scale; a wrong pairing, key or scale costs 1e-2 and more.
                let e = crate::rel_to_scale(&what, &got.0[0], &want.0[0]);
                assert!(e <= 2e-3, "{what}: {e:e} of the outputs' scale (bound 2e-3)");
            }
        }
    }
    for (planes, h, w, s) in [(1, 1, 1, 1), (6, 5, 7, 2), (2, 3, 4, 3)] {
        let n = planes * h * w;
        let (got, want) = both!(be, vec![rng.normal_vec(n, 1.0)], vec![poisoned(n * s * s)], |b, i, o| b
            .upsample_nearest2d(&mut o[0], &i[0], planes, h, w, s));
        close(&format!("{} upsample ({planes}, {h}, {w}) x{s}", be.name()), &got.0[0], &want.0[0], tol);
    }
    for order in [PatchOrder::ChannelFirst, PatchOrder::ChannelLast] {
        for (batch, channels, height, width, patch) in
            [(1, 1, 1, 1, 1), (2, 3, 4, 6, 2), (1, 16, 8, 4, 1), (1, 5, 9, 6, 3)]
        {
            let spec = PatchSpec { batch, channels, height, width, patch, order };
            let n = batch * channels * height * width;
            let x = rng.normal_vec(n, 1.0);
            let (got, want) = both!(be, vec![x.clone()], vec![poisoned(n), poisoned(n)], |b, i, o| {
                let (tokens, back) = o.split_at_mut(1);
                b.patchify(&mut tokens[0], &i[0], &spec)
                    .and_then(|_| b.unpatchify(&mut back[0], &tokens[0], &spec))
            });
            close(&format!("{} patchify {spec:?}", be.name()), &got.0[0], &want.0[0], tol);
            // Pure data movement: the round trip gives the input back, bit for bit.
            assert_eq!(got.0[1], x, "{} unpatchify(patchify(x)) {spec:?}", be.name());
            assert_eq!(want.0[1], x, "reference unpatchify(patchify(x)) {spec:?}");
        }
    }
}
