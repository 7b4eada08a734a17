//! The building blocks the image models share, over `Backend`, with their weights under
//! the names `diffusers` and `transformers` give them.
//!
//! A model is a tree of typed layers built once from a [`Source`]: each layer asks for its
//! tensors by name and shape as it is built, so a published name is written once, in the
//! layer's `load`. The same code records the [`Layout`] (names and shapes, for reading
//! files and counting parameters without allocating: the [`Layout`] source hands out empty
//! buffers of the reference backend) and loads the weights (the [`Loader`] takes each
//! tensor out of the map it was given, checks its length, and reports what is missing or
//! left over). The forward passes then hold buffers, never look names up.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::backend::{
    ColumnCopy, Conv2dSpec, GroupNormSpec, MatmulSpec, OperandPrecision, PatchSpec, SdpaSpec, Unary,
};
use crate::ops::spatial::PatchOrder;
use crate::reference::ReferenceBackend;
use crate::{Backend, CoreError, Result};

/// Tensor names and shapes in the order a model defines them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Layout {
    /// `(name, shape)` of every tensor.
    pub tensors: Vec<(String, Vec<usize>)>,
}

impl Layout {
    /// Appends a tensor.
    pub fn push(&mut self, name: String, shape: Vec<usize>) {
        self.tensors.push((name, shape));
    }
    /// Total number of values.
    pub fn parameter_count(&self) -> usize {
        self.tensors.iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }
    /// Bytes the tensors take with the matrices `int8` picks held as int8 (a byte a
    /// weight, rows padded to whole f32 words, and an f32 scale a block) and the rest as f32.
    pub fn q8_bytes(&self, int8: impl Fn(&str, &[usize]) -> bool) -> usize {
        self.quant_bytes(crate::ops::q8::QuantFormat::Q8, int8)
    }
    /// [`Layout::q8_bytes`] with the picked matrices held in `format` (at
    /// [`crate::ops::q8::QuantFormat::Q4`]: half a byte a weight, rows padded to whole
    /// 64-value steps, and two f32s a block of 32 plus two a row).
    pub fn quant_bytes(
        &self, format: crate::ops::q8::QuantFormat, pick: impl Fn(&str, &[usize]) -> bool,
    ) -> usize {
        use crate::ops::q8::QuantFormat;
        self.tensors
            .iter()
            .map(|(name, shape)| match (&shape[..], format) {
                (&[rows, cols], QuantFormat::Q8) if pick(name, shape) => crate::ops::q8::q8_bytes(rows, cols),
                (&[rows, cols], QuantFormat::Q8Rows) if pick(name, shape) => {
                    4 * rows * (crate::ops::q8::packed_cols(cols) + 1)
                }
                // A convolution's weight as int8 rows, one an output channel.
                (&[rows, cin, kh, kw], QuantFormat::Q8Rows) if pick(name, shape) => {
                    4 * rows * (crate::ops::q8::packed_cols(cin * kh * kw) + 1)
                }
                (&[rows, cols], QuantFormat::Q4) if pick(name, shape) => crate::ops::q4::q4_bytes(rows, cols),
                _ => 4 * shape.iter().product::<usize>(),
            })
            .sum()
    }
}

/// A matrix held as f32, or as int8 (`packed`, `scales` as [`crate::ops::q8`] lays them
/// out, one scale a row).
pub enum Tensor<B: Backend> {
    /// f32 values.
    F32(B::Buffer),
    /// int8 values and a scale a row.
    Q8 {
        /// Four int8 values a word.
        packed: B::Buffer,
        /// One scale a row.
        scales: B::Buffer,
    },
}

/// Where a model's tensors come from while its layers are built.
pub trait Source<B: Backend> {
    /// The f32 tensor `name` of `shape`.
    fn f32(&mut self, name: String, shape: &[usize]) -> Result<B::Buffer>;
    /// The matrix `name`, `(rows, cols)`, held as f32 or int8.
    fn matrix(&mut self, name: String, rows: usize, cols: usize) -> Result<Tensor<B>>;
    /// The convolution weight `name` (`spec`'s `(cout, cin, kh, kw)`), held as f32 or as
    /// int8 rows in [`crate::ops::conv::conv2d_q8`]'s channels-last order.
    fn conv_weight(&mut self, name: String, spec: &Conv2dSpec) -> Result<Tensor<B>> {
        let shape = [spec.out_channels, spec.in_channels, spec.kernel.0, spec.kernel.1];
        Ok(Tensor::F32(self.f32(name, &shape)?))
    }
    /// The model's mixed-precision switch, shared by the layers that multiply.
    fn mixed(&self) -> Mixed {
        Mixed::default()
    }
}

