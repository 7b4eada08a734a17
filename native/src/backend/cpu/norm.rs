//! Layer and group normalization on the CPU. Twins of `rusting_brain_core::ops::norm`.
//!
//! Statistics as the reference takes them (two passes, the mean first), with f32 partial
//! sums over blocks of `BLOCK` values added in f64: the blocks vectorize, and the f64 total
//! keeps a group of hundreds of thousands of values as exact as the reference's.

use rayon::prelude::*;
use rusting_brain_core::ops::norm::{check_layer_norm, GroupNormSpec};
use rusting_brain_core::Result;

use super::simd;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::NormOps;

const BLOCK: usize = 256;
const LANES: usize = 16;

/// sum(f(x)) with f32 lanes inside a block and f64 across blocks.
#[inline(always)]
fn blocked_sum(x: &[f32], f: impl Fn(f32) -> f32 + Copy) -> f64 {
    let mut total = 0.0f64;
    for block in x.chunks(BLOCK) {
        let mut acc = [0.0f32; LANES];
        let mut chunks = block.chunks_exact(LANES);
        for c in chunks.by_ref() {
            for l in 0..LANES {
                acc[l] += f(c[l]);
            }
        }
        let tail: f32 = chunks.remainder().iter().map(|&v| f(v)).sum();
        total += (acc.iter().sum::<f32>() + tail) as f64;
    }
    total
}

/// The mean as two f32s, `hi + lo`, and `1 / sqrt(var + eps)`. `x - hi` is exact for the
/// values near the mean (Sterbenz), so `(x - hi) - lo` centres as the reference's f64
/// subtraction does: with a common offset of 100 an f32 mean alone is off by half an ulp
/// (4e-6), which every normalized value would carry.
fn mean_rstd(x: &[f32], eps: f32) -> (f32, f32, f32) {
    let n = x.len().max(1) as f64;
    // Summed relative to the first value: f32 partial sums of values with a large common
    // offset (100 +- 3) would lose the digits the mean is made of.
    let pivot = x.first().copied().unwrap_or(0.0);
    let mean = pivot as f64 + blocked_sum(x, |v| v - pivot) / n;
    let hi = mean as f32;
    let lo = (mean - hi as f64) as f32;
    let var = blocked_sum(x, |v| {
        let d = (v - hi) - lo;
        d * d
    }) / n;
    (hi, lo, (1.0 / (var + eps as f64).sqrt()) as f32)
}

#[allow(clippy::too_many_arguments)]
pub fn layer_norm(
    out: &mut [f32], inp: &[f32], weight: Option<&[f32]>, bias: Option<&[f32]>, rows: usize, dim: usize,
    eps: f32,
) -> Result<()> {
    check_layer_norm(out.len(), inp.len(), weight.map(|w| w.len()), bias.map(|b| b.len()), rows, dim)?;
    out.par_chunks_mut(dim).zip(inp.par_chunks(dim)).with_min_len(super::rows_per_task(dim)).for_each(
        |(o, x)| {
            let (hi, lo, rstd) = mean_rstd(x, eps);
            normalize(o, x, (hi, lo), rstd, weight.map(|w| (w, 1)), bias.map(|b| (b, 1)));
        },
    );
    Ok(())
}

pub fn group_norm(
    out: &mut [f32], inp: &[f32], weight: Option<&[f32]>, bias: Option<&[f32]>, spec: &GroupNormSpec,
) -> Result<()> {
    spec.check(out.len(), inp.len(), weight.map(|w| w.len()), bias.map(|b| b.len()))?;
    let (len, per, hw) = (spec.group_len(), spec.channels / spec.groups, spec.spatial);
    if len == 0 {
        return Ok(());
    }
    out.par_chunks_mut(len).zip(inp.par_chunks(len)).enumerate().for_each(|(bg, (o, x))| {
        let (hi, lo, rstd) = mean_rstd(x, spec.eps);
        let c0 = (bg % spec.groups) * per;
        // One channel's plane at a time: its weight and bias are one value each.
        for (c, (op, xp)) in o.chunks_mut(hw).zip(x.chunks(hw)).enumerate() {
            let w = weight.map(|v| (&v[c0 + c..c0 + c + 1], 0));
            let b = bias.map(|v| (&v[c0 + c..c0 + c + 1], 0));
            normalize(op, xp, (hi, lo), rstd, w, b);
            if let Some(act) = spec.act {
                // While the plane is still in cache.
                let normed = &mut *op;
                simd::unary_in_place(normed, act);
            }
        }
    });
    Ok(())
}

/// `o = (x - mean) * rstd * w + b`, the mean as `(hi, lo)`; `w`/`b` are `(values, stride)`: stride 1 walks a row
/// of per-feature values, stride 0 repeats one value.
#[inline(always)]
fn normalize(
    o: &mut [f32], x: &[f32], (hi, lo): (f32, f32), rstd: f32, w: Option<(&[f32], usize)>,
    b: Option<(&[f32], usize)>,
) {
    for (i, (o, &x)) in o.iter_mut().zip(x).enumerate() {
        let mut y = ((x - hi) - lo) * rstd;
        if let Some((w, s)) = w {
            y *= w[i * s];
        }
        if let Some((b, s)) = b {
            y += b[i * s];
        }
        *o = y;
    }
}

impl NormOps for CpuBackend {
    fn group_norm(
        &self, out: &mut Vec<f32>, inp: &Vec<f32>, weight: Option<&Vec<f32>>, bias: Option<&Vec<f32>>,
        spec: &GroupNormSpec,
    ) -> Result<()> {
        group_norm(out, inp, weight.map(|w| &w[..]), bias.map(|b| &b[..]), spec)
    }
    fn layer_norm(
        &self, out: &mut Vec<f32>, inp: &Vec<f32>, weight: Option<&Vec<f32>>, bias: Option<&Vec<f32>>,
        rows: usize, dim: usize, eps: f32,
    ) -> Result<()> {
        layer_norm(out, inp, weight.map(|w| &w[..]), bias.map(|b| &b[..]), rows, dim, eps)
    }
}
