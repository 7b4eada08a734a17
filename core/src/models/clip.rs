//! CLIP's text tower (`CLIPTextModel`, `CLIPTextModelWithProjection` in transformers), the
//! prompt encoder of Stable Diffusion and the pooled-vector source of FLUX.1 and SD3.
//!
//! Pre-norm transformer blocks with learned absolute positions, causal self-attention (as
//! CLIP was trained, whatever the mask), `quick_gelu` or `gelu` in the MLP, a final
//! LayerNorm. The pooled vector is the final-normed state at the end-of-text token: the
//! first position holding the largest id when the config's `eos_token_id` is 2 (the
//! original OpenAI configs, whose real end token is the largest id), else the first
//! position holding `eos_token_id`. The projection tower maps it to `projection_dim`.
//!
//! Activations are `(batch, seq, hidden)`; weights carry transformers' names.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::backend::{SdpaSpec, Unary};
use crate::models::layers::{linear, Layout, Weights};
use crate::{Backend, CoreError, Result};

/// A CLIP text tower's shapes, from its `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipTextConfig {
    /// Token ids run from 0 to `vocab_size - 1`.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Hidden width of the MLP.
    pub intermediate_size: usize,
    /// Transformer layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Positions (77).
    pub max_position_embeddings: usize,
    /// The MLP's activation (quick GELU for OpenAI's towers, GELU for OpenCLIP's).
    pub hidden_act: Unary,
    /// LayerNorm's epsilon.
    pub layer_norm_eps: f32,
    /// The id whose state is pooled (the highest id, for the original towers, is found by argmax).
    pub eos_token_id: u32,
    /// `Some` for `CLIPTextModelWithProjection` (`text_projection`, no bias).
    pub projection_dim: Option<usize>,
}

impl ClipTextConfig {
    /// Checks the shapes, naming the first bad one.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(CoreError::InvalidArgument { op: "clip config", message });
        for (what, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_attention_heads", self.num_attention_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return bad(format!("{what} must be at least 1"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(format!(
                "hidden_size ({}) is not a multiple of num_attention_heads ({})",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.projection_dim == Some(0) {
            return bad("projection_dim must be at least 1".into());
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return bad(format!("layer_norm_eps is {}", self.layer_norm_eps));
        }
        Ok(())
    }

    /// Every tensor, under transformers' names.
    pub fn layout(&self) -> Layout {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let mut l = Layout::default();
        l.push("text_model.embeddings.token_embedding.weight".into(), vec![self.vocab_size, h]);
        l.push(
            "text_model.embeddings.position_embedding.weight".into(),
            vec![self.max_position_embeddings, h],
        );
        for n in 0..self.num_hidden_layers {
            let p = format!("text_model.encoder.layers.{n}");
            for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                l.linear(&format!("{p}.self_attn.{proj}"), h, h);
            }
            l.norm(&format!("{p}.layer_norm1"), h);
            l.linear(&format!("{p}.mlp.fc1"), h, i);
            l.linear(&format!("{p}.mlp.fc2"), i, h);
            l.norm(&format!("{p}.layer_norm2"), h);
        }
        l.norm("text_model.final_layer_norm", h);
        if let Some(p) = self.projection_dim {
            l.push("text_projection.weight".into(), vec![p, h]);
        }
        l
    }
}

/// What one call computes, on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipTextOutput {
    /// `(batch, seq, hidden)` after the final LayerNorm.
    pub last_hidden_state: Vec<f32>,
    /// The residual stream after the embeddings and after each layer (transformers'
    /// `hidden_states`: `num_hidden_layers + 1` entries, none normed). Stable Diffusion XL
    /// reads the second to last, SD 2.x normalizes it with [`ClipText::final_norm`].
    pub hidden_states: Vec<Vec<f32>>,
    /// `(batch, hidden)`: the final-normed state at each row's end-of-text token.
    pub pooled: Vec<f32>,
    /// `(batch, projection_dim)`: `pooled` projected, for the projection tower.
    pub text_embeds: Option<Vec<f32>>,
}

/// A CLIP text encoder over backend `B`, with its weights.
pub struct ClipText<B: Backend> {
    backend: B,
    config: ClipTextConfig,
    weights: Weights<B>,
}