/// Whether a model's products (its `Linear` layers' f32 matrices and its convolutions)
/// round their operands to bf16 and sum in f32: one switch per model, shared by those
/// layers, flipped by the model's `set_mixed_precision` (off when loaded).
#[derive(Clone, Default, Debug)]
pub struct Mixed(Arc<AtomicBool>);

impl Mixed {
    /// The operand precision the layers multiply at now.
    pub fn precision(&self) -> OperandPrecision {
        // Relaxed: the flag orders nothing else; a forward reads it once a product.
        if self.0.load(Ordering::Relaxed) {
            OperandPrecision::Bf16
        } else {
            OperandPrecision::F32
        }
    }

    /// Turns bf16 operands on or off.
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}

/// Recording: every tensor asked for is appended; the buffers handed out are empty.
impl Source<ReferenceBackend> for Layout {
    fn f32(&mut self, name: String, shape: &[usize]) -> Result<Vec<f32>> {
        self.push(name, shape.to_vec());
        Ok(Vec::new())
    }
    fn matrix(&mut self, name: String, rows: usize, cols: usize) -> Result<Tensor<ReferenceBackend>> {
        self.push(name, alloc::vec![rows, cols]);
        Ok(Tensor::F32(Vec::new()))
    }
}

/// Loading: each tensor is taken out of the maps it was given and its length checked.
pub struct Loader<'a, B: Backend> {
    backend: &'a B,
    f32: BTreeMap<String, B::Buffer>,
    q8: BTreeMap<String, (B::Buffer, B::Buffer)>,
    bytes: usize,
    mixed: Mixed,
}

impl<'a, B: Backend> Loader<'a, B> {
    /// A loader over f32 tensors and int8 matrices by name.
    pub fn new(
        backend: &'a B, f32: BTreeMap<String, B::Buffer>, q8: BTreeMap<String, (B::Buffer, B::Buffer)>,
    ) -> Self {
        Loader { backend, f32, q8, bytes: 0, mixed: Mixed::default() }
    }

    /// The switch the loaded layers share.
    pub fn mixed_switch(&self) -> Mixed {
        self.mixed.clone()
    }

    /// Bytes of everything taken; an error naming a tensor nobody asked for.
    pub fn finish(self) -> Result<usize> {
        match self.f32.keys().chain(self.q8.keys()).next() {
            Some(extra) => Err(checkpoint(extra, "not part of the model the configuration describes")),
            None => Ok(self.bytes),
        }
    }
}

