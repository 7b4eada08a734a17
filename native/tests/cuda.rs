//! The CUDA backend (feature `cuda`) against the reference, on a device:
//! - every primitive through `CudaBackend` against `ReferenceBackend` on awkward shapes,
//!   outputs poisoned with NaN first (through `Memory::upload`), FP32 and BF16 paths;
//! - whole models: dense and mixture-of-experts `TransformerLm` logits, then the weights
//!   after 3 AdamW steps, CUDA against CPU in FP32 and in mixed precision; a dense
//!   `Network` trained on both; greedy decoding on both;
//! - the budget and the missing-device errors.
//!
//! Without a CUDA driver and device the device tests are reported as ignored with the
//! reason (a custom harness: libtest cannot decide that at run time), never as passed;
//! the no-device test runs everywhere.
//!
//! Tolerances, relative to the largest reference value of the output (`close`):
//! - FP32 kernels: 1e-5 for element-wise and row-wise ops (summation order, `expf`), 1e-4
//!   for GEMMs over k up to 1000 and attention over up to 300 keys (f32 sums of that many
//!   terms in another order), 1e-4 for whole-model logits (the FP32 bound) and,
//!   per tensor in the L2 sense, for the weights after 3 AdamW steps. Element-wise, Adam
//!   amplifies rounding: an element whose gradient is near zero moves by about the learning
//!   rate in a direction its rounding decides, so the same comparison between the CPU
//!   backend and the f64 reference measures 8.7e-5 (dense) and 7.5e-4 (MoE) element-wise
//!   but 2.5e-6 and 3.2e-5 in the L2 sense, on these very models and steps.
//! - BF16: the GEMM operands are rounded exactly as the reference rounds them, so only the
//!   accumulation order differs: 1e-4. Flash attention also rounds q, k, v and the
//!   probabilities to bf16 (8 bits of mantissa: 4e-3 relative each), against the f32
//!   reference: 2e-2, the BF16 bound, also used for whole-model logits and (L2)
//!   weights.

use libtest_mimic::{Arguments, Failed, Trial};
use rusting_brain::core::backend::*;
use rusting_brain::core::{Activation, Loss, ReferenceBackend, Rng};
use rusting_brain::cuda::{cuda_available, CudaBackend, CudaBuffer};
use rusting_brain::{Dataset, Network, Optimizer, Sampler, TrainConfig, TransformerLm};
use rusting_brain_test_support::check_close;

type R<T = ()> = Result<T, Failed>;
/// A device test: its name and the check it runs.
type Case = (&'static str, fn(&CudaBackend) -> R);

fn fail(m: impl Into<String>) -> Failed {
    m.into().into()
}

fn close(what: &str, got: &[f32], want: &[f32], rel: f64) -> R {
    close_to(what, got, want, rel, 0.0)
}

/// [`close`] with the scale at least `floor`: the size of the terms a result that can
/// cancel to zero is a difference of.
fn close_to(what: &str, got: &[f32], want: &[f32], rel: f64, floor: f64) -> R {
    let scale = want.iter().fold(floor.max(1e-30), |m, &v| m.max((v as f64).abs()));
    // The workspace's one comparison (fails on NaN and on a length mismatch), with the
    // bound absolute: `rel` times the scale.
    let worst = check_close(what, got, want, 0.0, rel * scale).map_err(fail)?;
    eprintln!("  {what}: worst {:.2e} of the scale (tolerance {rel:.0e})", worst * rel);
    Ok(())
}

/// `||got - want|| / ||want||` (L2) within `rel`: for weights after optimizer steps, where
/// Adam turns a rounding-level difference in a near-zero gradient into a difference of
/// about the learning rate in that one element (see the module docs).
fn close_l2(what: &str, got: &[f32], want: &[f32], rel: f64) -> R {
    if got.len() != want.len() {
        return Err(fail(format!("{what}: {} values, want {}", got.len(), want.len())));
    }
    let diff: f64 = got.iter().zip(want).map(|(&g, &w)| (g as f64 - w as f64).powi(2)).sum();
    let norm: f64 = want.iter().map(|&w| (w as f64).powi(2)).sum();
    let r = (diff / norm.max(1e-60)).sqrt();
    eprintln!("  {what}: L2-relative {r:.2e} (tolerance {rel:.0e})");
    if r.is_nan() || r > rel {
        return Err(fail(format!("{what}: L2-relative difference {r:.3e} over {rel}")));
    }
    Ok(())
}

/// One op run on both backends: inputs uploaded to both, outputs compared.
struct Pair<'a> {
    cuda: &'a CudaBackend,
    rng: Rng,
}

impl Pair<'_> {
    fn randn(&mut self, n: usize) -> Vec<f32> {
        self.rng.normal_vec(n, 1.0)
    }
    fn up(&self, x: &[f32]) -> R<CudaBuffer> {
        Ok(self.cuda.upload(x)?)
    }
    fn down(&self, x: &CudaBuffer) -> R<Vec<f32>> {
        Ok(self.cuda.download(x)?)
    }
}

const REF: ReferenceBackend = ReferenceBackend;

fn nan(n: usize) -> Vec<f32> {
    vec![f32::NAN; n]
}

