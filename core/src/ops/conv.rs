//! 2-D convolution (cross-correlation, as PyTorch's `Conv2d`), inference only.
//!
//! Layouts, as PyTorch stores them so checkpoints load without a transpose:
//! - `inp`: `(batch, in_channels, height, width)`
//! - `weight`: `(out_channels, in_channels / groups, kernel_h, kernel_w)`
//! - `bias`: `(out_channels)`, optional
//! - `out`: `(batch, out_channels, out_h, out_w)` with
//!   `out_h = (height + 2 pad_h + pad_end_h - dilation_h (kernel_h - 1) - 1) / stride_h + 1`.
//!
//! Zero padding: `padding` on every side, plus `pad_end` more rows and columns after the
//! input (below and right), as the VAE's downsamplers pad with `F.pad(x, (0, 1, 0, 1))`
//! before a stride-2 convolution. Output channel `o` of group `g = o / (out_channels / groups)` reads input
//! channels `g * in_per_group..(g + 1) * in_per_group`.

use crate::backend::Memory;
use crate::error::{check_len, nonzero, product};
use crate::ops::matmul::{operand, OperandPrecision};
use crate::ops::q8::{packed_cols, q8_at, quantize_activations};
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};

/// A 2-D convolution's shape and settings (PyTorch's `Conv2d`): input `(batch, in_channels, height, width)`, weight `(out_channels, in_channels / groups, kh, kw)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dSpec {
    /// Images.
    pub batch: usize,
    /// Input channels.
    pub in_channels: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Input rows.
    pub height: usize,
    /// Input columns.
    pub width: usize,
    /// Kernel rows and columns.
    pub kernel: (usize, usize),
    /// Steps between outputs, down and across.
    pub stride: (usize, usize),
    /// Zero rows and columns added on each side.
    pub padding: (usize, usize),
    /// Extra zero rows and columns after the input (asymmetric padding).
    pub pad_end: (usize, usize),
    /// Spacing of the kernel's taps.
    pub dilation: (usize, usize),
    /// Channel groups (both channel counts divide by it).
    pub groups: usize,
    /// What input and weight values are rounded to before multiplying (mixed precision:
    /// bf16 operands, f32 sums, as [`crate::ops::matmul`]'s products).
    pub precision: OperandPrecision,
}

