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

use crate::backend::{ColumnCopy, MatmulSpec, PatchSpec, SdpaSpec, Unary};
use crate::models::layers::{conv, group_norm, linear, upsample2x, Image, Layout, Weights};
use crate::ops::spatial::{timestep_embedding, PatchOrder, TimestepSpec};
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

    /// Every tensor under diffusers' names.
    pub fn layout(&self) -> Layout {
        let mut l = Layout::default();
        let c0 = self.block_out_channels[0];
        let te = self.time_embed_dim();
        l.conv("conv_in", self.in_channels, c0, 3);
        l.linear("time_embedding.linear_1", c0, te);
        l.linear("time_embedding.linear_2", te, te);
        if self.addition_time_embed_dim.is_some() {
            l.linear("add_embedding.linear_1", self.projection_class_embeddings_input_dim, te);
            l.linear("add_embedding.linear_2", te, te);
        }
        let n = self.block_out_channels.len();
        let mut out = c0;
        for i in 0..n {
            let cin = out;
            out = self.block_out_channels[i];
            for j in 0..self.layers_per_block[i] {
                let p = format!("down_blocks.{i}");
                self.resnet_layout(&mut l, &format!("{p}.resnets.{j}"), if j == 0 { cin } else { out }, out);
                if self.down_cross[i] {
                    self.transformer_layout(
                        &mut l,
                        &format!("{p}.attentions.{j}"),
                        out,
                        self.transformer_layers_per_block[i],
                    );
                }
            }
            if i + 1 < n {
                l.conv(&format!("down_blocks.{i}.downsamplers.0.conv"), out, out, 3);
            }
        }
        let top = self.block_out_channels[n - 1];
        if self.mid_block {
            self.resnet_layout(&mut l, "mid_block.resnets.0", top, top);
            self.transformer_layout(
                &mut l,
                "mid_block.attentions.0",
                top,
                self.transformer_layers_per_block[n - 1],
            );
            self.resnet_layout(&mut l, "mid_block.resnets.1", top, top);
        }
        let mut prev = top;
        for i in 0..n {
            let (out, skip_in) = self.up_channels(i);
            let b = n - 1 - i;
            for j in 0..self.layers_per_block[b] + 1 {
                let skip = if j == self.layers_per_block[b] { skip_in } else { out };
                let rin = if j == 0 { prev } else { out };
                let p = format!("up_blocks.{i}");
                self.resnet_layout(&mut l, &format!("{p}.resnets.{j}"), rin + skip, out);
                if self.up_cross[i] {
                    self.transformer_layout(
                        &mut l,
                        &format!("{p}.attentions.{j}"),
                        out,
                        self.transformer_layers_per_block[b],
                    );
                }
            }
            if i + 1 < n {
                l.conv(&format!("up_blocks.{i}.upsamplers.0.conv"), out, out, 3);
            }
            prev = out;
        }
        l.norm("conv_norm_out", c0);
        l.conv("conv_out", c0, self.out_channels, 3);
        l
    }

    /// Up block `i`'s output channels and the channels of the skip its last ResNet takes.
    fn up_channels(&self, i: usize) -> (usize, usize) {
        let n = self.block_out_channels.len();
        let out = self.block_out_channels[n - 1 - i];
        let skip_in = self.block_out_channels[(n - 1).saturating_sub(i + 1)];
        (out, skip_in)
    }

    fn resnet_layout(&self, l: &mut Layout, p: &str, cin: usize, cout: usize) {
        l.resnet(p, cin, cout);
        l.linear(&format!("{p}.time_emb_proj"), self.time_embed_dim(), cout);
    }

    fn transformer_layout(&self, l: &mut Layout, p: &str, c: usize, layers: usize) {
        l.norm(&format!("{p}.norm"), c);
        if self.use_linear_projection {
            l.linear(&format!("{p}.proj_in"), c, c);
        } else {
            l.conv(&format!("{p}.proj_in"), c, c, 1);
        }
        for k in 0..layers {
            let b = format!("{p}.transformer_blocks.{k}");
            l.norm(&format!("{b}.norm1"), c);
            for proj in ["to_q", "to_k", "to_v"] {
                l.push(format!("{b}.attn1.{proj}.weight"), vec![c, c]);
            }
            l.linear(&format!("{b}.attn1.to_out.0"), c, c);
            l.norm(&format!("{b}.norm2"), c);
            l.push(format!("{b}.attn2.to_q.weight"), vec![c, c]);
            for proj in ["to_k", "to_v"] {
                l.push(format!("{b}.attn2.{proj}.weight"), vec![c, self.cross_attention_dim]);
            }
            l.linear(&format!("{b}.attn2.to_out.0"), c, c);
            l.norm(&format!("{b}.norm3"), c);
            l.linear(&format!("{b}.ff.net.0.proj"), c, 8 * c);
            l.linear(&format!("{b}.ff.net.2"), 4 * c, c);
        }
        if self.use_linear_projection {
            l.linear(&format!("{p}.proj_out"), c, c);
        } else {
            l.conv(&format!("{p}.proj_out"), c, c, 1);
        }
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

/// A Stable Diffusion UNet (1.x, 2.x, XL) over backend `B`, with its weights.
pub struct Unet<B: Backend> {
    backend: B,
    config: UnetConfig,
    weights: Weights<B>,
}

impl<B: Backend> Unet<B> {
    /// The UNet from its weights by diffusers' names, each checked against the configuration.
    pub fn new(backend: B, config: UnetConfig, weights: BTreeMap<String, B::Buffer>) -> Result<Self> {
        Unet::with_q8(backend, config, weights, BTreeMap::new())
    }

    /// [`Unet::new`] with the matrices in `q8` held as int8.
    pub fn with_q8(
        backend: B, config: UnetConfig, weights: BTreeMap<String, B::Buffer>,
        q8: BTreeMap<String, (B::Buffer, B::Buffer)>,
    ) -> Result<Self> {
        config.validate()?;
        let weights = Weights::with_q8(&backend, &config.layout(), weights, q8)?;
        Ok(Unet { backend, config, weights })
    }

    /// The architecture.
    pub fn config(&self) -> &UnetConfig {
        &self.config
    }

    /// The backend it runs on.
    pub fn backend_ref(&self) -> &B {
        &self.backend
    }

    /// Bytes the weights hold (see [`Weights::bytes`]).
    pub fn weight_bytes(&self) -> usize {
        self.weights.bytes(&self.backend)
    }

    /// `x W^T` without a bias.
    fn project(&self, name: &str, x: &B::Buffer, rows: usize, din: usize, dout: usize) -> Result<B::Buffer> {
        let mut y = self.backend.zeros(rows * dout)?;
        self.weights.project(&self.backend, &format!("{name}.weight"), &mut y, x, rows, din, dout)?;
        Ok(y)
    }

    fn act(&self, op: Unary, x: &B::Buffer) -> Result<B::Buffer> {
        let mut y = self.backend.zeros(self.backend.len(x))?;
        self.backend.unary(op, &mut y, x)?;
        Ok(y)
    }

    /// `TimestepEmbedding` over sinusoidal features of `values` (`dim` of them each).
    fn embed(&self, prefix: &str, feats: &[f32], rows: usize, din: usize) -> Result<B::Buffer> {
        let (be, te) = (&self.backend, self.config.time_embed_dim());
        let x = be.upload(feats)?;
        let h = linear(be, &self.weights, &format!("{prefix}.linear_1"), &x, rows, din, te)?;
        let h = self.act(Unary::Silu, &h)?;
        linear(be, &self.weights, &format!("{prefix}.linear_2"), &h, rows, te, te)
    }

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

    /// `ResnetBlock2D` with the timestep: `shortcut(x) + conv2(act(norm2(conv1(act(norm1
    /// (x))) + proj(temb))))`; `temb` is already through SiLU.
    fn resnet(&self, p: &str, x: &Image<B>, temb: &B::Buffer, cout: usize) -> Result<Image<B>> {
        let (be, w, cfg) = (&self.backend, &self.weights, &self.config);
        let (g, eps) = (cfg.norm_num_groups, cfg.norm_eps);
        let h = group_norm(be, w, &format!("{p}.norm1"), x, g, eps, Some(Unary::Silu))?;
        let mut h = conv(be, w, &format!("{p}.conv1"), &h, cout, 3, 1, 1, 0)?;
        // + time_emb_proj(temb) on every pixel: (batch * cout, 1) x ones(1, hw), added.
        let t = linear(be, w, &format!("{p}.time_emb_proj"), temb, x.batch, cfg.time_embed_dim(), cout)?;
        let hw = h.h * h.w;
        let ones = be.upload(&vec![1.0; hw])?;
        be.matmul(&mut h.data, &t, &ones, &MatmulSpec::new(x.batch * cout, hw, 1).accumulate())?;
        let h = group_norm(be, w, &format!("{p}.norm2"), &h, g, eps, Some(Unary::Silu))?;
        let mut h = conv(be, w, &format!("{p}.conv2"), &h, cout, 3, 1, 1, 0)?;
        if x.channels != cout {
            let s = conv(be, w, &format!("{p}.conv_shortcut"), x, cout, 1, 1, 0, 0)?;
            be.axpy(&mut h.data, 1.0, &s.data)?;
        } else {
            be.axpy(&mut h.data, 1.0, &x.data)?;
        }
        Ok(h)
    }

    /// `(batch, c, h, w)` to tokens `(batch, hw, c)` and back.
    fn tokens_spec(x: &Image<B>) -> PatchSpec {
        PatchSpec {
            batch: x.batch,
            channels: x.channels,
            height: x.h,
            width: x.w,
            patch: 1,
            order: PatchOrder::ChannelFirst,
        }
    }

    /// Multi-head attention of `q (batch, nq, c)` over `k`, `v (batch, nk, c)`, then
    /// `to_out.0`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self, p: &str, q: &B::Buffer, k: &B::Buffer, v: &B::Buffer, batch: usize, nq: usize, nk: usize,
        c: usize, heads: usize,
    ) -> Result<B::Buffer> {
        let be = &self.backend;
        let mut att = be.zeros(batch * nq * c)?;
        let spec = SdpaSpec::new(batch, nq, heads, c / heads).kv_len(nk);
        be.sdpa(&mut att, q, k, v, None, None, &spec)?;
        linear(be, &self.weights, &format!("{p}.to_out.0"), &att, batch * nq, c, c)
    }

    fn layer_norm(&self, p: &str, x: &B::Buffer, rows: usize, c: usize) -> Result<B::Buffer> {
        let be = &self.backend;
        let mut y = be.zeros(rows * c)?;
        let (w, b) = (self.weights.get(&format!("{p}.weight"))?, self.weights.get(&format!("{p}.bias"))?);
        // BasicTransformerBlock's norms: LayerNorm with the default eps.
        be.layer_norm(&mut y, x, Some(w), Some(b), rows, c, 1e-5)?;
        Ok(y)
    }

    /// `Transformer2DModel`: group norm, projection in, `layers` blocks of self-attention,
    /// cross-attention to `context (batch, nk, cross_attention_dim)` and a GEGLU MLP, each
    /// pre-normed and residual, projection out, plus the input.
    fn transformer(
        &self, p: &str, x: &Image<B>, context: &B::Buffer, nk: usize, heads: usize, layers: usize,
    ) -> Result<Image<B>> {
        let (be, w, cfg) = (&self.backend, &self.weights, &self.config);
        let (c, n) = (x.channels, x.h * x.w);
        let rows = x.batch * n;
        let h = group_norm(be, w, &format!("{p}.norm"), x, cfg.norm_num_groups, 1e-6, None)?;
        let spec = Self::tokens_spec(x);
        let mut tokens = be.zeros(x.len())?;
        if cfg.use_linear_projection {
            be.patchify(&mut tokens, &h.data, &spec)?;
            tokens = linear(be, w, &format!("{p}.proj_in"), &tokens, rows, c, c)?;
        } else {
            let h = conv(be, w, &format!("{p}.proj_in"), &h, c, 1, 1, 0, 0)?;
            be.patchify(&mut tokens, &h.data, &spec)?;
        }
        let xd = cfg.cross_attention_dim;
        for k in 0..layers {
            let b = format!("{p}.transformer_blocks.{k}");
            let nrm = self.layer_norm(&format!("{b}.norm1"), &tokens, rows, c)?;
            let q = self.project(&format!("{b}.attn1.to_q"), &nrm, rows, c, c)?;
            let kk = self.project(&format!("{b}.attn1.to_k"), &nrm, rows, c, c)?;
            let v = self.project(&format!("{b}.attn1.to_v"), &nrm, rows, c, c)?;
            let a = self.attend(&format!("{b}.attn1"), &q, &kk, &v, x.batch, n, n, c, heads)?;
            be.axpy(&mut tokens, 1.0, &a)?;
            let nrm = self.layer_norm(&format!("{b}.norm2"), &tokens, rows, c)?;
            let q = self.project(&format!("{b}.attn2.to_q"), &nrm, rows, c, c)?;
            let kk = self.project(&format!("{b}.attn2.to_k"), context, x.batch * nk, xd, c)?;
            let v = self.project(&format!("{b}.attn2.to_v"), context, x.batch * nk, xd, c)?;
            let a = self.attend(&format!("{b}.attn2"), &q, &kk, &v, x.batch, n, nk, c, heads)?;
            be.axpy(&mut tokens, 1.0, &a)?;
            // GEGLU: [hidden | gate] = proj(x); hidden * gelu(gate).
            let nrm = self.layer_norm(&format!("{b}.norm3"), &tokens, rows, c)?;
            let hg = linear(be, w, &format!("{b}.ff.net.0.proj"), &nrm, rows, c, 8 * c)?;
            let (mut hidden, mut gate) = (be.zeros(rows * 4 * c)?, be.zeros(rows * 4 * c)?);
            for (dst, at) in [(&mut hidden, 0), (&mut gate, 4 * c)] {
                let spec = ColumnCopy {
                    rows,
                    width: 4 * c,
                    src_cols: 8 * c,
                    src_at: at,
                    dst_cols: 4 * c,
                    dst_at: 0,
                };
                be.copy_cols(dst, &hg, &spec)?;
            }
            let mut g = be.zeros(rows * 4 * c)?;
            be.gated(Unary::Gelu, &mut g, &gate, &hidden)?;
            let f = linear(be, w, &format!("{b}.ff.net.2"), &g, rows, 4 * c, c)?;
            be.axpy(&mut tokens, 1.0, &f)?;
        }
        let mut out = be.zeros(x.len())?;
        if cfg.use_linear_projection {
            let t = linear(be, w, &format!("{p}.proj_out"), &tokens, rows, c, c)?;
            be.unpatchify(&mut out, &t, &spec)?;
        } else {
            let mut img = be.zeros(x.len())?;
            be.unpatchify(&mut img, &tokens, &spec)?;
            let img = Image { data: img, batch: x.batch, channels: c, h: x.h, w: x.w };
            out = conv(be, w, &format!("{p}.proj_out"), &img, c, 1, 1, 0, 0)?.data;
        }
        be.axpy(&mut out, 1.0, &x.data)?;
        Ok(Image { data: out, batch: x.batch, channels: c, h: x.h, w: x.w })
    }

    /// `[a | b]` along the channels.
    fn cat_channels(&self, a: &Image<B>, b: &Image<B>) -> Result<Image<B>> {
        let be = &self.backend;
        let hw = a.h * a.w;
        let c = a.channels + b.channels;
        let mut out = be.zeros(a.batch * c * hw)?;
        for (src, at) in [(a, 0), (b, a.channels)] {
            let spec = ColumnCopy {
                rows: a.batch,
                width: src.channels * hw,
                src_cols: src.channels * hw,
                src_at: 0,
                dst_cols: c * hw,
                dst_at: at * hw,
            };
            be.copy_cols(&mut out, &src.data, &spec)?;
        }
        Ok(Image { data: out, batch: a.batch, channels: c, h: a.h, w: a.w })
    }

    /// The predicted noise (or velocity), `(batch, out_channels, h, w)`.
    pub fn forward(&self, input: &UnetInput<'_>) -> Result<Vec<f32>> {
        let (be, w, cfg) = (&self.backend, &self.weights, &self.config);
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
        let c0 = cfg.block_out_channels[0];

        // The timestep embedding, plus SD-XL's pooled prompt and size/crop numbers.
        let t = self.sinusoids(input.timestep, c0)?;
        let mut temb = self.embed("time_embedding", &t, batch, c0)?;
        if let Some(d) = cfg.addition_time_embed_dim {
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
            let aug =
                self.embed("add_embedding", &feats, batch, cfg.projection_class_embeddings_input_dim)?;
            be.axpy(&mut temb, 1.0, &aug)?;
        }
        let temb = self.act(Unary::Silu, &temb)?;
        let context = be.upload(input.context)?;

        let x = Image {
            data: be.upload(input.sample)?,
            batch,
            channels: cfg.in_channels,
            h: input.h,
            w: input.w,
        };
        let mut x = conv(be, w, "conv_in", &x, c0, 3, 1, 1, 0)?;
        let n = cfg.block_out_channels.len();
        let mut kept: Vec<Image<B>> = Vec::new();
        kept.push(copy_image(be, &x)?);
        for i in 0..n {
            let out = cfg.block_out_channels[i];
            for j in 0..cfg.layers_per_block[i] {
                let p = format!("down_blocks.{i}");
                x = self.resnet(&format!("{p}.resnets.{j}"), &x, &temb, out)?;
                if cfg.down_cross[i] {
                    x = self.transformer(
                        &format!("{p}.attentions.{j}"),
                        &x,
                        &context,
                        nk,
                        cfg.heads[i],
                        cfg.transformer_layers_per_block[i],
                    )?;
                }
                kept.push(copy_image(be, &x)?);
            }
            if i + 1 < n {
                x = conv(
                    be,
                    w,
                    &format!("down_blocks.{i}.downsamplers.0.conv"),
                    &x,
                    out,
                    3,
                    2,
                    cfg.downsample_padding,
                    0,
                )?;
                kept.push(copy_image(be, &x)?);
            }
        }
        if cfg.mid_block {
            let top = cfg.block_out_channels[n - 1];
            x = self.resnet("mid_block.resnets.0", &x, &temb, top)?;
            x = self.transformer(
                "mid_block.attentions.0",
                &x,
                &context,
                nk,
                cfg.heads[n - 1],
                cfg.transformer_layers_per_block[n - 1],
            )?;
            x = self.resnet("mid_block.resnets.1", &x, &temb, top)?;
        }
        for i in 0..n {
            let (out, _) = cfg.up_channels(i);
            let b = n - 1 - i;
            for j in 0..cfg.layers_per_block[b] + 1 {
                let skip = kept.pop().ok_or(CoreError::InvalidArgument {
                    op: "unet forward",
                    message: "the up blocks take more skips than the down blocks keep".into(),
                })?;
                let cat = self.cat_channels(&x, &skip)?;
                let p = format!("up_blocks.{i}");
                x = self.resnet(&format!("{p}.resnets.{j}"), &cat, &temb, out)?;
                if cfg.up_cross[i] {
                    x = self.transformer(
                        &format!("{p}.attentions.{j}"),
                        &x,
                        &context,
                        nk,
                        cfg.heads[b],
                        cfg.transformer_layers_per_block[b],
                    )?;
                }
            }
            if i + 1 < n {
                let up = upsample2x(be, &x)?;
                x = conv(be, w, &format!("up_blocks.{i}.upsamplers.0.conv"), &up, out, 3, 1, 1, 0)?;
            }
        }
        let h = group_norm(be, w, "conv_norm_out", &x, cfg.norm_num_groups, cfg.norm_eps, Some(Unary::Silu))?;
        let out = conv(be, w, "conv_out", &h, cfg.out_channels, 3, 1, 1, 0)?;
        be.download(&out.data)
    }
}

fn copy_image<B: Backend>(be: &B, x: &Image<B>) -> Result<Image<B>> {
    let mut data = be.zeros(x.len())?;
    be.copy(&mut data, &x.data)?;
    Ok(Image { data, batch: x.batch, channels: x.channels, h: x.h, w: x.w })
}
