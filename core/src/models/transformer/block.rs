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
    Cache { k: &'a mut B::Buffer, v: &'a mut B::Buffer, pos: usize },
    /// New positions of several sequences, one after another: `rows[i]` is sequence `i`'s
    /// cache (keys, values), where its new positions start, and how many it has. The
    /// products run over every row at once; RoPE and attention run a sequence at a time in
    /// `one`.
    Rows { rows: Vec<(&'a mut B::Buffer, &'a mut B::Buffer, usize, usize)>, one: &'a mut RowScratch<B> },
}

/// One sequence's rotated queries and keys for `len` positions (made again when a sequence
/// has another count), and one query's attention, for [`Keys::Rows`].
pub(super) struct RowScratch<B: Backend> {
    pub(super) len: usize,
    pub(super) q: B::Buffer,
    pub(super) k: B::Buffer,
    /// Every sequence's rotated queries of a pass, in order (`q_rows` rows of room; grows).
    pub(super) q_all: B::Buffer,
    pub(super) q_rows: usize,
    /// One query, its attention output and log-sum-exp.
    pub(super) q1: B::Buffer,
    pub(super) att: B::Buffer,
    pub(super) lse: B::Buffer,
}

impl<B: Backend> RowScratch<B> {
    pub(super) fn new(b: &B, c: &TransformerConfig, len: usize) -> Result<Self> {
        let (q, kv) = (c.q_dim(), c.kv_dim());
        Ok(RowScratch {
            len,
            q: b.zeros(len * q)?,
            k: b.zeros(len * kv)?,
            q_all: b.zeros(q)?,
            q_rows: 1,
            q1: b.zeros(q)?,
            att: b.zeros(q)?,
            lse: b.zeros(c.q_heads)?,
        })
    }
}

