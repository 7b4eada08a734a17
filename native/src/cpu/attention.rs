//! Causal GQA attention on the CPU. Twin of `rusting_brain_core::ops::attention` (same
//! layouts, same saved log-sum-exp).
//!
//! Forward: one task per query row (b, t), all heads; scores, softmax and the weighted sum
//! of values in SIMD loops, one scratch row per task.
//! Backward, in two race-free passes so no two tasks write the same gradient row:
//! 1. per query row: dq = scale * sum_j dS_tj k_j,
//! 2. per key row: dk_j = scale * sum_t dS_tj q_t and dv_j = sum_t P_tj dout_t,
//!
//! recomputing P from the saved log-sum-exp in each pass (the flash-attention trade:
//! twice the QK^T work for no (T, T) buffer).

use rayon::prelude::*;
use rusting_brain_core::ops::attention::AttentionSpec;
use rusting_brain_core::Result;

use super::simd;

pub fn attention_forward(
    out: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    spec: &AttentionSpec,
) -> Result<()> {
    let (nq, _, _) = spec.check("attention_forward")?;
    spec.check_forward(out.len(), lse.len(), q.len(), k.len(), v.len())?;
    let (d, hq) = (spec.head_dim, spec.q_heads);
    if nq == 0 {
        return Ok(());
    }
    let scale = 1.0 / (d as f32).sqrt();
    out.par_chunks_mut(hq * d)
        .zip(lse.par_chunks_mut(hq))
        .enumerate()
        .for_each_init(
            || vec![0.0f32; spec.kv_len],
            |scores, (row, (o, l))| {
                let (b, t) = (row / spec.q_len, row % spec.q_len);
                let n = spec.visible(t);
                for h in 0..hq {
                    let kvh = h / spec.group();
                    let qi = spec.q_index(b, t, h);
                    let qrow = &q[qi..qi + d];
                    let s = &mut scores[..n];
                    for (j, sj) in s.iter_mut().enumerate() {
                        let ki = spec.kv_index(b, j, kvh);
                        *sj = scale * simd::dot(qrow, &k[ki..ki + d]);
                    }
                    let max = simd::max(s);
                    let sum = simd::exp_sub_sum(s, max);
                    l[h] = max + sum.ln();
                    let inv = 1.0 / sum;
                    let oh = &mut o[h * d..(h + 1) * d];
                    oh.fill(0.0);
                    for (j, &p) in s.iter().enumerate() {
                        let vi = spec.kv_index(b, j, kvh);
                        simd::axpy(oh, p * inv, &v[vi..vi + d]);
                    }
                }
            },
        );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    dout: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    spec: &AttentionSpec,
) -> Result<()> {
    let (nq, nkv, nl) = spec.check("attention_backward")?;
    spec.check_backward([
        dq.len(),
        dk.len(),
        dv.len(),
        dout.len(),
        q.len(),
        k.len(),
        v.len(),
        out.len(),
        lse.len(),
    ])?;
    let (d, hq, hkv) = (spec.head_dim, spec.q_heads, spec.kv_heads);
    let scale = 1.0 / (d as f32).sqrt();
    // delta[b, t, h] = dot(dout, out): the row sums of P * dP.
    let mut delta = vec![0.0f32; nl];
    delta.par_chunks_mut(hq.max(1)).enumerate().for_each(|(row, dl)| {
        for (h, x) in dl.iter_mut().enumerate() {
            let i = row * hq * d + h * d;
            *x = simd::dot(&dout[i..i + d], &out[i..i + d]);
        }
    });
    let lse_at = |b: usize, t: usize, h: usize| lse[(b * spec.q_len + t) * hq + h];
    let delta_at = |b: usize, t: usize, h: usize| delta[(b * spec.q_len + t) * hq + h];

    // Pass 1: dq, one task per query row.
    if nq > 0 {
        dq.par_chunks_mut(hq * d).enumerate().for_each(|(row, dqr)| {
            let (b, t) = (row / spec.q_len, row % spec.q_len);
            dqr.fill(0.0);
            for h in 0..hq {
                let kvh = h / spec.group();
                let qi = spec.q_index(b, t, h);
                let (qrow, dorow) = (&q[qi..qi + d], &dout[qi..qi + d]);
                let (l, dl) = (lse_at(b, t, h), delta_at(b, t, h));
                let dqh = &mut dqr[h * d..(h + 1) * d];
                for j in 0..spec.visible(t) {
                    let ki = spec.kv_index(b, j, kvh);
                    let p = simd::exp(scale * simd::dot(qrow, &k[ki..ki + d]) - l);
                    let ds = p * (simd::dot(dorow, &v[ki..ki + d]) - dl) * scale;
                    simd::axpy(dqh, ds, &k[ki..ki + d]);
                }
            }
        });
    }

    // Pass 2: dk and dv, one task per key row (b, j); rows past kv_len stay zero.
    if nkv > 0 {
        let offset = spec.kv_len - spec.q_len; // absolute position of query row 0
        dk.par_chunks_mut(hkv * d)
            .zip(dv.par_chunks_mut(hkv * d))
            .enumerate()
            .for_each(|(row, (dkr, dvr))| {
                let (b, j) = (row / spec.kv_capacity, row % spec.kv_capacity);
                dkr.fill(0.0);
                dvr.fill(0.0);
                if j >= spec.kv_len {
                    return;
                }
                // Query t sees key j when offset + t >= j.
                let first_t = j.saturating_sub(offset);
                for kvh in 0..hkv {
                    let ki = spec.kv_index(b, j, kvh);
                    let (krow, vrow) = (&k[ki..ki + d], &v[ki..ki + d]);
                    let dkh = &mut dkr[kvh * d..(kvh + 1) * d];
                    for h in kvh * spec.group()..(kvh + 1) * spec.group() {
                        for t in first_t..spec.q_len {
                            let qi = spec.q_index(b, t, h);
                            let (qrow, dorow) = (&q[qi..qi + d], &dout[qi..qi + d]);
                            let p = simd::exp(scale * simd::dot(qrow, krow) - lse_at(b, t, h));
                            let ds = p * (simd::dot(dorow, vrow) - delta_at(b, t, h)) * scale;
                            simd::axpy(dkh, ds, qrow);
                            simd::axpy(&mut dvr[kvh * d..(kvh + 1) * d], p, dorow);
                        }
                    }
                }
            });
    }
    Ok(())
}
