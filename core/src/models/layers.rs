//! The building blocks of the image models (the VAEs now, the UNets next), over `Backend`,
//! with their weights under the names `diffusers` gives them. Each block has two halves
//! side by side: the tensors it needs (name and shape, for loading and for counting
//! parameters without allocating any) and its forward pass.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::backend::{Conv2dSpec, GroupNormSpec, MatmulSpec, PatchSpec, SdpaSpec, Unary};
use crate::ops::spatial::PatchOrder;
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
    /// weight, rows padded to whole f32 words, and an f32 scale a row) and the rest as f32.
    pub fn q8_bytes(&self, int8: impl Fn(&str, &[usize]) -> bool) -> usize {
        self.tensors
            .iter()
            .map(|(name, shape)| match shape[..] {
                [rows, cols] if int8(name, shape) => 4 * rows * (crate::ops::q8::packed_cols(cols) + 1),
                _ => 4 * shape.iter().product::<usize>(),
            })
            .sum()
    }
    /// `conv_tensors`: a convolution's weight and bias.
    pub fn conv(&mut self, prefix: &str, cin: usize, cout: usize, k: usize) {
        self.push(format!("{prefix}.weight"), alloc::vec![cout, cin, k, k]);
        self.push(format!("{prefix}.bias"), alloc::vec![cout]);
    }
    /// A `GroupNorm`/`LayerNorm` with weight and bias.
    pub fn norm(&mut self, prefix: &str, c: usize) {
        self.push(format!("{prefix}.weight"), alloc::vec![c]);
        self.push(format!("{prefix}.bias"), alloc::vec![c]);
    }
    /// A `Linear` with bias: weight (dout, din).
    pub fn linear(&mut self, prefix: &str, din: usize, dout: usize) {
        self.push(format!("{prefix}.weight"), alloc::vec![dout, din]);
        self.push(format!("{prefix}.bias"), alloc::vec![dout]);
    }
    /// [`resnet`]'s tensors.
    pub fn resnet(&mut self, prefix: &str, cin: usize, cout: usize) {
        self.norm(&format!("{prefix}.norm1"), cin);
        self.conv(&format!("{prefix}.conv1"), cin, cout, 3);
        self.norm(&format!("{prefix}.norm2"), cout);
        self.conv(&format!("{prefix}.conv2"), cout, cout, 3);
        if cin != cout {
            self.conv(&format!("{prefix}.conv_shortcut"), cin, cout, 1);
        }
    }
    /// [`spatial_attention`]'s tensors.
    pub fn spatial_attention(&mut self, prefix: &str, c: usize) {
        self.norm(&format!("{prefix}.group_norm"), c);
        for part in ["to_q", "to_k", "to_v", "to_out.0"] {
            self.linear(&format!("{prefix}.{part}"), c, c);
        }
    }
}

/// A model's weights on its backend, by name; matrices may be int8 instead
/// (`(packed, scales)` as [`crate::ops::q8`] lays them out, one scale a row).
pub struct Weights<B: Backend> {
    map: BTreeMap<String, B::Buffer>,
    q8: BTreeMap<String, (B::Buffer, B::Buffer)>,
}

impl<B: Backend> Weights<B> {
    /// Checks that `map` holds exactly the tensors of `layout`, each of its length.
    pub fn new(backend: &B, layout: &Layout, map: BTreeMap<String, B::Buffer>) -> Result<Self> {
        Weights::with_q8(backend, layout, map, BTreeMap::new())
    }

