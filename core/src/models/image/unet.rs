//! The denoising UNet of Stable Diffusion 1.x, 2.x and XL (diffusers'
//! `UNet2DConditionModel`), over `Backend`, inference only.
//!
//! A convolution in; down blocks of ResNets (each told the timestep through a per-channel
//! shift) and, in the cross-attention blocks, spatial transformers attending to the prompt,
//! each block's outputs kept for the way up; a middle block; up blocks that concatenate the
//! kept outputs back on, channel-wise; a group norm, SiLU and a convolution out. SD-XL adds
//! its pooled prompt and the picture's size and crop (`add_time_ids`) to the timestep
//! embedding (`addition_embed_type: "text_time"`).
//!
//! diffusers' naming quirk is kept: the config's `attention_head_dim` is the number of heads
//! of each block (the head size is the channels over it). Activations are `(batch,
//! channels, h, w)`; weights carry diffusers' names.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::backend::{SdpaSpec, Unary};
use crate::models::image::blocks::{
    columns, concat, image_model, layout_of, optional, unary, upsample2x, Conv2d, FeatureMap, Layout, Linear,
    Norm, Resnet, Source, TimestepMlp,
};
use crate::ops::spatial::{timestep_embedding, TimestepSpec};
use crate::{Backend, CoreError, Result};

/// Every shape of a `UNet2DConditionModel`, from its `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct UnetConfig {
    /// Latent channels in.
    pub in_channels: usize,
    /// Channels out (the predicted noise or velocity).
    pub out_channels: usize,
    /// Per down block: whether it has cross-attention (`CrossAttnDownBlock2D`) or not
    /// (`DownBlock2D`).
    pub down_cross: Vec<bool>,
    /// Per up block, in up order: `CrossAttnUpBlock2D` or `UpBlock2D`.
    pub up_cross: Vec<bool>,
    /// Channels of each resolution, finest first.
    pub block_out_channels: Vec<usize>,
    /// ResNet layers per block.
    pub layers_per_block: Vec<usize>,
    /// Transformer layers per spatial transformer, per block.
    pub transformer_layers_per_block: Vec<usize>,
    /// Heads per block (diffusers' `attention_head_dim`).
    pub heads: Vec<usize>,
    /// Width of the prompt states.
    pub cross_attention_dim: usize,
    /// Groups of the group norms.
    pub norm_num_groups: usize,
    /// The group norms' epsilon.
    pub norm_eps: f32,
    /// `Linear` instead of 1x1 convolutions around each spatial transformer (SD 2.x, XL).
    pub use_linear_projection: bool,
    /// The timestep features' order (sin first, or cos first).
    pub flip_sin_to_cos: bool,
    /// The timestep features' frequency shift.
    pub freq_shift: f32,
    /// `UNetMidBlock2DCrossAttn` (true in every SD model).
    pub mid_block: bool,
    /// SD-XL's `addition_embed_type: "text_time"`: the Fourier width of each size/crop
    /// number and the width of `[pooled | time ids]`.
    pub addition_time_embed_dim: Option<usize>,
    /// SD-XL: width of `[pooled | time ids features]`.
    pub projection_class_embeddings_input_dim: usize,
    /// Padding of the downsampling convolutions.
    pub downsample_padding: usize,
}

impl UnetConfig {
    /// The timestep embedding's width (`4 * block_out_channels[0]`).
    pub fn time_embed_dim(&self) -> usize {
        4 * self.block_out_channels.first().copied().unwrap_or(0)
    }

    /// How much a picture's sides shrink: 2 for every down block but the last.
    pub fn downscale(&self) -> usize {
        1 << self.block_out_channels.len().saturating_sub(1)
    }