fn primitives_elementwise(c: &CudaBackend) -> R {
    let mut p = Pair { cuda: c, rng: Rng::new(1) };
    for n in [1usize, 7, 1000, 100_003] {
        let (x, y) = (p.randn(n), p.randn(n));
        let (mut yr, mut yg) = (y.clone(), p.up(&y)?);
        REF.axpy(&mut yr, 0.3, &x)?;
        c.axpy(&mut yg, 0.3, &p.up(&x)?)?;
        close("axpy", &p.down(&yg)?, &yr, 1e-6)?;
        c.scale(&mut yg, -2.0)?;
        REF.scale(&mut yr, -2.0)?;
        close("scale", &p.down(&yg)?, &yr, 1e-6)?;
        let s = c.sum_of_squares(&p.up(&x)?)?;
        let want = REF.sum_of_squares(&x)?;
        if (s - want).abs() > 1e-5 * want {
            return Err(fail(format!("sum_of_squares {s} vs {want}")));
        }
        let mut f = p.up(&nan(n))?;
        c.fill(&mut f, 1.5)?;
        close("fill", &p.down(&f)?, &vec![1.5; n], 0.0)?;
        let mut dst = p.up(&nan(n + 5))?;
        c.fill(&mut dst, 0.0)?;
        c.copy_range(&mut dst, 3, &p.up(&x)?, 0, n)?;
        let got = p.down(&dst)?;
        close("copy_range", &got[3..3 + n], &x, 0.0)?;
    }
    let many: Vec<Vec<f32>> = [3usize, 1000, 77_777].iter().map(|&n| p.randn(n)).collect();
    let bufs: Vec<CudaBuffer> = many.iter().map(|m| p.up(m)).collect::<R<_>>()?;
    let refs: Vec<&CudaBuffer> = bufs.iter().collect();
    let got = c.sum_of_squares_many(&refs)?;
    let want: f64 = many.iter().map(|m| REF.sum_of_squares(m).unwrap_or(f64::NAN)).sum();
    if (got - want).abs() > 1e-5 * want {
        return Err(fail(format!("sum_of_squares_many {got} vs {want}")));
    }
    Ok(())
}

fn primitives_matmul(c: &CudaBackend) -> R {
    let mut p = Pair { cuda: c, rng: Rng::new(2) };
    for (m, n, k) in [(1, 1, 1), (3, 7, 33), (127, 33, 1000), (64, 768, 256), (33, 1000, 7)] {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            for prec in [OperandPrecision::F32, OperandPrecision::Bf16] {
                for beta in [0.0f32, 1.0] {
                    let (a, b, c0) = (p.randn(m * k), p.randn(k * n), p.randn(m * n));
                    let spec = MatmulSpec::new(m, n, k)
                        .trans_a(ta)
                        .trans_b(tb)
                        .precision(prec)
                        .beta(beta)
                        .alpha(0.5);
                    let mut want = if beta == 0.0 { nan(m * n) } else { c0.clone() };
                    REF.matmul(&mut want, &a, &b, &spec)?;
                    let mut got = p.up(&if beta == 0.0 { nan(m * n) } else { c0.clone() })?;
                    c.matmul(&mut got, &p.up(&a)?, &p.up(&b)?, &spec)?;
                    close(
                        &format!("matmul {m}x{n}x{k} ta={ta} tb={tb} {prec:?} beta={beta}"),
                        &p.down(&got)?,
                        &want,
                        1e-4,
                    )?;
                }
            }
        }
    }
    // Batched, and windowed into larger buffers (the MoE expert products).
    let (m, n, k, batch) = (5, 9, 13, 3);
    let (a, b) = (p.randn(batch * m * k), p.randn(batch * k * n));
    let spec = MatmulSpec::new(m, n, k).batch(batch);
    let mut want = nan(batch * m * n);
    REF.matmul(&mut want, &a, &b, &spec)?;
    let mut got = p.up(&nan(batch * m * n))?;
    c.matmul(&mut got, &p.up(&a)?, &p.up(&b)?, &spec)?;
    close("batched matmul", &p.down(&got)?, &want, 1e-5)?;
    let (big_a, big_b, big_c) = (p.randn(300), p.randn(400), p.randn(200));
    for prec in [OperandPrecision::F32, OperandPrecision::Bf16] {
        let spec = MatmulSpec::new(4, 6, 10).trans_b(true).window(37, 11, 101).precision(prec).accumulate();
        let mut want = big_c.clone();
        REF.matmul(&mut want, &big_a, &big_b, &spec)?;
        let mut got = p.up(&big_c)?;
        c.matmul(&mut got, &p.up(&big_a)?, &p.up(&big_b)?, &spec)?;
        close(&format!("windowed matmul {prec:?}"), &p.down(&got)?, &want, 1e-5)?;
    }
    // k = 0: C = beta C.
    let c0 = p.randn(12);
    let mut want = c0.clone();
    REF.matmul(&mut want, &vec![], &vec![], &MatmulSpec::new(3, 4, 0).beta(0.5))?;
    let mut got = p.up(&c0)?;
    c.matmul(&mut got, &p.up(&[])?, &p.up(&[])?, &MatmulSpec::new(3, 4, 0).beta(0.5))?;
    close("matmul k=0", &p.down(&got)?, &want, 1e-6)?;
    // A wrong length is the same error as on the host.
    let e = c.matmul(&mut got, &p.up(&[1.0; 5])?, &p.up(&[])?, &MatmulSpec::new(3, 4, 2));
    if e.is_ok() {
        return Err(fail("a short operand was accepted"));
    }
    Ok(())
}