/// Attention for [`Keys::Rows`]: each sequence's queries and keys rotated at its own
/// positions, its keys and values appended to its cache, then every query attending over
/// its sequence's cache alone up to its own position ([`AttentionOps::attention_rows`],
/// one query a row). One query a row keeps a position's sums the same however its
/// sequence's positions are split between passes (a backend may tile a many-query call),
/// so a prompt continued from a copied prefix, or prefilled beside others, gets the bits
/// of its own pass. `q`, `k`, `v` hold every row's projections, `att` receives every
/// row's output.
#[allow(clippy::too_many_arguments)]
fn attend_rows<B: Backend>(
    b: &B, c: &TransformerConfig, mut rows: Vec<(&mut B::Buffer, &mut B::Buffer, usize, usize)>,
    one: &mut RowScratch<B>, q: &B::Buffer, k: &B::Buffer, v: &B::Buffer, att: &mut B::Buffer,
) -> Result<()> {
    let (qd, kv) = (c.q_dim(), c.kv_dim());
    let total: usize = rows.iter().map(|r| r.3).sum();
    if one.q_rows < total {
        one.q_all = b.zeros(total * qd)?;
        one.q_rows = total;
    }
    let mut at = 0;
    for (cache_k, cache_v, pos, len) in rows.iter_mut() {
        let (pos, len) = (*pos, *len);
        if one.len != len {
            // This sequence's positions: its queries and keys to rotate.
            one.q = b.zeros(len * qd)?;
            one.k = b.zeros(len * kv)?;
            one.len = len;
        }
        let (rope_q, rope_k) = c.rope_specs(1, len, pos);
        b.copy_range(&mut one.q, 0, q, at * qd, len * qd)?;
        b.copy_range(&mut one.k, 0, k, at * kv, len * kv)?;
        b.rope_forward(&mut one.q, &rope_q)?;
        b.rope_forward(&mut one.k, &rope_k)?;
        b.copy_range(&mut one.q_all, at * qd, &one.q, 0, len * qd)?;
        b.copy_range(cache_k, pos * kv, &one.k, 0, len * kv)?;
        b.copy_range(cache_v, pos * kv, v, at * kv, len * kv)?;
        at += len;
    }
    let caches: Vec<(&B::Buffer, &B::Buffer)> = rows.iter().map(|(k, v, _, _)| (&**k, &**v)).collect();
    let seen: Vec<(usize, usize)> = rows
        .iter()
        .enumerate()
        .flat_map(|(s, &(_, _, pos, len))| (0..len).map(move |i| (s, pos + i + 1)))
        .collect();
    let spec = AttentionSpec {
        batch: 1,
        q_len: 1,
        kv_len: 1,
        kv_capacity: c.max_seq_len,
        q_heads: c.q_heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
    };
    b.attention_rows(crate::backend::AttentionRows {
        out: att,
        q: &one.q_all,
        caches: &caches,
        rows: &seen,
        spec,
        scratch: [&mut one.q1, &mut one.att, &mut one.lse],
    })
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
    n: usize, prec: OperandPrecision, lora: Option<BlockLora<'_, B>>,
) -> Result<()> {
    let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
    let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
    let BlockActs { h, rstd1, q: qb, k: kb, v: vb, qk, att, lse, h2, rstd2, ffn, moe, mut saved } = a;
    if let Some((x_in, _)) = saved.as_mut() {
        b.copy(x_in, x)?;
    }
    // h = rmsnorm(x); q, k, v = h W^T (+ bias)   h: (n, d), Wq: (q, d)
    b.rmsnorm_forward(h, rstd1, x, &p.attn_norm, n, d, c.norm_eps)?;
    let (groups, mut lt, stride) = match lora {
        Some(l) => (l.groups, Some(l.t), l.stride),
        None => (Vec::new(), None, 0),
    };
    let adapted = lt.is_some();
    let mut project = |qp: &mut B::Buffer, kp: &mut B::Buffer| -> Result<()> {
        match (&w.wq, &w.wk, &w.wv) {
            // All three int8 (an int8 model): one call, which a backend may run as one job.
            (Mat::Q8(pq, sq), Mat::Q8(pk, sk), Mat::Q8(pv, sv)) => {
                let t = |spec: MatmulSpec| spec.trans_b(true);
                b.q8_matmul_many(
                    h,
                    &mut [
                        Q8Product { out: &mut *qp, packed: pq, scales: sq, spec: t(mm(n, q, d)) },
                        Q8Product { out: &mut *kp, packed: pk, scales: sk, spec: t(mm(n, kv, d)) },
                        Q8Product { out: &mut *vb, packed: pv, scales: sv, spec: t(mm(n, kv, d)) },
                    ],
                )?;
            }
            _ => {
                w.wq.apply(b, qp, h, mm(n, q, d))?;
                w.wk.apply(b, kp, h, mm(n, kv, d))?;
                w.wv.apply(b, vb, h, mm(n, kv, d))?;
            }
        }
        if let Some(lt) = lt.as_deref_mut() {
            adapt(b, &groups, |w| &w.wq, &mut lt.wq, stride, qp, h, d, q)?;
            adapt(b, &groups, |w| &w.wk, &mut lt.wk, stride, kp, h, d, kv)?;
            adapt(b, &groups, |w| &w.wv, &mut lt.wv, stride, vb, h, d, kv)?;
        }
        for (out, bias, cols) in [(qp, &p.q_bias, q), (kp, &p.k_bias, kv), (&mut *vb, &p.v_bias, kv)] {
            if let Some(bias) = bias {
                b.add_bias(out, bias, n, cols)?;
            }
        }
        Ok(())
    };
    let inference = !matches!(keys, Keys::Fresh);
    // An int8 block decoding from its cache with nothing in between (no adapters, biases
    // or per-head norms): the projections through Wo's product in one call, which a
    // backend may run as one job.
    let plain =
        !adapted && [&p.q_bias, &p.k_bias, &p.v_bias, &p.q_norm, &p.k_norm].iter().all(|o| o.is_none());
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
            if !matches!(keys, Keys::Rows { .. }) {
                b.rope_forward(qb, rope_q)?;
                b.rope_forward(kb, rope_k)?;
            }
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
                Keys::Rows { rows, one } => attend_rows(b, c, rows, one, qb, kb, vb, att)?,
            }
            // x += att Wo^T
            w.wo.apply(b, x, att, mm(n, d, q).beta(1.0))?;
            if let Some(lt) = lt.as_deref_mut() {
                adapt(b, &groups, |w| &w.wo, &mut lt.wo, stride, x, att, q, d)?;
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
    if let Some(lt) = lt {
        let Block { mlp: tm, moe: te, .. } = lt.as_mut();
        if let Some(t) = tm {
            mlp_lora = Some((groups.iter().filter_map(|g| g.part(|w| w.mlp.as_ref())).collect(), t, stride));
        }
        // Routed experts take one set of adapters over every row (the groups, one a
        // sequence, all of the same adapters): different picks are refused on them before
        // the pass (`TransformerModel::check_picks`).
        if let (Some(t), Some(g0)) = (te, groups.first()) {
            if groups.iter().any(|g| g.w.moe.is_some()) {
                let whole = groups.iter().all(|g| core::ptr::eq(g.w, g0.w))
                    && g0.first == 0
                    && groups.windows(2).all(|p| p[1].first == p[0].first + p[0].rows)
                    && groups.last().is_some_and(|g| g.first + g.rows == n);
                match (whole, g0.w.moe.as_ref()) {
                    (true, Some(w)) => moe_lora = Some((w, t, g0.ctx)),
                    _ => {
                        return Err(invalid(
                            "adapters picked per sequence cannot adapt routed experts".into(),
                        ));
                    }
                }
            }
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

/// What every block's backward pass reads, the same for all of a step's blocks: the
/// backend, the model and its weights as the products see them, the adapters' shape, and
/// the batch's.
pub(super) struct BackwardCtx<'a, B: Backend> {
    pub(super) b: &'a B,
    pub(super) c: &'a TransformerConfig,
    pub(super) prec: OperandPrecision,
    pub(super) params: &'a Params<B>,
    pub(super) quantized: Option<&'a QuantParams<B>>,
    pub(super) lora_ctx: Option<LoraCtx>,
    pub(super) batch: usize,
    pub(super) seq: usize,
}

/// Block `l`'s backward pass, [`block_forward`] in reverse: on entry `arena.dx` holds the
/// gradient of the block's output, on return the gradient of its input. Parameter
/// gradients accumulate into `g` (none while adapters freeze the base) and the adapters'
/// into `lora`; `aux_scales` are this block's shares of the auxiliary losses' weights.
pub(super) fn block_backward<B: Backend>(
    ctx: &BackwardCtx<'_, B>, l: usize, mut g: Option<&mut LayerParams<B>>, lora: Option<&mut LoraState<B>>,
    arena: &mut Arena<B>, aux_scales: (f32, f32),
) -> Result<()> {
    let &BackwardCtx { b, c, prec, params, quantized, lora_ctx, batch, seq } = ctx;
    let (n, d, q, kv) = (batch * seq, c.d_model, c.q_dim(), c.kv_dim());
    let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
    let (rope_q, rope_k) = c.rope_specs(batch, seq, 0);
    let att_spec = AttentionSpec::causal(batch, seq, c.q_heads, c.kv_heads, c.head_dim);
    let layout_err = || invalid("gradients laid out differently from the parameters".into());
    let (p, a) = (&params.layers[l], &arena.layers[l]);
    let w = block_view(params, quantized, l)?;
    // The adapters of this block: weights, gradients (split by part), kept x A^T.
    let (lw, mut lg, lt) = match lora {
        Some(st) => (Some(&st.weights.layers[l]), Some(st.grads.layers[l].as_mut()), Some(&arena.lora_t[l])),
        None => (None, None, None),
    };
    let (lg_mlp, lg_moe) = match lg.as_mut() {
        Some(lg) => (lg.mlp.take(), lg.moe.take()),
        None => (None, None),
    };
    // --- FFN: x_out = x_mid + mlp(h2) + experts(h2); dx holds d x_out, dh gets d h2.
    match (&w.mlp, c.mlp_width(l)) {
        (Some(pm), Some(f)) => {
            let gm = match g.as_deref_mut() {
                Some(g) => Some(g.mlp.as_mut().ok_or_else(layout_err)?),
                None => None,
            };
            let ml =
                match (lw.and_then(|w| w.mlp.as_ref()), lg_mlp, lt.and_then(|t| t.mlp.as_ref()), lora_ctx) {
                    (Some(w), Some(g), Some(t), Some(ctx)) => Some((w, g, t, &mut arena.lora_dt, ctx)),
                    _ => None,
                };
            mlp_backward(
                b,
                pm,
                gm,
                [&a.h2, &a.gate, &a.up, &a.s],
                &arena.dx,
                &mut arena.dh,
                arena.ffn.get(n * f)?,
                (n, d, f),
                prec,
                &mut arena.deq,
                ml,
            )?
        }
        (None, None) => b.fill(&mut arena.dh, 0.0)?,
        _ => return Err(layout_err()),
    }
    match (&w.moe, c.sparse(l), &a.moe) {
        (Some(pe), Some(m), Some(acts)) => {
            let ge = match g.as_deref_mut() {
                Some(g) => Some(g.moe.as_mut().ok_or_else(layout_err)?),
                None => None,
            };
            let ml =
                match (lw.and_then(|w| w.moe.as_ref()), lg_moe, lt.and_then(|t| t.moe.as_ref()), lora_ctx) {
                    (Some(w), Some(g), Some(t), Some(ctx)) => Some((w, g, t, &mut arena.lora_dt, ctx)),
                    _ => None,
                };
            moe_backward(
                b,
                pe,
                ge,
                m,
                acts,
                &a.h2,
                &arena.dx,
                &mut arena.dh,
                &mut arena.dxe,
                &mut arena.dlogits,
                arena.ffn.get(n * m.top_k * m.expert_d_ff)?,
                (n, d),
                prec,
                aux_scales,
                &mut arena.deq,
                ml,
            )?
        }
        (None, None, None) => {}
        _ => return Err(layout_err()),
    }
    // d x_mid = dx (residual) + rmsnorm backward of dh
    let dw = match g.as_deref_mut() {
        Some(g) => &mut g.ffn_norm,
        None => &mut arena.sink_d,
    };
    norm_backward(
        b,
        &mut arena.dx2,
        dw,
        &arena.dh,
        (&a.x_mid, &p.ffn_norm, &a.rstd2),
        (n, d),
        Some(&arena.dx),
    )?;
    // --- attention: x_mid = x_in + att Wo^T; dx2 holds d x_mid.
    if let Some(g) = g.as_deref_mut() {
        b.matmul(&mut g.wo, &arena.dx2, &a.att, &mm(d, q, n).trans_a(true).accumulate())?;
    }
    w.wo.grad_input(b, &mut arena.datt, &arena.dx2, mm(n, q, d), &mut arena.deq)?;
    if let (Some(lw), Some(lg), Some(lt), Some(ctx)) = (lw, lg.as_mut(), lt, lora_ctx) {
        let spec = ctx.spec(n, q, d);
        adapt_backward(
            b,
            &lw.wo,
            lg.wo,
            &lt.wo,
            &mut arena.lora_dt,
            Some(&mut arena.datt),
            &arena.dx2,
            &a.att,
            spec,
        )?;
    }
    b.attention_backward(
        &mut arena.dq,
        &mut arena.dk,
        &mut arena.dv,
        &arena.datt,
        &a.q,
        &a.k,
        &a.v,
        &a.att,
        &a.lse,
        &att_spec,
    )?;
    b.rope_backward(&mut arena.dq, &rope_q)?;
    b.rope_backward(&mut arena.dk, &rope_k)?;
    // Through the per-head norms: dq then holds the gradient of q before them.
    if let (Some(qn), Some(kn)) = (&p.q_norm, &p.k_norm) {
        let [q_raw, k_raw, rstd_q, rstd_k] = &a.qk;
        let hd = c.head_dim;
        let rows = [n * c.q_heads, n * c.kv_heads];
        let ins = [(q_raw, qn, rstd_q), (k_raw, kn, rstd_k)];
        let mut outs = [(&mut arena.dq_raw, &arena.dq), (&mut arena.dk_raw, &arena.dk)];
        for (i, (dst, dy)) in outs.iter_mut().enumerate() {
            let (x, wn, rstd) = ins[i];
            let dweight = match g.as_deref_mut() {
                Some(g) => {
                    if i == 0 { g.q_norm.as_mut() } else { g.k_norm.as_mut() }.ok_or_else(layout_err)?
                }
                None => &mut arena.sink_hd,
            };
            norm_backward(b, dst, dweight, dy, (x, wn, rstd), (rows[i], hd), None)?;
        }
        core::mem::swap(&mut arena.dq, &mut arena.dq_raw);
        core::mem::swap(&mut arena.dk, &mut arena.dk_raw);
    }
    if let Some(g) = g.as_deref_mut() {
        for (gb, dout, cols) in [
            (g.q_bias.as_mut(), &arena.dq, q),
            (g.k_bias.as_mut(), &arena.dk, kv),
            (g.v_bias.as_mut(), &arena.dv, kv),
        ] {
            if let Some(gb) = gb {
                b.bias_backward(gb, dout, n, cols)?;
            }
        }
        b.matmul(&mut g.wq, &arena.dq, &a.h, &mm(q, d, n).trans_a(true).accumulate())?;
        b.matmul(&mut g.wk, &arena.dk, &a.h, &mm(kv, d, n).trans_a(true).accumulate())?;
        b.matmul(&mut g.wv, &arena.dv, &a.h, &mm(kv, d, n).trans_a(true).accumulate())?;
    }
    w.wq.grad_input(b, &mut arena.dh, &arena.dq, mm(n, d, q), &mut arena.deq)?;
    w.wk.grad_input(b, &mut arena.dh, &arena.dk, mm(n, d, kv).accumulate(), &mut arena.deq)?;
    w.wv.grad_input(b, &mut arena.dh, &arena.dv, mm(n, d, kv).accumulate(), &mut arena.deq)?;
    if let (Some(lw), Some(lg), Some(lt), Some(ctx)) = (lw, lg, lt, lora_ctx) {
        let dt = &mut arena.lora_dt;
        for (pair, grad, t, dy, cols) in [
            (&lw.wq, lg.wq, &lt.wq, &arena.dq, q),
            (&lw.wk, lg.wk, &lt.wk, &arena.dk, kv),
            (&lw.wv, lg.wv, &lt.wv, &arena.dv, kv),
        ] {
            adapt_backward(b, pair, grad, t, dt, Some(&mut arena.dh), dy, &a.h, ctx.spec(n, d, cols))?;
        }
    }
    // d x_in = dx2 (residual) + rmsnorm backward of dh, into dx for the block below.
    let dw = match g {
        Some(g) => &mut g.attn_norm,
        None => &mut arena.sink_d,
    };
    norm_backward(
        b,
        &mut arena.dx,
        dw,
        &arena.dh,
        (&a.x_in, &p.attn_norm, &a.rstd1),
        (n, d),
        Some(&arena.dx2),
    )
}

/// The backward of `y = rmsnorm(x) * w` over `(rows, dim)`: `dx = d/dx (+ residual)`, the
/// weight's gradient accumulated into `dw`. The block's two norms, its q/k norms and the
/// model's final norm all come through here; `residual` is the stream's gradient that
/// skips the norm (a pre-norm block's `x + f(norm(x))`), `None` for the q/k and final norms.
pub(super) fn norm_backward<B: Backend>(
    b: &B, dx: &mut B::Buffer, dw: &mut B::Buffer, dy: &B::Buffer,
    (x, w, rstd): (&B::Buffer, &B::Buffer, &B::Buffer), (rows, dim): (usize, usize),
    residual: Option<&B::Buffer>,
) -> Result<()> {
    b.rmsnorm_backward(dx, dw, dy, x, w, rstd, rows, dim)?;
    match residual {
        Some(r) => b.axpy(dx, 1.0, r),
        None => Ok(()),
    }
}
