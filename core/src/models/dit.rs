//! The rectified-flow diffusion transformers: FLUX.1 (`FluxTransformer2DModel`), FLUX.2
//! (`Flux2Transformer2DModel`) and Stable Diffusion 3 (`SD3Transformer2DModel`), one
//! definition over `Backend` with the differences as switches.
//!
//! All three run "double-stream" blocks: the image tokens and the prompt tokens keep their
//! own weights but attend jointly over one sequence, each stream normed and gated by its own
//! modulation of the timestep embedding (adaLN-zero). FLUX then runs "single-stream"
//! blocks over the joined sequence, attention and MLP side by side from one input. FLUX
//! places tokens with multi-axis rotary embeddings; SD3 adds a 2-D sin-cos table to its
//! patch embeddings instead.
//!
//! - FLUX.1: biases everywhere, GELU (tanh) MLPs, one modulation `Linear` a block, the
//!   pooled CLIP vector and (dev) the guidance strength added to the timestep embedding.
//! - FLUX.2: no biases, SwiGLU MLPs, the modulations computed once and shared by every
//!   block, no pooled vector.
//! - SD3: a patchifying convolution, joint blocks only, the last of which updates no prompt
//!   stream, optional q/k RMS norms, and SD3.5's second (image-only) attention in the
//!   blocks `dual_attention_layers` lists.
//!
//! Activations are `(batch, tokens, dim)`, tokens prompt-first in the joined sequence;
//! weights carry diffusers' names (the native loader maps the BFL/SAI spellings onto them).

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::backend::{ColumnCopy, Conv2dSpec, ModulationSpec, PatchSpec, RopePairsSpec, SdpaSpec, Unary};
use crate::models::layers::{Layout, Weights};
use crate::ops::spatial::{timestep_embedding, PatchOrder, TimestepSpec};
use crate::{Backend, CoreError, Result};

/// Which diffusion transformer family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DitKind {
    /// FLUX.1 (dev, schnell).
    Flux,
    /// FLUX.2 (klein, dev).
    Flux2,
    /// Stable Diffusion 3 and 3.5 (MMDiT).
    Sd3,
}

/// Every shape a diffusion transformer has, from its `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct DitConfig {
    /// The family.
    pub kind: DitKind,
    /// Side of the latent squares that become tokens (1 where the pipeline packs them, 2 for SD3).
    pub patch_size: usize,
    /// Channels of a token as fed.
    pub in_channels: usize,
    /// Channels of a token as returned.
    pub out_channels: usize,
    /// Double-stream (joint) blocks.
    pub num_layers: usize,
    /// Single-stream blocks (FLUX only; 0 for SD3).
    pub num_single_layers: usize,
    /// Width of an attention head.
    pub attention_head_dim: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Width of the prompt states the pipeline feeds.
    pub joint_attention_dim: usize,
    /// Width of the pooled prompt vector (FLUX.1, SD3; 0 for FLUX.2).
    pub pooled_projection_dim: usize,
    /// FLUX.1 dev / FLUX.2 base: a guidance-strength embedding.
    pub guidance_embeds: bool,
    /// Rotary widths per position axis (FLUX: 3 axes, FLUX.2: 4; empty for SD3).
    pub axes_dims_rope: Vec<usize>,
    /// RoPE's base frequency.
    pub rope_theta: f64,
    /// MLP width over model width (FLUX: 4, FLUX.2: 3, SD3: 4).
    pub mlp_ratio: f32,
    /// Sinusoidal timestep features (256 everywhere so far).
    pub timestep_channels: usize,
    /// The norms' epsilon.
    pub eps: f32,
    /// SD3: the learned-size sin-cos table is `pos_embed_max_size`² positions.
    pub pos_embed_max_size: usize,
    /// SD3.5: blocks with a second, image-only attention.
    pub dual_attention_layers: Vec<usize>,
    /// RMS norms on queries and keys (always in FLUX; SD3's `qk_norm: "rms_norm"`).
    pub qk_norm: bool,
}