fn primitives_dense(c: &CudaBackend) -> R {
    let mut p = Pair { cuda: c, rng: Rng::new(3) };
    for (rows, cols) in [(1usize, 1usize), (7, 33), (127, 10), (1000, 3)] {
        let n = rows * cols;
        let (x, bias, dy) = (p.randn(n), p.randn(cols), p.randn(n));
        let mut want = x.clone();
        REF.add_bias(&mut want, &bias, rows, cols)?;
        let mut got = p.up(&x)?;
        c.add_bias(&mut got, &p.up(&bias)?, rows, cols)?;
        close("add_bias", &p.down(&got)?, &want, 1e-6)?;
        let mut want = bias.clone();
        REF.bias_backward(&mut want, &dy, rows, cols)?;
        let mut got = p.up(&bias)?;
        c.bias_backward(&mut got, &p.up(&dy)?, rows, cols)?;
        close("bias_backward", &p.down(&got)?, &want, 1e-5)?;
        for act in Activation::every(0.01) {
            let mut out = nan(n);
            REF.activation_forward(act, &mut out, &x, rows, cols)?;
            let mut og = p.up(&nan(n))?;
            c.activation_forward(act, &mut og, &p.up(&x)?, rows, cols)?;
            close(&format!("{act:?} forward"), &p.down(&og)?, &out, 1e-5)?;
            let mut dx = nan(n);
            REF.activation_backward(act, &mut dx, &dy, &x, &out, rows, cols)?;
            let mut dg = p.up(&nan(n))?;
            c.activation_backward(act, &mut dg, &p.up(&dy)?, &p.up(&x)?, &p.up(&out)?, rows, cols)?;
            close(&format!("{act:?} backward"), &p.down(&dg)?, &dx, 1e-5)?;
        }
        let probs: Vec<f32> = x.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
        let target: Vec<f32> = (0..n).map(|i| (i % 3 == 0) as u8 as f32).collect();
        for loss in [Loss::MeanSquaredError, Loss::BinaryCrossEntropy, Loss::CategoricalCrossEntropy] {
            let want = REF.loss_forward(loss, &probs, &target, rows, cols)?;
            let got = c.loss_forward(loss, &p.up(&probs)?, &p.up(&target)?, rows, cols)?;
            if (got - want).abs() > 1e-5 * want.abs().max(1e-3) {
                return Err(fail(format!("{loss:?} forward {got} vs {want}")));
            }
            let mut d = nan(n);
            REF.loss_backward(loss, &mut d, &probs, &target, rows, cols)?;
            let mut dg = p.up(&nan(n))?;
            c.loss_backward(loss, &mut dg, &p.up(&probs)?, &p.up(&target)?, rows, cols)?;
            close(&format!("{loss:?} backward"), &p.down(&dg)?, &d, 1e-5)?;
            let mut d = nan(n);
            REF.fused_output_backward(loss, &mut d, &probs, &target, rows, cols)?;
            let mut dg = p.up(&nan(n))?;
            c.fused_output_backward(loss, &mut dg, &p.up(&probs)?, &p.up(&target)?, rows, cols)?;
            close(&format!("{loss:?} fused backward"), &p.down(&dg)?, &d, 1e-6)?;
        }
    }
    Ok(())
}

fn primitives_transformer(c: &CudaBackend) -> R {
    let mut p = Pair { cuda: c, rng: Rng::new(4) };
    for (rows, dim) in [(1usize, 1usize), (7, 33), (127, 768), (1000, 64)] {
        let n = rows * dim;
        let (x, w, dy) = (p.randn(n), p.randn(dim), p.randn(n));
        let (mut out, mut rstd) = (nan(n), nan(rows));
        REF.rmsnorm_forward(&mut out, &mut rstd, &x, &w, rows, dim, 1e-5)?;
        let (mut og, mut rg) = (p.up(&nan(n))?, p.up(&nan(rows))?);
        let (xg, wg, dyg) = (p.up(&x)?, p.up(&w)?, p.up(&dy)?);
        c.rmsnorm_forward(&mut og, &mut rg, &xg, &wg, rows, dim, 1e-5)?;
        close("rmsnorm out", &p.down(&og)?, &out, 1e-5)?;
        let dw0 = p.randn(dim);
        let (mut dx, mut dw) = (nan(n), dw0.clone());
        REF.rmsnorm_backward(&mut dx, &mut dw, &dy, &x, &w, &rstd, rows, dim)?;
        let (mut dxg, mut dwg) = (p.up(&nan(n))?, p.up(&dw0)?);
        c.rmsnorm_backward(&mut dxg, &mut dwg, &dyg, &xg, &wg, &rg, rows, dim)?;
        // dim 1: dx is a difference of two O(w) terms that cancel (see backend_vs_reference).
        close("rmsnorm dx", &p.down(&dxg)?, &dx, if dim == 1 { 1e-2 } else { 1e-5 })?;
        close("rmsnorm dweight", &p.down(&dwg)?, &dw, 1e-4)?;
        let (mut sm, mut smg) = (nan(n), p.up(&nan(n))?);
        REF.softmax_forward(&mut sm, &x, rows, dim)?;
        c.softmax_forward(&mut smg, &xg, rows, dim)?;
        close("softmax", &p.down(&smg)?, &sm, 1e-5)?;
        let (mut ds, mut dsg) = (nan(n), p.up(&nan(n))?);
        REF.softmax_backward(&mut ds, &dy, &sm, rows, dim)?;
        c.softmax_backward(&mut dsg, &dyg, &p.up(&sm)?, rows, dim)?;
        close("softmax backward", &p.down(&dsg)?, &ds, 1e-5)?;
        let g = p.randn(n);
        let (mut sw, mut swg) = (nan(n), p.up(&nan(n))?);
        REF.swiglu_forward(&mut sw, &g, &x)?;
        c.swiglu_forward(&mut swg, &p.up(&g)?, &xg)?;
        close("swiglu", &p.down(&swg)?, &sw, 1e-5)?;
        let (mut dg, mut du, mut dgg, mut dug) = (nan(n), nan(n), p.up(&nan(n))?, p.up(&nan(n))?);
        REF.swiglu_backward(&mut dg, &mut du, &dy, &g, &x)?;
        c.swiglu_backward(&mut dgg, &mut dug, &dyg, &p.up(&g)?, &xg)?;
        close("swiglu dgate", &p.down(&dgg)?, &dg, 1e-5)?;
        close("swiglu dup", &p.down(&dug)?, &du, 1e-5)?;
    }
    for (batch, seq, heads, head_dim, offset) in [(1, 1, 1, 2, 0), (2, 7, 3, 64, 5), (1, 127, 12, 64, 1000)] {
        let spec = RopeSpec {
            batch,
            seq,
            heads,
            head_dim,
            pos_offset: offset,
            theta: 10000.0,
            scaling: Default::default(),
        };
        let x = p.randn(batch * seq * heads * head_dim);
        let (mut want, mut got) = (x.clone(), p.up(&x)?);
        REF.rope_forward(&mut want, &spec)?;
        c.rope_forward(&mut got, &spec)?;
        close("rope", &p.down(&got)?, &want, 1e-4)?;
        REF.rope_backward(&mut want, &spec)?;
        c.rope_backward(&mut got, &spec)?;
        close("rope backward", &p.down(&got)?, &want, 1e-4)?;
    }
    for (rows, vocab, dim) in [(1usize, 3usize, 1usize), (33, 1000, 7), (300, 32000, 64)] {
        let ids: Vec<u32> = (0..rows).map(|_| p.rng.below(vocab as u64) as u32).collect();
        let table = p.randn(vocab * dim);
        let (mut want, mut got) = (nan(rows * dim), p.up(&nan(rows * dim))?);
        REF.embedding_forward(&mut want, &table, &ids, vocab, dim)?;
        c.embedding_forward(&mut got, &p.up(&table)?, &ids, vocab, dim)?;
        close("embedding", &p.down(&got)?, &want, 0.0)?;
        let dy = p.randn(rows * dim);
        let (mut want, mut got) = (table.clone(), p.up(&table)?);
        REF.embedding_backward(&mut want, &dy, &ids, vocab, dim)?;
        c.embedding_backward(&mut got, &p.up(&dy)?, &ids, vocab, dim)?;
        close("embedding backward", &p.down(&got)?, &want, 1e-6)?;
        let logits: Vec<f32> = p.randn(rows * vocab).iter().map(|v| v * 4.0).collect();
        let mask: Vec<bool> = (0..rows).map(|r| r % 5 != 3).collect();
        let mut want = logits.clone();
        let ws = REF.cross_entropy(&mut want, &ids, Some(&mask), rows, vocab, Some(0.25))?;
        let mut got = p.up(&logits)?;
        let gs = c.cross_entropy(&mut got, &ids, Some(&mask), rows, vocab, Some(0.25))?;
        close("cross-entropy gradient", &p.down(&got)?, &want, 1e-5)?;
        if gs.count != ws.count || (gs.loss_sum - ws.loss_sum).abs() > 1e-5 * ws.loss_sum.abs().max(1.0) {
            return Err(fail(format!("cross-entropy sum {gs:?} vs {ws:?}")));
        }
    }
    Ok(())
}

