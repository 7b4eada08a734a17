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
use crate::error::first_zero;
use crate::models::image::blocks::{image_model, layout_of, unary, Layout, Linear, Norm, Source};
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
        if let Some(m) = first_zero!(self; vocab_size, hidden_size, intermediate_size, num_attention_heads, max_position_embeddings)
        {
            return bad(m);
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
}

/// What one call computes, on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipTextOutput {
    /// `(batch, seq, hidden)` after the final LayerNorm.
    pub last_hidden_state: Vec<f32>,
    /// The residual stream after the embeddings and after each layer (transformers'
    /// `hidden_states`: `num_hidden_layers + 1` entries, none normed). Stable Diffusion XL
    /// reads the second to last, SD 2.x normalizes it with [`ClipTextModel::final_norm`].
    pub hidden_states: Vec<Vec<f32>>,
    /// `(batch, hidden)`: the final-normed state at each row's end-of-text token.
    pub pooled: Vec<f32>,
    /// `(batch, projection_dim)`: `pooled` projected, for the projection tower.
    pub text_embeds: Option<Vec<f32>>,
}

/// One encoder layer: pre-norm self-attention and MLP, each residual.
struct EncoderLayer<B: Backend> {
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    out_proj: Linear<B>,
    layer_norm1: Norm<B>,
    fc1: Linear<B>,
    fc2: Linear<B>,
    layer_norm2: Norm<B>,
}

/// Every layer of a CLIP text tower.
struct Layers<B: Backend> {
    token_embedding: B::Buffer,
    position_embedding: B::Buffer,
    layers: Vec<EncoderLayer<B>>,
    final_layer_norm: Norm<B>,
    text_projection: Option<Linear<B>>,
}

impl<B: Backend> Layers<B> {
    fn load(cfg: &ClipTextConfig, s: &mut impl Source<B>) -> Result<Self> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let e = "text_model.embeddings";
        let token_embedding = s.f32(format!("{e}.token_embedding.weight"), &[cfg.vocab_size, h])?;
        let position_embedding =
            s.f32(format!("{e}.position_embedding.weight"), &[cfg.max_position_embeddings, h])?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for n in 0..cfg.num_hidden_layers {
            let p = format!("text_model.encoder.layers.{n}");
            layers.push(EncoderLayer {
                q_proj: Linear::load(s, &format!("{p}.self_attn.q_proj"), h, h, true)?,
                k_proj: Linear::load(s, &format!("{p}.self_attn.k_proj"), h, h, true)?,
                v_proj: Linear::load(s, &format!("{p}.self_attn.v_proj"), h, h, true)?,
                out_proj: Linear::load(s, &format!("{p}.self_attn.out_proj"), h, h, true)?,
                layer_norm1: Norm::load(s, &format!("{p}.layer_norm1"), h)?,
                fc1: Linear::load(s, &format!("{p}.mlp.fc1"), h, i, true)?,
                fc2: Linear::load(s, &format!("{p}.mlp.fc2"), i, h, true)?,
                layer_norm2: Norm::load(s, &format!("{p}.layer_norm2"), h)?,
            });
        }
        let final_layer_norm = Norm::load(s, "text_model.final_layer_norm", h)?;
        let text_projection = match cfg.projection_dim {
            Some(p) => Some(Linear::load(s, "text_projection", h, p, false)?),
            None => None,
        };
        Ok(Layers { token_embedding, position_embedding, layers, final_layer_norm, text_projection })
    }
}

image_model!(
    /// A CLIP text encoder over backend `B`, with its weights.
    ClipTextModel,
    ClipTextConfig,
    "transformers"
);

impl<B: Backend> ClipTextModel<B> {
    /// The final LayerNorm over `(rows, hidden)` states (SD 2.x's penultimate-layer prompts).
    pub fn final_norm(&self, states: &[f32]) -> Result<Vec<f32>> {
        let h = self.config.hidden_size;
        if !states.len().is_multiple_of(h) {
            return Err(CoreError::InvalidDimension {
                op: "clip final_norm",
                message: format!("{} values are not rows of {h}", states.len()),
            });
        }
        let (be, eps) = (&self.backend, self.config.layer_norm_eps);
        let y = self.layers.final_layer_norm.layer(be, &be.upload(states)?, states.len() / h, eps)?;
        be.download(&y)
    }

    /// Encodes `ids (batch, seq)`; `mask (batch, seq)`, when given, hides padding keys (the
    /// causal mask applies either way). `seq` is at most `max_position_embeddings`.
    pub fn forward(&self, ids: &[u32], batch: usize, mask: Option<&[bool]>) -> Result<ClipTextOutput> {
        let cfg = &self.config;
        let (be, m, eps) = (&self.backend, &self.layers, cfg.layer_norm_eps);
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
        be.embedding_forward(&mut x, &m.token_embedding, ids, cfg.vocab_size, h)?;
        let positions: Vec<u32> = (0..rows).map(|r| (r % seq) as u32).collect();
        let mut pos = be.zeros(rows * h)?;
        be.embedding_forward(&mut pos, &m.position_embedding, &positions, cfg.max_position_embeddings, h)?;
        be.axpy(&mut x, 1.0, &pos)?;

        let mut hidden_states = vec![be.download(&x)?];
        let spec = SdpaSpec::new(batch, seq, heads, h / heads).causal(true);
        for layer in &m.layers {
            // x += out_proj(attention(ln1(x)))
            let normed = layer.layer_norm1.layer(be, &x, rows, eps)?;
            let q = layer.q_proj.forward(be, &normed, rows)?;
            let k = layer.k_proj.forward(be, &normed, rows)?;
            let v = layer.v_proj.forward(be, &normed, rows)?;
            let mut att = be.zeros(rows * h)?;
            be.sdpa(&mut att, &q, &k, &v, mask, None, &spec)?;
            be.axpy(&mut x, 1.0, &layer.out_proj.forward(be, &att, rows)?)?;
            // x += fc2(act(fc1(ln2(x))))
            let normed = layer.layer_norm2.layer(be, &x, rows, eps)?;
            let act = unary(be, cfg.hidden_act, &layer.fc1.forward(be, &normed, rows)?)?;
            be.axpy(&mut x, 1.0, &layer.fc2.forward(be, &act, rows)?)?;
            hidden_states.push(be.download(&x)?);
        }
        let last = m.final_layer_norm.layer(be, &x, rows, eps)?;
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
        let text_embeds = match &m.text_projection {
            Some(proj) => Some(be.download(&proj.forward(be, &be.upload(&pooled)?, batch)?)?),
            None => None,
        };
        Ok(ClipTextOutput { last_hidden_state, hidden_states, pooled, text_embeds })
    }
}