impl<B: Backend> Source<B> for Loader<'_, B> {
    fn mixed(&self) -> Mixed {
        self.mixed.clone()
    }
    fn f32(&mut self, name: String, shape: &[usize]) -> Result<B::Buffer> {
        if self.q8.contains_key(&name) {
            let message = match shape {
                [_, _] => "held as int8 where f32 is needed".into(),
                _ => format!("int8 needs a matrix; the layout gives {shape:?}"),
            };
            return Err(checkpoint(&name, message));
        }
        let want: usize = shape.iter().product();
        let b = self
            .f32
            .remove(&name)
            .ok_or_else(|| checkpoint(&name, "missing: the configuration needs this tensor"))?;
        let len = self.backend.len(&b);
        if len != want {
            return Err(checkpoint(&name, format!("{len} values, the configuration gives {shape:?}")));
        }
        self.bytes += 4 * len;
        Ok(b)
    }

    fn matrix(&mut self, name: String, rows: usize, cols: usize) -> Result<Tensor<B>> {
        let Some((packed, scales)) = self.q8.remove(&name) else {
            return Ok(Tensor::F32(self.f32(name, &[rows, cols])?));
        };
        let blocked = rows * crate::ops::q8::blocks_of(cols, crate::ops::q8::Q8_BLOCK);
        let got = (self.backend.len(&packed), self.backend.len(&scales));
        // 4-bit buffers (core's `ops::q4`, told apart by their lengths) or int8 ones, in
        // blocks or one scale a row.
        let want = if crate::ops::q4::is_q4(rows, cols, got.0, got.1) {
            got
        } else {
            (rows * crate::ops::q8::packed_cols(cols), if got.1 == rows { rows } else { blocked })
        };
        if got != want {
            return Err(checkpoint(
                &name,
                format!(
                    "quantized buffers of {} and {} values; {:?} needs {} and {} (int8) or 4-bit ones",
                    got.0,
                    got.1,
                    [rows, cols],
                    want.0,
                    want.1
                ),
            ));
        }
        self.bytes += 4 * (got.0 + got.1);
        Ok(Tensor::Q8 { packed, scales })
    }
    fn conv_weight(&mut self, name: String, spec: &Conv2dSpec) -> Result<Tensor<B>> {
        let shape = [spec.out_channels, spec.in_channels, spec.kernel.0, spec.kernel.1];
        let Some((packed, scales)) = self.q8.remove(&name) else {
            return Ok(Tensor::F32(self.f32(name, &shape)?));
        };
        let (rows, cols) = (shape[0], shape[1] * shape[2] * shape[3]);
        let got = (self.backend.len(&packed), self.backend.len(&scales));
        let want = (rows * crate::ops::q8::packed_cols(cols), rows);
        if got != want || spec.groups != 1 {
            return Err(checkpoint(
                &name,
                format!(
                    "quantized buffers of {} and {} values; an int8 convolution of {shape:?} (one group) \
                     needs {} and {} (int8, one scale an output channel)",
                    got.0, got.1, want.0, want.1
                ),
            ));
        }
        // Rows rounded in the checkpoint's order, reordered channels last for the product.
        let reordered = crate::ops::conv::q8_weight_channels_last(&self.backend.download(&packed)?, spec)?;
        self.bytes += 4 * (got.0 + got.1);
        Ok(Tensor::Q8 { packed: self.backend.upload(&reordered)?, scales })
    }
}

fn checkpoint(name: &str, message: impl Into<String>) -> CoreError {
    CoreError::Checkpoint { location: String::from(name), message: message.into() }
}

/// Builds a model's layers from `load` over a [`Layout`] recorder: its tensors by name
/// and shape, without allocating any.
pub fn layout_of<T>(load: impl FnOnce(&mut Layout) -> Result<T>) -> Layout {
    let mut l = Layout::default();
    // The recorder never fails; a configuration's own checks come before loading.
    let _ = load(&mut l);
    l
}