    /// [`Weights::new`] with some matrices (`(rows, cols)` in the layout) int8 in `q8`
    /// instead of f32 in `map`.
    pub fn with_q8(
        backend: &B, layout: &Layout, map: BTreeMap<String, B::Buffer>,
        q8: BTreeMap<String, (B::Buffer, B::Buffer)>,
    ) -> Result<Self> {
        for (name, shape) in &layout.tensors {
            let want: usize = shape.iter().product();
            if let Some((packed, scales)) = q8.get(name) {
                let [rows, cols] = shape[..] else {
                    return Err(checkpoint(name, format!("int8 needs a matrix; the layout gives {shape:?}")));
                };
                let want = (rows * crate::ops::q8::packed_cols(cols), rows);
                if (backend.len(packed), backend.len(scales)) != want {
                    return Err(checkpoint(
                        name,
                        format!(
                            "int8 buffers of {} and {} values; {shape:?} needs {} and {}",
                            backend.len(packed),
                            backend.len(scales),
                            want.0,
                            want.1
                        ),
                    ));
                }
                continue;
            }
            match map.get(name) {
                None => return Err(checkpoint(name, "missing: the configuration needs this tensor")),
                Some(b) if backend.len(b) != want => {
                    return Err(checkpoint(
                        name,
                        format!("{} values, the configuration gives {shape:?}", backend.len(b)),
                    ))
                }
                Some(_) => {}
            }
        }
        if let Some(extra) =
            map.keys().chain(q8.keys()).find(|k| !layout.tensors.iter().any(|(n, _)| n == *k))
        {
            return Err(checkpoint(extra, "not part of the model the configuration describes"));
        }
        Ok(Weights { map, q8 })
    }
    /// Bytes the weights hold: 4 a value for f32 tensors, the packed bytes and the
    /// scales for int8 matrices.
    pub fn bytes(&self, backend: &B) -> usize {
        let f32s: usize = self.map.values().map(|b| backend.len(b)).sum();
        let q8: usize = self.q8.values().map(|(p, s)| backend.len(p) + backend.len(s)).sum();
        4 * (f32s + q8)
    }

    /// An f32 tensor.
    pub fn get(&self, name: &str) -> Result<&B::Buffer> {
        self.map.get(name).ok_or_else(|| checkpoint(name, "missing (or held as int8 where f32 is needed)"))
    }

    /// `out = x W^T` for the matrix `name` (a `Linear` weight `(dout, din)`), f32 or int8.
    #[allow(clippy::too_many_arguments)]
    pub fn project(
        &self, be: &B, name: &str, out: &mut B::Buffer, x: &B::Buffer, rows: usize, din: usize, dout: usize,
    ) -> Result<()> {
        let spec = MatmulSpec::new(rows, dout, din).trans_b(true);
        match self.q8.get(name) {
            Some((packed, scales)) => be.q8_matmul(out, x, packed, scales, &spec),
            None => be.matmul(out, x, self.get(name)?, &spec),
        }
    }
}

fn checkpoint(name: &str, message: impl Into<String>) -> CoreError {
    CoreError::Checkpoint { location: String::from(name), message: message.into() }
}

/// An activation `(batch, channels, h, w)` on the backend.
pub struct Image<B: Backend> {
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

impl<B: Backend> Image<B> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.batch * self.channels * self.h * self.w
    }
    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `data` as an image of this batch, `channels` channels, `h x w`.
    fn with(&self, data: B::Buffer, channels: usize, h: usize, w: usize) -> Image<B> {
        Image { data, batch: self.batch, channels, h, w }
    }
}

/// A `k x k` convolution `prefix` to `cout` channels; `pad_end` extra zeros after the input
/// (the VAE downsampler's `F.pad(x, (0, 1, 0, 1))`).
#[allow(clippy::too_many_arguments)]
pub fn conv<B: Backend>(
    be: &B, w: &Weights<B>, prefix: &str, x: &Image<B>, cout: usize, k: usize, stride: usize, padding: usize,
    pad_end: usize,
) -> Result<Image<B>> {
    let spec = Conv2dSpec::new(x.batch, x.channels, cout, x.h, x.w, k)
        .stride(stride)
        .padding(padding)
        .pad_end(pad_end);
    let (_, _, n, (h, wd)) = spec.check()?;
    let mut out = be.zeros(n)?;
    let (weight, bias) = (w.get(&format!("{prefix}.weight"))?, w.get(&format!("{prefix}.bias"))?);
    be.conv2d(&mut out, &x.data, weight, Some(bias), &spec)?;
    Ok(x.with(out, cout, h, wd))
}

/// `GroupNorm` `prefix` (affine), then `act` when given, in one pass.
pub fn group_norm<B: Backend>(
    be: &B, w: &Weights<B>, prefix: &str, x: &Image<B>, groups: usize, eps: f32, act: Option<Unary>,
) -> Result<Image<B>> {
    let spec = GroupNormSpec { batch: x.batch, channels: x.channels, spatial: x.h * x.w, groups, eps, act };
    let mut out = be.zeros(x.len())?;
    let (weight, bias) = (w.get(&format!("{prefix}.weight"))?, w.get(&format!("{prefix}.bias"))?);
    be.group_norm(&mut out, &x.data, Some(weight), Some(bias), &spec)?;
    Ok(x.with(out, x.channels, x.h, x.w))
}

