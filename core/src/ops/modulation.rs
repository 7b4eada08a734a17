//! The glue of the diffusion transformers (FLUX, FLUX.2, SD3): adaptive-norm modulation
//! and gated residuals driven by one conditioning vector a batch row, a strided column
//! copy for their fused projections and joint sequences, and rotary embedding from
//! per-token angle tables (FLUX's multi-axis positions).

use crate::backend::Memory;
use crate::error::{check_len, check_range, nonzero, product};
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};

/// `x: (batch, tokens, dim)` modulated by `mods: (batch, stride)`, of which a block reads
/// `dim`-wide chunks at column offsets (diffusers `chunk`s one `Linear` output into
/// shift, scale and gate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModulationSpec {
    /// Images (or sequences) in the batch.
    pub batch: usize,
    /// Tokens of each.
    pub tokens: usize,
    /// Width of a token and of a chunk.
    pub dim: usize,
    /// Columns of one row of `mods`.
    pub stride: usize,
}

impl ModulationSpec {
    /// A spec of `batch x tokens x dim` with `stride` columns of modulation a row.
    pub fn new(batch: usize, tokens: usize, dim: usize, stride: usize) -> Self {
        ModulationSpec { batch, tokens, dim, stride }
    }

    /// Checks `x`'s and `mods`' lengths and that each chunk offset fits in a row.
    pub fn check(&self, op: &'static str, x: usize, mods: usize, offsets: &[usize]) -> Result<()> {
        nonzero(op, "dim", self.dim)?;
        check_len(op, "x", x, product(op, &[self.batch, self.tokens, self.dim])?)?;
        check_len(op, "mods", mods, product(op, &[self.batch, self.stride])?)?;
        for &at in offsets {
            if at.checked_add(self.dim).is_none_or(|end| end > self.stride) {
                return Err(CoreError::InvalidDimension {
                    op,
                    message: alloc::format!(
                        "a chunk of {} at column {at} does not fit rows of {}",
                        self.dim,
                        self.stride
                    ),
                });
            }
        }
        Ok(())
    }
}

/// `out[b, t, i] = x[b, t, i] * (1 + mods[b, scale_at + i]) + mods[b, shift_at + i]`:
/// a normalized activation shifted and scaled by its row's conditioning.
pub fn modulate<T: Real>(
    out: &mut [T], x: &[T], mods: &[T], shift_at: usize, scale_at: usize, spec: &ModulationSpec,
) -> Result<()> {
    const OP: &str = "modulate";
    spec.check(OP, x.len(), mods.len(), &[shift_at, scale_at])?;
    check_len(OP, "out", out.len(), x.len())?;
    let (d, per_row) = (spec.dim, spec.tokens * spec.dim);
    for b in 0..spec.batch {
        let m = &mods[b * spec.stride..(b + 1) * spec.stride];
        let (shift, scale) = (&m[shift_at..shift_at + d], &m[scale_at..scale_at + d]);
        let rows = b * per_row..(b + 1) * per_row;
        for (o, xr) in out[rows.clone()].chunks_exact_mut(d).zip(x[rows].chunks_exact(d)) {
            for i in 0..d {
                o[i] = xr[i] * (T::from_f32(1.0) + scale[i]) + shift[i];
            }
        }
    }
    Ok(())
}

/// `x[b, t, i] += mods[b, gate_at + i] * y[b, t, i]`: a gated residual add.
pub fn gate_add<T: Real>(
    x: &mut [T], y: &[T], mods: &[T], gate_at: usize, spec: &ModulationSpec,
) -> Result<()> {
    const OP: &str = "gate_add";
    spec.check(OP, x.len(), mods.len(), &[gate_at])?;
    check_len(OP, "y", y.len(), x.len())?;
    let (d, per_row) = (spec.dim, spec.tokens * spec.dim);
    for b in 0..spec.batch {
        let gate = &mods[b * spec.stride + gate_at..b * spec.stride + gate_at + d];
        let rows = b * per_row..(b + 1) * per_row;
        for (xr, yr) in x[rows.clone()].chunks_exact_mut(d).zip(y[rows].chunks_exact(d)) {
            for i in 0..d {
                xr[i] += gate[i] * yr[i];
            }
        }
    }
    Ok(())
}