impl DitConfig {
    /// The model width.
    pub fn dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }
    /// The MLP width, as diffusers rounds it (`int(dim * mlp_ratio)`).
    pub fn mlp_dim(&self) -> usize {
        (self.dim() as f64 * self.mlp_ratio as f64) as usize
    }
    fn bias(&self) -> bool {
        self.kind != DitKind::Flux2
    }
    /// Features a token carries out: `patch² * out_channels`.
    pub fn out_features(&self) -> usize {
        self.patch_size * self.patch_size * self.out_channels
    }

    /// Checks the shapes against each other, naming the first that does not fit.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(CoreError::InvalidArgument { op: "dit config", message });
        for (what, v) in [
            ("patch_size", self.patch_size),
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("attention_head_dim", self.attention_head_dim),
            ("num_attention_heads", self.num_attention_heads),
            ("joint_attention_dim", self.joint_attention_dim),
            ("timestep_channels", self.timestep_channels),
        ] {
            if v == 0 {
                return bad(format!("{what} must be at least 1"));
            }
        }
        if !(self.mlp_ratio.is_finite() && self.mlp_ratio > 0.0) || self.mlp_dim() == 0 {
            return bad(format!("mlp_ratio is {}", self.mlp_ratio));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return bad(format!("eps is {}", self.eps));
        }
        match self.kind {
            DitKind::Flux | DitKind::Flux2 => {
                let sum: usize = self.axes_dims_rope.iter().sum();
                if sum != self.attention_head_dim || self.axes_dims_rope.iter().any(|a| !a.is_multiple_of(2))
                {
                    return bad(format!(
                        "axes_dims_rope {:?} must be even and sum to attention_head_dim ({})",
                        self.axes_dims_rope, self.attention_head_dim
                    ));
                }
                if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
                    return bad(format!("rope theta is {}", self.rope_theta));
                }
            }
            DitKind::Sd3 => {
                if self.pos_embed_max_size == 0 {
                    return bad("pos_embed_max_size must be at least 1".into());
                }
                if self.num_single_layers != 0 {
                    return bad("SD3 has no single-stream blocks".into());
                }
                if self.num_layers == 0 {
                    return bad("num_layers must be at least 1".into());
                }
                if let Some(l) = self.dual_attention_layers.iter().find(|l| **l >= self.num_layers) {
                    return bad(format!("dual attention layer {l} of {} blocks", self.num_layers));
                }
            }
        }
        if self.kind == DitKind::Flux2 && self.pooled_projection_dim != 0 {
            return bad("FLUX.2 takes no pooled vector".into());
        }
        if self.kind != DitKind::Flux2 && self.pooled_projection_dim == 0 {
            return bad("pooled_projection_dim must be at least 1".into());
        }
        Ok(())
    }

    /// Every tensor under diffusers' names, in the order the modules are defined.
    pub fn layout(&self) -> Layout {
        let (d, hd, bias) = (self.dim(), self.attention_head_dim, self.bias());
        let mut l = Layout::default();
        let lin = |l: &mut Layout, p: &str, din: usize, dout: usize| {
            l.push(format!("{p}.weight"), vec![dout, din]);
            if bias {
                l.push(format!("{p}.bias"), vec![dout]);
            }
        };
        let heads_norm = |l: &mut Layout, p: &str| l.push(format!("{p}.weight"), vec![hd]);
        let tc = self.timestep_channels;
        // The timestep MLP (and the guidance one where the model has it) under `prefix`.
        let time = |l: &mut Layout, prefix: &str| {
            lin(l, &format!("{prefix}.timestep_embedder.linear_1"), tc, d);
            lin(l, &format!("{prefix}.timestep_embedder.linear_2"), d, d);
            if self.guidance_embeds {
                lin(l, &format!("{prefix}.guidance_embedder.linear_1"), tc, d);
                lin(l, &format!("{prefix}.guidance_embedder.linear_2"), d, d);
            }
        };
        // FLUX.1 and SD3: the pooled-text MLP beside the timestep's, and the per-token
        // context projection.
        let text = |l: &mut Layout| {
            let pooled = self.pooled_projection_dim;
            lin(l, "time_text_embed.text_embedder.linear_1", pooled, d);
            lin(l, "time_text_embed.text_embedder.linear_2", d, d);
            lin(l, "context_embedder", self.joint_attention_dim, d);
        };
        match self.kind {
            DitKind::Flux => {
                time(&mut l, "time_text_embed");
                text(&mut l);
                lin(&mut l, "x_embedder", self.in_channels, d);
            }
            DitKind::Flux2 => {
                time(&mut l, "time_guidance_embed");
                lin(&mut l, "double_stream_modulation_img.linear", d, 6 * d);
                lin(&mut l, "double_stream_modulation_txt.linear", d, 6 * d);
                lin(&mut l, "single_stream_modulation.linear", d, 3 * d);
                lin(&mut l, "x_embedder", self.in_channels, d);
                lin(&mut l, "context_embedder", self.joint_attention_dim, d);
            }
            DitKind::Sd3 => {
                let p = self.patch_size;
                l.push("pos_embed.proj.weight".into(), vec![d, self.in_channels, p, p]);
                l.push("pos_embed.proj.bias".into(), vec![d]);
                let m = self.pos_embed_max_size;
                l.push("pos_embed.pos_embed".into(), vec![1, m * m, d]);
                time(&mut l, "time_text_embed");
                text(&mut l);
            }
        }
        for n in 0..self.num_layers {
            let p = format!("transformer_blocks.{n}");
            let last = self.kind == DitKind::Sd3 && n + 1 == self.num_layers;
            let dual = self.kind == DitKind::Sd3 && self.dual_attention_layers.contains(&n);
            if self.kind != DitKind::Flux2 {
                lin(&mut l, &format!("{p}.norm1.linear"), d, if dual { 9 * d } else { 6 * d });
                lin(&mut l, &format!("{p}.norm1_context.linear"), d, if last { 2 * d } else { 6 * d });
            }
            for proj in ["to_q", "to_k", "to_v"] {
                lin(&mut l, &format!("{p}.attn.{proj}"), d, d);
            }
            if self.qk_norm {
                heads_norm(&mut l, &format!("{p}.attn.norm_q"));
                heads_norm(&mut l, &format!("{p}.attn.norm_k"));
            }
            for proj in ["add_q_proj", "add_k_proj", "add_v_proj"] {
                lin(&mut l, &format!("{p}.attn.{proj}"), d, d);
            }
            if self.qk_norm {
                heads_norm(&mut l, &format!("{p}.attn.norm_added_q"));
                heads_norm(&mut l, &format!("{p}.attn.norm_added_k"));
            }
            lin(&mut l, &format!("{p}.attn.to_out.0"), d, d);
            if !last {
                lin(&mut l, &format!("{p}.attn.to_add_out"), d, d);
            }
            if dual {
                for proj in ["to_q", "to_k", "to_v"] {
                    lin(&mut l, &format!("{p}.attn2.{proj}"), d, d);
                }
                if self.qk_norm {
                    heads_norm(&mut l, &format!("{p}.attn2.norm_q"));
                    heads_norm(&mut l, &format!("{p}.attn2.norm_k"));
                }
                lin(&mut l, &format!("{p}.attn2.to_out.0"), d, d);
            }
            let streams: &[&str] = if last { &["ff"] } else { &["ff", "ff_context"] };
            for ff in streams {
                self.ff_layout(&mut l, &format!("{p}.{ff}"));
            }
        }
        let m = self.mlp_dim();
        for n in 0..self.num_single_layers {
            let p = format!("single_transformer_blocks.{n}");
            if self.kind == DitKind::Flux2 {
                lin(&mut l, &format!("{p}.attn.to_qkv_mlp_proj"), d, 3 * d + 2 * m);
                heads_norm(&mut l, &format!("{p}.attn.norm_q"));
                heads_norm(&mut l, &format!("{p}.attn.norm_k"));
                lin(&mut l, &format!("{p}.attn.to_out"), d + m, d);
            } else {
                lin(&mut l, &format!("{p}.norm.linear"), d, 3 * d);
                lin(&mut l, &format!("{p}.proj_mlp"), d, m);
                lin(&mut l, &format!("{p}.proj_out"), d + m, d);
                for proj in ["to_q", "to_k", "to_v"] {
                    lin(&mut l, &format!("{p}.attn.{proj}"), d, d);
                }
                heads_norm(&mut l, &format!("{p}.attn.norm_q"));
                heads_norm(&mut l, &format!("{p}.attn.norm_k"));
            }
        }
        lin(&mut l, "norm_out.linear", d, 2 * d);
        lin(&mut l, "proj_out", d, self.out_features());
        l
    }

    fn ff_layout(&self, l: &mut Layout, p: &str) {
        let (d, m) = (self.dim(), self.mlp_dim());
        if self.kind == DitKind::Flux2 {
            l.push(format!("{p}.linear_in.weight"), vec![2 * m, d]);
            l.push(format!("{p}.linear_out.weight"), vec![d, m]);
        } else {
            l.linear(&format!("{p}.net.0.proj"), d, m);
            l.linear(&format!("{p}.net.2"), m, d);
        }
    }
}

