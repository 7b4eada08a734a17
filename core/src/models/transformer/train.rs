//! The training step: `accumulate` (the forward pass, then the backward pass from the loss
//! through the head and the blocks in reverse), `zero_grad`, `grad_norm` and `step`.

use super::*;

impl<B: Backend> TransformerModel<B> {
    /// Forward and backward: adds the gradient of this batch's objective — the mean LM
    /// loss over its counted positions, plus the sparse blocks' auxiliary losses times
    /// their coefficients — to `grads`, and returns the losses. With adapters attached only
    /// the adapters' gradients are computed: no frozen weight's gradient is formed, the
    /// backward pass only carries the input gradients through the frozen (f32 or int8)
    /// weights.
    pub fn accumulate(&mut self, tb: &TokenBatch) -> Result<LossSum> {
        if self.lora.is_none() {
            self.refuse_if_quantized("training")?;
        }
        let count = tb.counted();
        if count == 0 {
            return Err(batch_err(
                "no position of the batch counts in the loss (the mask is all false)".into(),
            ));
        }
        let aux = self.forward(tb)?;
        let c = &self.config;
        let (n, d, q, kv) = (tb.batch * tb.seq, c.d_model, c.q_dim(), c.kv_dim());
        let prec = self.precision;
        let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
        let b = &self.backend;
        let arena = self.arena.as_mut().expect("forward made it");
        let quantized = self.quantized.as_ref();
        let params = &self.params;
        // Frozen under adapters: `grads` is empty, and the adapters' gradients are formed.
        let mut lora = self.lora.as_mut();
        let frozen = lora.is_some();
        let lora_ctx = lora.as_ref().map(|st| LoraCtx {
            rank: st.config.rank,
            scale: st.config.scale(),
            prec,
        });
        let grads = &mut self.grads;
        // Each sparse block's share of the auxiliary losses' weights.
        let aux_scales = match &c.moe {
            Some(m) => {
                let sparse = m.layers.len() as f32;
                (m.load_balance_coef / sparse, m.router_z_coef / sparse)
            }
            None => (0.0, 0.0),
        };
        // Loss and dlogits (in place), for the mean over counted positions.
        let s = b.cross_entropy(
            &mut arena.logits,
            &tb.targets,
            Some(&tb.mask),
            n,
            c.vocab_size,
            Some(1.0 / count as f32),
        )?;
        // Head W (the embedding when tied): dW += dlogits^T hf, dhf = dlogits W
        if !frozen {
            let head_grad = match grads.lm_head.as_mut() {
                Some(g) => g,
                None => &mut grads.embed,
            };
            b.matmul(
                head_grad,
                &arena.logits,
                &arena.hf,
                &mm(c.vocab_size, d, n).trans_a(true).accumulate(),
            )?;
        }
        let head = match quantized.map(|q| q.head()) {
            Some(Some((packed, scales))) => Mat::Q8(packed, scales),
            _ => Mat::F32(params.head()),
        };
        head.grad_input(
            b,
            &mut arena.dh,
            &arena.logits,
            mm(n, d, c.vocab_size),
            &mut arena.deq,
        )?;
        b.rmsnorm_backward(
            &mut arena.dx,
            if frozen {
                &mut arena.sink_d
            } else {
                &mut grads.final_norm
            },
            &arena.dh,
            &arena.x_out,
            &params.final_norm,
            &arena.rstd_f,
            n,
            d,
        )?;
        let (rope_q, rope_k) = c.rope_specs(tb.batch, tb.seq, 0);
        let att_spec = AttentionSpec::causal(tb.batch, tb.seq, c.q_heads, c.kv_heads, c.head_dim);
        let layout_err = || invalid("gradients laid out differently from the parameters".into());
        for l in (0..c.n_layers).rev() {
            let (p, a) = (&params.layers[l], &arena.layers[l]);
            let w = block_view(params, quantized, l)?;
            let mut g = (!frozen).then(|| &mut grads.layers[l]);
            // The adapters of this block: weights, gradients (split by part), kept x A^T.
            let (lw, mut lg, lt) = match lora.as_deref_mut() {
                Some(st) => (
                    Some(&st.weights.layers[l]),
                    Some(st.grads.layers[l].as_mut()),
                    Some(&arena.lora_t[l]),
                ),
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
                    let ml = match (
                        lw.and_then(|w| w.mlp.as_ref()),
                        lg_mlp,
                        lt.and_then(|t| t.mlp.as_ref()),
                        lora_ctx,
                    ) {
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
                    let ml = match (
                        lw.and_then(|w| w.moe.as_ref()),
                        lg_moe,
                        lt.and_then(|t| t.moe.as_ref()),
                        lora_ctx,
                    ) {
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
            b.rmsnorm_backward(
                &mut arena.dx2,
                match g.as_deref_mut() {
                    Some(g) => &mut g.ffn_norm,
                    None => &mut arena.sink_d,
                },
                &arena.dh,
                &a.x_mid,
                &p.ffn_norm,
                &a.rstd2,
                n,
                d,
            )?;
            b.axpy(&mut arena.dx2, 1.0, &arena.dx)?;
            // --- attention: x_mid = x_in + att Wo^T; dx2 holds d x_mid.
            if let Some(g) = g.as_deref_mut() {
                b.matmul(
                    &mut g.wo,
                    &arena.dx2,
                    &a.att,
                    &mm(d, q, n).trans_a(true).accumulate(),
                )?;
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
                        Some(g) => if i == 0 {
                            g.q_norm.as_mut()
                        } else {
                            g.k_norm.as_mut()
                        }
                        .ok_or_else(layout_err)?,
                        None => &mut arena.sink_hd,
                    };
                    b.rmsnorm_backward(dst, dweight, dy, x, wn, rstd, rows[i], hd)?;
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
                b.matmul(
                    &mut g.wq,
                    &arena.dq,
                    &a.h,
                    &mm(q, d, n).trans_a(true).accumulate(),
                )?;
                b.matmul(
                    &mut g.wk,
                    &arena.dk,
                    &a.h,
                    &mm(kv, d, n).trans_a(true).accumulate(),
                )?;
                b.matmul(
                    &mut g.wv,
                    &arena.dv,
                    &a.h,
                    &mm(kv, d, n).trans_a(true).accumulate(),
                )?;
            }
            w.wq.grad_input(b, &mut arena.dh, &arena.dq, mm(n, d, q), &mut arena.deq)?;
            w.wk.grad_input(
                b,
                &mut arena.dh,
                &arena.dk,
                mm(n, d, kv).accumulate(),
                &mut arena.deq,
            )?;
            w.wv.grad_input(
                b,
                &mut arena.dh,
                &arena.dv,
                mm(n, d, kv).accumulate(),
                &mut arena.deq,
            )?;
            if let (Some(lw), Some(lg), Some(lt), Some(ctx)) = (lw, lg, lt, lora_ctx) {
                let dt = &mut arena.lora_dt;
                for (pair, grad, t, dy, cols) in [
                    (&lw.wq, lg.wq, &lt.wq, &arena.dq, q),
                    (&lw.wk, lg.wk, &lt.wk, &arena.dk, kv),
                    (&lw.wv, lg.wv, &lt.wv, &arena.dv, kv),
                ] {
                    adapt_backward(
                        b,
                        pair,
                        grad,
                        t,
                        dt,
                        Some(&mut arena.dh),
                        dy,
                        &a.h,
                        ctx.spec(n, d, cols),
                    )?;
                }
            }
            // d x_in = dx2 (residual) + rmsnorm backward of dh, into dx for the block below.
            b.rmsnorm_backward(
                &mut arena.dx,
                match g {
                    Some(g) => &mut g.attn_norm,
                    None => &mut arena.sink_d,
                },
                &arena.dh,
                &a.x_in,
                &p.attn_norm,
                &a.rstd1,
                n,
                d,
            )?;
            b.axpy(&mut arena.dx, 1.0, &arena.dx2)?;
        }
        if !frozen {
            b.embedding_backward(&mut grads.embed, &arena.dx, &tb.inputs, c.vocab_size, d)?;
        }
        Ok(LossSum {
            sum: s.loss_sum,
            count: s.count,
            load_balance: aux.load_balance,
            router_z: aux.router_z,
        })
    }
    /// Zeroes the accumulated gradients (the adapters' while adapters are attached).
    pub fn zero_grad(&mut self) -> Result<()> {
        if let Some(st) = self.lora.as_mut() {
            for g in adapter_buffers_mut(&mut st.grads) {
                self.backend.fill(g, 0.0)?;
            }
            return Ok(());
        }
        self.refuse_if_quantized("zero_grad")?;
        for g in self.grads.as_mut().into_leaves() {
            self.backend.fill(g, 0.0)?;
        }
        Ok(())
    }
    /// The global L2 norm of the accumulated gradients (the adapters' while attached)
    /// times `scale`.
    pub fn grad_norm(&self, scale: f32) -> Result<f64> {
        let total = match &self.lora {
            Some(st) => self.backend.sum_of_squares_many(&adapter_buffers(&st.grads))?,
            None => self
                .backend
                .sum_of_squares_many(&self.grads.as_ref().into_leaves())?,
        };
        Ok(libm::sqrt(total) * scale.abs() as f64)
    }
    /// One AdamW (or SGD) step with the accumulated gradients times `grad_scale`; weight
    /// decay applies to the embedding, the projections and the routers, never to norm
    /// weights.
    pub fn step(&mut self, optimizer: &Optimizer, grad_scale: f32) -> Result<()> {
        if let Some(st) = self.lora.as_mut() {
            // Adapters alone, every one decayed (as AdamW over PEFT's trainable parameters).
            optimizer.validate()?;
            self.step += 1;
            let b = &self.backend;
            let ps = adapter_buffers_mut(&mut st.weights);
            let gs = adapter_buffers(&st.grads);
            let ms = adapter_buffers_mut(&mut st.m);
            let vs = adapter_buffers_mut(&mut st.v);
            for (((p, g), m), v) in ps.into_iter().zip(gs).zip(ms).zip(vs) {
                if let Some(hp) = optimizer.adam_params(grad_scale) {
                    b.adam_update(p, g, m, v, &hp, self.step)?;
                } else if let Some(hp) = optimizer.sgd_params(grad_scale) {
                    let velocity = if hp.momentum != 0.0 { Some(m) } else { None };
                    b.sgd_update(p, g, velocity, &hp)?;
                }
            }
            return Ok(());
        }
        self.refuse_if_quantized("step")?;
        optimizer.validate()?;
        self.step += 1;
        let decays: Vec<bool> = self
            .config
            .layout()
            .into_leaves()
            .iter()
            .map(|t| !matches!(t.kind, TensorKind::Norm | TensorKind::Bias))
            .collect();
        let b = &self.backend;
        let params = self.params.as_mut().into_leaves();
        let grads = self.grads.as_ref().into_leaves();
        let ms = self.m.as_mut().into_leaves();
        let vs = self.v.as_mut().into_leaves();
        for ((((p, g), m), v), decay) in params.into_iter().zip(grads).zip(ms).zip(vs).zip(decays) {
            let opt = if decay {
                *optimizer
            } else {
                optimizer.weight_decay(0.0)
            };
            if let Some(hp) = opt.adam_params(grad_scale) {
                b.adam_update(p, g, m, v, &hp, self.step)?;
            } else if let Some(hp) = opt.sgd_params(grad_scale) {
                let velocity = if hp.momentum != 0.0 { Some(m) } else { None };
                b.sgd_update(p, g, velocity, &hp)?;
            }
        }
        Ok(())
    }
}
