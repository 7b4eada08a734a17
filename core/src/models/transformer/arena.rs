//! The activations one (batch, seq) shape keeps for the backward pass, allocated once and reused.

use super::*;

/// Backward-pass scratch triples `(ds, dgate, dup)` (or forward `(gate, up, s)`), one per
/// buffer length: dense blocks, shared experts and grouped experts may differ in width.
pub(super) struct Triples<B: Backend> {
    pub(super) by_len: Vec<(usize, [B::Buffer; 3])>,
}

impl<B: Backend> Triples<B> {
    pub(super) fn new(b: &B, lens: impl IntoIterator<Item = usize>) -> Result<Self> {
        let mut by_len: Vec<(usize, [B::Buffer; 3])> = Vec::new();
        for len in lens {
            if !by_len.iter().any(|(l, _)| *l == len) {
                by_len.push((len, [b.zeros(len)?, b.zeros(len)?, b.zeros(len)?]));
            }
        }
        Ok(Triples { by_len })
    }
    pub(super) fn get(&mut self, len: usize) -> Result<&mut [B::Buffer; 3]> {
        self.by_len
            .iter_mut()
            .find(|(l, _)| *l == len)
            .map(|(_, t)| t)
            .ok_or_else(|| invalid(format!("no scratch of {len} values was prepared")))
    }
}

/// What a sparse block's forward pass keeps for its backward pass (and a cached forward
/// pass uses as scratch).
pub(super) struct MoeActs<B: Backend> {
    /// `(n, n_experts)` router logits.
    pub(super) logits: B::Buffer,
    /// On the host.
    pub(super) routing: Routing,
    /// `(n * top_k, d)`: the block's input rows, grouped by expert.
    pub(super) xe: B::Buffer,
    /// `(n * top_k, expert_d_ff)` each.
    pub(super) gate: B::Buffer,
    pub(super) up: B::Buffer,
    pub(super) s: B::Buffer,
    /// `(n * top_k, d)`: each expert's output, before its routing weight.
    pub(super) y: B::Buffer,
    /// `(n, top_k)` each slot's expert (`u32` bits) and weight, when the backend routes
    /// on its own buffers (see [`MoeOps::routes_on_device`](crate::backend::MoeOps::routes_on_device)); the slot-ordered rows of
    /// `gate`, `up`, `s` and `y` then follow them instead of the grouping.
    pub(super) slot_expert: B::Buffer,
    pub(super) slot_weight: B::Buffer,
}

impl<B: Backend> MoeActs<B> {
    pub(super) fn new(b: &B, n: usize, d: usize, m: &MoeConfig) -> Result<Self> {
        let rows = n * m.top_k;
        Ok(MoeActs {
            logits: b.zeros(n * m.n_experts)?,
            routing: Routing::default(),
            xe: b.zeros(rows * d)?,
            gate: b.zeros(rows * m.expert_d_ff)?,
            up: b.zeros(rows * m.expert_d_ff)?,
            s: b.zeros(rows * m.expert_d_ff)?,
            y: b.zeros(rows * d)?,
            slot_expert: b.zeros(rows)?,
            slot_weight: b.zeros(rows)?,
        })
    }
}

/// Activations of one block, kept for the backward pass.
pub(super) struct LayerActs<B: Backend> {
    pub(super) x_in: B::Buffer,
    pub(super) h: B::Buffer,
    pub(super) rstd1: B::Buffer,
    pub(super) q: B::Buffer,
    pub(super) k: B::Buffer,
    pub(super) v: B::Buffer,
    /// With `qk_norm`: q and k before their norms, and the norms' `rstd` per head;
    /// empty without.
    pub(super) qk: [B::Buffer; 4],
    pub(super) att: B::Buffer,
    pub(super) lse: B::Buffer,
    pub(super) x_mid: B::Buffer,
    pub(super) h2: B::Buffer,
    pub(super) rstd2: B::Buffer,
    /// `(n, f)` of the dense feed-forward or the shared expert; empty without one.
    pub(super) gate: B::Buffer,
    pub(super) up: B::Buffer,
    pub(super) s: B::Buffer,
    pub(super) moe: Option<MoeActs<B>>,
}