fn attention_case(c: &CudaBackend, p: &mut Pair, spec: AttentionSpec, rel: f64) -> R {
    let (nq, nkv, nl) = spec.check("test")?;
    let (q, k, v, dout) = (p.randn(nq), p.randn(nkv), p.randn(nkv), p.randn(nq));
    let (mut out, mut lse) = (nan(nq), nan(nl));
    REF.attention_forward(&mut out, &mut lse, &q, &k, &v, &spec)?;
    let (qg, kg, vg) = (p.up(&q)?, p.up(&k)?, p.up(&v)?);
    let (mut og, mut lg) = (p.up(&nan(nq))?, p.up(&nan(nl))?);
    c.attention_forward(&mut og, &mut lg, &qg, &kg, &vg, &spec)?;
    let tag = format!("attention {spec:?} flash={}", c.bf16_attention());
    close(&format!("{tag} out"), &p.down(&og)?, &out, rel)?;
    close(&format!("{tag} lse"), &p.down(&lg)?, &lse, rel)?;
    let (mut dq, mut dk, mut dv) = (nan(nq), nan(nkv), nan(nkv));
    REF.attention_backward(&mut dq, &mut dk, &mut dv, &dout, &q, &k, &v, &out, &lse, &spec)?;
    let (mut dqg, mut dkg, mut dvg) = (p.up(&nan(nq))?, p.up(&nan(nkv))?, p.up(&nan(nkv))?);
    c.attention_backward(
        &mut dqg,
        &mut dkg,
        &mut dvg,
        &p.up(&dout)?,
        &qg,
        &kg,
        &vg,
        &p.up(&out)?,
        &p.up(&lse)?,
        &spec,
    )?;
    // dq and dk are sums of p * (dp - D) with D = sum(p * dp): with one key (or one
    // dominant one) the terms cancel to zero, and what is left is the rounding of
    // |dout| |v| |k| / sqrt(head_dim)-sized terms (bf16 operands in the flash kernels).
    let amax = |x: &[f32]| x.iter().fold(0.0f64, |m, &v| m.max((v as f64).abs()));
    let terms = amax(&dout) * amax(&v) * amax(&q).max(amax(&k)) / (spec.head_dim as f64).sqrt();
    close_to(&format!("{tag} dq"), &p.down(&dqg)?, &dq, rel, terms)?;
    close_to(&format!("{tag} dk"), &p.down(&dkg)?, &dk, rel, terms)?;
    close(&format!("{tag} dv"), &p.down(&dvg)?, &dv, rel)?;
    Ok(())
}

