//! One pre-norm block: attention, then the feed-forward, each added to the residual stream.

use super::*;

/// Where a block's attention finds its keys and values.
pub(super) enum Keys<'a, B: Backend> {
    /// This pass's own: the whole sequence (training, evaluation).
    Fresh,
    /// This pass's own under a padding mask `(batch, seq)`, `true` for real tokens: the
    /// decoder used as a prompt encoder, whose padded positions are fed on and must see
    /// the real tokens only, as transformers computes them under an attention mask.
    Masked(&'a [bool]),
    /// A KV cache, after this pass's keys and values are appended at position `pos`.
    Cache {
        k: &'a mut B::Buffer,
        v: &'a mut B::Buffer,
        pos: usize,
    },
}

/// A block's activations: kept for the backward pass by the batch forward pass, scratch
/// for the cached one. `(n, d)` for `h`, `h2`; `(n, q_dim)` for `q`, `att`; `(n, kv_dim)`
/// for `k`, `v`; `(n)` for the `rstd`s; `(n, q_heads)` for `lse`.
pub(super) struct BlockActs<'a, B: Backend> {
    pub(super) h: &'a mut B::Buffer,
    pub(super) rstd1: &'a mut B::Buffer,
    pub(super) q: &'a mut B::Buffer,
    pub(super) k: &'a mut B::Buffer,
    pub(super) v: &'a mut B::Buffer,
    /// `(q_raw, k_raw, rstd_q, rstd_k)`, used with `qk_norm`.
    pub(super) qk: &'a mut [B::Buffer; 4],
    pub(super) att: &'a mut B::Buffer,
    pub(super) lse: &'a mut B::Buffer,
    pub(super) h2: &'a mut B::Buffer,
    pub(super) rstd2: &'a mut B::Buffer,
    /// `(gate, up, s)` of the dense feed-forward or shared expert, `(n, f)`.
    pub(super) ffn: Option<[&'a mut B::Buffer; 3]>,
    pub(super) moe: Option<&'a mut MoeActs<B>>,
    /// The stream before attention and before the feed-forward (`x_in`, `x_mid`), which
    /// the backward pass reads; `None` when nothing will be differentiated.
    pub(super) saved: Option<(&'a mut B::Buffer, &'a mut B::Buffer)>,
}