impl<B: Backend> LayerActs<B> {
    /// The block's activations for the batch forward pass; `save` keeps the block's input
    /// and middle for the backward pass (training), off when only the states are wanted.
    pub(super) fn acts(&mut self, save: bool) -> BlockActs<'_, B> {
        BlockActs {
            h: &mut self.h,
            rstd1: &mut self.rstd1,
            q: &mut self.q,
            k: &mut self.k,
            v: &mut self.v,
            qk: &mut self.qk,
            att: &mut self.att,
            lse: &mut self.lse,
            h2: &mut self.h2,
            rstd2: &mut self.rstd2,
            ffn: Some([&mut self.gate, &mut self.up, &mut self.s]),
            moe: self.moe.as_mut(),
            saved: if save { Some((&mut self.x_in, &mut self.x_mid)) } else { None },
        }
    }
}

/// Everything one (batch, seq) shape needs, allocated once and reused.
pub(super) struct Arena<B: Backend> {
    pub(super) batch: usize,
    pub(super) seq: usize,
    pub(super) layers: Vec<LayerActs<B>>,
    pub(super) x_out: B::Buffer,
    pub(super) hf: B::Buffer,
    pub(super) rstd_f: B::Buffer,
    pub(super) logits: B::Buffer,
    // backward scratch
    pub(super) dx: B::Buffer,
    pub(super) dx2: B::Buffer,
    pub(super) dh: B::Buffer,
    pub(super) datt: B::Buffer,
    pub(super) dq: B::Buffer,
    pub(super) dk: B::Buffer,
    pub(super) dv: B::Buffer,
    /// With `qk_norm`, the gradients of q and k before their norms; empty without.
    pub(super) dq_raw: B::Buffer,
    pub(super) dk_raw: B::Buffer,
    /// `(ds, dgate, dup)` for each feed-forward width.
    pub(super) ffn: Triples<B>,
    /// `(n * top_k, d)` and `(n, n_experts)` for sparse blocks; empty without.
    pub(super) dxe: B::Buffer,
    pub(super) dlogits: B::Buffer,
    /// With adapters: each adapted projection's `x A^T` per block, the `dt` scratch
    /// (`(n * top_k or n, rank)`), the gradients of frozen norm weights (discarded, `(d)`
    /// and `(head_dim)`), and f32 copies of an int8 base's matrices.
    pub(super) lora_t: Vec<Block<Option<B::Buffer>>>,
    pub(super) lora_dt: B::Buffer,
    pub(super) sink_d: B::Buffer,
    pub(super) sink_hd: B::Buffer,
    pub(super) deq: Dequant<B>,
}

/// `(q_raw, k_raw, rstd_q, rstd_k)` for `n` rows with `qk_norm`; empty buffers without.
pub(super) fn qk_scratch<B: Backend>(b: &B, c: &TransformerConfig, n: usize) -> Result<[B::Buffer; 4]> {
    let on = usize::from(c.qk_norm);
    Ok([
        b.zeros(on * n * c.q_dim())?,
        b.zeros(on * n * c.kv_dim())?,
        b.zeros(on * n * c.q_heads)?,
        b.zeros(on * n * c.kv_heads)?,
    ])
}

/// Each block's `x A^T` buffers for `n` rows, when adapters are attached.
pub(super) fn lora_t_for<B: Backend>(
    b: &B, c: &TransformerConfig, lora: Option<&LoraConfig>, n: usize,
) -> Result<Vec<Block<Option<B::Buffer>>>> {
    let Some(cfg) = lora else { return Ok(Vec::new()) };
    let shapes = adapted_shapes(cfg, &c.layout());
    let top_k = c.moe.as_ref().map_or(1, |m| m.top_k);
    shapes.layers.iter().map(|s| lora_acts(b, s, n, top_k, cfg.rank)).collect()
}