/// An image model over a backend: its configuration and the tree of its layers (`Layers`,
/// loaded by `Layers::load(&config, source)` in the model's file), with the constructors
/// and accessors every model has. `$names` says whose tensor names the weights carry.
macro_rules! image_model {
    ($(#[$doc:meta])* $model:ident, $config:ty, $names:literal) => {
        $(#[$doc])*
        pub struct $model<B: Backend> {
            backend: B,
            config: $config,
            layers: Layers<B>,
            weight_bytes: usize,
            mixed: $crate::models::image::blocks::Mixed,
        }

        impl<B: Backend> $model<B> {
            #[doc = concat!("The model from its weights by ", $names, "' names, each checked against the configuration.")]
            pub fn new(backend: B, config: $config, weights: BTreeMap<String, B::Buffer>) -> Result<Self> {
                Self::with_q8(backend, config, weights, BTreeMap::new())
            }

            #[doc = concat!("[`", stringify!($model), "::new`] with the matrices in `q8` held as int8.")]
            pub fn with_q8(
                backend: B, config: $config, weights: BTreeMap<String, B::Buffer>,
                q8: BTreeMap<String, (B::Buffer, B::Buffer)>,
            ) -> Result<Self> {
                config.validate()?;
                let mut s = $crate::models::image::blocks::Loader::new(&backend, weights, q8);
                let layers = Layers::load(&config, &mut s)?;
                let mixed = s.mixed_switch();
                let weight_bytes = s.finish()?;
                Ok($model { backend, config, layers, weight_bytes, mixed })
            }

            /// Mixed precision: its convolutions, the f32 matrices of its linear layers and
            /// (UNet, DiT, autoencoder) its attention multiply bf16-rounded operands, summing
            /// in f32 (on CPUs with AVX512_BF16 at about twice the f32 rate; int8 matrices
            /// stay int8). Off when loaded.
            pub fn set_mixed_precision(&mut self, on: bool) {
                self.mixed.set(on);
            }

            /// Whether mixed precision is on.
            pub fn mixed_precision(&self) -> bool {
                self.mixed.precision() == $crate::backend::OperandPrecision::Bf16
            }

            /// Bytes the weights hold: 4 a value for f32 tensors, the packed bytes and the
            /// scales for int8 matrices.
            pub fn weight_bytes(&self) -> usize {
                self.weight_bytes
            }

            /// The architecture.
            pub fn config(&self) -> &$config {
                &self.config
            }

            /// The backend it runs on.
            pub fn backend(&self) -> &B {
                &self.backend
            }
        }

        impl $config {
            /// Every tensor under its published name, in the order the layers load them.
            pub fn layout(&self) -> Layout {
                layout_of(|l| Layers::<$crate::reference::ReferenceBackend>::load(self, l))
            }
        }
    };
}
pub(crate) use image_model;

/// A feature map `(batch, channels, h, w)` on the backend.
pub struct FeatureMap<B: Backend> {
    /// The values, `batch x channels x h x w`.
    pub data: B::Buffer,
    /// Images.
    pub batch: usize,
    /// Channels.
    pub channels: usize,
    /// Rows.
    pub h: usize,
    /// Columns.
    pub w: usize,
}

impl<B: Backend> FeatureMap<B> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.batch * self.channels * self.h * self.w
    }
    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `data` as a map of this batch, `channels` channels, `h x w`.
    pub fn with(&self, data: B::Buffer, channels: usize, h: usize, w: usize) -> FeatureMap<B> {
        FeatureMap { data, batch: self.batch, channels, h, w }
    }
    /// A copy.
    pub fn copy(&self, be: &B) -> Result<FeatureMap<B>> {
        let mut data = be.zeros(self.len())?;
        be.copy(&mut data, &self.data)?;
        Ok(self.with(data, self.channels, self.h, self.w))
    }
    /// The pixels as tokens: `(batch, c, h, w)` <-> `(batch, hw, c)` (patches of one pixel).
    pub fn tokens_spec(&self) -> PatchSpec {
        PatchSpec {
            batch: self.batch,
            channels: self.channels,
            height: self.h,
            width: self.w,
            patch: 1,
            order: PatchOrder::ChannelFirst,
        }
    }
    /// `(batch, hw, c)` tokens of the pixels.
    pub fn to_tokens(&self, be: &B) -> Result<B::Buffer> {
        let mut tokens = be.zeros(self.len())?;
        be.patchify(&mut tokens, &self.data, &self.tokens_spec())?;
        Ok(tokens)
    }
    /// `tokens (batch, hw, c)` back as a map of this shape.
    pub fn from_tokens(&self, be: &B, tokens: &B::Buffer) -> Result<FeatureMap<B>> {
        let mut data = be.zeros(self.len())?;
        be.unpatchify(&mut data, tokens, &self.tokens_spec())?;
        Ok(self.with(data, self.channels, self.h, self.w))
    }
}

/// `op(x)` into a new buffer.
pub fn unary<B: Backend>(be: &B, op: Unary, x: &B::Buffer) -> Result<B::Buffer> {
    let mut y = be.zeros(be.len(x))?;
    be.unary(op, &mut y, x)?;
    Ok(y)
}

/// `(rows, width)` columns `at..at + width` of `x (rows, cols)`.
pub fn columns<B: Backend>(
    be: &B, x: &B::Buffer, rows: usize, cols: usize, at: usize, width: usize,
) -> Result<B::Buffer> {
    let mut out = be.zeros(rows * width)?;
    let spec = ColumnCopy { rows, width, src_cols: cols, src_at: at, dst_cols: width, dst_at: 0 };
    be.copy_cols(&mut out, x, &spec)?;
    Ok(out)
}