/// One transformer block on the residual stream `x` `(n, d)`, in place:
/// `x += attn(rmsnorm(x))`, then `x += ffn(rmsnorm(x))`, the feed-forward a dense SwiGLU or
/// routed experts plus the shared one. The one block of both the batch forward pass and
/// the cached one (which passes its KV cache as `keys`).
#[allow(clippy::too_many_arguments)]
pub(super) fn block_forward<B: Backend>(
    b: &B, c: &TransformerConfig, l: usize, p: &LayerParams<B>, w: &Block<Mat<'_, B>>, x: &mut B::Buffer,
    a: BlockActs<'_, B>, keys: Keys<'_, B>, (rope_q, rope_k, spec): (&RopeSpec, &RopeSpec, &AttentionSpec),
    n: usize, prec: Precision, lora: Option<BlockLora<'_, B>>,
) -> Result<()> {
    let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
    let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
    let BlockActs {
        h,
        rstd1,
        q: qb,
        k: kb,
        v: vb,
        qk,
        att,
        lse,
        h2,
        rstd2,
        ffn,
        moe,
        mut saved,
    } = a;
    if let Some((x_in, _)) = saved.as_mut() {
        b.copy(x_in, x)?;
    }
    // h = rmsnorm(x); q, k, v = h W^T (+ bias)   h: (n, d), Wq: (q, d)
    b.rmsnorm_forward(h, rstd1, x, &p.attn_norm, n, d, c.norm_eps)?;
    let (lw, mut lt, ctx) = match lora {
        Some(l) => (Some(l.w), Some(l.t), Some(l.ctx)),
        None => (None, None, None),
    };
    let mut project = |qp: &mut B::Buffer, kp: &mut B::Buffer| -> Result<()> {
        match (&w.wq, &w.wk, &w.wv) {
            // All three int8 (an int8 model): one call, which a backend may run as one job.
            (Mat::Q8(pq, sq), Mat::Q8(pk, sk), Mat::Q8(pv, sv)) => {
                let t = |spec: MatmulSpec| spec.trans_b(true);
                b.q8_matmul_many(
                    h,
                    &mut [
                        Q8Product {
                            out: &mut *qp,
                            packed: pq,
                            scales: sq,
                            spec: t(mm(n, q, d)),
                        },
                        Q8Product {
                            out: &mut *kp,
                            packed: pk,
                            scales: sk,
                            spec: t(mm(n, kv, d)),
                        },
                        Q8Product {
                            out: &mut *vb,
                            packed: pv,
                            scales: sv,
                            spec: t(mm(n, kv, d)),
                        },
                    ],
                )?;
            }
            _ => {
                w.wq.apply(b, qp, h, mm(n, q, d))?;
                w.wk.apply(b, kp, h, mm(n, kv, d))?;
                w.wv.apply(b, vb, h, mm(n, kv, d))?;
            }
        }
        if let (Some(lw), Some(lt), Some(ctx)) = (lw, lt.as_deref_mut(), ctx) {
            adapt(b, &lw.wq, &mut lt.wq, qp, h, ctx.spec(n, d, q))?;
            adapt(b, &lw.wk, &mut lt.wk, kp, h, ctx.spec(n, d, kv))?;
            adapt(b, &lw.wv, &mut lt.wv, vb, h, ctx.spec(n, d, kv))?;
        }
        for (out, bias, cols) in [(qp, &p.q_bias, q), (kp, &p.k_bias, kv), (&mut *vb, &p.v_bias, kv)] {
            if let Some(bias) = bias {
                b.add_bias(out, bias, n, cols)?;
            }
        }
        Ok(())
    };
    let inference = matches!(keys, Keys::Cache { .. } | Keys::Masked(_));
    // An int8 block decoding from its cache with nothing in between (no adapters, biases
    // or per-head norms): the projections through Wo's product in one call, which a
    // backend may run as one job.
    let plain = lw.is_none()
        && [&p.q_bias, &p.k_bias, &p.v_bias, &p.q_norm, &p.k_norm]
            .iter()
            .all(|o| o.is_none());
    match (keys, &w.wq, &w.wk, &w.wv, &w.wo) {
        (Keys::Cache { k, v, pos }, Mat::Q8(pq, sq), Mat::Q8(pk, sk), Mat::Q8(pv, sv), Mat::Q8(po, so))
            if plain =>
        {
            b.q8_attention(Q8Attention {
                x: &mut *x,
                h: &*h,
                q: qb,
                k: kb,
                v: vb,
                cache_k: k,
                cache_v: v,
                pos,
                att: &mut *att,
                lse,
                weights: [(pq, sq), (pk, sk), (pv, sv), (po, so)],
                rope_q,
                rope_k,
                spec,
            })?;
        }
        (keys, ..) => {
            match (&p.q_norm, &p.k_norm) {
                // Per-head norms: the projections land in q_raw/k_raw (kept for the backward),
                // then q = rmsnorm(q_raw) over rows (n * heads) of head_dim.
                (Some(qn), Some(kn)) => {
                    let [q_raw, k_raw, rstd_q, rstd_k] = qk;
                    project(q_raw, k_raw)?;
                    let hd = c.head_dim;
                    b.rmsnorm_forward(qb, rstd_q, q_raw, qn, n * c.q_heads, hd, c.norm_eps)?;
                    b.rmsnorm_forward(kb, rstd_k, k_raw, kn, n * c.kv_heads, hd, c.norm_eps)?;
                }
                _ => project(qb, kb)?,
            }
            b.rope_forward(qb, rope_q)?;
            b.rope_forward(kb, rope_k)?;
            match keys {
                Keys::Fresh => b.attention_forward(att, lse, qb, kb, vb, spec)?,
                Keys::Masked(mask) => {
                    let masked = SdpaSpec::new(spec.batch, spec.q_len, spec.q_heads, spec.head_dim)
                        .kv_heads(spec.kv_heads)
                        .causal(true);
                    b.sdpa(att, qb, kb, vb, Some(mask), None, &masked)?;
                }
                Keys::Cache { k, v, pos } => {
                    b.copy_range(k, pos * kv, kb, 0, n * kv)?;
                    b.copy_range(v, pos * kv, vb, 0, n * kv)?;
                    b.attention_forward(att, lse, qb, k, v, spec)?;
                }
            }
            // x += att Wo^T
            w.wo.apply(b, x, att, mm(n, d, q).beta(1.0))?;
            if let (Some(lw), Some(lt), Some(ctx)) = (lw, lt.as_deref_mut(), ctx) {
                adapt(b, &lw.wo, &mut lt.wo, x, att, ctx.spec(n, q, d))?;
            }
        }
    }
    if let Some((_, x_mid)) = saved.as_mut() {
        b.copy(x_mid, x)?;
    }
    b.rmsnorm_forward(h2, rstd2, x, &p.ffn_norm, n, d, c.norm_eps)?;
    // The feed-forward's adapters and activations, split between the dense part (or shared
    // expert) and the routed experts.
    let (mut mlp_lora, mut moe_lora) = (None, None);
    if let (Some(lw), Some(lt), Some(ctx)) = (lw, lt, ctx) {
        let Block { mlp: tm, moe: te, .. } = lt.as_mut();
        if let (Some(w), Some(t)) = (lw.mlp.as_ref(), tm) {
            mlp_lora = Some((w, t, ctx));
        }
        if let (Some(w), Some(t)) = (lw.moe.as_ref(), te) {
            moe_lora = Some((w, t, ctx));
        }
    }
    if let (Some(wm), Some(f), Some(scratch)) = (&w.mlp, c.mlp_width(l), ffn) {
        mlp_forward(b, wm, h2, x, scratch, n, d, f, prec, mlp_lora)?;
    }
    if let (Some(we), Some(m), Some(acts)) = (&w.moe, c.sparse(l), moe) {
        moe_forward(b, we, m, acts, h2, x, n, d, prec, inference, moe_lora)?;
    }
    Ok(())
}