fn primitives_attention(c: &CudaBackend) -> R {
    let mut p = Pair { cuda: c, rng: Rng::new(5) };
    let shapes = [
        AttentionSpec::causal(1, 1, 1, 1, 64),
        AttentionSpec::causal(2, 7, 4, 2, 64),
        AttentionSpec::causal(1, 130, 12, 4, 64),
        AttentionSpec::causal(3, 65, 2, 1, 128),
        AttentionSpec::causal(1, 33, 6, 3, 32),
        // Not a multiple of 32: the FP32 kernels' partly filled lanes.
        AttentionSpec::causal(1, 20, 4, 2, 80),
        // Decoding: 3 new rows after 97 cached, capacity 128.
        AttentionSpec {
            batch: 2,
            q_len: 3,
            kv_len: 100,
            kv_capacity: 128,
            q_heads: 4,
            kv_heads: 2,
            head_dim: 64,
        },
        AttentionSpec {
            batch: 1,
            q_len: 1,
            kv_len: 300,
            kv_capacity: 301,
            q_heads: 2,
            kv_heads: 1,
            head_dim: 128,
        },
    ];
    for flash in [false, true] {
        c.set_bf16_attention(flash);
        for spec in shapes {
            attention_case(
                c,
                &mut p,
                spec,
                if flash && (spec.head_dim == 64 || spec.head_dim == 128) { 2e-2 } else { 1e-4 },
            )?;
        }
    }
    c.set_bf16_attention(false);
    Ok(())
}

fn primitives_moe_q8_optim(c: &CudaBackend) -> R {
    let mut p = Pair { cuda: c, rng: Rng::new(6) };
    let (n, top_k, dim) = (37usize, 2usize, 48usize);
    let slots = n * top_k;
    let mut rows: Vec<u32> = (0..slots as u32).collect();
    p.rng.shuffle(&mut rows);
    let weight: Vec<f32> = (0..slots).map(|_| p.rng.next_f64() as f32).collect();
    let (y, out0, dout) = (p.randn(slots * dim), p.randn(n * dim), p.randn(n * dim));
    let mut want = out0.clone();
    REF.moe_combine(&mut want, &y, &rows, &weight, top_k, dim)?;
    let mut got = p.up(&out0)?;
    c.moe_combine(&mut got, &p.up(&y)?, &rows, &weight, top_k, dim)?;
    close("moe_combine", &p.down(&got)?, &want, 1e-6)?;
    let mut dy = nan(slots * dim);
    let dw = REF.moe_combine_backward(&mut dy, &dout, &y, &rows, &weight, top_k, dim)?;
    let mut dyg = p.up(&nan(slots * dim))?;
    let dwg = c.moe_combine_backward(&mut dyg, &p.up(&dout)?, &p.up(&y)?, &rows, &weight, top_k, dim)?;
    close("moe_combine dy", &p.down(&dyg)?, &dy, 1e-6)?;
    close("moe_combine dweight", &dwg, &dw, 1e-5)?;

    for (m, nn, k) in [(1usize, 5usize, 3usize), (7, 33, 1000), (33, 127, 768)] {
        let w = p.randn(nn * k);
        let (packed, scales) = rusting_brain::core::ops::q8::quantize_rows(&w, nn, k)?;
        let x = p.randn(m * k);
        let spec = MatmulSpec::new(m, nn, k).trans_b(true);
        let mut want = nan(m * nn);
        REF.q8_matmul(&mut want, &x, &packed, &scales, &spec)?;
        let mut got = p.up(&nan(m * nn))?;
        c.q8_matmul(&mut got, &p.up(&x)?, &p.up(&packed)?, &p.up(&scales)?, &spec)?;
        // The i32 sum is exact and scaled the same way: the same bits.
        close("q8_matmul", &p.down(&got)?, &want, 0.0)?;
        let ids: Vec<u32> = (0..9).map(|_| p.rng.below(nn as u64) as u32).collect();
        let mut want = nan(ids.len() * k);
        REF.q8_embedding(&mut want, &packed, &scales, &ids, nn, k)?;
        let mut got = p.up(&nan(ids.len() * k))?;
        c.q8_embedding(&mut got, &p.up(&packed)?, &p.up(&scales)?, &ids, nn, k)?;
        close("q8_embedding", &p.down(&got)?, &want, 0.0)?;
    }

    let hp = AdamParams {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        decoupled: true,
        grad_scale: 0.5,
    };
    for n in [1usize, 1000, 100_003] {
        let (w, g) = (p.randn(n), p.randn(n));
        let (mut wr, mut mr, mut vr) = (w.clone(), vec![0.0; n], vec![0.0; n]);
        let (mut wg, gg, mut mg, mut vg) = (p.up(&w)?, p.up(&g)?, p.up(&vec![0.0; n])?, p.up(&vec![0.0; n])?);
        for step in 1..=3 {
            REF.adam_update(&mut wr, &g, &mut mr, &mut vr, &hp, step)?;
            c.adam_update(&mut wg, &gg, &mut mg, &mut vg, &hp, step)?;
        }
        close("adamw", &p.down(&wg)?, &wr, 1e-5)?;
        for (momentum, nesterov) in [(0.0f32, false), (0.9, false), (0.9, true)] {
            let hp = SgdParams { lr: 0.1, momentum, nesterov, weight_decay: 0.01, grad_scale: 0.5 };
            let (mut wr, mut vr) = (w.clone(), vec![0.0; n]);
            let (mut wg, mut vg) = (p.up(&w)?, p.up(&vec![0.0; n])?);
            for _ in 0..3 {
                REF.sgd_update(&mut wr, &g, (momentum > 0.0).then_some(&mut vr), &hp)?;
                c.sgd_update(&mut wg, &gg, (momentum > 0.0).then_some(&mut vg), &hp)?;
            }
            close(&format!("sgd momentum {momentum} nesterov {nesterov}"), &p.down(&wg)?, &wr, 1e-5)?;
        }
    }
    Ok(())
}

fn small_lm(moe: bool) -> R<TransformerLm> {
    let mut b = TransformerLm::builder()
        .shape(300, 128, 2, (4, 2, 32), 200, 40)
        .optimizer(Optimizer::adam(1e-3).weight_decay(0.1))
        .seed(7);
    if moe {
        b = b.experts(4, 2).expert_d_ff(96).shared_expert(true);
    }
    Ok(b.build()?)
}

