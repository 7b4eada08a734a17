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

use crate::backend::{ModulationSpec, PatchSpec, RopePairsSpec, SdpaSpec, Unary};
use crate::error::first_zero;
use crate::models::image::blocks::{
    columns, concat, image_model, layout_of, optional, unary, Conv2d, FeatureMap, Layout, Linear, Norm,
    Source, TimestepMlp,
};
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
        if let Some(m) = first_zero!(self; patch_size, in_channels, out_channels, attention_head_dim, num_attention_heads, joint_attention_dim, timestep_channels)
        {
            return bad(m);
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

/// One stream's query, key and value projections, with RMS norms over each head where
/// the model has them.
struct QkvProj<B: Backend> {
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    norms: Option<(Norm<B>, Norm<B>)>,
}

impl<B: Backend> QkvProj<B> {
    /// The projections `names` and the norms `norm_names` (when `norms`) under `p`.
    fn load(
        s: &mut impl Source<B>, cfg: &DitConfig, p: &str, names: [&str; 3], norm_names: Option<[&str; 2]>,
    ) -> Result<Self> {
        let (d, hd, bias) = (cfg.dim(), cfg.attention_head_dim, cfg.bias());
        let [q, k, v] = names.map(|n| Linear::load(s, &format!("{p}.{n}"), d, d, bias));
        let (q, k, v) = (q?, k?, v?);
        let norms = match norm_names {
            Some([nq, nk]) => Some((
                Norm::load_weight(s, &format!("{p}.{nq}"), hd)?,
                Norm::load_weight(s, &format!("{p}.{nk}"), hd)?,
            )),
            None => None,
        };
        Ok(QkvProj { q, k, v, norms })
    }
}

/// The MLP of a joint block: GELU (tanh) in FLUX.1 and SD3 (`net.0.proj`, `net.2`), SwiGLU
/// in FLUX.2 (`linear_in` to `[gate | up]`, `linear_out`).
struct FeedForward<B: Backend> {
    proj_in: Linear<B>,
    proj_out: Linear<B>,
    swiglu: bool,
}

impl<B: Backend> FeedForward<B> {
    fn load(s: &mut impl Source<B>, cfg: &DitConfig, p: &str) -> Result<Self> {
        let (d, m) = (cfg.dim(), cfg.mlp_dim());
        Ok(match cfg.kind {
            DitKind::Flux2 => FeedForward {
                proj_in: Linear::load(s, &format!("{p}.linear_in"), d, 2 * m, false)?,
                proj_out: Linear::load(s, &format!("{p}.linear_out"), m, d, false)?,
                swiglu: true,
            },
            _ => FeedForward {
                proj_in: Linear::load(s, &format!("{p}.net.0.proj"), d, m, true)?,
                proj_out: Linear::load(s, &format!("{p}.net.2"), m, d, true)?,
                swiglu: false,
            },
        })
    }

    fn forward(&self, be: &B, x: &B::Buffer, rows: usize) -> Result<B::Buffer> {
        let h = self.proj_in.forward(be, x, rows)?;
        let width = self.proj_in.dout();
        let a = match self.swiglu {
            // [gate | up], each half the width.
            true => swiglu(be, &h, rows, width, 0, width / 2)?,
            false => unary(be, Unary::GeluTanh, &h)?,
        };
        self.proj_out.forward(be, &a, rows)
    }
}

/// `silu(gate) * up`, each `m` wide, from `h (rows, cols)` holding `[gate | up]` at column `at`.
fn swiglu<B: Backend>(
    be: &B, h: &B::Buffer, rows: usize, cols: usize, at: usize, m: usize,
) -> Result<B::Buffer> {
    let gate = columns(be, h, rows, cols, at, m)?;
    let up = columns(be, h, rows, cols, at + m, m)?;
    let mut out = be.zeros(rows * m)?;
    be.gated(Unary::Silu, &mut out, &gate, &up)?;
    Ok(out)
}

/// A double-stream block: the image and prompt streams' own projections, norms and MLPs,
/// one joint attention; SD3.5's dual blocks add an image-only attention (`attn2`), SD3's
/// last block updates no prompt stream.
struct JointBlock<B: Backend> {
    /// `norm1.linear` and `norm1_context.linear`: the block's own modulations (not FLUX.2's).
    modulation: Option<(Linear<B>, Linear<B>)>,
    img: QkvProj<B>,
    txt: QkvProj<B>,
    to_out: Linear<B>,
    to_add_out: Option<Linear<B>>,
    attn2: Option<(QkvProj<B>, Linear<B>)>,
    ff: FeedForward<B>,
    ff_context: Option<FeedForward<B>>,
}

impl<B: Backend> JointBlock<B> {
    fn load(s: &mut impl Source<B>, cfg: &DitConfig, n: usize) -> Result<Self> {
        let (d, bias) = (cfg.dim(), cfg.bias());
        let p = format!("transformer_blocks.{n}");
        let last = cfg.kind == DitKind::Sd3 && n + 1 == cfg.num_layers;
        let dual = cfg.kind == DitKind::Sd3 && cfg.dual_attention_layers.contains(&n);
        let modulation = optional(cfg.kind != DitKind::Flux2, || {
            Ok((
                Linear::load(s, &format!("{p}.norm1.linear"), d, if dual { 9 * d } else { 6 * d }, bias)?,
                Linear::load(
                    s,
                    &format!("{p}.norm1_context.linear"),
                    d,
                    if last { 2 * d } else { 6 * d },
                    bias,
                )?,
            ))
        })?;
        let qk = |a: [&'static str; 2]| cfg.qk_norm.then_some(a);
        let img = QkvProj::load(
            s,
            cfg,
            &p,
            ["attn.to_q", "attn.to_k", "attn.to_v"],
            qk(["attn.norm_q", "attn.norm_k"]),
        )?;
        let txt = QkvProj::load(
            s,
            cfg,
            &p,
            ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"],
            qk(["attn.norm_added_q", "attn.norm_added_k"]),
        )?;
        let to_out = Linear::load(s, &format!("{p}.attn.to_out.0"), d, d, bias)?;
        let to_add_out = optional(!last, || Linear::load(s, &format!("{p}.attn.to_add_out"), d, d, bias))?;
        let attn2 = optional(dual, || {
            let names = ["attn2.to_q", "attn2.to_k", "attn2.to_v"];
            let qkv = QkvProj::load(s, cfg, &p, names, qk(["attn2.norm_q", "attn2.norm_k"]))?;
            Ok((qkv, Linear::load(s, &format!("{p}.attn2.to_out.0"), d, d, bias)?))
        })?;
        let ff = FeedForward::load(s, cfg, &format!("{p}.ff"))?;
        let ff_context = optional(!last, || FeedForward::load(s, cfg, &format!("{p}.ff_context")))?;
        Ok(JointBlock { modulation, img, txt, to_out, to_add_out, attn2, ff, ff_context })
    }
}

/// A single-stream block over the joined sequence: FLUX.2's one fused projection
/// `[q | k | v | gate | up]` and `attn.to_out`, or FLUX.1's `norm.linear` (its own
/// modulation), `proj_mlp`, the attention projections and `proj_out`.
enum SingleBlock<B: Backend> {
    Fused { to_qkv_mlp_proj: Linear<B>, norm_q: Norm<B>, norm_k: Norm<B>, to_out: Linear<B> },
    Split { modulation: Linear<B>, proj_mlp: Linear<B>, proj_out: Linear<B>, qkv: QkvProj<B> },
}

impl<B: Backend> SingleBlock<B> {
    fn load(s: &mut impl Source<B>, cfg: &DitConfig, n: usize) -> Result<Self> {
        let (d, m, hd) = (cfg.dim(), cfg.mlp_dim(), cfg.attention_head_dim);
        let p = format!("single_transformer_blocks.{n}");
        Ok(match cfg.kind {
            DitKind::Flux2 => SingleBlock::Fused {
                to_qkv_mlp_proj: Linear::load(
                    s,
                    &format!("{p}.attn.to_qkv_mlp_proj"),
                    d,
                    3 * d + 2 * m,
                    false,
                )?,
                norm_q: Norm::load_weight(s, &format!("{p}.attn.norm_q"), hd)?,
                norm_k: Norm::load_weight(s, &format!("{p}.attn.norm_k"), hd)?,
                to_out: Linear::load(s, &format!("{p}.attn.to_out"), d + m, d, false)?,
            },
            _ => SingleBlock::Split {
                modulation: Linear::load(s, &format!("{p}.norm.linear"), d, 3 * d, true)?,
                proj_mlp: Linear::load(s, &format!("{p}.proj_mlp"), d, m, true)?,
                proj_out: Linear::load(s, &format!("{p}.proj_out"), d + m, d, true)?,
                qkv: QkvProj::load(
                    s,
                    cfg,
                    &p,
                    ["attn.to_q", "attn.to_k", "attn.to_v"],
                    Some(["attn.norm_q", "attn.norm_k"]),
                )?,
            },
        })
    }
}

/// How the image enters: FLUX's `x_embedder` over packed tokens, or SD3's patchifying
/// convolution plus the stored sin-cos table `(1, max², dim)`.
enum ImageIn<B: Backend> {
    Tokens(Linear<B>),
    Patches { proj: Conv2d<B>, pos_embed: B::Buffer },
}

/// Every layer of a diffusion transformer.
struct Layers<B: Backend> {
    timestep: TimestepMlp<B>,
    guidance: Option<TimestepMlp<B>>,
    /// The pooled prompt's MLP (FLUX.1, SD3).
    text: Option<TimestepMlp<B>>,
    image_in: ImageIn<B>,
    context_embedder: Linear<B>,
    /// FLUX.2's modulations, computed once for every block: image, prompt, single stream.
    shared_modulation: Option<[Linear<B>; 3]>,
    joint: Vec<JointBlock<B>>,
    single: Vec<SingleBlock<B>>,
    norm_out: Linear<B>,
    proj_out: Linear<B>,
}

impl<B: Backend> Layers<B> {
    fn load(cfg: &DitConfig, s: &mut impl Source<B>) -> Result<Self> {
        let (d, bias, tc) = (cfg.dim(), cfg.bias(), cfg.timestep_channels);
        let sd3 = cfg.kind == DitKind::Sd3;
        // SD3's patch embedding comes first in its module order.
        let patches = optional(sd3, || {
            let (p, m) = (cfg.patch_size, cfg.pos_embed_max_size);
            let proj = Conv2d::load(s, "pos_embed.proj", cfg.in_channels, d, p)?.strided(p, 0, 0);
            Ok(ImageIn::Patches { proj, pos_embed: s.f32("pos_embed.pos_embed".into(), &[1, m * m, d])? })
        })?;
        let root = if cfg.kind == DitKind::Flux2 { "time_guidance_embed" } else { "time_text_embed" };
        let timestep = TimestepMlp::load(s, &format!("{root}.timestep_embedder"), tc, d, bias)?;
        let guidance = optional(cfg.guidance_embeds, || {
            TimestepMlp::load(s, &format!("{root}.guidance_embedder"), tc, d, bias)
        })?;
        let (text, context_embedder, shared_modulation, tokens_in);
        if cfg.kind == DitKind::Flux2 {
            text = None;
            shared_modulation = Some([
                Linear::load(s, "double_stream_modulation_img.linear", d, 6 * d, false)?,
                Linear::load(s, "double_stream_modulation_txt.linear", d, 6 * d, false)?,
                Linear::load(s, "single_stream_modulation.linear", d, 3 * d, false)?,
            ]);
            tokens_in = Some(Linear::load(s, "x_embedder", cfg.in_channels, d, false)?);
            context_embedder = Linear::load(s, "context_embedder", cfg.joint_attention_dim, d, false)?;
        } else {
            let pd = cfg.pooled_projection_dim;
            text = Some(TimestepMlp::load(s, "time_text_embed.text_embedder", pd, d, true)?);
            shared_modulation = None;
            context_embedder = Linear::load(s, "context_embedder", cfg.joint_attention_dim, d, true)?;
            tokens_in = optional(!sd3, || Linear::load(s, "x_embedder", cfg.in_channels, d, true))?;
        }
        let image_in = match (patches, tokens_in) {
            (Some(p), _) => p,
            (None, Some(l)) => ImageIn::Tokens(l),
            (None, None) => unreachable!("FLUX loads x_embedder, SD3 its patch embedding"),
        };
        let joint = (0..cfg.num_layers).map(|n| JointBlock::load(s, cfg, n)).collect::<Result<_>>()?;
        let single =
            (0..cfg.num_single_layers).map(|n| SingleBlock::load(s, cfg, n)).collect::<Result<_>>()?;
        let norm_out = Linear::load(s, "norm_out.linear", d, 2 * d, bias)?;
        let proj_out = Linear::load(s, "proj_out", d, cfg.out_features(), bias)?;
        Ok(Layers {
            timestep,
            guidance,
            text,
            image_in,
            context_embedder,
            shared_modulation,
            joint,
            single,
            norm_out,
            proj_out,
        })
    }
}

image_model!(
    /// A diffusion transformer (FLUX.1, FLUX.2 or SD3) over backend `B`, with its weights.
    DitModel,
    DitConfig,
    "diffusers"
);

/// One stream's queries, keys and values `(batch, tokens, dim)`.
struct Qkv<B: Backend> {
    q: B::Buffer,
    k: B::Buffer,
    v: B::Buffer,
    tokens: usize,
}

impl<B: Backend> DitModel<B> {
    // ----- small pieces -----

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

    /// RMS norm over each head of `x (rows, dim)`.
    fn head_norm(&self, norm: &Norm<B>, x: &B::Buffer, rows: usize) -> Result<B::Buffer> {
        norm.rms(&self.backend, x, rows * self.config.num_attention_heads, self.config.eps)
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
            let part = |f: fn(&Qkv<B>) -> &B::Buffer| -> Vec<(&B::Buffer, usize)> {
                streams.iter().map(|s| (f(s), s.tokens * d)).collect()
            };
            (
                concat(be, &part(|s| &s.q), batch)?,
                concat(be, &part(|s| &s.k), batch)?,
                concat(be, &part(|s| &s.v), batch)?,
            )
        };
        let (heads, hd) = (self.config.num_attention_heads, self.config.attention_head_dim);
        if let Some((cos, sin)) = rope {
            let spec = RopePairsSpec { batch, seq: total, heads, head_dim: hd };
            be.rope_pairs(&mut q, cos, sin, &spec)?;
            be.rope_pairs(&mut k, cos, sin, &spec)?;
        }
        let mut out = be.zeros(batch * total * d)?;
        let spec = SdpaSpec::new(batch, total, heads, hd).precision(self.mixed.precision());
        be.sdpa(&mut out, &q, &k, &v, None, None, &spec)?;
        if lens.len() == 1 {
            return Ok(vec![out]);
        }
        let mut parts = Vec::with_capacity(lens.len());
        let mut at = 0;
        for t in lens {
            parts.push(columns(be, &out, batch, total * d, at * d, t * d)?);
            at += t;
        }
        Ok(parts)
    }

    /// The sinusoidal features of the scalars `values` (one a row) through `mlp`, `(batch, dim)`.
    fn embed_scalars(&self, mlp: &TimestepMlp<B>, values: &[f32]) -> Result<B::Buffer> {
        let (tc, batch) = (self.config.timestep_channels, values.len());
        let mut feats = vec![0.0; batch * tc];
        timestep_embedding(&mut feats, values, &TimestepSpec::new(tc))?;
        mlp.forward(&self.backend, &self.backend.upload(&feats)?, batch)
    }

    /// The conditioning vector `temb (batch, dim)`: timestep, plus guidance strength, plus
    /// the projected pooled prompt, as the model has them.
    fn conditioning(&self, input: &DitInput<'_>) -> Result<B::Buffer> {
        let (cfg, be, m) = (&self.config, &self.backend, &self.layers);
        // FLUX's pipelines pass t / 1000 and the model multiplies back (in f32, as here).
        let scale = if cfg.kind == DitKind::Sd3 { 1.0 } else { 1000.0 };
        let t: Vec<f32> = input.timestep.iter().map(|t| t * scale).collect();
        let mut temb = self.embed_scalars(&m.timestep, &t)?;
        if let Some(mlp) = &m.guidance {
            let g = input.guidance.ok_or_else(|| CoreError::InvalidArgument {
                op: "dit forward",
                message: "this model embeds a guidance strength (guidance_embeds); pass one a row".into(),
            })?;
            crate::error::check_len("dit forward", "guidance", g.len(), input.batch)?;
            let g: Vec<f32> = g.iter().map(|g| g * 1000.0).collect();
            be.axpy(&mut temb, 1.0, &self.embed_scalars(mlp, &g)?)?;
        }
        if let Some(mlp) = &m.text {
            let pd = cfg.pooled_projection_dim;
            let pooled = input.pooled.ok_or_else(|| CoreError::InvalidArgument {
                op: "dit forward",
                message: format!("this model needs the pooled prompt vector ({pd} a row)"),
            })?;
            crate::error::check_len("dit forward", "pooled", pooled.len(), input.batch * pd)?;
            be.axpy(&mut temb, 1.0, &mlp.forward(be, &be.upload(pooled)?, input.batch)?)?;
        }
        Ok(temb)
    }

    /// Queries, keys and values of one stream `x (batch, tokens, dim)`, each head RMS-normed
    /// when the model has q/k norms.
    fn stream_qkv(&self, p: &QkvProj<B>, x: &B::Buffer, batch: usize, tokens: usize) -> Result<Qkv<B>> {
        let (be, rows) = (&self.backend, batch * tokens);
        let (mut q, mut k, v) =
            (p.q.forward(be, x, rows)?, p.k.forward(be, x, rows)?, p.v.forward(be, x, rows)?);
        if let (true, Some((nq, nk))) = (self.config.qk_norm, &p.norms) {
            q = self.head_norm(nq, &q, rows)?;
            k = self.head_norm(nk, &k, rows)?;
        }
        Ok(Qkv { q, k, v, tokens })
    }

    /// Double-stream block `blk`: `img (batch, ni, dim)` and `txt (batch, nt, dim)` updated
    /// in place; `m_img`, `m_txt` are the block's modulations (six chunks: shift, scale, gate
    /// for attention then MLP; SD3.5's dual blocks add three for the second attention, and
    /// SD3's last block has only scale and shift for the prompt, which it does not update).
    #[allow(clippy::too_many_arguments)]
    fn joint_block(
        &self, blk: &JointBlock<B>, img: &mut B::Buffer, txt: &mut B::Buffer,
        (batch, ni, nt): (usize, usize, usize), m_img: &B::Buffer, m_txt: &B::Buffer,
        rope: Option<&(B::Buffer, B::Buffer)>,
    ) -> Result<()> {
        let be = &self.backend;
        let last = blk.to_add_out.is_none();
        let n_img = self.norm_modulate(img, batch, ni, m_img, 0, 1)?;
        let n_txt = if last {
            self.norm_modulate(txt, batch, nt, m_txt, 1, 0)?
        } else {
            self.norm_modulate(txt, batch, nt, m_txt, 0, 1)?
        };
        let n_img2 = match blk.attn2 {
            Some(_) => Some(self.norm_modulate(img, batch, ni, m_img, 6, 7)?),
            None => None,
        };
        let a = self.stream_qkv(&blk.img, &n_img, batch, ni)?;
        let b = self.stream_qkv(&blk.txt, &n_txt, batch, nt)?;
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
        self.gate_add(img, &blk.to_out.forward(be, &a_img, ri)?, batch, ni, m_img, 2)?;
        if let (Some(n2), Some((qkv, to_out))) = (n_img2, &blk.attn2) {
            let s = self.stream_qkv(qkv, &n2, batch, ni)?;
            let a2 = self.attention(vec![s], batch, None)?.remove(0);
            self.gate_add(img, &to_out.forward(be, &a2, ri)?, batch, ni, m_img, 8)?;
        }
        let h = self.norm_modulate(img, batch, ni, m_img, 3, 4)?;
        self.gate_add(img, &blk.ff.forward(be, &h, ri)?, batch, ni, m_img, 5)?;
        if let (Some(to_add_out), Some(ff)) = (&blk.to_add_out, &blk.ff_context) {
            self.gate_add(txt, &to_add_out.forward(be, &a_txt, rt)?, batch, nt, m_txt, 2)?;
            let h = self.norm_modulate(txt, batch, nt, m_txt, 3, 4)?;
            self.gate_add(txt, &ff.forward(be, &h, rt)?, batch, nt, m_txt, 5)?;
        }
        Ok(())
    }

    /// A single-stream block over the joined sequence `x (batch, s, dim)`, in place:
    /// attention and MLP from one modulated input, concatenated, projected, gated.
    fn single_block(
        &self, blk: &SingleBlock<B>, x: &mut B::Buffer, batch: usize, s: usize, mods: &B::Buffer,
        rope: Option<&(B::Buffer, B::Buffer)>,
    ) -> Result<()> {
        let (be, d, m) = (&self.backend, self.config.dim(), self.config.mlp_dim());
        let rows = batch * s;
        let h = self.norm_modulate(x, batch, s, mods, 0, 1)?;
        let out = match blk {
            SingleBlock::Fused { to_qkv_mlp_proj, norm_q, norm_k, to_out } => {
                // One fused projection: [q | k | v | gate | up].
                let cols = 3 * d + 2 * m;
                let f = to_qkv_mlp_proj.forward(be, &h, rows)?;
                let q = self.head_norm(norm_q, &columns(be, &f, rows, cols, 0, d)?, rows)?;
                let k = self.head_norm(norm_k, &columns(be, &f, rows, cols, d, d)?, rows)?;
                let v = columns(be, &f, rows, cols, 2 * d, d)?;
                let mlp = swiglu(be, &f, rows, cols, 3 * d, m)?;
                let a = self.attention(vec![Qkv { q, k, v, tokens: s }], batch, rope)?.remove(0);
                to_out.forward(be, &concat(be, &[(&a, d), (&mlp, m)], rows)?, rows)?
            }
            SingleBlock::Split { proj_mlp, proj_out, qkv, .. } => {
                let mlp = unary(be, Unary::GeluTanh, &proj_mlp.forward(be, &h, rows)?)?;
                let qkv = self.stream_qkv(qkv, &h, batch, s)?;
                let a = self.attention(vec![qkv], batch, rope)?.remove(0);
                proj_out.forward(be, &concat(be, &[(&a, d), (&mlp, m)], rows)?, rows)?
            }
        };
        self.gate_add(x, &out, batch, s, mods, 2)
    }

    /// SD3's `PatchEmbed`: a `patch`-strided convolution to tokens `(batch, gh * gw, dim)`
    /// plus the centre crop of the stored sin-cos table.
    fn patch_embed(
        &self, proj: &Conv2d<B>, table: &B::Buffer, data: &[f32], batch: usize, h: usize, w: usize,
    ) -> Result<(B::Buffer, usize)> {
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
        let x = FeatureMap { data: be.upload(data)?, batch, channels: cfg.in_channels, h, w };
        let grid = proj.forward(be, &x)?;
        let (gh, gw) = (grid.h, grid.w);
        let mut tokens = grid.to_tokens(be)?;
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
        let st = unary(be, Unary::Silu, &temb)?;
        let m = &self.layers;

        let (mut img, ni, rope) = match (input.latent, &m.image_in) {
            (DitLatent::Tokens { data, ids }, ImageIn::Tokens(x_embedder)) => {
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
                let img = x_embedder.forward(be, &x, batch * ni)?;
                let mut ids_all = input.context_ids.to_vec();
                ids_all.extend_from_slice(ids);
                let (cos, sin) =
                    crate::ops::modulation::rope_tables(&ids_all, &cfg.axes_dims_rope, cfg.rope_theta)?;
                (img, ni, Some((be.upload(&cos)?, be.upload(&sin)?)))
            }
            (DitLatent::Tokens { .. }, ImageIn::Patches { .. }) => {
                return bad("SD3 takes the latent image, not tokens".into());
            }
            (DitLatent::Image { .. }, ImageIn::Tokens(_)) => {
                return bad("FLUX takes packed tokens with their ids, not an image".into());
            }
            (DitLatent::Image { data, height, width }, ImageIn::Patches { proj, pos_embed }) => {
                crate::error::check_len(
                    "dit forward",
                    "latent",
                    data.len(),
                    batch * cfg.in_channels * height * width,
                )?;
                let (img, ni) = self.patch_embed(proj, pos_embed, data, batch, height, width)?;
                (img, ni, None)
            }
        };
        let ctx = be.upload(input.context)?;
        let mut txt = m.context_embedder.forward(be, &ctx, batch * nt)?;
        drop(ctx);

        let shared = match &m.shared_modulation {
            Some(lins) => Some(
                [0, 1, 2].map(|i| lins[i].forward(be, &st, batch)).into_iter().collect::<Result<Vec<_>>>()?,
            ),
            None => None,
        };
        for blk in &m.joint {
            let dims = (batch, ni, nt);
            match (&shared, &blk.modulation) {
                (Some(sh), _) => {
                    self.joint_block(blk, &mut img, &mut txt, dims, &sh[0], &sh[1], rope.as_ref())?
                }
                (None, Some((mod_img, mod_txt))) => {
                    let (mi, mt) = (mod_img.forward(be, &st, batch)?, mod_txt.forward(be, &st, batch)?);
                    self.joint_block(blk, &mut img, &mut txt, dims, &mi, &mt, rope.as_ref())?;
                }
                (None, None) => unreachable!("a block without shared modulations loads its own"),
            }
        }
        if !m.single.is_empty() {
            let s = nt + ni;
            let mut x = concat(be, &[(&txt, nt * d), (&img, ni * d)], batch)?;
            for blk in &m.single {
                match (&shared, blk) {
                    (Some(sh), _) => self.single_block(blk, &mut x, batch, s, &sh[2], rope.as_ref())?,
                    (None, SingleBlock::Split { modulation, .. }) => {
                        let ms = modulation.forward(be, &st, batch)?;
                        self.single_block(blk, &mut x, batch, s, &ms, rope.as_ref())?;
                    }
                    (None, SingleBlock::Fused { .. }) => {
                        unreachable!("FLUX.2's blocks share their modulation")
                    }
                }
            }
            img = columns(be, &x, batch, s * d, nt * d, ni * d)?;
        }
        // AdaLayerNormContinuous: scale first, then shift.
        let mods = m.norm_out.forward(be, &st, batch)?;
        let h = self.norm_modulate(&img, batch, ni, &mods, 1, 0)?;
        let out = m.proj_out.forward(be, &h, batch * ni)?;
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
