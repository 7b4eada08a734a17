//! [`TransformerModel`]: construction, the training step (forward, backward, update) and the named parameters.

use super::*;

/// The loss of one batch: the LM loss summed over the counted positions, and their
/// number; the auxiliary losses of the sparse blocks, averaged over those blocks (0 for a
/// dense model).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LossSum {
    /// The LM loss summed over the counted positions.
    pub sum: f64,
    /// Counted positions.
    pub count: usize,
    /// The load-balancing loss (0 for a dense model).
    pub load_balance: f64,
    /// The router z-loss (0 for a dense model).
    pub router_z: f64,
}

/// Auxiliary losses of a forward pass, averaged over the sparse blocks.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(super) struct AuxLoss {
    pub(super) load_balance: f64,
    pub(super) router_z: f64,
}

/// A transformer LM living on backend `B`.
pub struct TransformerModel<B: Backend> {
    /// Where the buffers live and the math runs.
    pub backend: B,
    /// The architecture.
    pub config: TransformerConfig,
    /// The weights, laid out as [`TransformerConfig::layout`].
    pub params: Params<B>,
    /// The accumulated gradients, laid out like `params`.
    pub grads: Params<B>,
    /// Adam's first moments (SGD's velocity), laid out like `params`.
    pub m: Params<B>,
    /// Adam's second moments.
    pub v: Params<B>,
    /// Optimizer steps taken.
    pub step: u64,
    /// Operand precision of every GEMM (BF16 operands, f32 accumulation, when mixed).
    pub precision: OperandPrecision,
    pub(super) arena: Option<Arena<B>>,
    pub(super) decode: Option<DecodeArena<B>>,
    /// Set by [`TransformerModel::quantize`]: the int8 matrices. The f32 matrices, the
    /// gradients and the optimizer state are then gone.
    pub quantized: Option<QuantParams<B>>,
    /// Expert usage of the last forward pass: per sparse block, the fraction of routed
    /// slots each expert received.
    pub(super) expert_usage: Vec<Vec<f64>>,
    /// Low-rank adapters ([`TransformerModel::add_lora`]); while attached, every parameter
    /// is frozen and `grads`, `m`, `v` are empty.
    pub lora: Option<LoraState<B>>,
    /// Adapters held beside the model under names ([`TransformerModel::add_named_lora`]),
    /// which the cached passes pick per sequence; the model itself stays unadapted.
    pub named_lora: Vec<NamedLora<B>>,
}