impl Conv2dSpec {
    /// A `k x k` convolution with stride 1, padding 0, no dilation, one group.
    pub fn new(
        batch: usize, in_channels: usize, out_channels: usize, height: usize, width: usize, k: usize,
    ) -> Self {
        Conv2dSpec {
            batch,
            in_channels,
            out_channels,
            height,
            width,
            kernel: (k, k),
            stride: (1, 1),
            padding: (0, 0),
            pad_end: (0, 0),
            dilation: (1, 1),
            groups: 1,
            precision: OperandPrecision::F32,
        }
    }
    /// Operands rounded to `p` before multiplying.
    pub fn precision(mut self, p: OperandPrecision) -> Self {
        self.precision = p;
        self
    }
    /// The same stride down and across.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = (s, s);
        self
    }
    /// The same padding on every side.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = (p, p);
        self
    }
    /// `e` extra zero rows and columns after the input.
    pub fn pad_end(mut self, e: usize) -> Self {
        self.pad_end = (e, e);
        self
    }
    /// The same dilation down and across.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = (d, d);
        self
    }
    /// Channel groups.
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }

    /// `(out_h, out_w)`; an error when the kernel does not fit the padded input.
    pub fn out_size(&self) -> Result<(usize, usize)> {
        const OP: &str = "conv2d";
        let dim = |size: usize,
                   k: usize,
                   s: usize,
                   (p, end): (usize, usize),
                   d: usize,
                   axis: &str|
         -> Result<usize> {
            nonzero(OP, "stride", s)?;
            nonzero(OP, "dilation", d)?;
            nonzero(OP, "kernel size", k)?;
            let span = d
                .checked_mul(k - 1)
                .and_then(|x| x.checked_add(1))
                .ok_or_else(|| invalid(alloc::format!("the {axis} kernel span overflows")))?;
            let padded = p
                .checked_mul(2)
                .and_then(|x| x.checked_add(size))
                .and_then(|x| x.checked_add(end))
                .ok_or_else(|| invalid(alloc::format!("the padded {axis} overflows")))?;
            if padded < span {
                return Err(invalid(alloc::format!(
                    "the {axis} kernel span {span} (kernel {k}, dilation {d}) is larger than the padded input {padded}"
                )));
            }
            Ok((padded - span) / s + 1)
        };
        Ok((
            dim(
                self.height,
                self.kernel.0,
                self.stride.0,
                (self.padding.0, self.pad_end.0),
                self.dilation.0,
                "height",
            )?,
            dim(
                self.width,
                self.kernel.1,
                self.stride.1,
                (self.padding.1, self.pad_end.1),
                self.dilation.1,
                "width",
            )?,
        ))
    }

    /// Validates the spec; returns the lengths `(inp, weight, out)` and the output size.
    pub fn check(&self) -> Result<(usize, usize, usize, (usize, usize))> {
        const OP: &str = "conv2d";
        nonzero(OP, "groups", self.groups)?;
        nonzero(OP, "in_channels", self.in_channels)?;
        nonzero(OP, "out_channels", self.out_channels)?;
        if !self.in_channels.is_multiple_of(self.groups) || !self.out_channels.is_multiple_of(self.groups) {
            return Err(invalid(alloc::format!(
                "in_channels ({}) and out_channels ({}) must both be multiples of groups ({})",
                self.in_channels,
                self.out_channels,
                self.groups
            )));
        }
        let (oh, ow) = self.out_size()?;
        let inp = product(OP, &[self.batch, self.in_channels, self.height, self.width])?;
        let weight =
            product(OP, &[self.out_channels, self.in_channels / self.groups, self.kernel.0, self.kernel.1])?;
        let out = product(OP, &[self.batch, self.out_channels, oh, ow])?;
        Ok((inp, weight, out, (oh, ow)))
    }

    /// The shape contract of `conv2d` (buffer lengths), shared by every backend.
    pub fn check_lens(
        &self, out: usize, inp: usize, weight: usize, bias: Option<usize>,
    ) -> Result<(usize, usize)> {
        const OP: &str = "conv2d";
        let (ni, nw, no, size) = self.check()?;
        check_len(OP, "inp", inp, ni)?;
        check_len(OP, "weight", weight, nw)?;
        check_len(OP, "out", out, no)?;
        if let Some(b) = bias {
            check_len(OP, "bias", b, self.out_channels)?;
        }
        Ok(size)
    }

    /// The shape contract of `conv2d_q8`: one group, the weight `out_channels` int8 rows of
    /// `K = in_channels * kh * kw` (`packed_cols(K)` slots each) and a scale a row. Returns
    /// the output size and K.
    pub fn check_q8_lens(
        &self, out: usize, inp: usize, packed: usize, scales: usize, bias: Option<usize>,
    ) -> Result<((usize, usize), usize)> {
        const OP: &str = "conv2d_q8";
        let (ni, _, no, size) = self.check()?;
        if self.groups != 1 {
            return Err(invalid(alloc::format!(
                "an int8 convolution takes one group, not {}: load this model's weights in f32",
                self.groups
            )));
        }
        let k = product(OP, &[self.in_channels, self.kernel.0, self.kernel.1])?;
        check_len(OP, "inp", inp, ni)?;
        check_len(OP, "packed weight", packed, product(OP, &[self.out_channels, packed_cols(k)])?)?;
        check_len(OP, "weight scales", scales, self.out_channels)?;
        check_len(OP, "out", out, no)?;
        if let Some(b) = bias {
            check_len(OP, "bias", b, self.out_channels)?;
        }
        Ok((size, k))
    }

    /// Multiply-adds times two.
    pub fn flops(&self) -> f64 {
        let (oh, ow) = self.out_size().unwrap_or((0, 0));
        2.0 * (self.batch * self.out_channels * oh * ow) as f64
            * (self.in_channels / self.groups.max(1) * self.kernel.0 * self.kernel.1) as f64
    }
}

fn invalid(message: alloc::string::String) -> CoreError {
    CoreError::InvalidDimension { op: "conv2d", message }
}