impl<B: Backend> Arena<B> {
    /// The token embedding of `ids` into the residual stream `x_out` (the int8 table where
    /// the model is quantized).
    pub(super) fn embed(
        &mut self, b: &B, c: &TransformerConfig, params: &Params<B>, quantized: Option<&QuantParams<B>>,
        ids: &[u32],
    ) -> Result<()> {
        match quantized.map(|q| &q.embed) {
            Some(Some((packed, scales))) => {
                b.q8_embedding(&mut self.x_out, packed, scales, ids, c.vocab_size, c.d_model)
            }
            _ => b.embedding_forward(&mut self.x_out, &params.embed, ids, c.vocab_size, c.d_model),
        }
    }

    /// The final RMSNorm of the residual stream's `n` rows into `hf`.
    pub(super) fn final_norm(
        &mut self, b: &B, c: &TransformerConfig, params: &Params<B>, n: usize,
    ) -> Result<()> {
        b.rmsnorm_forward(
            &mut self.hf,
            &mut self.rstd_f,
            &self.x_out,
            &params.final_norm,
            n,
            c.d_model,
            c.norm_eps,
        )
    }

    pub(super) fn new(
        b: &B, c: &TransformerConfig, batch: usize, seq: usize, lora: Option<&LoraConfig>,
    ) -> Result<Self> {
        let n = batch * seq;
        let (d, q, kv) = (c.d_model, c.q_dim(), c.kv_dim());
        let mut layers = Vec::new();
        let mut lens = Vec::new();
        for l in 0..c.n_layers {
            let f = c.mlp_width(l).unwrap_or(0);
            if f > 0 {
                lens.push(n * f);
            }
            let moe = match c.sparse(l) {
                Some(m) => {
                    lens.push(n * m.top_k * m.expert_d_ff);
                    Some(MoeActs::new(b, n, d, m)?)
                }
                None => None,
            };
            layers.push(LayerActs {
                x_in: b.zeros(n * d)?,
                h: b.zeros(n * d)?,
                rstd1: b.zeros(n)?,
                q: b.zeros(n * q)?,
                k: b.zeros(n * kv)?,
                v: b.zeros(n * kv)?,
                qk: qk_scratch(b, c, n)?,
                att: b.zeros(n * q)?,
                lse: b.zeros(n * c.q_heads)?,
                x_mid: b.zeros(n * d)?,
                h2: b.zeros(n * d)?,
                rstd2: b.zeros(n)?,
                gate: b.zeros(n * f)?,
                up: b.zeros(n * f)?,
                s: b.zeros(n * f)?,
                moe,
            });
        }
        let (dxe, dlogits) = match &c.moe {
            Some(m) => (b.zeros(n * m.top_k * d)?, b.zeros(n * m.n_experts)?),
            None => (b.zeros(0)?, b.zeros(0)?),
        };
        Ok(Arena {
            batch,
            seq,
            layers,
            x_out: b.zeros(n * d)?,
            hf: b.zeros(n * d)?,
            rstd_f: b.zeros(n)?,
            logits: b.zeros(n * c.vocab_size)?,
            dx: b.zeros(n * d)?,
            dx2: b.zeros(n * d)?,
            dh: b.zeros(n * d)?,
            datt: b.zeros(n * q)?,
            dq: b.zeros(n * q)?,
            dk: b.zeros(n * kv)?,
            dv: b.zeros(n * kv)?,
            dq_raw: b.zeros(if c.qk_norm { n * q } else { 0 })?,
            dk_raw: b.zeros(if c.qk_norm { n * kv } else { 0 })?,
            ffn: Triples::new(b, lens)?,
            dxe,
            dlogits,
            lora_t: lora_t_for(b, c, lora, n)?,
            lora_dt: b.zeros(lora.map_or(0, |l| n * c.moe.as_ref().map_or(1, |m| m.top_k) * l.rank))?,
            sink_d: b.zeros(if lora.is_some() { d } else { 0 })?,
            sink_hd: b.zeros(if lora.is_some() { c.head_dim } else { 0 })?,
            deq: Dequant::new(),
        })
    }
}