impl<B: Backend> TransformerModel<B> {
    /// Initialization (GPT-2 / Llama practice): every matrix and router normal(0, 0.02),
    /// the two output projections of each block and expert (`o_proj`, `down_proj`) scaled
    /// by `1 / sqrt(2 * n_layers)` so the residual stream's variance does not grow with
    /// depth; norm weights one. Tensors are drawn in [`Tree::into_leaves`] order.
    pub fn new(backend: B, config: TransformerConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let mut rng = Rng::new(seed);
        let std = 0.02f32;
        let out_std = std / libm::sqrtf(2.0 * config.n_layers as f32);
        let b = &backend;
        let params = config.layout().try_map(|name, t| match t.kind {
            TensorKind::Norm => b.upload(&alloc::vec![1.0f32; t.len()]),
            TensorKind::Bias => b.zeros(t.len()),
            TensorKind::Matrix | TensorKind::Router => {
                let out_proj = name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight");
                b.upload(&rng.normal_vec(t.len(), if out_proj { out_std } else { std }))
            }
        })?;
        Self::from_params(backend, config, params)
    }
    /// A model around given parameters (a checkpoint, a test fixture).
    pub fn from_params(backend: B, config: TransformerConfig, params: Params<B>) -> Result<Self> {
        Self::from_params_with(backend, config, params, false)
    }
    /// [`TransformerModel::from_params`]; `frozen` leaves the gradients and moments empty
    /// (a copy of a model with adapters attached).
    pub(super) fn from_params_with(
        backend: B, config: TransformerConfig, params: Params<B>, frozen: bool,
    ) -> Result<Self> {
        config.validate()?;
        let layout = config.layout();
        let named = params.as_ref().into_named();
        let want = layout.as_ref().into_named();
        if named.len() != want.len() || params.as_ref().zip(layout.as_ref()).is_none() {
            return Err(CoreError::InvalidArgument {
                op: "transformer parameters",
                message: format!(
                    "{} parameter tensors laid out differently from the configuration's {}",
                    named.len(),
                    want.len()
                ),
            });
        }
        for ((name, buf), (_, t)) in named.iter().zip(&want) {
            let (have, need) = (backend.len(buf), t.len());
            if have != need {
                return Err(CoreError::InvalidArgument {
                    op: "transformer parameters",
                    message: format!("{name} has {have} values, the configuration needs {need}"),
                });
            }
        }
        let state = |b: &B| {
            if frozen {
                hollow(b, &layout)
            } else {
                zeros_like(b, &layout)
            }
        };
        let (grads, m, v) = (state(&backend)?, state(&backend)?, state(&backend)?);
        Ok(Self::assemble(backend, config, params, [grads, m, v], None))
    }
    /// An int8 model from its parts (a Q8 checkpoint): `params` holds the f32 norms and
    /// routers (its matrices may be empty: they are dropped), `quantized` the int8
    /// matrices, both in the configuration's layout.
    pub fn from_quantized(
        backend: B, config: TransformerConfig, params: Params<B>, quantized: QuantParams<B>,
    ) -> Result<Self> {
        config.validate()?;
        let layout = config.layout();
        let b = &backend;
        let pc = crate::ops::q8::packed_cols;
        let bad = |message: String| CoreError::InvalidArgument { op: "transformer parameters", message };
        let mismatch = || bad("the tensors are laid out differently from the configuration".into());
        let pairs = params
            .as_ref()
            .zip(quantized.as_ref())
            .and_then(|t| t.zip(layout.as_ref()))
            .ok_or_else(mismatch)?;
        for (name, ((f, q), t)) in pairs.into_named() {
            let (rows, cols) = t.rows_cols();
            match (t.kind, q) {
                (TensorKind::Matrix, Some((p, s))) => {
                    let q4 = crate::ops::q4::is_q4(rows, cols, b.len(p), b.len(s));
                    if !q4 && b.len(p) != rows * pc(cols) {
                        return Err(bad(format!("int8 {name} does not have {rows} rows of {cols}")));
                    }
                    if !q4 {
                        crate::ops::q8::q8_block("transformer parameters", rows, cols, b.len(s))?;
                    }
                }
                (TensorKind::Matrix, None) => return Err(bad(format!("{name} has no int8 weights"))),
                (_, Some(_)) => return Err(bad(format!("{name} stays f32 in an int8 model"))),
                (_, None) => {
                    if b.len(f) != t.len() {
                        return Err(bad(format!("{name} does not have {} values", t.len())));
                    }
                }
            }
        }
        // The f32 matrices an int8 model does not keep.
        let mut params = params;
        for (buf, t) in params.as_mut().into_leaves().into_iter().zip(layout.as_ref().into_leaves()) {
            if t.kind == TensorKind::Matrix {
                *buf = b.zeros(0)?;
            }
        }
        let state = [hollow(b, &layout)?, hollow(b, &layout)?, hollow(b, &layout)?];
        Ok(Self::assemble(backend, config, params, state, Some(quantized)))
    }
    /// The same model on another backend (a device, or back to the host): its weights,
    /// f32 or int8, and for an f32 model the gradients, optimizer moments, step count and
    /// GEMM precision. `self` is not changed.
    pub fn copy_to<C: Backend>(&self, backend: C) -> Result<TransformerModel<C>> {
        self.check_fits(&backend)?;
        let b = &self.backend;
        let copy = |c: &C, buf: &B::Buffer| c.upload(&b.download(buf)?);
        let tree = |c: &C, t: &Params<B>| t.as_ref().try_map(|_, h| copy(c, h));
        let params = tree(&backend, &self.params)?;
        let config = self.config.clone();
        let mut to = match &self.quantized {
            Some(q) => {
                let quantized = q.as_ref().try_map(|_, leaf| match leaf {
                    Some((packed, scales)) => Ok(Some((copy(&backend, packed)?, copy(&backend, scales)?))),
                    None => Ok(None),
                })?;
                TransformerModel::from_quantized(backend, config, params, quantized)?
            }
            None => {
                let state =
                    [tree(&backend, &self.grads)?, tree(&backend, &self.m)?, tree(&backend, &self.v)?];
                let mut to =
                    TransformerModel::from_params_with(backend, config, params, self.lora.is_some())?;
                [to.grads, to.m, to.v] = state;
                to
            }
        };
        if let Some(st) = &self.lora {
            to.lora = Some(st.copy_to(&self.backend, &to.backend)?);
        }
        for n in &self.named_lora {
            let weights = lora::copy_adapters(&self.backend, &to.backend, &n.weights)?;
            to.named_lora.push(NamedLora { name: n.name.clone(), config: n.config.clone(), weights });
        }
        to.step = self.step;
        to.precision = self.precision;
        Ok(to)
    }
    /// Refuses a backend whose one-buffer bound ([`Memory::max_binding_len`](crate::backend::Memory::max_binding_len)) is below
    /// what this model's f32 tensors or one position's scratch need, before anything is
    /// copied. int8 matrices are not bounded here: a backend binds them in row slabs.
    pub(super) fn check_fits<C: Backend>(&self, to: &C) -> Result<()> {
        let limit = to.max_binding_len();
        if limit == usize::MAX {
            return Ok(());
        }
        let c = &self.config;
        let mut needs: Vec<(String, usize)> = alloc::vec![
            ("the logits of one position".into(), c.vocab_size),
            ("one layer's KV cache".into(), c.max_seq_len * c.kv_dim()),
            ("one position's attention scores".into(), c.q_heads * c.max_seq_len),
            ("the RoPE table".into(), c.max_seq_len * c.head_dim),
        ];
        if let Some(f) = (0..c.n_layers).filter_map(|l| c.mlp_width(l)).max() {
            needs.push(("one position's feed-forward".into(), f));
        }
        for (name, buf) in self.params.as_ref().into_named() {
            needs.push((name, self.backend.len(buf)));
        }
        match needs.into_iter().find(|(_, n)| *n > limit) {
            Some((what, n)) => Err(CoreError::Device {
                backend: to.name(),
                message: format!(
                    "{what} needs {n} values in one buffer, over this adapter's limit of {limit} \
                     values per binding: use a smaller model or max_seq_len, or the CPU"
                ),
            }),
            None => Ok(()),
        }
    }
    /// A model at step 0 around checked parts: `[grads, m, v]` laid out like `params`.
    pub(super) fn assemble(
        backend: B, config: TransformerConfig, params: Params<B>, [grads, m, v]: [Params<B>; 3],
        quantized: Option<QuantParams<B>>,
    ) -> Self {
        TransformerModel {
            backend,
            config,
            params,
            grads,
            m,
            v,
            step: 0,
            precision: OperandPrecision::F32,
            arena: None,
            decode: None,
            quantized,
            expert_usage: Vec::new(),
            lora: None,
            named_lora: Vec::new(),
        }
    }
    pub(super) fn ensure_arena(&mut self, batch: usize, seq: usize) -> Result<()> {
        if seq > self.config.max_seq_len {
            return Err(CoreError::InvalidDimension {
                op: "transformer forward",
                message: format!("sequence length {seq} is over max_seq_len {}", self.config.max_seq_len),
            });
        }
        if self.arena.as_ref().is_none_or(|a| a.batch != batch || a.seq != seq) {
            // Drop the old arena first so peak memory holds one, not two.
            self.arena = None;
            let lora = self.lora.as_ref().map(|l| &l.config);
            self.arena = Some(Arena::new(&self.backend, &self.config, batch, seq, lora)?);
        }
        Ok(())
    }
    /// Expert usage of the last forward pass (training, evaluation or decoding): one row
    /// per sparse block, the fraction of routed slots each expert received. Empty for a
    /// dense model or before any forward pass.
    pub fn expert_usage(&self) -> &[Vec<f64>] {
        &self.expert_usage
    }
    /// Forward pass of a batch up to the logits (kept in the arena); returns the sparse
    /// blocks' auxiliary losses.
    pub(super) fn forward(&mut self, tb: &TokenBatch) -> Result<AuxLoss> {
        tb.check(self.config.vocab_size)?;
        self.ensure_arena(tb.batch, tb.seq)?;
        let c = &self.config;
        let (n, d) = (tb.batch * tb.seq, c.d_model);
        let b = &self.backend;
        let arena = self.arena.as_mut().expect("ensured above");
        let (rope_q, rope_k) = c.rope_specs(tb.batch, tb.seq, 0);
        let att_spec = AttentionSpec::causal(tb.batch, tb.seq, c.q_heads, c.kv_heads, c.head_dim);
        let prec = self.precision;
        let mm = |m, nn, k| MatmulSpec::new(m, nn, k).precision(prec);
        let quantized = self.quantized.as_ref();
        // The residual stream runs through x_out; each block saves its input and middle.
        arena.embed(b, c, &self.params, quantized, &tb.inputs)?;
        let mut aux = AuxLoss::default();
        self.expert_usage.clear();
        let lora_ctx = LoraCtx::of(self.lora.as_ref(), prec);
        for l in 0..c.n_layers {
            let w = block_view(&self.params, quantized, l)?;
            let lora = block_lora(self.lora.as_ref(), lora_ctx, l, &mut arena.lora_t, n);
            let a = &mut arena.layers[l];
            let acts = a.acts(true);
            let specs = (&rope_q, &rope_k, &att_spec);
            let p = &self.params.layers[l];
            block_forward(b, c, l, p, &w, &mut arena.x_out, acts, Keys::Fresh, specs, n, prec, lora)?;
            if let Some(acts) = &a.moe {
                aux.load_balance += acts.routing.load_balance;
                aux.router_z += acts.routing.z_loss;
                self.expert_usage.push(acts.routing.usage());
            }
        }
        let sparse = c.sparse_layers().max(1) as f64;
        aux.load_balance /= sparse;
        aux.router_z /= sparse;
        arena.final_norm(b, c, &self.params, n)?;
        // logits = hf E^T   (n, d) x (vocab, d)^T
        let head = match quantized.map(|q| q.head()) {
            Some(Some((packed, scales))) => Mat::Q8(packed, scales),
            _ => Mat::F32(self.params.head()),
        };
        head.apply(b, &mut arena.logits, &arena.hf, mm(n, c.vocab_size, d))?;
        Ok(aux)
    }
    /// The residual stream after each decoder layer in `layers` (1-based: layer `k`'s
    /// output is transformers' `hidden_states[k]`: before the final norm, except after the
    /// last layer, where transformers records the normed stream), for `ids`
    /// (`batch` rows of equal length) under `mask` (`true` for real tokens; padded
    /// positions see the real tokens only). Layers past the last one asked for are not
    /// run. Each entry is `(batch, seq, d_model)`.
    pub fn hidden_states(
        &mut self, ids: &[u32], batch: usize, mask: Option<&[bool]>, layers: &[usize],
    ) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        let err = |message: String| CoreError::InvalidDimension { op: "hidden_states", message };
        if batch == 0 || ids.is_empty() || !ids.len().is_multiple_of(batch) {
            return Err(err(format!("{} ids do not make {batch} rows", ids.len())));
        }
        if let Some(&bad) = layers.iter().find(|&&l| l == 0 || l > c.n_layers) {
            return Err(err(format!("layer {bad}: the model's layers are 1..={}", c.n_layers)));
        }
        let seq = ids.len() / batch;
        let tb = TokenBatch {
            batch,
            seq,
            inputs: ids.to_vec(),
            targets: alloc::vec![0; ids.len()],
            mask: alloc::vec![true; ids.len()],
        };
        tb.check(c.vocab_size)?;
        let all_open;
        let mask = match mask {
            Some(m) => {
                crate::error::check_len("hidden_states", "mask", m.len(), ids.len())?;
                m
            }
            None => {
                all_open = alloc::vec![true; ids.len()];
                &all_open
            }
        };
        self.ensure_arena(batch, seq)?;
        let c = &self.config;
        let n = batch * seq;
        let b = &self.backend;
        let arena = self.arena.as_mut().expect("ensured above");
        let (rope_q, rope_k) = c.rope_specs(batch, seq, 0);
        let att_spec = AttentionSpec::causal(batch, seq, c.q_heads, c.kv_heads, c.head_dim);
        let quantized = self.quantized.as_ref();
        arena.embed(b, c, &self.params, quantized, ids)?;
        let last = layers.iter().copied().max().unwrap_or(0);
        let mut out = alloc::vec![Vec::new(); layers.len()];
        for l in 0..last {
            let w = block_view(&self.params, quantized, l)?;
            let acts = arena.layers[l].acts(false);
            let specs = (&rope_q, &rope_k, &att_spec);
            let p = &self.params.layers[l];
            block_forward(
                b,
                c,
                l,
                p,
                &w,
                &mut arena.x_out,
                acts,
                Keys::Masked(mask),
                specs,
                n,
                self.precision,
                None,
            )?;
            // transformers' last entry is the final-normed stream, not the residual.
            let state = if l + 1 == c.n_layers {
                arena.final_norm(b, c, &self.params, n)?;
                &arena.hf
            } else {
                &arena.x_out
            };
            for (slot, _) in layers.iter().enumerate().filter(|(_, &k)| k == l + 1) {
                out[slot] = b.download(state)?;
            }
        }
        Ok(out)
    }
    /// Bytes the weights and any training state hold (parameters, gradients, optimizer
    /// moments, int8 matrices and their scales); activations are not counted.
    pub fn weight_bytes(&self) -> usize {
        let b = &self.backend;
        let tree = |t: &Params<B>| -> usize { t.as_ref().into_leaves().into_iter().map(|x| b.len(x)).sum() };
        let q8: usize = match &self.quantized {
            Some(q) => q.as_ref().into_leaves().into_iter().flatten().map(|(p, s)| b.len(p) + b.len(s)).sum(),
            None => 0,
        };
        4 * (tree(&self.params) + tree(&self.grads) + tree(&self.m) + tree(&self.v) + q8)
    }
    /// Logits of the last forward pass, on the host, `(batch * seq, vocab)`.
    pub fn forward_logits(&mut self, tb: &TokenBatch) -> Result<Vec<f32>> {
        self.forward(tb)?;
        self.backend.download(&self.arena.as_ref().expect("forward made it").logits)
    }
    /// Forward and loss, no gradients.
    pub fn evaluate(&mut self, tb: &TokenBatch) -> Result<LossSum> {
        let aux = self.forward(tb)?;
        let arena = self.arena.as_mut().expect("forward made it");
        let n = tb.batch * tb.seq;
        let s = self.backend.cross_entropy(
            &mut arena.logits,
            &tb.targets,
            Some(&tb.mask),
            n,
            self.config.vocab_size,
            None,
        )?;
        Ok(LossSum {
            sum: s.loss_sum,
            count: s.count,
            load_balance: aux.load_balance,
            router_z: aux.router_z,
        })
    }
    /// Rounds every matrix to int8 in blocks of 32 (norm weights and routers stay f32),
    /// then frees the f32 matrices, the gradients and the optimizer state: one-way,
    /// inference only. Calling it again does nothing.
    pub fn quantize(&mut self) -> Result<()> {
        self.quantize_as(QuantFormat::Q8)
    }
    /// [`TransformerModel::quantize`] to `format`: at [`QuantFormat::Q4`] the blocks'
    /// matrices take 4 bits and the embedding and output head stay int8 (see
    /// [`crate::ops::q4`] for why). A model already quantized is left as it is.
    pub fn quantize_as(&mut self, format: QuantFormat) -> Result<()> {
        if self.quantized.is_some() {
            return Ok(());
        }
        let layout = self.config.layout();
        let b = &self.backend;
        let pairs = self
            .params
            .as_ref()
            .zip(layout.as_ref())
            .ok_or_else(|| invalid("parameters laid out differently from the configuration".into()))?;
        let quantized = pairs.try_map(|name, (buf, t)| match t.kind {
            TensorKind::Matrix => {
                let (rows, cols) = t.rows_cols();
                let host = b.download(buf)?;
                let (packed, scales) = match format_of(format, name) {
                    QuantFormat::Q4 => crate::ops::q4::quantize_q4(&host, rows, cols)?,
                    QuantFormat::Q8 => crate::ops::q8::quantize_blocks(&host, rows, cols)?,
                    QuantFormat::Q8Rows => crate::ops::q8::quantize_rows(&host, rows, cols)?,
                };
                Ok(Some((b.upload(&packed)?, b.upload(&scales)?)))
            }
            TensorKind::Norm | TensorKind::Bias | TensorKind::Router => Ok(None),
        })?;
        self.quantized = Some(quantized);
        // Free what an int8 model no longer has: f32 matrices, gradients, moments, arenas.
        for (buf, t) in self.params.as_mut().into_leaves().into_iter().zip(layout.as_ref().into_leaves()) {
            if t.kind == TensorKind::Matrix {
                *buf = b.zeros(0)?;
            }
        }
        for set in [&mut self.grads, &mut self.m, &mut self.v] {
            for buf in set.as_mut().into_leaves() {
                *buf = b.zeros(0)?;
            }
        }
        self.arena = None;
        self.decode = None;
        Ok(())
    }
    /// Whether any matrix is held at 4 bits ([`QuantFormat::Q4`]).
    pub fn has_q4(&self) -> bool {
        let b = &self.backend;
        let Some(q) = &self.quantized else { return false };
        q.as_ref().zip(self.config.layout()).is_some_and(|t| {
            t.into_leaves().into_iter().any(|(w, spec)| match w {
                Some((p, s)) => {
                    let (rows, cols) = spec.rows_cols();
                    crate::ops::q4::is_q4(rows, cols, b.len(p), b.len(s))
                }
                None => false,
            })
        })
    }
    pub(super) fn refuse_if_quantized(&self, what: &str) -> Result<()> {
        if self.quantized.is_some() {
            return Err(CoreError::InvalidArgument {
                op: "transformer",
                message: format!("{what}: the model is quantized (int8, inference only); reload the f32 checkpoint to train"),
            });
        }
        Ok(())
    }
    /// Attaches fresh adapters ([`LoraState::new`], drawn from `seed`) to the projections
    /// `config` targets and freezes every parameter: the gradients and optimizer moments of
    /// the base are freed, and `accumulate`/`step` train the adapters alone. The model's
    /// predictions are unchanged (every `B` starts at zero). The base may be int8.
    pub fn add_lora(&mut self, config: LoraConfig, seed: u64) -> Result<()> {
        if self.lora.is_some() {
            return Err(invalid(
                "adapters are attached already: merge_lora() first, or start again from the base".into(),
            ));
        }
        let state = LoraState::new(&self.backend, config, &self.config.layout(), seed)?;
        let layout = self.config.layout();
        let b = &self.backend;
        for set in [&mut self.grads, &mut self.m, &mut self.v] {
            *set = hollow(b, &layout)?;
        }
        self.lora = Some(state);
        self.arena = None;
        self.decode = None;
        Ok(())
    }
    /// Folds the adapters into the weights they adapt (`W += scale * B A`) and unfreezes
    /// the model, with fresh gradients and optimizer moments: an ordinary model that
    /// predicts what the adapted one did. Refused on an int8 base (its f32 weights are gone).
    pub fn merge_lora(&mut self) -> Result<()> {
        let Some(st) = self.lora.as_ref() else {
            return Err(invalid("merge_lora: no adapters are attached".into()));
        };
        if self.quantized.is_some() {
            return Err(invalid(
                "merge_lora: the base is int8 and its f32 weights are gone; attach and load the adapters on the f32 base to merge".into(),
            ));
        }
        lora::merge_into(&self.backend, &mut self.params, st)?;
        let layout = self.config.layout();
        self.grads = zeros_like(&self.backend, &layout)?;
        self.m = zeros_like(&self.backend, &layout)?;
        self.v = zeros_like(&self.backend, &layout)?;
        self.lora = None;
        self.arena = None;
        self.decode = None;
        Ok(())
    }
    /// Holds `weights` (adapters of `config`'s rank and targets, shaped as
    /// [`adapted_shapes`] says) beside the model under `name`, and returns their index: the
    /// cached passes then pick them per sequence
    /// ([`TransformerModel::forward_cached_picked`],
    /// [`TransformerModel::forward_cached_rows_picked`]), so one base serves several
    /// adapters in one step. The model's weights and any attached adapters are untouched.
    /// An empty or taken name, bad settings or a misshapen tensor is refused.
    pub fn add_named_lora(&mut self, name: &str, config: LoraConfig, weights: Adapters<B>) -> Result<usize> {
        if name.is_empty() || self.named_lora.iter().any(|n| n.name == name) {
            return Err(invalid(format!("adapter name `{name}` is empty or already held")));
        }
        config.validate()?;
        let shapes = adapted_shapes(&config, &self.config.layout());
        let r = config.rank;
        let b = &self.backend;
        let pairs = shapes
            .as_ref()
            .zip(weights.as_ref())
            .ok_or_else(|| invalid(format!("adapter `{name}` is laid out differently from the model")))?;
        for (tensor, (shape, pair)) in pairs.into_named() {
            let fits = match (shape, pair) {
                (Some((d_out, d_in)), Some(p)) => b.len(&p.a) == r * d_in && b.len(&p.b) == d_out * r,
                (None, None) => true,
                _ => false,
            };
            if !fits {
                return Err(invalid(format!(
                    "adapter `{name}`: {tensor} does not match rank {r} and targets {}",
                    config.targets.join(",")
                )));
            }
        }
        self.named_lora.push(NamedLora { name: name.into(), config, weights });
        self.decode = None;
        Ok(self.named_lora.len() - 1)
    }
    /// Values the optimizer updates: the adapters' while attached, else every parameter.
    pub fn trainable_parameters(&self) -> usize {
        match &self.lora {
            Some(st) => st.parameter_count(&self.backend),
            None => self.config.parameter_count(),
        }
    }
    /// Overwrites the parameter called `name` (a Hugging Face name, as listed by
    /// [`TransformerModel::named_parameters`]) with `values`, which must hold exactly its
    /// number of elements, all finite. On an int8 model only the f32 tensors (norms,
    /// routers) can be set.
    pub fn set_parameter(&mut self, name: &str, values: &[f32]) -> Result<()> {
        let bad = |message: String| CoreError::InvalidArgument { op: "set_parameter", message };
        let layout = self.config.layout();
        let pairs = self
            .params
            .as_mut()
            .zip(layout.as_ref())
            .ok_or_else(|| bad("parameters laid out differently from the configuration".into()))?;
        let (buf, spec) = pairs
            .into_named()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, pair)| pair)
            .ok_or_else(|| bad(format!("the model has no parameter named `{name}`")))?;
        if self.quantized.is_some() && spec.kind == TensorKind::Matrix {
            return Err(bad(format!("{name} is int8 in a quantized model; set it before quantize()")));
        }
        if values.len() != spec.len() {
            return Err(bad(format!(
                "{name} has shape {:?} ({} values); got {}",
                spec.shape,
                spec.len(),
                values.len()
            )));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(bad(format!("{name}: value {i} is {}", values[i])));
        }
        self.backend.write(buf, values)
    }
    /// Every parameter on the host with its Hugging Face name.
    pub fn named_parameters(&self) -> Result<Vec<(String, Vec<f32>)>> {
        self.params
            .as_ref()
            .into_named()
            .into_iter()
            .map(|(n, p)| Ok((n, self.backend.download(p)?)))
            .collect()
    }
    /// The adapters (`grads: false`) or their accumulated gradients (`true`) on the host,
    /// under PEFT's names, `lora_A` then `lora_B` per projection; empty without adapters.
    pub fn named_adapters(&self, grads: bool) -> Result<Vec<(String, Vec<f32>)>> {
        let Some(st) = &self.lora else {
            return Ok(Vec::new());
        };
        st.named(if grads { &st.grads } else { &st.weights })
            .into_iter()
            .map(|(n, buf)| Ok((n, self.backend.download(buf)?)))
            .collect()
    }
    /// Every gradient on the host, named like its parameter.
    pub fn named_gradients(&self) -> Result<Vec<(String, Vec<f32>)>> {
        self.grads
            .as_ref()
            .into_named()
            .into_iter()
            .map(|(n, g)| Ok((n, self.backend.download(g)?)))
            .collect()
    }
}

