//! 2-D convolution on the CPU as GEMMs. Twin of `rusting_brain_core::ops::conv::conv2d`.
//!
//! Per image and group, `out_g (cout_g, oh*ow) = W_g (cout_g, K) cols (K, oh*ow)` with
//! `K = cin_g * kh * kw`. A 1x1 convolution with stride 1 and no padding needs no `cols`:
//! the input planes are that matrix already. Otherwise the columns (im2col) are built for
//! a band of output rows at a time, so the scratch stays near `BAND_VALUES` floats
//! whatever the image size (a 3x3 convolution of 128 channels at 256x256 would otherwise
//! need 300 MB of columns), and each band's product writes straight into its place in
//! `out` through the GEMM's row stride.
//!
//! Mixed precision (`spec.precision` BF16): the same columns, multiplied by the BF16 GEMM
//! (`vdpbf16ps`, twice the f32 FMA's multiply-adds an instruction) where the CPU has
//! AVX512_BF16, which rounds both operands while packing them; elsewhere the input and
//! weights are rounded first and the f32 path runs, the same numbers at f32's speed.

use crate::backend::cpu::{bf16, matmul::round_all, simd, CpuBackend};
use rayon::prelude::*;
use rusting_brain_core::backend::ConvOps;
use rusting_brain_core::ops::conv::Conv2dSpec;
use rusting_brain_core::ops::matmul::{MatmulSpec, OperandPrecision};
use rusting_brain_core::Result;

/// Scratch floats per im2col band: 4 MiB of f32, large enough for the GEMM to run at its
/// full rate (hundreds of columns), small enough to stay in the last-level cache.
const BAND_VALUES: usize = 1 << 20;
/// Below this many multiply-adds a product runs on one thread.
const PARALLEL_MACS: usize = 1 << 18;
/// Columns a BF16 band has at least: the BF16 GEMM packs the whole weight matrix for every
/// product, so a band of a few hundred columns would spend a fifth of its time packing
/// (512 x 4608 weights against 192 columns at 64 x 64).
const BF16_BAND_COLUMNS: usize = 1024;

pub fn conv2d(
    out: &mut [f32], inp: &[f32], weight: &[f32], bias: Option<&[f32]>, spec: &Conv2dSpec,
) -> Result<()> {
    let (oh, ow) = spec.check_lens(out.len(), inp.len(), weight.len(), bias.map(|b| b.len()))?;
    if out.is_empty() {
        return Ok(());
    }
    let bf16 = spec.precision == OperandPrecision::Bf16;
    if bf16 && !bf16::available() {
        // Products of bf16 values are exact in f32: rounding the operands first and running
        // the f32 path is the same arithmetic.
        let spec = Conv2dSpec { precision: OperandPrecision::F32, ..*spec };
        return conv2d(out, &round_all(inp), &round_all(weight), bias, &spec);
    }
    let (h, w) = (spec.height, spec.width);
    let (kh, kw) = spec.kernel;
    let (cin_g, cout_g) = (spec.in_channels / spec.groups, spec.out_channels / spec.groups);
    let k = cin_g * kh * kw;
    let n = oh * ow;
    let pointwise = spec.kernel == (1, 1) && spec.stride == (1, 1) && spec.padding == (0, 0);
    // Output rows per band: the columns of a band are (K, rows * ow).
    let mut band_rows = (BAND_VALUES / (k * ow).max(1)).clamp(1, oh);
    if bf16 {
        band_rows = band_rows.max(BF16_BAND_COLUMNS.div_ceil(ow)).min(oh);
    }
    let mut cols = if pointwise { Vec::new() } else { vec![0.0f32; k * band_rows * ow] };
    // A BF16 band's product, before it joins the output (the BF16 GEMM writes rows of
    // contiguous columns).
    let mut band_out = Vec::new();
    for b in 0..spec.batch {
        for g in 0..spec.groups {
            let o0 = (b * spec.out_channels + g * cout_g) * n;
            let out_g = &mut out[o0..o0 + cout_g * n];
            // The bias first; the products then accumulate onto it.
            match bias {
                Some(bias) => out_g
                    .par_chunks_mut(n)
                    .zip(&bias[g * cout_g..(g + 1) * cout_g])
                    .for_each(|(row, &v)| row.fill(v)),
                None => out_g.fill(0.0),
            }
            let w_g = &weight[g * cout_g * k..(g + 1) * cout_g * k];
            let i0 = (b * spec.in_channels + g * cin_g) * h * w;
            let x_g = &inp[i0..i0 + cin_g * h * w];
            if pointwise {
                if bf16 {
                    // The output block is (cout_g, n) contiguous: the product adds onto the bias.
                    bf16::gemm(out_g, w_g, x_g, &MatmulSpec::new(cout_g, n, k).beta(1.0));
                } else {
                    gemm_into(out_g, n, 0, cout_g, n, k, w_g, x_g, n);
                }
                continue;
            }
            for y0 in (0..oh).step_by(band_rows) {
                let rows = band_rows.min(oh - y0);
                let width = rows * ow;
                let c = &mut cols[..k * width];
                im2col(c, x_g, spec, y0, rows, ow);
                if !bf16 {
                    gemm_into(out_g, n, y0 * ow, cout_g, width, k, w_g, c, width);
                } else if width == n {
                    bf16::gemm(out_g, w_g, c, &MatmulSpec::new(cout_g, n, k).beta(1.0));
                } else {
                    band_out.resize(cout_g * width, 0.0);
                    bf16::gemm(&mut band_out, w_g, c, &MatmulSpec::new(cout_g, width, k));
                    out_g.par_chunks_mut(n).zip(band_out.par_chunks(width)).for_each(|(row, part)| {
                        simd::axpy(&mut row[y0 * ow..y0 * ow + width], 1.0, part);
                    });
                }
            }
        }
    }
    Ok(())
}

