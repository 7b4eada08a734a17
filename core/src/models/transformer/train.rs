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
        let (n, d) = (tb.batch * tb.seq, c.d_model);
        let prec = self.precision;
        let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
        let b = &self.backend;
        let arena = self.arena.as_mut().expect("forward made it");
        let quantized = self.quantized.as_ref();
        let params = &self.params;
        // Frozen under adapters: `grads` is empty, and the adapters' gradients are formed.
        let mut lora = self.lora.as_mut();
        let frozen = lora.is_some();
        let lora_ctx = LoraCtx::of(lora.as_deref(), prec);
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
        head.grad_input(b, &mut arena.dh, &arena.logits, mm(n, d, c.vocab_size), &mut arena.deq)?;
        let dw = if frozen { &mut arena.sink_d } else { &mut grads.final_norm };
        let saved = (&arena.x_out, &params.final_norm, &arena.rstd_f);
        norm_backward(b, &mut arena.dx, dw, &arena.dh, saved, (n, d), None)?;
        // The blocks in reverse, each one's backward beside its forward in block.rs.
        let ctx = BackwardCtx { b, c, prec, params, quantized, lora_ctx, batch: tb.batch, seq: tb.seq };
        for l in (0..c.n_layers).rev() {
            let g = (!frozen).then(|| &mut grads.layers[l]);
            block_backward(&ctx, l, g, lora.as_deref_mut(), arena, aux_scales)?;
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
            None => self.backend.sum_of_squares_many(&self.grads.as_ref().into_leaves())?,
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
            let opt = if decay { *optimizer } else { optimizer.weight_decay(0.0) };
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