/// The format tensor `name` (a Hugging Face name) takes when a model is quantized to
/// `format`: at [`QuantFormat::Q4`] the embedding and the output head stay int8, the one
/// choice that moved SmolLM2-135M's KL to f32 from 0.065 to 0.015 (see [`crate::ops::q4`]),
/// and so do routed experts (`mlp.experts.`), whose routed product reads int8 only.
pub fn format_of(format: QuantFormat, name: &str) -> QuantFormat {
    let int8 =
        name == "model.embed_tokens.weight" || name == "lm_head.weight" || name.contains(".mlp.experts.");
    match format {
        QuantFormat::Q4 if int8 => QuantFormat::Q8,
        f => f,
    }
}

impl<B: Backend + Memory<Buffer = crate::backend::HostBuffer>> TransformerModel<B> {
    /// The model `config` describes from its tensors read by our (transformers') names, on
    /// a host backend, the one builder of every loader (a Hugging Face folder, a GGUF file
    /// natively or in the browser). `read` gives a tensor in f32 in the layout's shape;
    /// with a `format`, `read_quant` gives each matrix already rounded to the format
    /// [`format_of`] picks for it (packed values, scales), so the f32 model never exists:
    /// each matrix's f32 values are dropped before the next is read. Norms, biases and
    /// routers stay f32.
    pub fn from_tensors<E: From<CoreError>>(
        backend: B, config: TransformerConfig, format: Option<QuantFormat>,
        mut read: impl FnMut(&str, &[usize]) -> core::result::Result<Vec<f32>, E>,
        mut read_quant: impl FnMut(&str, &[usize], QuantFormat) -> core::result::Result<(Vec<f32>, Vec<f32>), E>,
    ) -> core::result::Result<Self, E> {
        let layout = config.layout();
        let Some(format) = format else {
            let params: Params<B> = layout.try_map(|name, t| read(name, &t.shape))?;
            return Ok(TransformerModel::from_params(backend, config, params)?);
        };
        let mut quantized = Vec::new();
        let params: Params<B> = layout.try_map(|name, t| -> core::result::Result<Vec<f32>, E> {
            if t.kind != TensorKind::Matrix {
                quantized.push(None);
                return read(name, &t.shape);
            }
            quantized.push(Some(read_quant(name, &t.shape, format_of(format, name))?));
            Ok(Vec::new())
        })?;
        let mut q = quantized.into_iter();
        let quantized: QuantParams<B> =
            config.layout().try_map(|_, _| -> core::result::Result<_, E> { Ok(q.next().flatten()) })?;
        Ok(TransformerModel::from_quantized(backend, config, params, quantized)?)
    }
}