/// `[a | b | ...]` along the columns, each part `(rows, cols)`.
pub fn concat<B: Backend>(be: &B, parts: &[(&B::Buffer, usize)], rows: usize) -> Result<B::Buffer> {
    let total: usize = parts.iter().map(|p| p.1).sum();
    let mut out = be.zeros(rows * total)?;
    let mut at = 0;
    for &(src, cols) in parts {
        let spec = ColumnCopy { rows, width: cols, src_cols: cols, src_at: 0, dst_cols: total, dst_at: at };
        be.copy_cols(&mut out, src, &spec)?;
        at += cols;
    }
    Ok(out)
}

/// A `Linear`: `y = x W^T (+ b)`, `W (dout, din)` f32 or int8.
pub struct Linear<B: Backend> {
    weight: Tensor<B>,
    bias: Option<B::Buffer>,
    din: usize,
    dout: usize,
    mixed: Mixed,
}

impl<B: Backend> Linear<B> {
    /// `{p}.weight` and, when `bias`, `{p}.bias`.
    pub fn load(s: &mut impl Source<B>, p: &str, din: usize, dout: usize, bias: bool) -> Result<Self> {
        let weight = s.matrix(format!("{p}.weight"), dout, din)?;
        let bias = if bias { Some(s.f32(format!("{p}.bias"), &[dout])?) } else { None };
        Ok(Linear { weight, bias, din, dout, mixed: s.mixed() })
    }

    /// Output width.
    pub fn dout(&self) -> usize {
        self.dout
    }

    /// The operand precision its model's products run at now (the attention next to it
    /// follows it).
    pub fn precision(&self) -> OperandPrecision {
        self.mixed.precision()
    }

    /// `x (rows, din)` to `(rows, dout)`.
    pub fn forward(&self, be: &B, x: &B::Buffer, rows: usize) -> Result<B::Buffer> {
        let mut y = be.zeros(rows * self.dout)?;
        let spec = MatmulSpec::new(rows, self.dout, self.din).trans_b(true);
        match &self.weight {
            Tensor::F32(w) => be.matmul(&mut y, x, w, &spec.precision(self.mixed.precision()))?,
            Tensor::Q8 { packed, scales } => be.q8_matmul(&mut y, x, packed, scales, &spec)?,
        }
        if let Some(b) = &self.bias {
            be.add_bias(&mut y, b, rows, self.dout)?;
        }
        Ok(y)
    }
}

/// A 2-D convolution with bias, `k x k`, `cin` to `cout` channels.
pub struct Conv2d<B: Backend> {
    /// f32, or int8 rows in channels-last order (`conv2d_q8`).
    weight: Tensor<B>,
    bias: B::Buffer,
    cout: usize,
    k: usize,
    stride: usize,
    padding: usize,
    pad_end: usize,
    mixed: Mixed,
}

impl<B: Backend> Conv2d<B> {
    /// `{p}.weight (cout, cin, k, k)` and `{p}.bias`; stride 1, padding `k / 2`.
    pub fn load(s: &mut impl Source<B>, p: &str, cin: usize, cout: usize, k: usize) -> Result<Self> {
        let weight = s.conv_weight(format!("{p}.weight"), &Conv2dSpec::new(1, cin, cout, k, k, k))?;
        let bias = s.f32(format!("{p}.bias"), &[cout])?;
        Ok(Conv2d { weight, bias, cout, k, stride: 1, padding: k / 2, pad_end: 0, mixed: s.mixed() })
    }
    /// With this stride and padding, and `pad_end` extra zeros after the input (the VAE
    /// downsampler's `F.pad(x, (0, 1, 0, 1))`).
    pub fn strided(mut self, stride: usize, padding: usize, pad_end: usize) -> Self {
        (self.stride, self.padding, self.pad_end) = (stride, padding, pad_end);
        self
    }