    /// Checks the shapes against each other, naming the first that does not fit.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(CoreError::InvalidArgument { op: "unet config", message });
        let n = self.block_out_channels.len();
        if n == 0 {
            return bad("block_out_channels is empty".into());
        }
        for (what, len) in [
            ("down_block_types", self.down_cross.len()),
            ("up_block_types", self.up_cross.len()),
            ("layers_per_block", self.layers_per_block.len()),
            ("transformer_layers_per_block", self.transformer_layers_per_block.len()),
            ("attention_head_dim", self.heads.len()),
        ] {
            if len != n {
                return bad(format!("{what} has {len} entries for {n} blocks"));
            }
        }
        if self.in_channels == 0 || self.out_channels == 0 || self.norm_num_groups == 0 {
            return bad("in_channels, out_channels and norm_num_groups must be at least 1".into());
        }
        for (i, (&c, &h)) in self.block_out_channels.iter().zip(&self.heads).enumerate() {
            if c == 0 || !c.is_multiple_of(self.norm_num_groups) {
                return bad(format!("block {i}: {c} channels are not groups of {}", self.norm_num_groups));
            }
            let cross = self.down_cross[i] || self.up_cross[n - 1 - i] || (self.mid_block && i == n - 1);
            if cross && (h == 0 || !c.is_multiple_of(h)) {
                return bad(format!("block {i}: {c} channels do not split into {h} heads"));
            }
        }
        if self.layers_per_block.contains(&0) {
            return bad("layers_per_block must be at least 1".into());
        }
        if self.cross_attention_dim == 0 {
            return bad("cross_attention_dim must be at least 1".into());
        }
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return bad(format!("norm_eps is {}", self.norm_eps));
        }
        if let Some(d) = self.addition_time_embed_dim {
            if d == 0 || self.projection_class_embeddings_input_dim <= 6 * d {
                return bad(format!(
                    "projection_class_embeddings_input_dim ({}) must hold 6 time ids of {d} and a pooled vector",
                    self.projection_class_embeddings_input_dim
                ));
            }
        }
        Ok(())
    }

    /// The width of the pooled vector SD-XL feeds (`projection_class_embeddings_input_dim`
    /// less the six embedded size/crop numbers), 0 without `text_time`.
    pub fn pooled_dim(&self) -> usize {
        match self.addition_time_embed_dim {
            Some(d) => self.projection_class_embeddings_input_dim - 6 * d,
            None => 0,
        }
    }

    /// Up block `i`'s output channels and the channels of the skip its last ResNet takes.
    fn up_channels(&self, i: usize) -> (usize, usize) {
        let n = self.block_out_channels.len();
        let out = self.block_out_channels[n - 1 - i];
        let skip_in = self.block_out_channels[(n - 1).saturating_sub(i + 1)];
        (out, skip_in)
    }
}

/// One UNet call's inputs, as diffusers passes them.
#[derive(Debug, Clone, Copy)]
pub struct UnetInput<'a> {
    /// `(batch, in_channels, h, w)`.
    pub sample: &'a [f32],
    /// Images.
    pub batch: usize,
    /// Latent rows.
    pub h: usize,
    /// Latent columns.
    pub w: usize,
    /// One timestep a row (0..num_train_timesteps).
    pub timestep: &'a [f32],
    /// `(batch, tokens, cross_attention_dim)`.
    pub context: &'a [f32],
    /// SD-XL: `(batch, pooled)` text embeds and `(batch, 6)` time ids.
    pub text_embeds: Option<&'a [f32]>,
    /// SD-XL: `(batch, 6)` original size, crop and target size.
    pub time_ids: Option<&'a [f32]>,
}

/// diffusers' `Attention` in a `BasicTransformerBlock`: projections without bias, the
/// output with one.
struct Attention<B: Backend> {
    to_q: Linear<B>,
    to_k: Linear<B>,
    to_v: Linear<B>,
    to_out: Linear<B>,
    heads: usize,
}

impl<B: Backend> Attention<B> {
    /// `c` channels of queries over keys and values from `ckv`-wide states.
    fn load(s: &mut impl Source<B>, p: &str, c: usize, ckv: usize, heads: usize) -> Result<Self> {
        Ok(Attention {
            to_q: Linear::load(s, &format!("{p}.to_q"), c, c, false)?,
            to_k: Linear::load(s, &format!("{p}.to_k"), ckv, c, false)?,
            to_v: Linear::load(s, &format!("{p}.to_v"), ckv, c, false)?,
            to_out: Linear::load(s, &format!("{p}.to_out.0"), c, c, true)?,
            heads,
        })
    }