/// Where the image tokens come from.
#[derive(Debug, Clone, Copy)]
pub enum DitLatent<'a> {
    /// FLUX: packed latent tokens `(batch, tokens, in_channels)` and their positions
    /// `ids: (tokens, axes)`.
    Tokens {
        /// The tokens.
        data: &'a [f32],
        /// Their positions.
        ids: &'a [f32],
    },
    /// SD3: the latent image `(batch, in_channels, height, width)`.
    Image {
        /// The latent.
        data: &'a [f32],
        /// Its rows.
        height: usize,
        /// Its columns.
        width: usize,
    },
}

/// One denoiser call, with the tensors diffusers passes to the transformer.
#[derive(Debug, Clone, Copy)]
pub struct DitInput<'a> {
    /// Images in the batch.
    pub batch: usize,
    /// The image tokens or latent.
    pub latent: DitLatent<'a>,
    /// `(batch, text_tokens, joint_attention_dim)`.
    pub context: &'a [f32],
    /// FLUX: `(text_tokens, axes)` positions of the prompt tokens (zeros in FLUX.1, the
    /// token index on the last axis in FLUX.2); empty for SD3.
    pub context_ids: &'a [f32],
    /// `(batch, pooled_projection_dim)` for FLUX.1 and SD3.
    pub pooled: Option<&'a [f32]>,
    /// One value a row: the flow time in 0..=1 for FLUX (the model scales it by 1000),
    /// 0..=1000 for SD3.
    pub timestep: &'a [f32],
    /// One value a row for the guidance-distilled models (FLUX scales it by 1000 too).
    pub guidance: Option<&'a [f32]>,
}

/// A diffusion transformer (FLUX.1, FLUX.2 or SD3) over backend `B`, with its weights.
pub struct Dit<B: Backend> {
    backend: B,
    config: DitConfig,
    weights: Weights<B>,
}

/// One stream's queries, keys and values `(batch, tokens, dim)`.
struct Qkv<B: Backend> {
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    tokens: usize,
}