    /// `x (batch, cin, h, w)` to `(batch, cout, h', w')`.
    pub fn forward(&self, be: &B, x: &FeatureMap<B>) -> Result<FeatureMap<B>> {
        let spec = Conv2dSpec::new(x.batch, x.channels, self.cout, x.h, x.w, self.k)
            .stride(self.stride)
            .padding(self.padding)
            .pad_end(self.pad_end)
            .precision(self.mixed.precision());
        let (_, _, n, (h, w)) = spec.check()?;
        let mut out = be.zeros(n)?;
        match &self.weight {
            Tensor::F32(w) => be.conv2d(&mut out, &x.data, w, Some(&self.bias), &spec)?,
            Tensor::Q8 { packed, scales } => {
                be.conv2d_q8(&mut out, &x.data, packed, scales, Some(&self.bias), &spec)?
            }
        }
        Ok(x.with(out, self.cout, h, w))
    }
}

/// A norm's weight (and bias), `dim` wide: `GroupNorm`, `LayerNorm` or an RMS norm.
pub struct Norm<B: Backend> {
    weight: B::Buffer,
    bias: Option<B::Buffer>,
    dim: usize,
}

impl<B: Backend> Norm<B> {
    /// `{p}.weight` and `{p}.bias`.
    pub fn load(s: &mut impl Source<B>, p: &str, dim: usize) -> Result<Self> {
        let weight = s.f32(format!("{p}.weight"), &[dim])?;
        Ok(Norm { weight, bias: Some(s.f32(format!("{p}.bias"), &[dim])?), dim })
    }
    /// `{p}.weight` alone (RMS norms).
    pub fn load_weight(s: &mut impl Source<B>, p: &str, dim: usize) -> Result<Self> {
        Ok(Norm { weight: s.f32(format!("{p}.weight"), &[dim])?, bias: None, dim })
    }

    /// `GroupNorm` of `x` in `groups`, then `act` when given, in one pass.
    pub fn group(
        &self, be: &B, x: &FeatureMap<B>, groups: usize, eps: f32, act: Option<Unary>,
    ) -> Result<FeatureMap<B>> {
        let spec =
            GroupNormSpec { batch: x.batch, channels: x.channels, spatial: x.h * x.w, groups, eps, act };
        let mut out = be.zeros(x.len())?;
        be.group_norm(&mut out, &x.data, Some(&self.weight), self.bias.as_ref(), &spec)?;
        Ok(x.with(out, x.channels, x.h, x.w))
    }

    /// `LayerNorm` of each `dim`-wide row of `x (rows, dim)`.
    pub fn layer(&self, be: &B, x: &B::Buffer, rows: usize, eps: f32) -> Result<B::Buffer> {
        let mut y = be.zeros(rows * self.dim)?;
        be.layer_norm(&mut y, x, Some(&self.weight), self.bias.as_ref(), rows, self.dim, eps)?;
        Ok(y)
    }

    /// RMS norm (no mean, no bias) of each `dim`-wide row of `x (rows, dim)`.
    pub fn rms(&self, be: &B, x: &B::Buffer, rows: usize, eps: f32) -> Result<B::Buffer> {
        let (mut y, mut rstd) = (be.zeros(rows * self.dim)?, be.zeros(rows)?);
        be.rmsnorm_forward(&mut y, &mut rstd, x, &self.weight, rows, self.dim, eps)?;
        Ok(y)
    }
}

/// diffusers' `ResnetBlock2D`: `shortcut(x) + conv2(act(norm2(conv1(act(norm1(x))) +
/// time_emb_proj(temb))))`, the shortcut a 1x1 convolution when the channel count changes,
/// the timestep term only in the UNet's.
pub struct Resnet<B: Backend> {
    norm1: Norm<B>,
    conv1: Conv2d<B>,
    time_emb_proj: Option<Linear<B>>,
    norm2: Norm<B>,
    conv2: Conv2d<B>,
    conv_shortcut: Option<Conv2d<B>>,
}

impl<B: Backend> Resnet<B> {
    /// The block `p` from `cin` to `cout` channels; `temb` the timestep embedding's width
    /// where the block takes one.
    pub fn load(
        s: &mut impl Source<B>, p: &str, cin: usize, cout: usize, temb: Option<usize>,
    ) -> Result<Self> {
        Ok(Resnet {
            norm1: Norm::load(s, &format!("{p}.norm1"), cin)?,
            conv1: Conv2d::load(s, &format!("{p}.conv1"), cin, cout, 3)?,
            time_emb_proj: match temb {
                Some(t) => Some(Linear::load(s, &format!("{p}.time_emb_proj"), t, cout, true)?),
                None => None,
            },
            norm2: Norm::load(s, &format!("{p}.norm2"), cout)?,
            conv2: Conv2d::load(s, &format!("{p}.conv2"), cout, cout, 3)?,
            conv_shortcut: optional(cin != cout, || {
                Conv2d::load(s, &format!("{p}.conv_shortcut"), cin, cout, 1)
            })?,
        })
    }