    /// `x (batch, nq, c)` attending to `kv (batch, nk, ckv)`, then `to_out`.
    fn forward(
        &self, be: &B, x: &B::Buffer, kv: &B::Buffer, batch: usize, nq: usize, nk: usize,
    ) -> Result<B::Buffer> {
        let c = self.to_q.dout();
        let q = self.to_q.forward(be, x, batch * nq)?;
        let k = self.to_k.forward(be, kv, batch * nk)?;
        let v = self.to_v.forward(be, kv, batch * nk)?;
        let mut att = be.zeros(batch * nq * c)?;
        let spec =
            SdpaSpec::new(batch, nq, self.heads, c / self.heads).kv_len(nk).precision(self.to_q.precision());
        be.sdpa(&mut att, &q, &k, &v, None, None, &spec)?;
        self.to_out.forward(be, &att, batch * nq)
    }
}

/// `BasicTransformerBlock`: self-attention, cross-attention to the prompt and a GEGLU MLP,
/// each pre-normed (LayerNorm, default eps) and residual.
struct TransformerBlock<B: Backend> {
    norm1: Norm<B>,
    attn1: Attention<B>,
    norm2: Norm<B>,
    attn2: Attention<B>,
    norm3: Norm<B>,
    ff_proj: Linear<B>,
    ff_out: Linear<B>,
}

/// A spatial transformer's in and out projections: `Linear` (SD 2.x, XL) or 1x1 convolutions.
enum Projection<B: Backend> {
    Linear(Linear<B>),
    Conv(Conv2d<B>),
}

impl<B: Backend> Projection<B> {
    fn load(s: &mut impl Source<B>, p: &str, c: usize, linear: bool) -> Result<Self> {
        Ok(match linear {
            true => Projection::Linear(Linear::load(s, p, c, c, true)?),
            false => Projection::Conv(Conv2d::load(s, p, c, c, 1)?),
        })
    }
}

/// `Transformer2DModel`: group norm, projection in, blocks, projection out, plus the input.
struct SpatialTransformer<B: Backend> {
    norm: Norm<B>,
    proj_in: Projection<B>,
    blocks: Vec<TransformerBlock<B>>,
    proj_out: Projection<B>,
}

impl<B: Backend> SpatialTransformer<B> {
    fn load(s: &mut impl Source<B>, cfg: &UnetConfig, p: &str, c: usize, block: usize) -> Result<Self> {
        let (xd, heads) = (cfg.cross_attention_dim, cfg.heads[block]);
        let norm = Norm::load(s, &format!("{p}.norm"), c)?;
        let proj_in = Projection::load(s, &format!("{p}.proj_in"), c, cfg.use_linear_projection)?;
        let mut blocks = Vec::new();
        for k in 0..cfg.transformer_layers_per_block[block] {
            let b = format!("{p}.transformer_blocks.{k}");
            blocks.push(TransformerBlock {
                norm1: Norm::load(s, &format!("{b}.norm1"), c)?,
                attn1: Attention::load(s, &format!("{b}.attn1"), c, c, heads)?,
                norm2: Norm::load(s, &format!("{b}.norm2"), c)?,
                attn2: Attention::load(s, &format!("{b}.attn2"), c, xd, heads)?,
                norm3: Norm::load(s, &format!("{b}.norm3"), c)?,
                ff_proj: Linear::load(s, &format!("{b}.ff.net.0.proj"), c, 8 * c, true)?,
                ff_out: Linear::load(s, &format!("{b}.ff.net.2"), 4 * c, c, true)?,
            });
        }
        let proj_out = Projection::load(s, &format!("{p}.proj_out"), c, cfg.use_linear_projection)?;
        Ok(SpatialTransformer { norm, proj_in, blocks, proj_out })
    }