impl<B: Backend> Dit<B> {
    /// Bytes the weights hold (see [`Weights::bytes`]).
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes(&self.backend)
    }

    /// The model from its weights by diffusers' names (every tensor checked against the configuration).
    pub fn new(backend: B, config: DitConfig, weights: BTreeMap<String, B::Buffer>) -> Result<Self> {
        Dit::with_q8(backend, config, weights, BTreeMap::new())
    }

    /// [`Dit::new`] with the matrices in `q8` held as int8.
    pub fn with_q8(
        backend: B, config: DitConfig, weights: BTreeMap<String, B::Buffer>,
        q8: BTreeMap<String, (B::Buffer, B::Buffer)>,
    ) -> Result<Self> {
        config.validate()?;
        let weights = Weights::with_q8(&backend, &config.layout(), weights, q8)?;
        Ok(Dit { backend, config, weights })
    }

    /// The architecture.
    pub fn config(&self) -> &DitConfig {
        &self.config
    }

    /// The backend it runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    // ----- small pieces -----

    /// `x W^T (+ b)`; the bias exists unless the model has none (FLUX.2).
    fn linear(&self, prefix: &str, x: &B::Buffer, rows: usize, din: usize, dout: usize) -> Result<B::Buffer> {
        let be = &self.backend;
        let mut y = be.zeros(rows * dout)?;
        self.weights.project(be, &format!("{prefix}.weight"), &mut y, x, rows, din, dout)?;
        if self.config.bias() {
            be.add_bias(&mut y, self.weights.get(&format!("{prefix}.bias"))?, rows, dout)?;
        }
        Ok(y)
    }

    fn act(&self, op: Unary, x: &B::Buffer) -> Result<B::Buffer> {
        let mut y = self.backend.zeros(self.backend.len(x))?;
        self.backend.unary(op, &mut y, x)?;
        Ok(y)
    }

    /// LayerNorm without affine, then `* (1 + scale) + shift` from `mods` at the chunks
    /// `shift` and `scale` (counted in model widths).
    fn norm_modulate(
        &self, x: &B::Buffer, batch: usize, tokens: usize, mods: &B::Buffer, shift: usize, scale: usize,
    ) -> Result<B::Buffer> {
        let (be, d) = (&self.backend, self.config.dim());
        let mut normed = be.zeros(batch * tokens * d)?;
        be.layer_norm(&mut normed, x, None, None, batch * tokens, d, self.config.eps)?;
        let spec = ModulationSpec::new(batch, tokens, d, be.len(mods) / batch);
        let mut out = be.zeros(batch * tokens * d)?;
        be.modulate(&mut out, &normed, mods, shift * d, scale * d, &spec)?;
        Ok(out)
    }

    /// `x += mods[gate] * y`.
    fn gate_add(
        &self, x: &mut B::Buffer, y: &B::Buffer, batch: usize, tokens: usize, mods: &B::Buffer, gate: usize,
    ) -> Result<()> {
        let (be, d) = (&self.backend, self.config.dim());
        let spec = ModulationSpec::new(batch, tokens, d, be.len(mods) / batch);
        be.gate_add(x, y, mods, gate * d, &spec)
    }

    /// RMS norm over each head of `x (rows, dim)` with the weight `prefix`.
    fn head_norm(&self, prefix: &str, x: &B::Buffer, rows: usize) -> Result<B::Buffer> {
        let (be, hd) = (&self.backend, self.config.attention_head_dim);
        let n = rows * self.config.num_attention_heads;
        let (mut out, mut rstd) = (be.zeros(n * hd)?, be.zeros(n)?);
        let w = self.weights.get(&format!("{prefix}.weight"))?;
        be.rmsnorm_forward(&mut out, &mut rstd, x, w, n, hd, self.config.eps)?;
        Ok(out)
    }

    /// `(rows, width)` columns `at..at + width` of `x (rows, cols)`.
    fn columns(&self, x: &B::Buffer, rows: usize, cols: usize, at: usize, width: usize) -> Result<B::Buffer> {
        let mut out = self.backend.zeros(rows * width)?;
        let spec = ColumnCopy { rows, width, src_cols: cols, src_at: at, dst_cols: width, dst_at: 0 };
        self.backend.copy_cols(&mut out, x, &spec)?;
        Ok(out)
    }

    /// `[a | b]` along the columns: `a (rows, ca)`, `b (rows, cb)`.
    fn concat(&self, a: &B::Buffer, b: &B::Buffer, rows: usize, ca: usize, cb: usize) -> Result<B::Buffer> {
        let be = &self.backend;
        let mut out = be.zeros(rows * (ca + cb))?;
        for (src, cols, at) in [(a, ca, 0), (b, cb, ca)] {
            let spec =
                ColumnCopy { rows, width: cols, src_cols: cols, src_at: 0, dst_cols: ca + cb, dst_at: at };
            be.copy_cols(&mut out, src, &spec)?;
        }
        Ok(out)
    }

    /// The MLP of a joint block: GELU (tanh) in FLUX.1 and SD3, SwiGLU in FLUX.2.
    fn feed_forward(&self, prefix: &str, x: &B::Buffer, rows: usize) -> Result<B::Buffer> {
        let (d, m) = (self.config.dim(), self.config.mlp_dim());
        if self.config.kind == DitKind::Flux2 {
            let h = self.linear(&format!("{prefix}.linear_in"), x, rows, d, 2 * m)?;
            let a = self.swiglu(&h, rows, 2 * m, 0)?;
            self.linear(&format!("{prefix}.linear_out"), &a, rows, m, d)
        } else {
            let h = self.linear(&format!("{prefix}.net.0.proj"), x, rows, d, m)?;
            let a = self.act(Unary::GeluTanh, &h)?;
            self.linear(&format!("{prefix}.net.2"), &a, rows, m, d)
        }
    }

    /// `silu(gate) * up` from `h (rows, cols)` holding `[gate | up]` at column `at`.
    fn swiglu(&self, h: &B::Buffer, rows: usize, cols: usize, at: usize) -> Result<B::Buffer> {
        let m = self.config.mlp_dim();
        let gate = self.columns(h, rows, cols, at, m)?;
        let up = self.columns(h, rows, cols, at + m, m)?;
        let mut out = self.backend.zeros(rows * m)?;
        self.backend.gated(Unary::Silu, &mut out, &gate, &up)?;
        Ok(out)
    }

    /// Attention over the streams joined in order (each `(batch, tokens, dim)`, already
    /// normed), rotary from `rope` when given; the output split back per stream.
    fn attention(
        &self, streams: Vec<Qkv<B>>, batch: usize, rope: Option<&(B::Buffer, B::Buffer)>,
    ) -> Result<Vec<B::Buffer>> {
        let (be, d) = (&self.backend, self.config.dim());
        let lens: Vec<usize> = streams.iter().map(|s| s.tokens).collect();
        let total: usize = lens.iter().sum();
        let (mut q, mut k, v) = if let [_] = lens[..] {
            let s = streams
                .into_iter()
                .next()
                .ok_or(CoreError::InvalidArgument { op: "dit attention", message: "no stream".into() })?;
            (s.q, s.k, s.v)
        } else {
            let n = batch * total * d;
            let mut joined = [be.zeros(n)?, be.zeros(n)?, be.zeros(n)?];
            let mut at = 0;
            for s in &streams {
                let spec = ColumnCopy {
                    rows: batch,
                    width: s.tokens * d,
                    src_cols: s.tokens * d,
                    src_at: 0,
                    dst_cols: total * d,
                    dst_at: at * d,
                };
                for (dst, src) in joined.iter_mut().zip([&s.q, &s.k, &s.v]) {
                    be.copy_cols(dst, src, &spec)?;
                }
                at += s.tokens;
            }
            let [q, k, v] = joined;
            (q, k, v)
        };
        let (heads, hd) = (self.config.num_attention_heads, self.config.attention_head_dim);
        if let Some((cos, sin)) = rope {
            let spec = RopePairsSpec { batch, seq: total, heads, head_dim: hd };
            be.rope_pairs(&mut q, cos, sin, &spec)?;
            be.rope_pairs(&mut k, cos, sin, &spec)?;
        }
        let mut out = be.zeros(batch * total * d)?;
        be.sdpa(&mut out, &q, &k, &v, None, None, &SdpaSpec::new(batch, total, heads, hd))?;
        if lens.len() == 1 {
            return Ok(vec![out]);
        }
        let mut parts = Vec::with_capacity(lens.len());
        let mut at = 0;
        for t in lens {
            parts.push(self.columns(&out, batch, total * d, at * d, t * d)?);
            at += t;
        }
        Ok(parts)
    }

    /// diffusers' `TimestepEmbedding` of the scalars `values` (one a row):
    /// `linear_2(silu(linear_1(sinusoidal(values))))`, `(batch, dim)`.
    fn embed_scalars(&self, prefix: &str, values: &[f32]) -> Result<B::Buffer> {
        let (tc, d, batch) = (self.config.timestep_channels, self.config.dim(), values.len());
        let mut feats = vec![0.0; batch * tc];
        timestep_embedding(&mut feats, values, &TimestepSpec::new(tc))?;
        let x = self.backend.upload(&feats)?;
        let h = self.linear(&format!("{prefix}.linear_1"), &x, batch, tc, d)?;
        let h = self.act(Unary::Silu, &h)?;
        self.linear(&format!("{prefix}.linear_2"), &h, batch, d, d)
    }

    /// The conditioning vector `temb (batch, dim)`: timestep, plus guidance strength, plus
    /// the projected pooled prompt, as the model has them.
    fn conditioning(&self, input: &DitInput<'_>) -> Result<B::Buffer> {
        let (cfg, be) = (&self.config, &self.backend);
        // FLUX's pipelines pass t / 1000 and the model multiplies back (in f32, as here).
        let scale = if cfg.kind == DitKind::Sd3 { 1.0 } else { 1000.0 };
        let root = if cfg.kind == DitKind::Flux2 { "time_guidance_embed" } else { "time_text_embed" };
        let t: Vec<f32> = input.timestep.iter().map(|t| t * scale).collect();
        let mut temb = self.embed_scalars(&format!("{root}.timestep_embedder"), &t)?;
        if cfg.guidance_embeds {
            let g = input.guidance.ok_or_else(|| CoreError::InvalidArgument {
                op: "dit forward",
                message: "this model embeds a guidance strength (guidance_embeds); pass one a row".into(),
            })?;
            crate::error::check_len("dit forward", "guidance", g.len(), input.batch)?;
            let g: Vec<f32> = g.iter().map(|g| g * 1000.0).collect();
            let e = self.embed_scalars(&format!("{root}.guidance_embedder"), &g)?;
            be.axpy(&mut temb, 1.0, &e)?;
        }
        if cfg.kind != DitKind::Flux2 {
            let (pd, d) = (cfg.pooled_projection_dim, cfg.dim());
            let pooled = input.pooled.ok_or_else(|| CoreError::InvalidArgument {
                op: "dit forward",
                message: format!("this model needs the pooled prompt vector ({pd} a row)"),
            })?;
            crate::error::check_len("dit forward", "pooled", pooled.len(), input.batch * pd)?;
            let x = be.upload(pooled)?;
            let h = self.linear("time_text_embed.text_embedder.linear_1", &x, input.batch, pd, d)?;
            let h = self.act(Unary::Silu, &h)?;
            let e = self.linear("time_text_embed.text_embedder.linear_2", &h, input.batch, d, d)?;
            be.axpy(&mut temb, 1.0, &e)?;
        }
        Ok(temb)
    }

    /// Queries, keys and values of one stream from the projections `names` under `prefix`,
    /// each head RMS-normed by `norms` when the model has q/k norms.
    fn stream_qkv(
        &self, prefix: &str, names: [&str; 3], norms: [&str; 2], x: &B::Buffer, batch: usize, tokens: usize,
    ) -> Result<Qkv<B>> {
        let (d, rows) = (self.config.dim(), batch * tokens);
        let [q, k, v] = names.map(|n| self.linear(&format!("{prefix}.{n}"), x, rows, d, d));
        let (mut q, mut k, v) = (q?, k?, v?);
        if self.config.qk_norm {
            q = self.head_norm(&format!("{prefix}.{}", norms[0]), &q, rows)?;
            k = self.head_norm(&format!("{prefix}.{}", norms[1]), &k, rows)?;
        }
        Ok(Qkv { q, k, v, tokens })
    }

    /// Double-stream block `n`: `img (batch, ni, dim)` and `txt (batch, nt, dim)` updated in
    /// place; `m_img`, `m_txt` are the block's modulations (six chunks: shift, scale, gate
    /// for attention then MLP; SD3.5's dual blocks add three for the second attention, and
    /// SD3's last block has only scale and shift for the prompt, which it does not update).
    #[allow(clippy::too_many_arguments)]
    fn joint_block(
        &self, n: usize, img: &mut B::Buffer, txt: &mut B::Buffer, (batch, ni, nt): (usize, usize, usize),
        m_img: &B::Buffer, m_txt: &B::Buffer, rope: Option<&(B::Buffer, B::Buffer)>,
    ) -> Result<()> {
        let cfg = &self.config;
        let d = cfg.dim();
        let p = format!("transformer_blocks.{n}");
        let last = cfg.kind == DitKind::Sd3 && n + 1 == cfg.num_layers;
        let dual = cfg.kind == DitKind::Sd3 && cfg.dual_attention_layers.contains(&n);
        let n_img = self.norm_modulate(img, batch, ni, m_img, 0, 1)?;
        let n_txt = if last {
            self.norm_modulate(txt, batch, nt, m_txt, 1, 0)?
        } else {
            self.norm_modulate(txt, batch, nt, m_txt, 0, 1)?
        };
        let n_img2 = if dual { Some(self.norm_modulate(img, batch, ni, m_img, 6, 7)?) } else { None };
        let a = self.stream_qkv(
            &p,
            ["attn.to_q", "attn.to_k", "attn.to_v"],
            ["attn.norm_q", "attn.norm_k"],
            &n_img,
            batch,
            ni,
        )?;
        let b = self.stream_qkv(
            &p,
            ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"],
            ["attn.norm_added_q", "attn.norm_added_k"],
            &n_txt,
            batch,
            nt,
        )?;
        let mut outs = self.attention(vec![b, a], batch, rope)?.into_iter();
        let (a_txt, a_img) = match (outs.next(), outs.next()) {
            (Some(t), Some(i)) => (t, i),
            _ => {
                return Err(CoreError::InvalidArgument {
                    op: "dit joint block",
                    message: "attention returned fewer than two streams".into(),
                })
            }
        };
        let (ri, rt) = (batch * ni, batch * nt);
        let o = self.linear(&format!("{p}.attn.to_out.0"), &a_img, ri, d, d)?;
        self.gate_add(img, &o, batch, ni, m_img, 2)?;
        if let Some(n2) = n_img2 {
            let s = self.stream_qkv(
                &p,
                ["attn2.to_q", "attn2.to_k", "attn2.to_v"],
                ["attn2.norm_q", "attn2.norm_k"],
                &n2,
                batch,
                ni,
            )?;
            let a2 = self.attention(vec![s], batch, None)?.remove(0);
            let o = self.linear(&format!("{p}.attn2.to_out.0"), &a2, ri, d, d)?;
            self.gate_add(img, &o, batch, ni, m_img, 8)?;
        }
        let h = self.norm_modulate(img, batch, ni, m_img, 3, 4)?;
        let f = self.feed_forward(&format!("{p}.ff"), &h, ri)?;
        self.gate_add(img, &f, batch, ni, m_img, 5)?;
        if !last {
            let o = self.linear(&format!("{p}.attn.to_add_out"), &a_txt, rt, d, d)?;
            self.gate_add(txt, &o, batch, nt, m_txt, 2)?;
            let h = self.norm_modulate(txt, batch, nt, m_txt, 3, 4)?;
            let f = self.feed_forward(&format!("{p}.ff_context"), &h, rt)?;
            self.gate_add(txt, &f, batch, nt, m_txt, 5)?;
        }
        Ok(())
    }

    /// Single-stream block `n` over the joined sequence `x (batch, s, dim)`, in place:
    /// attention and MLP from one modulated input, concatenated, projected, gated.
    fn single_block(
        &self, n: usize, x: &mut B::Buffer, batch: usize, s: usize, mods: &B::Buffer,
        rope: Option<&(B::Buffer, B::Buffer)>,
    ) -> Result<()> {
        let (d, m) = (self.config.dim(), self.config.mlp_dim());
        let p = format!("single_transformer_blocks.{n}");
        let rows = batch * s;
        let h = self.norm_modulate(x, batch, s, mods, 0, 1)?;
        let out = if self.config.kind == DitKind::Flux2 {
            // One fused projection: [q | k | v | gate | up].
            let cols = 3 * d + 2 * m;
            let f = self.linear(&format!("{p}.attn.to_qkv_mlp_proj"), &h, rows, d, cols)?;
            let q =
                self.head_norm(&format!("{p}.attn.norm_q"), &self.columns(&f, rows, cols, 0, d)?, rows)?;
            let k =
                self.head_norm(&format!("{p}.attn.norm_k"), &self.columns(&f, rows, cols, d, d)?, rows)?;
            let v = self.columns(&f, rows, cols, 2 * d, d)?;
            let mlp = self.swiglu(&f, rows, cols, 3 * d)?;
            let a = self.attention(vec![Qkv { q, k, v, tokens: s }], batch, rope)?.remove(0);
            let cat = self.concat(&a, &mlp, rows, d, m)?;
            self.linear(&format!("{p}.attn.to_out"), &cat, rows, d + m, d)?
        } else {
            let up = self.linear(&format!("{p}.proj_mlp"), &h, rows, d, m)?;
            let mlp = self.act(Unary::GeluTanh, &up)?;
            let qkv = self.stream_qkv(
                &p,
                ["attn.to_q", "attn.to_k", "attn.to_v"],
                ["attn.norm_q", "attn.norm_k"],
                &h,
                batch,
                s,
            )?;
            let a = self.attention(vec![qkv], batch, rope)?.remove(0);
            let cat = self.concat(&a, &mlp, rows, d, m)?;
            self.linear(&format!("{p}.proj_out"), &cat, rows, d + m, d)?
        };
        self.gate_add(x, &out, batch, s, mods, 2)
    }

    /// SD3's `PatchEmbed`: a `patch`-strided convolution to tokens `(batch, gh * gw, dim)`
    /// plus the centre crop of the stored sin-cos table.
    fn patch_embed(&self, data: &[f32], batch: usize, h: usize, w: usize) -> Result<(B::Buffer, usize)> {
        let (cfg, be) = (&self.config, &self.backend);
        let (p, d, max) = (cfg.patch_size, cfg.dim(), cfg.pos_embed_max_size);
        if !h.is_multiple_of(p) || !w.is_multiple_of(p) || h / p > max || w / p > max {
            return Err(CoreError::InvalidDimension {
                op: "dit forward",
                message: format!(
                    "a {h}x{w} latent: each side must be a multiple of the patch ({p}) and at most {} patches (pos_embed_max_size)",
                    max
                ),
            });
        }
        let x = be.upload(data)?;
        let spec = Conv2dSpec::new(batch, cfg.in_channels, d, h, w, p).stride(p);
        let (_, _, n, (gh, gw)) = spec.check()?;
        let mut grid = be.zeros(n)?;
        let (weight, bias) =
            (self.weights.get("pos_embed.proj.weight")?, self.weights.get("pos_embed.proj.bias")?);
        be.conv2d(&mut grid, &x, weight, Some(bias), &spec)?;
        let to_tokens = PatchSpec {
            batch,
            channels: d,
            height: gh,
            width: gw,
            patch: 1,
            order: PatchOrder::ChannelFirst,
        };
        let mut tokens = be.zeros(n)?;
        be.patchify(&mut tokens, &grid, &to_tokens)?;
        let table = self.weights.get("pos_embed.pos_embed")?;
        let (top, left) = ((max - gh) / 2, (max - gw) / 2);
        let mut pos = be.zeros(gh * gw * d)?;
        for r in 0..gh {
            be.copy_range(&mut pos, r * gw * d, table, ((top + r) * max + left) * d, gw * d)?;
        }
        be.add_bias(&mut tokens, &pos, batch, gh * gw * d)?;
        Ok((tokens, gh * gw))
    }

    /// The denoiser's prediction for `input`: FLUX, `(batch, tokens, patch² * out_channels)`
    /// tokens like its input; SD3, the image `(batch, out_channels, height, width)`.
    pub fn forward(&self, input: &DitInput<'_>) -> Result<Vec<f32>> {
        let (cfg, be) = (&self.config, &self.backend);
        let (d, batch) = (cfg.dim(), input.batch);
        let bad = |message: String| Err(CoreError::InvalidDimension { op: "dit forward", message });
        if batch == 0 {
            return bad("the batch is empty".into());
        }
        crate::error::check_len("dit forward", "timestep", input.timestep.len(), batch)?;
        if !cfg.guidance_embeds && input.guidance.is_some() {
            return Err(CoreError::InvalidArgument {
                op: "dit forward",
                message: "this model has no guidance embedding (guidance_embeds is false); pass None".into(),
            });
        }
        let joint = cfg.joint_attention_dim;
        if input.context.is_empty() || !input.context.len().is_multiple_of(batch * joint) {
            return bad(format!(
                "{} prompt values are not {batch} rows of tokens of {joint}",
                input.context.len()
            ));
        }
        let nt = input.context.len() / (batch * joint);
        let axes = cfg.axes_dims_rope.len();
        let temb = self.conditioning(input)?;
        let st = self.act(Unary::Silu, &temb)?;

        let (mut img, ni, rope) = match input.latent {
            DitLatent::Tokens { data, ids } => {
                if cfg.kind == DitKind::Sd3 {
                    return bad("SD3 takes the latent image, not tokens".into());
                }
                if ids.is_empty() || !ids.len().is_multiple_of(axes) {
                    return bad(format!("{} image ids are not rows of {axes} axes", ids.len()));
                }
                let ni = ids.len() / axes;
                crate::error::check_len(
                    "dit forward",
                    "latent tokens",
                    data.len(),
                    batch * ni * cfg.in_channels,
                )?;
                crate::error::check_len("dit forward", "context ids", input.context_ids.len(), nt * axes)?;
                let x = be.upload(data)?;
                let img = self.linear("x_embedder", &x, batch * ni, cfg.in_channels, d)?;
                let mut ids_all = input.context_ids.to_vec();
                ids_all.extend_from_slice(ids);
                let (cos, sin) =
                    crate::ops::modulation::rope_tables(&ids_all, &cfg.axes_dims_rope, cfg.rope_theta)?;
                (img, ni, Some((be.upload(&cos)?, be.upload(&sin)?)))
            }
            DitLatent::Image { data, height, width } => {
                if cfg.kind != DitKind::Sd3 {
                    return bad("FLUX takes packed tokens with their ids, not an image".into());
                }
                crate::error::check_len(
                    "dit forward",
                    "latent",
                    data.len(),
                    batch * cfg.in_channels * height * width,
                )?;
                let (img, ni) = self.patch_embed(data, batch, height, width)?;
                (img, ni, None)
            }
        };
        let ctx = be.upload(input.context)?;
        let mut txt = self.linear("context_embedder", &ctx, batch * nt, joint, d)?;
        drop(ctx);

        let shared = if cfg.kind == DitKind::Flux2 {
            Some([
                self.linear("double_stream_modulation_img.linear", &st, batch, d, 6 * d)?,
                self.linear("double_stream_modulation_txt.linear", &st, batch, d, 6 * d)?,
                self.linear("single_stream_modulation.linear", &st, batch, d, 3 * d)?,
            ])
        } else {
            None
        };
        for n in 0..cfg.num_layers {
            let dims = (batch, ni, nt);
            if let Some([mi, mt, _]) = &shared {
                self.joint_block(n, &mut img, &mut txt, dims, mi, mt, rope.as_ref())?;
            } else {
                let last = cfg.kind == DitKind::Sd3 && n + 1 == cfg.num_layers;
                let dual = cfg.kind == DitKind::Sd3 && cfg.dual_attention_layers.contains(&n);
                let p = format!("transformer_blocks.{n}");
                let mi = self.linear(
                    &format!("{p}.norm1.linear"),
                    &st,
                    batch,
                    d,
                    if dual { 9 * d } else { 6 * d },
                )?;
                let mt = self.linear(
                    &format!("{p}.norm1_context.linear"),
                    &st,
                    batch,
                    d,
                    if last { 2 * d } else { 6 * d },
                )?;
                self.joint_block(n, &mut img, &mut txt, dims, &mi, &mt, rope.as_ref())?;
            }
        }
        if cfg.num_single_layers > 0 {
            let s = nt + ni;
            let mut x = self.concat(&txt, &img, batch, nt * d, ni * d)?;
            for n in 0..cfg.num_single_layers {
                if let Some([_, _, ms]) = &shared {
                    self.single_block(n, &mut x, batch, s, ms, rope.as_ref())?;
                } else {
                    let m = self.linear(
                        &format!("single_transformer_blocks.{n}.norm.linear"),
                        &st,
                        batch,
                        d,
                        3 * d,
                    )?;
                    self.single_block(n, &mut x, batch, s, &m, rope.as_ref())?;
                }
            }
            img = self.columns(&x, batch, s * d, nt * d, ni * d)?;
        }
        // AdaLayerNormContinuous: scale first, then shift.
        let m = self.linear("norm_out.linear", &st, batch, d, 2 * d)?;
        let h = self.norm_modulate(&img, batch, ni, &m, 1, 0)?;
        let out = self.linear("proj_out", &h, batch * ni, d, cfg.out_features())?;
        if let DitLatent::Image { height, width, .. } = input.latent {
            let spec = PatchSpec {
                batch,
                channels: cfg.out_channels,
                height,
                width,
                patch: cfg.patch_size,
                order: PatchOrder::ChannelLast,
            };
            let mut image = be.zeros(be.len(&out))?;
            be.unpatchify(&mut image, &out, &spec)?;
            return be.download(&image);
        }
        be.download(&out)
    }
}