    /// The block over `x`; `temb (batch, t)` already through the activation.
    pub fn forward(
        &self, be: &B, x: &FeatureMap<B>, temb: Option<&B::Buffer>, groups: usize, eps: f32, act: Unary,
    ) -> Result<FeatureMap<B>> {
        let h = self.norm1.group(be, x, groups, eps, Some(act))?;
        let mut h = self.conv1.forward(be, &h)?;
        if let (Some(proj), Some(temb)) = (&self.time_emb_proj, temb) {
            // + time_emb_proj(temb) on every pixel: (batch * cout, 1) x ones(1, hw), added.
            let t = proj.forward(be, temb, x.batch)?;
            let hw = h.h * h.w;
            let ones = be.upload(&alloc::vec![1.0; hw])?;
            be.matmul(&mut h.data, &t, &ones, &MatmulSpec::new(x.batch * h.channels, hw, 1).accumulate())?;
        }
        let h = self.norm2.group(be, &h, groups, eps, Some(act))?;
        let mut h = self.conv2.forward(be, &h)?;
        match &self.conv_shortcut {
            Some(c) => be.axpy(&mut h.data, 1.0, &c.forward(be, x)?.data)?,
            None => be.axpy(&mut h.data, 1.0, &x.data)?,
        }
        Ok(h)
    }
}

/// The VAE's mid-block self-attention over the pixels: one head as wide as the channels,
/// group-normed input, residual added (diffusers' `Attention` with `residual_connection`).
pub struct SpatialAttention<B: Backend> {
    group_norm: Norm<B>,
    to_q: Linear<B>,
    to_k: Linear<B>,
    to_v: Linear<B>,
    to_out: Linear<B>,
}

impl<B: Backend> SpatialAttention<B> {
    /// The attention `p` over `c` channels.
    pub fn load(s: &mut impl Source<B>, p: &str, c: usize) -> Result<Self> {
        Ok(SpatialAttention {
            group_norm: Norm::load(s, &format!("{p}.group_norm"), c)?,
            to_q: Linear::load(s, &format!("{p}.to_q"), c, c, true)?,
            to_k: Linear::load(s, &format!("{p}.to_k"), c, c, true)?,
            to_v: Linear::load(s, &format!("{p}.to_v"), c, c, true)?,
            to_out: Linear::load(s, &format!("{p}.to_out.0"), c, c, true)?,
        })
    }

    /// `x + to_out(attention(to_q, to_k, to_v of norm(x)))`.
    pub fn forward(&self, be: &B, x: &FeatureMap<B>, groups: usize, eps: f32) -> Result<FeatureMap<B>> {
        let (c, hw) = (x.channels, x.h * x.w);
        let rows = x.batch * hw;
        let tokens = self.group_norm.group(be, x, groups, eps, None)?.to_tokens(be)?;
        let q = self.to_q.forward(be, &tokens, rows)?;
        let k = self.to_k.forward(be, &tokens, rows)?;
        let v = self.to_v.forward(be, &tokens, rows)?;
        let mut att = be.zeros(rows * c)?;
        let spec = SdpaSpec::new(x.batch, hw, 1, c).precision(self.to_q.precision());
        be.sdpa(&mut att, &q, &k, &v, None, None, &spec)?;
        let o = self.to_out.forward(be, &att, rows)?;
        let mut out = x.from_tokens(be, &o)?;
        be.axpy(&mut out.data, 1.0, &x.data)?;
        Ok(out)
    }
}

/// diffusers' `TimestepEmbedding`: `linear_2(silu(linear_1(x)))`.
pub struct TimestepMlp<B: Backend> {
    linear_1: Linear<B>,
    linear_2: Linear<B>,
}

