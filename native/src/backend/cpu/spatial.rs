//! Image layout moves on the CPU: nearest upsampling and patches to tokens. Twins of
//! `rusting_brain_core::ops::spatial`. Pure data movement, parallel over output rows.

use crate::backend::cpu::CpuBackend;
use rayon::prelude::*;
use rusting_brain_core::backend::SpatialOps;
use rusting_brain_core::ops::spatial::{check_upsample, PatchOrder, PatchSpec};
use rusting_brain_core::Result;

pub fn upsample_nearest2d(
    out: &mut [f32], inp: &[f32], planes: usize, h: usize, w: usize, s: usize,
) -> Result<()> {
    check_upsample(out.len(), inp.len(), planes, h, w, s)?;
    let ow = w * s;
    if ow == 0 {
        return Ok(());
    }
    // Output row `r` of plane `p` repeats input row `r / s` of that plane.
    out.par_chunks_mut(ow).enumerate().for_each(|(r, row)| {
        let (p, y) = (r / (h * s), (r % (h * s)) / s);
        let src = &inp[(p * h + y) * w..(p * h + y + 1) * w];
        for (chunk, &v) in row.chunks_mut(s).zip(src) {
            chunk.fill(v);
        }
    });
    Ok(())
}

/// Token `(b, ty, tx)` gathers, for each feature, one value of the image; a task fills
/// whole tokens so writes are contiguous.
pub fn patchify(out: &mut [f32], inp: &[f32], spec: &PatchSpec) -> Result<()> {
    spec.check("patchify", inp.len(), out.len())?;
    move_patches(out, inp, spec, true);
    Ok(())
}

pub fn unpatchify(out: &mut [f32], inp: &[f32], spec: &PatchSpec) -> Result<()> {
    spec.check("unpatchify", inp.len(), out.len())?;
    move_patches(out, inp, spec, false);
    Ok(())
}

/// Tokens to image when `!to_tokens`: a task fills one image row, reading the tokens of
/// that row; tokens from image when `to_tokens`: a task fills one token.
fn move_patches(out: &mut [f32], inp: &[f32], spec: &PatchSpec, to_tokens: bool) {
    let (c, h, w, p) = (spec.channels, spec.height, spec.width, spec.patch);
    let (f, tokens, pw) = (spec.features(), spec.tokens(), w / p);
    if out.is_empty() {
        return;
    }
    let feature = |ch: usize, py: usize, px: usize| match spec.order {
        PatchOrder::ChannelFirst => (ch * p + py) * p + px,
        PatchOrder::ChannelLast => (py * p + px) * c + ch,
    };
    if to_tokens {
        out.par_chunks_mut(f).enumerate().for_each(|(bt, tok)| {
            let (b, t) = (bt / tokens, bt % tokens);
            let (ty, tx) = (t / pw, t % pw);
            for ch in 0..c {
                for py in 0..p {
                    let row = ((b * c + ch) * h + ty * p + py) * w + tx * p;
                    for px in 0..p {
                        tok[feature(ch, py, px)] = inp[row + px];
                    }
                }
            }
        });
    } else {
        out.par_chunks_mut(w).enumerate().for_each(|(r, row)| {
            let (y, ch, b) = (r % h, (r / h) % c, r / (h * c));
            let (ty, py) = (y / p, y % p);
            for (x, v) in row.iter_mut().enumerate() {
                let t = b * tokens + ty * pw + x / p;
                *v = inp[t * f + feature(ch, py, x % p)];
            }
        });
    }
}

impl SpatialOps for CpuBackend {
    fn upsample_nearest2d(
        &self, out: &mut Vec<f32>, inp: &Vec<f32>, planes: usize, h: usize, w: usize, scale: usize,
    ) -> Result<()> {
        upsample_nearest2d(out, inp, planes, h, w, scale)
    }
    fn patchify(&self, out: &mut Vec<f32>, inp: &Vec<f32>, spec: &PatchSpec) -> Result<()> {
        patchify(out, inp, spec)
    }
    fn unpatchify(&self, out: &mut Vec<f32>, inp: &Vec<f32>, spec: &PatchSpec) -> Result<()> {
        unpatchify(out, inp, spec)
    }
}