/// `out = conv(inp, weight) + bias`; see the module docs for layouts.
pub fn conv2d<T: Real>(
    out: &mut [T], inp: &[T], weight: &[T], bias: Option<&[T]>, spec: &Conv2dSpec,
) -> Result<()> {
    let (oh, ow) = spec.check_lens(out.len(), inp.len(), weight.len(), bias.map(|b| b.len()))?;
    let (h, w) = (spec.height, spec.width);
    let (kh, kw) = spec.kernel;
    let (cin_g, cout_g) = (spec.in_channels / spec.groups, spec.out_channels / spec.groups);
    for b in 0..spec.batch {
        for o in 0..spec.out_channels {
            let g = o / cout_g;
            let b0 = bias.map_or(T::ZERO, |bias| bias[o]);
            for y in 0..oh {
                for x in 0..ow {
                    let mut acc = b0;
                    for c in 0..cin_g {
                        let ci = g * cin_g + c;
                        for i in 0..kh {
                            // Input row of kernel row i, before padding is removed.
                            let iy =
                                (y * spec.stride.0 + i * spec.dilation.0) as isize - spec.padding.0 as isize;
                            if iy < 0 || iy >= h as isize {
                                continue;
                            }
                            for j in 0..kw {
                                let ix = (x * spec.stride.1 + j * spec.dilation.1) as isize
                                    - spec.padding.1 as isize;
                                if ix < 0 || ix >= w as isize {
                                    continue;
                                }
                                let xv =
                                    inp[((b * spec.in_channels + ci) * h + iy as usize) * w + ix as usize];
                                let wv = weight[((o * cin_g + c) * kh + i) * kw + j];
                                let (xv, wv) = (operand(xv, spec.precision), operand(wv, spec.precision));
                                acc += xv * wv;
                            }
                        }
                    }
                    out[((b * spec.out_channels + o) * oh + y) * ow + x] = acc;
                }
            }
        }
    }
    Ok(())
}

/// Column `t` of a pixel's patch in an int8 convolution's channels-last order, for kernel
/// tap `(i, j)` and input channel `c`.
pub fn q8_patch_col(spec: &Conv2dSpec, i: usize, j: usize, c: usize) -> usize {
    (i * spec.kernel.1 + j) * spec.in_channels + c
}

/// Reorders a `(cout, cin, kh, kw)` weight's int8 rows (as `q8::quantize_rows` packs the
/// PyTorch layout: `cout` rows of `cin * kh * kw`) into [`conv2d_q8`]'s channels-last
/// order `(cout, kh, kw, cin)`. A row's scale is its largest value's, whatever the order,
/// so rounding then reordering is reordering then rounding.
pub fn q8_weight_channels_last(packed: &[f32], spec: &Conv2dSpec) -> Result<alloc::vec::Vec<f32>> {
    let k = product("conv2d_q8", &[spec.in_channels, spec.kernel.0, spec.kernel.1])?;
    let pc = packed_cols(k);
    check_len("conv2d_q8", "packed weight", packed.len(), product("conv2d_q8", &[spec.out_channels, pc])?)?;
    let (kh, kw) = spec.kernel;
    let mut out = alloc::vec![0f32; packed.len()];
    let mut bytes = alloc::vec![0u8; 4 * pc];
    for (row, dst) in packed.chunks_exact(pc).zip(out.chunks_exact_mut(pc)) {
        bytes.iter_mut().for_each(|b| *b = 0);
        for c in 0..spec.in_channels {
            for i in 0..kh {
                for j in 0..kw {
                    bytes[q8_patch_col(spec, i, j, c)] = q8_at(row, (c * kh + i) * kw + j) as u8;
                }
            }
        }
        for (slot, four) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
            *slot = f32::from_ne_bytes([four[0], four[1], four[2], four[3]]);
        }
    }
    Ok(out)
}