impl<B: Backend> TimestepMlp<B> {
    /// `{p}.linear_1 (din -> dout)` and `{p}.linear_2 (dout -> dout)`.
    pub fn load(s: &mut impl Source<B>, p: &str, din: usize, dout: usize, bias: bool) -> Result<Self> {
        Ok(TimestepMlp {
            linear_1: Linear::load(s, &format!("{p}.linear_1"), din, dout, bias)?,
            linear_2: Linear::load(s, &format!("{p}.linear_2"), dout, dout, bias)?,
        })
    }

    /// `x (rows, din)` to `(rows, dout)`.
    pub fn forward(&self, be: &B, x: &B::Buffer, rows: usize) -> Result<B::Buffer> {
        let h = unary(be, Unary::Silu, &self.linear_1.forward(be, x, rows)?)?;
        self.linear_2.forward(be, &h, rows)
    }
}

/// Nearest 2x upsampling.
pub fn upsample2x<B: Backend>(be: &B, x: &FeatureMap<B>) -> Result<FeatureMap<B>> {
    let mut out = be.zeros(x.len() * 4)?;
    be.upsample_nearest2d(&mut out, &x.data, x.batch * x.channels, x.h, x.w, 2)?;
    Ok(x.with(out, x.channels, x.h * 2, x.w * 2))
}

/// The `Option` of a layer that exists when `present`.
pub fn optional<T>(present: bool, load: impl FnOnce() -> Result<T>) -> Result<Option<T>> {
    if present {
        load().map(Some)
    } else {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    fn load(f32: &[(&str, usize)], q8: &[(&str, usize, usize)]) -> Result<usize> {
        let be = ReferenceBackend;
        let map = f32.iter().map(|(n, len)| (n.to_string(), vec![0.0; *len])).collect();
        let q8 = q8.iter().map(|(n, p, s)| (n.to_string(), (vec![0.0; *p], vec![0.0; *s]))).collect();
        let mut s = Loader::new(&be, map, q8);
        Linear::load(&mut s, "fc", 5, 3, true)?;
        Norm::load_weight(&mut s, "norm", 3)?;
        s.finish()
    }

    fn message(r: Result<usize>) -> String {
        r.err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn the_loader_takes_every_tensor_once_and_names_what_does_not_fit() {
        let q8_fc = ("fc.weight", 3 * crate::ops::q8::packed_cols(5), 3);
        assert_eq!(load(&[("fc.weight", 15), ("fc.bias", 3), ("norm.weight", 3)], &[]).ok(), Some(4 * 21));
        assert_eq!(load(&[("fc.bias", 3), ("norm.weight", 3)], &[q8_fc]).ok(), Some(4 * (q8_fc.1 + 3 + 6)));
        let missing = message(load(&[("fc.weight", 15), ("norm.weight", 3)], &[]));
        assert!(missing.contains("fc.bias") && missing.contains("missing"), "{missing}");
        let short = message(load(&[("fc.weight", 14), ("fc.bias", 3), ("norm.weight", 3)], &[]));
        assert!(short.contains("fc.weight") && short.contains("14 values"), "{short}");
        let extra = message(load(&[("fc.weight", 15), ("fc.bias", 3), ("norm.weight", 3), ("x", 1)], &[]));
        assert!(extra.contains("not part of the model"), "{extra}");
        let int8_norm = message(load(&[("fc.weight", 15), ("fc.bias", 3)], &[("norm.weight", 1, 3)]));
        assert!(int8_norm.contains("int8 needs a matrix"), "{int8_norm}");
        let bad_q8 = message(load(&[("fc.bias", 3), ("norm.weight", 3)], &[("fc.weight", 1, 3)]));
        assert!(bad_q8.contains("quantized buffers"), "{bad_q8}");
    }

    #[test]
    fn the_layout_records_what_the_loader_asks_for() {
        let l = layout_of(|l| Linear::<ReferenceBackend>::load(l, "fc", 5, 3, true));
        assert_eq!(l.tensors, vec![("fc.weight".to_string(), vec![3, 5]), ("fc.bias".to_string(), vec![3])]);
        assert_eq!(l.parameter_count(), 18);
    }
}