impl<B: Backend> ClipText<B> {
    /// Bytes the weights hold (see [`Weights::bytes`]).
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes(&self.backend)
    }

    /// The encoder from its weights by transformers' names, each checked against the configuration.
    pub fn new(backend: B, config: ClipTextConfig, weights: BTreeMap<String, B::Buffer>) -> Result<Self> {
        ClipText::with_q8(backend, config, weights, BTreeMap::new())
    }

    /// [`ClipText::new`] with the projection matrices in `q8` as int8.
    pub fn with_q8(
        backend: B, config: ClipTextConfig, weights: BTreeMap<String, B::Buffer>,
        q8: BTreeMap<String, (B::Buffer, B::Buffer)>,
    ) -> Result<Self> {
        config.validate()?;
        let weights = Weights::with_q8(&backend, &config.layout(), weights, q8)?;
        Ok(ClipText { backend, config, weights })
    }

    /// The architecture.
    pub fn config(&self) -> &ClipTextConfig {
        &self.config
    }

    fn layer_norm(&self, prefix: &str, x: &B::Buffer, rows: usize) -> Result<B::Buffer> {
        let (be, h) = (&self.backend, self.config.hidden_size);
        let mut y = be.zeros(rows * h)?;
        let (w, b) =
            (self.weights.get(&format!("{prefix}.weight"))?, self.weights.get(&format!("{prefix}.bias"))?);
        be.layer_norm(&mut y, x, Some(w), Some(b), rows, h, self.config.layer_norm_eps)?;
        Ok(y)
    }

    /// The final LayerNorm over `(rows, hidden)` states (SD 2.x's penultimate-layer prompts).
    pub fn final_norm(&self, states: &[f32]) -> Result<Vec<f32>> {
        let h = self.config.hidden_size;
        if !states.len().is_multiple_of(h) {
            return Err(CoreError::InvalidDimension {
                op: "clip final_norm",
                message: format!("{} values are not rows of {h}", states.len()),
            });
        }
        let x = self.backend.upload(states)?;
        let y = self.layer_norm("text_model.final_layer_norm", &x, states.len() / h)?;
        self.backend.download(&y)
    }

    /// Encodes `ids (batch, seq)`; `mask (batch, seq)`, when given, hides padding keys (the
    /// causal mask applies either way). `seq` is at most `max_position_embeddings`.
    pub fn forward(&self, ids: &[u32], batch: usize, mask: Option<&[bool]>) -> Result<ClipTextOutput> {
        let cfg = &self.config;
        let (be, w) = (&self.backend, &self.weights);
        let (h, heads) = (cfg.hidden_size, cfg.num_attention_heads);
        if batch == 0 || ids.is_empty() || !ids.len().is_multiple_of(batch) {
            return Err(CoreError::InvalidDimension {
                op: "clip forward",
                message: format!("{} ids do not make {batch} rows", ids.len()),
            });
        }
        let seq = ids.len() / batch;
        if seq > cfg.max_position_embeddings {
            return Err(CoreError::InvalidDimension {
                op: "clip forward",
                message: format!(
                    "{seq} tokens a row; the model has {} positions",
                    cfg.max_position_embeddings
                ),
            });
        }
        if let Some(m) = mask {
            crate::error::check_len("clip forward", "mask", m.len(), ids.len())?;
        }
        let rows = batch * seq;
        // Embeddings: token rows plus position rows 0..seq.
        let mut x = be.zeros(rows * h)?;
        let tok = w.get("text_model.embeddings.token_embedding.weight")?;
        be.embedding_forward(&mut x, tok, ids, cfg.vocab_size, h)?;
        let positions: Vec<u32> = (0..rows).map(|r| (r % seq) as u32).collect();
        let mut pos = be.zeros(rows * h)?;
        let pos_table = w.get("text_model.embeddings.position_embedding.weight")?;
        be.embedding_forward(&mut pos, pos_table, &positions, cfg.max_position_embeddings, h)?;
        be.axpy(&mut x, 1.0, &pos)?;

        let mut hidden_states = vec![be.download(&x)?];
        let spec = SdpaSpec::new(batch, seq, heads, h / heads).causal(true);
        for n in 0..cfg.num_hidden_layers {
            let p = format!("text_model.encoder.layers.{n}");
            // x += out_proj(attention(ln1(x)))
            let normed = self.layer_norm(&format!("{p}.layer_norm1"), &x, rows)?;
            let q = linear(be, w, &format!("{p}.self_attn.q_proj"), &normed, rows, h, h)?;
            let k = linear(be, w, &format!("{p}.self_attn.k_proj"), &normed, rows, h, h)?;
            let v = linear(be, w, &format!("{p}.self_attn.v_proj"), &normed, rows, h, h)?;
            let mut att = be.zeros(rows * h)?;
            be.sdpa(&mut att, &q, &k, &v, mask, None, &spec)?;
            let o = linear(be, w, &format!("{p}.self_attn.out_proj"), &att, rows, h, h)?;
            be.axpy(&mut x, 1.0, &o)?;
            // x += fc2(act(fc1(ln2(x))))
            let normed = self.layer_norm(&format!("{p}.layer_norm2"), &x, rows)?;
            let i = cfg.intermediate_size;
            let up = linear(be, w, &format!("{p}.mlp.fc1"), &normed, rows, h, i)?;
            let mut act = be.zeros(rows * i)?;
            be.unary(cfg.hidden_act, &mut act, &up)?;
            let down = linear(be, w, &format!("{p}.mlp.fc2"), &act, rows, i, h)?;
            be.axpy(&mut x, 1.0, &down)?;
            hidden_states.push(be.download(&x)?);
        }
        let last = self.layer_norm("text_model.final_layer_norm", &x, rows)?;
        let last_hidden_state = be.download(&last)?;

        // The end-of-text position of each row.
        let mut pooled = Vec::with_capacity(batch * h);
        for b in 0..batch {
            let row = &ids[b * seq..(b + 1) * seq];
            let at = if cfg.eos_token_id == 2 {
                let max = row.iter().copied().max().unwrap_or(0);
                row.iter().position(|&t| t == max)
            } else {
                row.iter().position(|&t| t == cfg.eos_token_id)
            };
            let Some(at) = at else {
                return Err(CoreError::InvalidArgument {
                    op: "clip forward",
                    message: format!("row {b} has no end-of-text token ({})", cfg.eos_token_id),
                });
            };
            let r = b * seq + at;
            pooled.extend_from_slice(&last_hidden_state[r * h..(r + 1) * h]);
        }
        let text_embeds = match cfg.projection_dim {
            Some(p) => {
                let mut y = be.zeros(batch * p)?;
                let x = be.upload(&pooled)?;
                w.project(be, "text_projection.weight", &mut y, &x, batch, h, p)?;
                Some(be.download(&y)?)
            }
            None => None,
        };
        Ok(ClipTextOutput { last_hidden_state, hidden_states, pooled, text_embeds })
    }
}