fn batch() -> Vec<Vec<u32>> {
    let mut rng = Rng::new(8);
    (0..3).map(|_| (0..38).map(|_| rng.below(300) as u32).collect()).collect()
}

/// Logits, then weights after 3 steps, CUDA against CPU.
fn whole_model(moe: bool, mixed: bool) -> R {
    let rel = if mixed { 2e-2 } else { 1e-4 };
    let (mut cpu, mut gpu) = (small_lm(moe)?, small_lm(moe)?);
    cpu.set_mixed_precision(mixed);
    gpu.set_mixed_precision(mixed);
    gpu.to_cuda(0, 2000)?;
    let seqs = batch();
    let tb = rusting_brain::TokenBatch::new(&seqs)?;
    close("logits", &gpu.forward_batch(&tb)?, &cpu.forward_batch(&tb)?, rel)?;
    for step in 0..3 {
        let (lc, lg) = (cpu.train_step(&seqs)?, gpu.train_step(&seqs)?);
        eprintln!("  step {step}: loss cpu {} cuda {}", lc.lm_loss, lg.lm_loss);
        if ((lc.lm_loss - lg.lm_loss) as f64).abs() > rel * lc.lm_loss as f64 {
            return Err(fail(format!("step {step} loss {} vs {}", lg.lm_loss, lc.lm_loss)));
        }
    }
    gpu.sync_from_device()?;
    for ((name, w), (_, want)) in gpu.named_parameters()?.iter().zip(cpu.named_parameters()?.iter()) {
        // A routed expert in mixed precision: the CUDA flash kernels round q, k, v and the
        // probabilities to bf16 where the CPU's bf16 path rounds only GEMM operands, and
        // an expert that receives few rows has its gradient from a handful of tokens, so
        // Adam's normalized steps turn that difference into lr-sized moves. The H200 run
        // measured 2.2e-2 on the expert with the fewest rows, 1e-2 or less elsewhere.
        let tol = if mixed && name.contains(".experts.") { 5e-2 } else { rel };
        close_l2(&format!("{name} after 3 steps"), w, want, tol)?;
    }
    if gpu.steps() != 3 {
        return Err(fail(format!("{} steps counted", gpu.steps())));
    }
    // Back on the CPU, the model continues where it was.
    gpu.to_cpu()?;
    close("logits after to_cpu", &gpu.forward_batch(&tb)?, &cpu.forward_batch(&tb)?, rel)?;
    Ok(())
}

/// The adapter pair through `CudaBackend` (two cuBLASLt products each way) against the
/// reference's loops, on row windows as the experts use them.
fn primitives_lora(c: &CudaBackend) -> R {
    let mut p = Pair { rng: Rng::new(41), cuda: c };
    for (rows, d_in, d_out, rank, offs) in
        [(1, 1, 1, 1, (0, 0, 0)), (7, 33, 20, 4, (33, 20, 4)), (130, 96, 200, 16, (0, 400, 32))]
    {
        let s = LoraSpec::new(rows, d_in, d_out, rank, 1.75).offsets(offs.0, offs.1, offs.2);
        let (lx, ly, lt) = (offs.0 + rows * d_in, offs.1 + rows * d_out, offs.2 + rows * rank);
        let (x, a, bm, y0, dy) =
            (p.randn(lx), p.randn(rank * d_in), p.randn(d_out * rank), p.randn(ly), p.randn(ly));
        let (mut y, mut t) = (y0.clone(), vec![0.0; lt]);
        REF.lora_forward(&mut y, &mut t, &x, &a, &bm, &s)?;
        let (mut yg, mut tg) = (p.up(&y0)?, p.up(&vec![0.0; lt])?);
        let (xg, ag, bg) = (p.up(&x)?, p.up(&a)?, p.up(&bm)?);
        c.lora_forward(&mut yg, &mut tg, &xg, &ag, &bg, &s)?;
        close("lora y", &p.down(&yg)?, &y, 1e-4)?;
        let (mut dx, mut da, mut db, mut dt) =
            (vec![0.5; lx], vec![0.25; rank * d_in], vec![0.0; d_out * rank], vec![0.0; lt]);
        REF.lora_backward(Some(&mut dx), &mut da, &mut db, &mut dt, &dy, &x, &t, &a, &bm, &s)?;
        let (mut dxg, mut dag, mut dbg, mut dtg) = (
            p.up(&vec![0.5; lx])?,
            p.up(&vec![0.25; rank * d_in])?,
            p.up(&vec![0.0; d_out * rank])?,
            p.up(&vec![0.0; lt])?,
        );
        c.lora_backward(Some(&mut dxg), &mut dag, &mut dbg, &mut dtg, &p.up(&dy)?, &xg, &tg, &ag, &bg, &s)?;
        close("lora dx", &p.down(&dxg)?, &dx, 1e-4)?;
        close("lora dA", &p.down(&dag)?, &da, 1e-4)?;
        close("lora dB", &p.down(&dbg)?, &db, 1e-4)?;
    }
    Ok(())
}