/// A block of `width` columns copied between two row-major matrices with the same number
/// of rows: `dst[r, dst_at + j] = src[r, src_at + j]`. Splitting a fused projection's
/// output, concatenating features, or (with `rows` the batch) joining two sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnCopy {
    /// Rows of both matrices.
    pub rows: usize,
    /// Columns copied.
    pub width: usize,
    /// Columns of a row of `src`.
    pub src_cols: usize,
    /// The first column read.
    pub src_at: usize,
    /// Columns of a row of `dst`.
    pub dst_cols: usize,
    /// The first column written.
    pub dst_at: usize,
}

impl ColumnCopy {
    /// Checks the widths and the buffers' lengths (`dst`, `src` elements).
    pub fn check(&self, dst: usize, src: usize) -> Result<()> {
        const OP: &str = "copy_cols";
        check_len(OP, "src", src, product(OP, &[self.rows, self.src_cols])?)?;
        check_len(OP, "dst", dst, product(OP, &[self.rows, self.dst_cols])?)?;
        check_range(OP, "src columns", self.src_cols, self.src_at, self.width)?;
        check_range(OP, "dst columns", self.dst_cols, self.dst_at, self.width)
    }
}

/// See [`ColumnCopy`]; the other columns of `dst` are left as they are.
pub fn copy_cols<T: Real>(dst: &mut [T], src: &[T], spec: &ColumnCopy) -> Result<()> {
    spec.check(dst.len(), src.len())?;
    let w = spec.width;
    for r in 0..spec.rows {
        let s = r * spec.src_cols + spec.src_at;
        let d = r * spec.dst_cols + spec.dst_at;
        dst[d..d + w].copy_from_slice(&src[s..s + w]);
    }
    Ok(())
}

/// Rotary embedding over adjacent pairs with angles given per token:
/// `x: (batch, seq, heads, head_dim)`, `cos`, `sin: (seq, head_dim / 2)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopePairsSpec {
    /// Sequences.
    pub batch: usize,
    /// Tokens of each.
    pub seq: usize,
    /// Heads.
    pub heads: usize,
    /// Width of a head (even).
    pub head_dim: usize,
}

/// In place: `(x[2i], x[2i+1]) <- (x[2i] c - x[2i+1] s, x[2i+1] c + x[2i] s)` with
/// `c = cos[t, i]`, `s = sin[t, i]` (diffusers' `apply_rotary_emb` with
/// `use_real_unbind_dim=-1`, the FLUX form; LLaMA's rotate-half form is [`super::rope`]).
pub fn rope_pairs<T: Real>(x: &mut [T], cos: &[T], sin: &[T], spec: &RopePairsSpec) -> Result<()> {
    const OP: &str = "rope_pairs";
    nonzero(OP, "head_dim", spec.head_dim)?;
    if !spec.head_dim.is_multiple_of(2) {
        return Err(CoreError::InvalidDimension {
            op: OP,
            message: alloc::format!("head_dim {} is odd; rotary needs pairs", spec.head_dim),
        });
    }
    let half = spec.head_dim / 2;
    check_len(OP, "x", x.len(), product(OP, &[spec.batch, spec.seq, spec.heads, spec.head_dim])?)?;
    check_len(OP, "cos", cos.len(), product(OP, &[spec.seq, half])?)?;
    check_len(OP, "sin", sin.len(), spec.seq * half)?;
    let token = spec.heads * spec.head_dim;
    for (n, row) in x.chunks_exact_mut(token.max(1)).enumerate() {
        let t = n % spec.seq.max(1);
        let (c, s) = (&cos[t * half..(t + 1) * half], &sin[t * half..(t + 1) * half]);
        for head in row.chunks_exact_mut(spec.head_dim) {
            for i in 0..half {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * c[i] - b * s[i];
                head[2 * i + 1] = b * c[i] + a * s[i];
            }
        }
    }
    Ok(())
}