    /// `x` attending to `context (batch, nk, cross_attention_dim)`.
    fn forward(
        &self, be: &B, x: &FeatureMap<B>, context: &B::Buffer, nk: usize, groups: usize,
    ) -> Result<FeatureMap<B>> {
        let (c, n) = (x.channels, x.h * x.w);
        let rows = x.batch * n;
        let h = self.norm.group(be, x, groups, 1e-6, None)?;
        let mut tokens = match &self.proj_in {
            Projection::Linear(l) => l.forward(be, &h.to_tokens(be)?, rows)?,
            Projection::Conv(conv) => conv.forward(be, &h)?.to_tokens(be)?,
        };
        for b in &self.blocks {
            // BasicTransformerBlock's norms: LayerNorm with the default eps.
            let nrm = b.norm1.layer(be, &tokens, rows, 1e-5)?;
            let a = b.attn1.forward(be, &nrm, &nrm, x.batch, n, n)?;
            be.axpy(&mut tokens, 1.0, &a)?;
            let nrm = b.norm2.layer(be, &tokens, rows, 1e-5)?;
            let a = b.attn2.forward(be, &nrm, context, x.batch, n, nk)?;
            be.axpy(&mut tokens, 1.0, &a)?;
            // GEGLU: [hidden | gate] = proj(x); hidden * gelu(gate).
            let nrm = b.norm3.layer(be, &tokens, rows, 1e-5)?;
            let hg = b.ff_proj.forward(be, &nrm, rows)?;
            let hidden = columns(be, &hg, rows, 8 * c, 0, 4 * c)?;
            let gate = columns(be, &hg, rows, 8 * c, 4 * c, 4 * c)?;
            let mut g = be.zeros(rows * 4 * c)?;
            be.gated(Unary::Gelu, &mut g, &gate, &hidden)?;
            let f = b.ff_out.forward(be, &g, rows)?;
            be.axpy(&mut tokens, 1.0, &f)?;
        }
        let mut out = match &self.proj_out {
            Projection::Linear(l) => x.from_tokens(be, &l.forward(be, &tokens, rows)?)?,
            Projection::Conv(conv) => conv.forward(be, &x.from_tokens(be, &tokens)?)?,
        };
        be.axpy(&mut out.data, 1.0, &x.data)?;
        Ok(out)
    }
}

/// A down or up block: ResNets, each followed by a spatial transformer in the
/// cross-attention blocks, then the change of size (not at the last).
struct Stage<B: Backend> {
    resnets: Vec<Resnet<B>>,
    attentions: Vec<SpatialTransformer<B>>,
    resample: Option<Conv2d<B>>,
}

/// Every layer of a UNet.
struct Layers<B: Backend> {
    conv_in: Conv2d<B>,
    time_embedding: TimestepMlp<B>,
    add_embedding: Option<TimestepMlp<B>>,
    down: Vec<Stage<B>>,
    mid: Option<(Resnet<B>, SpatialTransformer<B>, Resnet<B>)>,
    up: Vec<Stage<B>>,
    conv_norm_out: Norm<B>,
    conv_out: Conv2d<B>,
}