/// Adapters on a dense and a mixture-of-experts model, on an f32 and an int8 base, trained
/// 3 steps on CUDA and on the CPU: logits, adapter gradients and adapters after the steps,
/// the base unchanged; and the frozen base holds no gradient or moment on the device.
fn lora_trains_as_on_the_cpu(_: &CudaBackend) -> R {
    for (moe, int8) in [(false, false), (true, false), (false, true)] {
        let tag = format!("lora moe={moe} int8={int8}");
        let (mut cpu, mut gpu) = (small_lm(moe)?, small_lm(moe)?);
        for m in [&mut cpu, &mut gpu] {
            if int8 {
                m.quantize()?;
            }
            m.add_lora(rusting_brain::LoraConfig::new(8).alpha(16.0))?;
        }
        let base = gpu.named_parameters()?;
        gpu.to_cuda(0, 2000)?;
        let seqs = batch();
        let tb = rusting_brain::TokenBatch::new(&seqs)?;
        for step in 0..3 {
            let (lc, lg) = (cpu.train_step(&seqs)?, gpu.train_step(&seqs)?);
            eprintln!("  {tag} step {step}: loss cpu {} cuda {}", lc.lm_loss, lg.lm_loss);
            if ((lc.lm_loss - lg.lm_loss) as f64).abs() > 1e-4 * lc.lm_loss as f64 {
                return Err(fail(format!("{tag} step {step} loss {} vs {}", lg.lm_loss, lc.lm_loss)));
            }
            if step == 0 {
                for ((n, g), (_, want)) in gpu.lora_gradients()?.iter().zip(cpu.lora_gradients()?.iter()) {
                    close_l2(&format!("{tag} grad {n}"), g, want, 1e-4)?;
                }
            }
        }
        // Every B starts at zero, so after 3 steps of lr 1e-3 its norm is a few lr and an
        // element whose gradient rounds near zero moves by about lr either way (Adam
        // normalizes): relative to that small norm the first H200 run measured 1.02e-4
        // on a weakly routed expert's B, 2e-5 or less elsewhere.
        // An int8 base also rounds each activation row to int8 (W8A8): once the steps have
        // moved the two copies apart by f32 rounding, an activation near a rounding
        // boundary lands on different int8 values. The run measured 1.3e-3 on one B and
        // the losses agreeing to 1.1e-5.
        let tol = if int8 { 1e-2 } else { 1e-3 };
        for ((n, w), (_, want)) in gpu.lora_parameters()?.iter().zip(cpu.lora_parameters()?.iter()) {
            close_l2(&format!("{tag} {n} after 3 steps"), w, want, tol)?;
        }
        // int8: the W8A8 rounding above, measured 1.3e-3 of the largest logit.
        close("logits", &gpu.forward_batch(&tb)?, &cpu.forward_batch(&tb)?, if int8 { 1e-2 } else { 1e-4 })?;
        gpu.to_cpu()?;
        if gpu.named_parameters()? != base {
            return Err(fail(format!("{tag}: the frozen base changed on the device")));
        }
        if !int8 && gpu.named_gradients()?.iter().any(|(_, g)| !g.is_empty()) {
            return Err(fail(format!("{tag}: the frozen base has gradients")));
        }
    }
    Ok(())
}

fn decoding_matches(_: &CudaBackend) -> R {
    let (mut cpu, mut gpu) = (small_lm(false)?, small_lm(false)?);
    gpu.to_cuda(0, 1000)?;
    let prompt = [1u32, 2, 3, 4, 5];
    let a = cpu.generate(&prompt, 20, &mut Sampler::greedy())?;
    let b = gpu.generate(&prompt, 20, &mut Sampler::greedy())?;
    if a != b {
        return Err(fail(format!("greedy ids differ: cpu {a:?} cuda {b:?}")));
    }
    Ok(())
}

fn dense_network(_: &CudaBackend) -> R {
    let mut rng = Rng::new(9);
    let rows = 200;
    let inputs: Vec<Vec<f32>> = (0..rows).map(|_| rng.normal_vec(5, 1.0)).collect();
    let targets: Vec<Vec<f32>> = inputs
        .iter()
        .map(|x| {
            let s: f32 = x.iter().sum();
            vec![(s > 0.0) as u8 as f32, (s <= 0.0) as u8 as f32]
        })
        .collect();
    let data = Dataset::new(inputs.clone(), targets)?;
    let build = || {
        Network::builder()
            .input_size(5)
            .dense(16, Activation::Relu)
            .dense(16, Activation::Tanh)
            .dense(2, Activation::Softmax)
            .loss(Loss::CategoricalCrossEntropy)
            .optimizer(Optimizer::adam(1e-2))
            .seed(3)
            .build()
    };
    let (mut cpu, mut gpu) = (build(), build());
    gpu.to_cuda(0, 500)?;
    let cfg = TrainConfig { epochs: 3, batch_size: 32, shuffle: false, seed: Some(1) };
    let lc = cpu.fit(&data, cfg)?;
    let lg = gpu.fit(&data, cfg)?;
    close("network losses", &lg, &lc, 1e-4)?;
    let pc: Vec<f32> = cpu.predict_batch(&inputs)?.concat();
    let pg: Vec<f32> = gpu.predict_batch(&inputs)?.concat();
    // 21 Adam steps: rounding differences grow by Adam's normalization (see the module
    // docs), so the predictions get 1e-3; the per-epoch losses above stay within 1e-4.
    close("network predictions", &pg, &pc, 1e-3)?;
    Ok(())
}

fn budget_is_checked_first(_: &CudaBackend) -> R {
    let mut m = small_lm(false)?;
    let before = m.named_parameters()?;
    let e = m.to_cuda(0, 4).err().ok_or_else(|| fail("a 4 MiB budget was accepted"))?;
    if !e.to_string().contains("budget") {
        return Err(fail(format!("the error does not name the budget: {e}")));
    }
    if m.device().is_some() || m.named_parameters()? != before {
        return Err(fail("a refused to_cuda changed the model"));
    }
    m.train_step(&batch())?;
    Ok(())
}

fn no_device_is_an_error() -> R {
    let mut m = small_lm(false)?;
    let e = match cuda_available() {
        // No driver or device: to_cuda must say so, and leave the model where it was.
        Err(_) => m.to_cuda(0, 1000).err().ok_or_else(|| fail("to_cuda succeeded without a device"))?,
        // A device is here: ask for one that is not.
        Ok(n) => m.to_cuda(n + 7, 1000).err().ok_or_else(|| fail("a missing device ordinal was accepted"))?,
    };
    eprintln!("  error: {e}");
    if m.device().is_some() {
        return Err(fail("the model moved after a failed to_cuda"));
    }
    m.train_step(&batch())?;
    Ok(())
}