/// The angle tables of FLUX's positional embedding: token `t` has one position per axis
/// (`ids: (seq, axes.len())`), axis `a` owns `axes[a] / 2` frequencies
/// `theta^(-2i / axes[a])`, and the tables hold `cos` and `sin` of position times
/// frequency, axis after axis: `(seq, sum(axes) / 2)` each. Computed in f64 and rounded
/// once, as diffusers does (`freqs_dtype=torch.float64`).
pub fn rope_tables(
    ids: &[f32], axes: &[usize], theta: f64,
) -> Result<(alloc::vec::Vec<f32>, alloc::vec::Vec<f32>)> {
    const OP: &str = "rope_tables";
    nonzero(OP, "axes", axes.len())?;
    if let Some(a) = axes.iter().find(|a| **a == 0 || !a.is_multiple_of(2)) {
        return Err(CoreError::InvalidDimension {
            op: OP,
            message: alloc::format!("axis width {a} must be even and positive"),
        });
    }
    if !ids.len().is_multiple_of(axes.len()) {
        return Err(CoreError::InvalidDimension {
            op: OP,
            message: alloc::format!("{} ids are not rows of {} axes", ids.len(), axes.len()),
        });
    }
    let half: usize = axes.iter().sum::<usize>() / 2;
    let seq = ids.len() / axes.len();
    let (mut cos, mut sin) = (alloc::vec![0.0; seq * half], alloc::vec![0.0; seq * half]);
    for t in 0..seq {
        let mut at = t * half;
        for (a, &width) in axes.iter().enumerate() {
            let pos = ids[t * axes.len() + a] as f64;
            for i in 0..width / 2 {
                let freq = 1.0 / libm::pow(theta, (2 * i) as f64 / width as f64);
                let angle = pos * freq;
                cos[at] = libm::cos(angle) as f32;
                sin[at] = libm::sin(angle) as f32;
                at += 1;
            }
        }
    }
    Ok((cos, sin))
}

/// The diffusion transformers' modulation, gates, column copies and paired rotations: see [`crate::ops::modulation`].
pub trait ModulationOps: Memory {
    /// See [`crate::ops::modulation::modulate`].
    fn modulate(
        &self, out: &mut Self::Buffer, x: &Self::Buffer, mods: &Self::Buffer, shift_at: usize,
        scale_at: usize, spec: &ModulationSpec,
    ) -> Result<()> {
        let mut o = alloc::vec![0.0; self.len(out)];
        let (x, mods) = (self.download(x)?, self.download(mods)?);
        crate::ops::modulation::modulate(&mut o, &x, &mods, shift_at, scale_at, spec)?;
        self.write(out, &o)
    }
    /// See [`crate::ops::modulation::gate_add`].
    fn gate_add(
        &self, x: &mut Self::Buffer, y: &Self::Buffer, mods: &Self::Buffer, gate_at: usize,
        spec: &ModulationSpec,
    ) -> Result<()> {
        let mut o = self.download(x)?;
        let (y, mods) = (self.download(y)?, self.download(mods)?);
        crate::ops::modulation::gate_add(&mut o, &y, &mods, gate_at, spec)?;
        self.write(x, &o)
    }
    /// See [`crate::ops::modulation::copy_cols`].
    fn copy_cols(&self, dst: &mut Self::Buffer, src: &Self::Buffer, spec: &ColumnCopy) -> Result<()> {
        let mut o = self.download(dst)?;
        crate::ops::modulation::copy_cols(&mut o, &self.download(src)?, spec)?;
        self.write(dst, &o)
    }
    /// See [`crate::ops::modulation::rope_pairs`]. In place.
    fn rope_pairs(
        &self, x: &mut Self::Buffer, cos: &Self::Buffer, sin: &Self::Buffer, spec: &RopePairsSpec,
    ) -> Result<()> {
        let mut o = self.download(x)?;
        let (cos, sin) = (self.download(cos)?, self.download(sin)?);
        crate::ops::modulation::rope_pairs(&mut o, &cos, &sin, spec)?;
        self.write(x, &o)
    }
}

impl ModulationOps for ReferenceBackend {}