impl<B: Backend> Layers<B> {
    fn load(cfg: &UnetConfig, s: &mut impl Source<B>) -> Result<Self> {
        let (c0, te, n) = (cfg.block_out_channels[0], cfg.time_embed_dim(), cfg.block_out_channels.len());
        let conv_in = Conv2d::load(s, "conv_in", cfg.in_channels, c0, 3)?;
        let time_embedding = TimestepMlp::load(s, "time_embedding", c0, te, true)?;
        let add_embedding = optional(cfg.addition_time_embed_dim.is_some(), || {
            TimestepMlp::load(s, "add_embedding", cfg.projection_class_embeddings_input_dim, te, true)
        })?;
        let mut down = Vec::with_capacity(n);
        let mut out = c0;
        for i in 0..n {
            let p = format!("down_blocks.{i}");
            let cin = out;
            out = cfg.block_out_channels[i];
            let mut stage = Stage { resnets: Vec::new(), attentions: Vec::new(), resample: None };
            for j in 0..cfg.layers_per_block[i] {
                let rin = if j == 0 { cin } else { out };
                stage.resnets.push(Resnet::load(s, &format!("{p}.resnets.{j}"), rin, out, Some(te))?);
                if cfg.down_cross[i] {
                    stage.attentions.push(SpatialTransformer::load(
                        s,
                        cfg,
                        &format!("{p}.attentions.{j}"),
                        out,
                        i,
                    )?);
                }
            }
            stage.resample = optional(i + 1 < n, || {
                let conv = Conv2d::load(s, &format!("{p}.downsamplers.0.conv"), out, out, 3)?;
                Ok(conv.strided(2, cfg.downsample_padding, 0))
            })?;
            down.push(stage);
        }
        let top = cfg.block_out_channels[n - 1];
        let mid = optional(cfg.mid_block, || {
            Ok((
                Resnet::load(s, "mid_block.resnets.0", top, top, Some(te))?,
                SpatialTransformer::load(s, cfg, "mid_block.attentions.0", top, n - 1)?,
                Resnet::load(s, "mid_block.resnets.1", top, top, Some(te))?,
            ))
        })?;
        let mut up = Vec::with_capacity(n);
        let mut prev = top;
        for i in 0..n {
            let p = format!("up_blocks.{i}");
            let (out, skip_in) = cfg.up_channels(i);
            let b = n - 1 - i;
            let mut stage = Stage { resnets: Vec::new(), attentions: Vec::new(), resample: None };
            for j in 0..cfg.layers_per_block[b] + 1 {
                let skip = if j == cfg.layers_per_block[b] { skip_in } else { out };
                let rin = if j == 0 { prev } else { out };
                stage.resnets.push(Resnet::load(s, &format!("{p}.resnets.{j}"), rin + skip, out, Some(te))?);
                if cfg.up_cross[i] {
                    stage.attentions.push(SpatialTransformer::load(
                        s,
                        cfg,
                        &format!("{p}.attentions.{j}"),
                        out,
                        b,
                    )?);
                }
            }
            stage.resample =
                optional(i + 1 < n, || Conv2d::load(s, &format!("{p}.upsamplers.0.conv"), out, out, 3))?;
            up.push(stage);
            prev = out;
        }
        let conv_norm_out = Norm::load(s, "conv_norm_out", c0)?;
        let conv_out = Conv2d::load(s, "conv_out", c0, cfg.out_channels, 3)?;
        Ok(Layers { conv_in, time_embedding, add_embedding, down, mid, up, conv_norm_out, conv_out })
    }
}

image_model!(
    /// A Stable Diffusion UNet (1.x, 2.x, XL) over backend `B`, with its weights.
    UnetModel,
    UnetConfig,
    "diffusers"
);

impl<B: Backend> UnetModel<B> {
    fn sinusoids(&self, values: &[f32], dim: usize) -> Result<Vec<f32>> {
        let spec = TimestepSpec {
            dim,
            flip_sin_to_cos: self.config.flip_sin_to_cos,
            downscale_freq_shift: self.config.freq_shift,
            scale: 1.0,
            max_period: 10000.0,
        };
        let mut out = vec![0.0; values.len() * dim];
        timestep_embedding(&mut out, values, &spec)?;
        Ok(out)
    }

    /// `[a | b]` along the channels.
    fn cat_channels(&self, a: &FeatureMap<B>, b: &FeatureMap<B>) -> Result<FeatureMap<B>> {
        let hw = a.h * a.w;
        let data = concat(&self.backend, &[(&a.data, a.channels * hw), (&b.data, b.channels * hw)], a.batch)?;
        Ok(a.with(data, a.channels + b.channels, a.h, a.w))
    }

    /// The timestep embedding, plus SD-XL's pooled prompt and size/crop numbers, through SiLU.
    fn conditioning(&self, input: &UnetInput<'_>) -> Result<B::Buffer> {
        let (be, cfg, batch) = (&self.backend, &self.config, input.batch);
        let c0 = cfg.block_out_channels[0];
        let t = be.upload(&self.sinusoids(input.timestep, c0)?)?;
        let mut temb = self.layers.time_embedding.forward(be, &t, batch)?;
        if let (Some(d), Some(add)) = (cfg.addition_time_embed_dim, &self.layers.add_embedding) {
            let pd = cfg.pooled_dim();
            let (Some(text), Some(ids)) = (input.text_embeds, input.time_ids) else {
                return Err(CoreError::InvalidArgument {
                    op: "unet forward",
                    message: "this UNet (text_time) needs the pooled text embeds and the six time ids".into(),
                });
            };
            crate::error::check_len("unet forward", "text_embeds", text.len(), batch * pd)?;
            crate::error::check_len("unet forward", "time_ids", ids.len(), batch * 6)?;
            let ids = self.sinusoids(ids, d)?;
            let mut feats = Vec::with_capacity(batch * cfg.projection_class_embeddings_input_dim);
            for b in 0..batch {
                feats.extend_from_slice(&text[b * pd..(b + 1) * pd]);
                feats.extend_from_slice(&ids[b * 6 * d..(b + 1) * 6 * d]);
            }
            let aug = add.forward(be, &be.upload(&feats)?, batch)?;
            be.axpy(&mut temb, 1.0, &aug)?;
        }
        unary(be, Unary::Silu, &temb)
    }