/// Every Hugging Face fixture directory (written by transformers, tests/fixtures/gen_hf.py;
/// the CPU matches transformers on them in tests/tests/hf_vs_transformers.rs) on CUDA
/// against the CPU: logits, a greedy continuation, the loss and every gradient. Run from
/// the repository root (device-check.sh does), or the build's checkout.
fn hf_directories_match_the_cpu(_: &CudaBackend) -> R {
    let root = ["tests/fixtures/hf", concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/hf")]
        .into_iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_dir())
        .ok_or_else(|| fail("tests/fixtures/hf not found: run from the repository root"))?;
    let mut names: Vec<_> = std::fs::read_dir(&root)
        .map_err(|e| fail(e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .collect();
    names.sort();
    if names.len() < 9 {
        return Err(fail(format!("only {} fixture directories in {}", names.len(), root.display())));
    }
    let rows: Vec<Vec<u32>> =
        (0..2u32).map(|r| (0..9u32).map(|t| (r * 17 + t * 5 + 3) % 64).collect()).collect();
    let tb = rusting_brain::TokenBatch::new(&rows)?;
    for dir in names {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut cpu = TransformerLm::from_pretrained(&dir)?;
        let mut gpu = TransformerLm::from_pretrained(&dir)?;
        gpu.to_cuda(0, 1000)?;
        close(&format!("{name} logits"), &gpu.forward_batch(&tb)?, &cpu.forward_batch(&tb)?, 1e-4)?;
        let prompt = [3u32, 9, 27, 17, 51];
        let (a, b) = (
            cpu.generate(&prompt, 12, &mut Sampler::greedy())?,
            gpu.generate(&prompt, 12, &mut Sampler::greedy())?,
        );
        if a != b {
            return Err(fail(format!("{name}: greedy ids differ: cpu {a:?} cuda {b:?}")));
        }
        cpu.zero_grad()?;
        gpu.zero_grad()?;
        let (lc, lg) = (cpu.accumulate_step(&tb)?, gpu.accumulate_step(&tb)?);
        if ((lc.lm_loss - lg.lm_loss) as f64).abs() > 1e-4 * lc.lm_loss as f64 {
            return Err(fail(format!("{name}: loss {} vs {}", lg.lm_loss, lc.lm_loss)));
        }
        for ((n, g), (_, want)) in gpu.named_gradients()?.iter().zip(cpu.named_gradients()?.iter()) {
            close_l2(&format!("{name} grad {n}"), g, want, 1e-4)?;
        }
        eprintln!("  {name}: logits, 12 greedy ids, loss and every gradient as on the CPU");
    }
    Ok(())
}

/// The sweep every backend runs (rusting_brain_test_support::sweep) at 1e-4, this file's
/// bound for the primitives: cuBLASLt's f32 GEMMs and the kernels' f32 sums order terms
/// differently from the reference's f64 sums. The sweep panics on a mismatch.
fn shared_backend_sweep(c: &CudaBackend) -> Result<(), Failed> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rusting_brain_test_support::backend_sweep(c, 1e-4)
    }))
    .map_err(|e| {
        let message = e
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the sweep panicked".into());
        fail(message)
    })
}

fn main() {
    let args = Arguments::from_args();
    let device = match cuda_available() {
        Ok(_) => CudaBackend::new(0, 8000).map_err(|e| e.to_string()),
        Err(e) => Err(e),
    };
    let cases: &[Case] = &[
        ("primitives_elementwise", primitives_elementwise),
        ("primitives_matmul", primitives_matmul),
        ("primitives_dense", primitives_dense),
        ("primitives_transformer", primitives_transformer),
        ("primitives_attention", primitives_attention),
        ("primitives_moe_q8_optim", primitives_moe_q8_optim),
        ("whole_model_dense_fp32", |_| whole_model(false, false)),
        ("whole_model_dense_bf16", |_| whole_model(false, true)),
        ("whole_model_moe_fp32", |_| whole_model(true, false)),
        ("whole_model_moe_bf16", |_| whole_model(true, true)),
        ("decoding_matches_the_cpu", decoding_matches),
        ("primitives_lora", primitives_lora),
        ("shared_backend_sweep", shared_backend_sweep),
        ("lora_trains_as_on_the_cpu", lora_trains_as_on_the_cpu),
        ("hf_directories_match_the_cpu", hf_directories_match_the_cpu),
        ("dense_network_matches_the_cpu", dense_network),
        ("budget_is_checked_before_allocating", budget_is_checked_first),
    ];
    let dev = std::sync::Arc::new(device);
    let mut trials = vec![Trial::test("no_device_is_an_error", no_device_is_an_error)];
    for &(name, f) in cases {
        let d = dev.clone();
        let trial = Trial::test(name, move || match d.as_ref() {
            // Said at once as well: a later abort (a driver fault) would lose the summary.
            Ok(c) => f(c).inspect_err(|e| eprintln!("  error: {}", e.message().unwrap_or("?"))),
            Err(e) => Err(fail(format!("no CUDA device: {e}"))),
        });
        // RB_REQUIRE_CUDA=1 (the device check sets it): a backend that does not start is
        // every test failing, never a run of ignored tests that looks green.
        let required = std::env::var("RB_REQUIRE_CUDA").as_deref() == Ok("1");
        trials.push(match dev.as_ref() {
            Ok(_) => trial,
            Err(_) if required => trial,
            Err(e) => {
                if name == "primitives_elementwise" {
                    eprintln!("skipped: no CUDA device ({e}); RB_REQUIRE_CUDA=1 makes this a failure");
                }
                trial.with_ignored_flag(true)
            }
        });
    }
    libtest_mimic::run(&args, trials).exit();
}