/// `out = conv(inp, weight) + bias` with int8 weights (one group): the weight's rows are
/// int8 with a scale each, in channels-last order (`packed` holds `out_channels` rows of
/// `K = kh * kw * in_channels` values, column [`q8_patch_col`]`(i, j, c)`: see
/// [`q8_weight_channels_last`]), and each output pixel's patch (its K inputs in that
/// order, zeros where the kernel reaches the padding) is rounded to int8 with its own
/// scale ([`quantize_activations`]): a convolution is the product of the patches and the
/// weight rows, so this is [`crate::ops::q8::q8_matmul`]'s one-scale-a-row arithmetic
/// (W8A8), exact i32 sums and `d as f32 * patch_scale * weight_scale`, the bias added
/// after.
pub fn conv2d_q8(
    out: &mut [f32], inp: &[f32], packed: &[f32], scales: &[f32], bias: Option<&[f32]>, spec: &Conv2dSpec,
) -> Result<()> {
    let ((oh, ow), k) =
        spec.check_q8_lens(out.len(), inp.len(), packed.len(), scales.len(), bias.map(|b| b.len()))?;
    let pc = packed_cols(k);
    let mut patch = alloc::vec![0f32; k];
    for b in 0..spec.batch {
        for y in 0..oh {
            for x in 0..ow {
                q8_patch(&mut patch, inp, spec, b, y, x);
                let (q, sx) = quantize_activations(&patch);
                for o in 0..spec.out_channels {
                    let row = &packed[o * pc..(o + 1) * pc];
                    let d: i32 = q.iter().enumerate().map(|(t, &v)| v as i32 * q8_at(row, t) as i32).sum();
                    let v = d as f32 * sx * scales[o];
                    out[((b * spec.out_channels + o) * oh + y) * ow + x] = bias.map_or(v, |bias| v + bias[o]);
                }
            }
        }
    }
    Ok(())
}

/// The patch of output pixel `(y, x)` of image `b` in [`conv2d_q8`]'s channels-last order:
/// for each kernel tap, the input's channels at the tap's place, or zeros where it falls
/// in the padding.
pub fn q8_patch(patch: &mut [f32], inp: &[f32], spec: &Conv2dSpec, b: usize, y: usize, x: usize) {
    let (h, w, cin) = (spec.height, spec.width, spec.in_channels);
    for i in 0..spec.kernel.0 {
        let iy = (y * spec.stride.0 + i * spec.dilation.0) as isize - spec.padding.0 as isize;
        for j in 0..spec.kernel.1 {
            let ix = (x * spec.stride.1 + j * spec.dilation.1) as isize - spec.padding.1 as isize;
            let inside = (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix);
            for c in 0..cin {
                patch[q8_patch_col(spec, i, j, c)] =
                    if inside { inp[((b * cin + c) * h + iy as usize) * w + ix as usize] } else { 0.0 };
            }
        }
    }
}

/// Two-dimensional convolution (image models): see [`crate::ops::conv`].
pub trait ConvOps: Memory {
    // The defaults compute on the host through the reference ops (a download and an
    // upload around each call): correct on every backend, and what a device backend has
    // until it brings its own kernel. The CPU backend overrides each one.

    /// See [`crate::ops::conv::conv2d`].
    fn conv2d(
        &self, out: &mut Self::Buffer, inp: &Self::Buffer, weight: &Self::Buffer,
        bias: Option<&Self::Buffer>, spec: &Conv2dSpec,
    ) -> Result<()> {
        let bias = bias.map(|b| self.download(b)).transpose()?;
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::conv::conv2d(
            &mut o,
            &self.download(inp)?,
            &self.download(weight)?,
            bias.as_deref(),
            spec,
        )?;
        self.write(out, &o)
    }

    /// See [`crate::ops::conv::conv2d_q8`].
    fn conv2d_q8(
        &self, out: &mut Self::Buffer, inp: &Self::Buffer, packed: &Self::Buffer, scales: &Self::Buffer,
        bias: Option<&Self::Buffer>, spec: &Conv2dSpec,
    ) -> Result<()> {
        let bias = bias.map(|b| self.download(b)).transpose()?;
        let mut o = alloc::vec![0.0; self.len(out)];
        crate::ops::conv::conv2d_q8(
            &mut o,
            &self.download(inp)?,
            &self.download(packed)?,
            &self.download(scales)?,
            bias.as_deref(),
            spec,
        )?;
        self.write(out, &o)
    }
}

impl ConvOps for ReferenceBackend {}