    /// The predicted noise (or velocity), `(batch, out_channels, h, w)`.
    pub fn forward(&self, input: &UnetInput<'_>) -> Result<Vec<f32>> {
        let (be, cfg, m) = (&self.backend, &self.config, &self.layers);
        let batch = input.batch;
        let bad = |message: String| Err(CoreError::InvalidDimension { op: "unet forward", message });
        if batch == 0 {
            return bad("the batch is empty".into());
        }
        let f = cfg.downscale();
        if input.h == 0 || input.w == 0 || !input.h.is_multiple_of(f) || !input.w.is_multiple_of(f) {
            return bad(format!(
                "a {}x{} latent: both sides must be positive multiples of {f}",
                input.h, input.w
            ));
        }
        crate::error::check_len(
            "unet forward",
            "sample",
            input.sample.len(),
            batch * cfg.in_channels * input.h * input.w,
        )?;
        crate::error::check_len("unet forward", "timestep", input.timestep.len(), batch)?;
        let xd = cfg.cross_attention_dim;
        if input.context.is_empty() || !input.context.len().is_multiple_of(batch * xd) {
            return bad(format!(
                "{} prompt values are not {batch} rows of tokens of {xd}",
                input.context.len()
            ));
        }
        let nk = input.context.len() / (batch * xd);
        let (g, eps) = (cfg.norm_num_groups, cfg.norm_eps);
        let temb = self.conditioning(input)?;
        let context = be.upload(input.context)?;
        let resnet = |r: &Resnet<B>, x: &FeatureMap<B>| r.forward(be, x, Some(&temb), g, eps, Unary::Silu);

        let x = FeatureMap {
            data: be.upload(input.sample)?,
            batch,
            channels: cfg.in_channels,
            h: input.h,
            w: input.w,
        };
        let mut x = m.conv_in.forward(be, &x)?;
        let mut kept: Vec<FeatureMap<B>> = vec![x.copy(be)?];
        for stage in &m.down {
            for (j, r) in stage.resnets.iter().enumerate() {
                x = resnet(r, &x)?;
                if let Some(t) = stage.attentions.get(j) {
                    x = t.forward(be, &x, &context, nk, g)?;
                }
                kept.push(x.copy(be)?);
            }
            if let Some(down) = &stage.resample {
                x = down.forward(be, &x)?;
                kept.push(x.copy(be)?);
            }
        }
        if let Some((r0, t, r1)) = &m.mid {
            x = resnet(r0, &x)?;
            x = t.forward(be, &x, &context, nk, g)?;
            x = resnet(r1, &x)?;
        }
        for stage in &m.up {
            for (j, r) in stage.resnets.iter().enumerate() {
                let skip = kept.pop().ok_or(CoreError::InvalidArgument {
                    op: "unet forward",
                    message: "the up blocks take more skips than the down blocks keep".into(),
                })?;
                x = resnet(r, &self.cat_channels(&x, &skip)?)?;
                if let Some(t) = stage.attentions.get(j) {
                    x = t.forward(be, &x, &context, nk, g)?;
                }
            }
            if let Some(up) = &stage.resample {
                x = up.forward(be, &upsample2x(be, &x)?)?;
            }
        }
        let h = m.conv_norm_out.group(be, &x, g, eps, Some(Unary::Silu))?;
        be.download(&m.conv_out.forward(be, &h)?.data)
    }
}