/// `cols (K, rows * ow)` for output rows `y0..y0 + rows` of one group's input planes
/// `x (cin_g, h, w)`; row `(c, i, j)` of `cols` holds input `(c, y*s + i*d - p, x*s + j*d - p)`
/// for each output position, zero where that falls in the padding.
fn im2col(cols: &mut [f32], x: &[f32], spec: &Conv2dSpec, y0: usize, rows: usize, ow: usize) {
    let (h, w) = (spec.height as isize, spec.width as isize);
    let (kh, kw) = spec.kernel;
    let width = rows * ow;
    cols.par_chunks_mut(width).enumerate().for_each(|(r, row)| {
        let (c, i, j) = (r / (kh * kw), (r / kw) % kh, r % kw);
        let plane = &x[c * (h * w) as usize..(c + 1) * (h * w) as usize];
        for yy in 0..rows {
            let iy = ((y0 + yy) * spec.stride.0 + i * spec.dilation.0) as isize - spec.padding.0 as isize;
            let dst = &mut row[yy * ow..(yy + 1) * ow];
            if iy < 0 || iy >= h {
                dst.fill(0.0);
                continue;
            }
            let src = &plane[(iy * w) as usize..((iy + 1) * w) as usize];
            let off = (j * spec.dilation.1) as isize - spec.padding.1 as isize;
            if spec.stride.1 == 1 {
                // A contiguous run of the input row with zeros on either side.
                let lo = (-off).clamp(0, ow as isize) as usize;
                let hi = (w - off).clamp(lo as isize, ow as isize) as usize;
                dst[..lo].fill(0.0);
                dst[lo..hi].copy_from_slice(&src[(lo as isize + off) as usize..(hi as isize + off) as usize]);
                dst[hi..].fill(0.0);
            } else {
                for (xx, d) in dst.iter_mut().enumerate() {
                    let ix = (xx * spec.stride.1) as isize + off;
                    *d = if ix < 0 || ix >= w { 0.0 } else { src[ix as usize] };
                }
            }
        }
    });
}

/// `dst[.., col0..col0 + n] += a (m, k) b (k, n)`, `dst` rows `dst_rs` apart, `a` and `b`
/// row-major (`b` rows `b_rs` apart).
#[allow(clippy::too_many_arguments)]
fn gemm_into(
    dst: &mut [f32], dst_rs: usize, col0: usize, m: usize, n: usize, k: usize, a: &[f32], b: &[f32],
    b_rs: usize,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    // Every element the strides address must lie inside the slices.
    assert!(
        col0 + n <= dst_rs && (m - 1) * dst_rs + col0 + n <= dst.len(),
        "conv2d: output view out of bounds"
    );
    assert!(m * k <= a.len(), "conv2d: weight view out of bounds");
    assert!(n <= b_rs && (k - 1) * b_rs + n <= b.len(), "conv2d: column view out of bounds");
    let parallelism = if m * n * k >= PARALLEL_MACS && rayon::current_num_threads() > 1 {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the asserts above prove every element addressed through these strides lies
    // inside `dst`, `a` and `b`; `dst` is a unique borrow, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().add(col0),
            1,
            dst_rs as isize,
            true,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
            1,
            b_rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

impl ConvOps for CpuBackend {
    fn conv2d(
        &self, out: &mut Vec<f32>, inp: &Vec<f32>, weight: &Vec<f32>, bias: Option<&Vec<f32>>,
        spec: &Conv2dSpec,
    ) -> Result<()> {
        conv2d(out, inp, weight, bias.map(|b| &b[..]), spec)
    }
}