/// diffusers' `ResnetBlock2D` without a time embedding:
/// `shortcut(x) + conv2(act(norm2(conv1(act(norm1(x))))))`, the shortcut a 1x1
/// convolution when the channel count changes.
#[allow(clippy::too_many_arguments)]
pub fn resnet<B: Backend>(
    be: &B, w: &Weights<B>, prefix: &str, x: &Image<B>, cout: usize, groups: usize, eps: f32, act: Unary,
) -> Result<Image<B>> {
    let h = group_norm(be, w, &format!("{prefix}.norm1"), x, groups, eps, Some(act))?;
    let h = conv(be, w, &format!("{prefix}.conv1"), &h, cout, 3, 1, 1, 0)?;
    let h = group_norm(be, w, &format!("{prefix}.norm2"), &h, groups, eps, Some(act))?;
    let mut h = conv(be, w, &format!("{prefix}.conv2"), &h, cout, 3, 1, 1, 0)?;
    if x.channels != cout {
        let s = conv(be, w, &format!("{prefix}.conv_shortcut"), x, cout, 1, 1, 0, 0)?;
        be.axpy(&mut h.data, 1.0, &s.data)?;
    } else {
        be.axpy(&mut h.data, 1.0, &x.data)?;
    }
    Ok(h)
}

/// `y = x W^T + b` over `rows` rows: the `Linear` `prefix`, weight `(dout, din)`, f32 or
/// int8.
pub fn linear<B: Backend>(
    be: &B, w: &Weights<B>, prefix: &str, x: &B::Buffer, rows: usize, din: usize, dout: usize,
) -> Result<B::Buffer> {
    let mut y = be.zeros(rows * dout)?;
    w.project(be, &format!("{prefix}.weight"), &mut y, x, rows, din, dout)?;
    be.add_bias(&mut y, w.get(&format!("{prefix}.bias"))?, rows, dout)?;
    Ok(y)
}

/// The VAE's mid-block self-attention over the pixels: one head as wide as the channels,
/// group-normed input, residual added (diffusers' `Attention` with `residual_connection`).
pub fn spatial_attention<B: Backend>(
    be: &B, w: &Weights<B>, prefix: &str, x: &Image<B>, groups: usize, eps: f32,
) -> Result<Image<B>> {
    let (c, hw) = (x.channels, x.h * x.w);
    let rows = x.batch * hw;
    let normed = group_norm(be, w, &format!("{prefix}.group_norm"), x, groups, eps, None)?;
    // (B, C, HW) -> (B, HW, C): patches of one pixel are the transpose.
    let to_tokens = PatchSpec {
        batch: x.batch,
        channels: c,
        height: x.h,
        width: x.w,
        patch: 1,
        order: PatchOrder::ChannelFirst,
    };
    let mut tokens = be.zeros(x.len())?;
    be.patchify(&mut tokens, &normed.data, &to_tokens)?;
    let q = linear(be, w, &format!("{prefix}.to_q"), &tokens, rows, c, c)?;
    let k = linear(be, w, &format!("{prefix}.to_k"), &tokens, rows, c, c)?;
    let v = linear(be, w, &format!("{prefix}.to_v"), &tokens, rows, c, c)?;
    let mut att = be.zeros(rows * c)?;
    be.sdpa(&mut att, &q, &k, &v, None, None, &SdpaSpec::new(x.batch, hw, 1, c))?;
    let o = linear(be, w, &format!("{prefix}.to_out.0"), &att, rows, c, c)?;
    let mut out = be.zeros(x.len())?;
    be.unpatchify(&mut out, &o, &to_tokens)?;
    be.axpy(&mut out, 1.0, &x.data)?;
    Ok(x.with(out, c, x.h, x.w))
}

/// Nearest 2x upsampling.
pub fn upsample2x<B: Backend>(be: &B, x: &Image<B>) -> Result<Image<B>> {
    let mut out = be.zeros(x.len() * 4)?;
    be.upsample_nearest2d(&mut out, &x.data, x.batch * x.channels, x.h, x.w, 2)?;
    Ok(x.with(out, x.channels, x.h * 2, x.w * 2))
}
