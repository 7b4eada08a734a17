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
//! A 3x3 convolution with stride 1 and padding 1 (a UNet's and a VAE's) over enough
//! pixels runs as Winograd's F(2x2, 3x3) instead (see [`winograd`]): 16 products of
//! `(cout, cin) x (cin, tiles)`, 2.25 times fewer multiply-adds than the columns' GEMM.
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
    if takes_winograd(spec) && (!bf16 || bf16::available()) {
        winograd(out, inp, weight, bias, spec);
        return Ok(());
    }
    if bf16 && !bf16::available() {
        // Products of bf16 values are exact in f32: rounding the operands first and running
        // the f32 path is the same arithmetic (up to f32 rounding where Winograd runs it).
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

/// Output tiles (2 x 2 pixels, over the batch) from which Winograd's transforms pay for
/// themselves: the weights' transform writes 16 x cout x cin values a call. SD 1.5's
/// convolutions at batch 2 (scratch timings, AMD EPYC Zen 4, 2 threads, against the
/// columns): 2048 tiles of 320 channels 47 ms against 85, 512 of 640 51 against 80, 128 of
/// 1280 73 against 85, 32 of 1280 44 against 20.
const WINOGRAD_MIN_TILES: usize = 128;

/// The same in mixed precision, where the columns' BF16 GEMM is the faster to beat: 2048
/// tiles of 320 channels 32-40 ms against 52-60, 512 of 640 45-57 against 53-60, 128 of 1280
/// 60 against 50.
const WINOGRAD_MIN_TILES_BF16: usize = 1024;

/// Whether `spec` runs as Winograd's F(2x2, 3x3): 3x3, stride 1, padding 1 (no extra
/// padding at the end), no dilation, one group, over enough tiles. In mixed precision the
/// 16 products are the BF16 GEMM's, which rounds the transformed weights and inputs (not
/// the input and weights themselves, as the columns' path and core's definition do): a
/// measured bound, not the definition's bits (`winograd_in_mixed_precision_stays_near`).
fn takes_winograd(spec: &Conv2dSpec) -> bool {
    spec.kernel == (3, 3)
        && spec.stride == (1, 1)
        && spec.padding == (1, 1)
        && spec.pad_end == (0, 0)
        && spec.dilation == (1, 1)
        && spec.groups == 1
        && spec.batch * spec.height.div_ceil(2) * spec.width.div_ceil(2)
            >= if spec.precision == OperandPrecision::Bf16 {
                WINOGRAD_MIN_TILES_BF16
            } else {
                WINOGRAD_MIN_TILES
            }
        && winograd_on()
}

/// `RB_CPU_WINOGRAD=0` keeps every convolution on the columns' GEMM (for comparisons).
fn winograd_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("RB_CPU_WINOGRAD").is_none_or(|v| v != "0"))
}

/// Values a band of Winograd tiles keeps transformed (its inputs' and its outputs' 16
/// planes each): 8 Mi floats, 32 MiB, whatever the picture's size.
const WINOGRAD_BAND_VALUES: usize = 1 << 23;

/// Winograd's F(2x2, 3x3) (Lavin and Gray, 2015): per 4 x 4 input tile `d` (2 x 2 outputs,
/// tiles overlapping by 2), `Y = A^T [sum_c (G g_c G^T) . (B^T d_c B)] A`, the sum over input
/// channels as 16 GEMMs, one per position of the 4 x 4 transformed tile:
/// `M[x] (cout, tiles) = U[x] (cout, cin) V[x] (cin, tiles)`.
///
/// B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1],
/// A^T = [1 1 1 0; 0 1 -1 -1]: additions and halvings, so the result differs from the
/// direct sum by rounding alone (the shared sweep holds it to the direct reference).
/// Tiles run in bands of tile rows, so the transformed planes stay near
/// `WINOGRAD_BAND_VALUES` however large the picture.
fn winograd(out: &mut [f32], inp: &[f32], weight: &[f32], bias: Option<&[f32]>, spec: &Conv2dSpec) {
    winograd_banded(out, inp, weight, bias, spec, WINOGRAD_BAND_VALUES);
}

/// [`winograd`] with bands of about `band_values` transformed values.
fn winograd_banded(
    out: &mut [f32], inp: &[f32], weight: &[f32], bias: Option<&[f32]>, spec: &Conv2dSpec, band_values: usize,
) {
    let (cin, cout, h, w) = (spec.in_channels, spec.out_channels, spec.height, spec.width);
    let (th, tw) = (h.div_ceil(2), w.div_ceil(2));
    // U[x][o][c] = (G g_oc G^T)[x], each filter's 16 values written to their planes (the
    // filters split over the threads; each writes only its own column of every plane).
    let plane = cout * cin;
    // This thread's kept buffers (empty ones if a convolution on it holds them already).
    let [mut u, mut v, mut m] = KEPT.with(|k| std::mem::take(&mut *k.borrow_mut()));
    u.resize(16 * plane, 0.0);
    let base = SendPtr(u.as_mut_ptr());
    weight.par_chunks(9 * 1024).enumerate().for_each(|(chunk, gs)| {
        for (i, g) in gs.chunks_exact(9).enumerate() {
            let f = chunk * 1024 + i;
            // G g: 4 x 3.
            let mut gg = [[0.0f32; 3]; 4];
            for j in 0..3 {
                let (a, b, c) = (g[j], g[3 + j], g[6 + j]);
                gg[0][j] = a;
                gg[1][j] = 0.5 * (a + b + c);
                gg[2][j] = 0.5 * (a - b + c);
                gg[3][j] = c;
            }
            // (G g) G^T: 4 x 4, value x to plane x.
            for (r, row) in gg.iter().enumerate() {
                let t = [row[0], 0.5 * (row[0] + row[1] + row[2]), 0.5 * (row[0] - row[1] + row[2]), row[2]];
                for (q, &val) in t.iter().enumerate() {
                    // SAFETY: plane 4r + q < 16, filter f < cout cin: inside `u`; only this
                    // task writes filter f's elements.
                    unsafe { *base.at((r * 4 + q) * plane + f) = val };
                }
            }
        }
    });
    // Tile rows over the whole batch (image b's row ty is b th + ty), in bands whose V
    // (16 x cin x tiles) and M (16 x cout x tiles) stay near WINOGRAD_BAND_VALUES.
    let per_row = 16 * (cin + cout) * tw;
    let band_rows = (band_values / per_row.max(1)).clamp(1, spec.batch * th);
    for r0 in (0..spec.batch * th).step_by(band_rows) {
        let rows = band_rows.min(spec.batch * th - r0);
        let tiles = rows * tw;
        v.resize(16 * cin * tiles, 0.0);
        m.resize(16 * cout * tiles, 0.0);
        winograd_inputs(&mut v, inp, cin, h, w, th, r0, rows, tw);
        // M[x] = U[x] V[x], the 16 products.
        for xi in 0..16 {
            let mx = &mut m[xi * cout * tiles..(xi + 1) * cout * tiles];
            let ux = &u[xi * cout * cin..(xi + 1) * cout * cin];
            let vx = &v[xi * cin * tiles..(xi + 1) * cin * tiles];
            if spec.precision == OperandPrecision::Bf16 {
                bf16::gemm(mx, ux, vx, &MatmulSpec::new(cout, tiles, cin));
            } else {
                gemm_to(mx, tiles, 0, cout, tiles, cin, ux, vx, tiles, false);
            }
        }
        winograd_outputs(out, &m, bias, cout, h, w, th, r0, rows, tw);
    }
    KEPT.with(|k| *k.borrow_mut() = [u, v, m]);
}

thread_local! {
    /// Winograd's transformed weights, inputs and products, kept by the calling thread
    /// between convolutions: tens of megabytes a call, whose fresh pages cost as much to
    /// fault in as the transforms take.
    static KEPT: std::cell::RefCell<[Vec<f32>; 3]> = const { std::cell::RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// The band's input tiles transformed: `v[x][c][t] = (B^T d B)[x]`, `d` the 4 x 4 input
/// block from row `2 ty - 1`, column `2 tx - 1` of channel `c` (zeros outside), `t` the
/// tile's index in the band (`(ty - ty0) tw + tx`). Row by row of tiles, each step a run
/// over the row's tiles (it vectorizes): `B` along each of the four input rows, then `B^T`
/// down them.
#[allow(clippy::too_many_arguments)]
fn winograd_inputs(
    v: &mut [f32], x: &[f32], cin: usize, h: usize, w: usize, th: usize, r0: usize, rows: usize, tw: usize,
) {
    let tiles = rows * tw;
    // One task a channel: its rows of the 16 planes are disjoint from every other's, and
    // written through a shared pointer.
    let base = SendPtr(v.as_mut_ptr());
    (0..cin).into_par_iter().for_each(|c| {
        // An input row with a zero on the left and zeros past its end: 2 tw + 2 values.
        let mut padded = vec![0.0f32; 2 * tw + 2];
        // hb[i][j][tx]: input row i of the tile row times B, column j.
        let mut hb = vec![0.0f32; 16 * tw];
        for ty in 0..rows {
            // Tile row r0 + ty is row ty_img of image b.
            let (b, ty_img) = ((r0 + ty) / th, (r0 + ty) % th);
            let plane = &x[(b * cin + c) * h * w..(b * cin + c + 1) * h * w];
            let top = 2 * ty_img as isize - 1;
            for i in 0..4 {
                let r = top + i as isize;
                padded.fill(0.0);
                if r >= 0 && r < h as isize {
                    padded[1..=w].copy_from_slice(&plane[r as usize * w..(r as usize + 1) * w]);
                }
                let (h0, rest) = hb[i * 4 * tw..(i + 1) * 4 * tw].split_at_mut(tw);
                let (h1, rest) = rest.split_at_mut(tw);
                let (h2, h3) = rest.split_at_mut(tw);
                for tx in 0..tw {
                    let (a, b, c, d) =
                        (padded[2 * tx], padded[2 * tx + 1], padded[2 * tx + 2], padded[2 * tx + 3]);
                    h0[tx] = a - c;
                    h1[tx] = b + c;
                    h2[tx] = c - b;
                    h3[tx] = b - d;
                }
            }
            for j in 0..4 {
                let row = |i: usize| &hb[(i * 4 + j) * tw..(i * 4 + j + 1) * tw];
                let (d0, d1, d2, d3) = (row(0), row(1), row(2), row(3));
                for (i, f) in [
                    (|a: f32, _b: f32, c: f32, _d: f32| a - c) as fn(f32, f32, f32, f32) -> f32,
                    |_a, b, c, _d| b + c,
                    |_a, b, c, _d| c - b,
                    |_a, b, _c, d| b - d,
                ]
                .iter()
                .enumerate()
                {
                    // SAFETY: plane 4i + j, row c, columns ty tw .. ty tw + tw <= tiles: inside
                    // `v` (16 x cin x tiles), and only this task writes row c of any plane.
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(base.at(((i * 4 + j) * cin + c) * tiles + ty * tw), tw)
                    };
                    for (tx, o) in out.iter_mut().enumerate() {
                        *o = f(d0[tx], d1[tx], d2[tx], d3[tx]);
                    }
                }
            }
        }
    });
}

/// The band's outputs from its products: `y = A^T M A` per tile and output channel, plus
/// the bias, the 2 x 2 pixels that fall inside the picture. Per tile row, runs over its
/// tiles: `A^T` down the four rows of M, then `A` along them.
#[allow(clippy::too_many_arguments)]
fn winograd_outputs(
    y: &mut [f32], m: &[f32], bias: Option<&[f32]>, cout: usize, h: usize, w: usize, th: usize, r0: usize,
    rows: usize, tw: usize,
) {
    let tiles = rows * tw;
    // Output planes (b, o) whose image has tile rows in this band.
    let (b_first, b_last) = (r0 / th, (r0 + rows - 1) / th);
    let planes = &mut y[b_first * cout * h * w..(b_last + 1) * cout * h * w];
    planes.par_chunks_mut(h * w).enumerate().for_each(|(bo, plane)| {
        let (b, o) = (b_first + bo / cout, bo % cout);
        let b0 = bias.map_or(0.0, |bias| bias[o]);
        let mut a = vec![0.0f32; 4 * tw];
        // This image's tile rows in the band.
        let (lo, hi) = ((b * th).max(r0), ((b + 1) * th).min(r0 + rows));
        for gr in lo..hi {
            let ty = gr - r0;
            let ty_img = gr - b * th;
            let mrow =
                |x: usize| &m[(x * cout + o) * tiles + ty * tw..(x * cout + o) * tiles + (ty + 1) * tw];
            let rows16: [&[f32]; 16] = std::array::from_fn(mrow);
            for i in 0..2 {
                let r = 2 * ty_img + i;
                if r >= h {
                    continue;
                }
                // a[j] = row i of A^T M: M's rows 0 + 1 + 2, or 1 - 2 - 3, at column j.
                for j in 0..4 {
                    let (m0, m1, m2, m3) = (rows16[j], rows16[4 + j], rows16[8 + j], rows16[12 + j]);
                    let aj = &mut a[j * tw..(j + 1) * tw];
                    if i == 0 {
                        for (t, e) in aj.iter_mut().enumerate() {
                            *e = m0[t] + m1[t] + m2[t];
                        }
                    } else {
                        for (t, e) in aj.iter_mut().enumerate() {
                            *e = m1[t] - m2[t] - m3[t];
                        }
                    }
                }
                let (a0, rest) = a.split_at(tw);
                let (a1, rest) = rest.split_at(tw);
                let (a2, a3) = rest.split_at(tw);
                let out = &mut plane[r * w..(r + 1) * w];
                let (pairs, last) = out.split_at_mut(w / 2 * 2);
                for (t, pair) in pairs.chunks_exact_mut(2).enumerate() {
                    pair[0] = a0[t] + a1[t] + a2[t] + b0;
                    pair[1] = a1[t] - a2[t] - a3[t] + b0;
                }
                if let Some(e) = last.first_mut() {
                    let t = w / 2;
                    *e = a0[t] + a1[t] + a2[t] + b0;
                }
            }
        }
    });
}

/// A raw pointer the Winograd input transform's tasks share (each writes its own rows).
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
impl SendPtr {
    /// The element `i` past the start (a method, so closures capture the whole wrapper).
    ///
    /// # Safety
    /// `i` is inside the buffer the pointer came from.
    unsafe fn at(self, i: usize) -> *mut f32 {
        // SAFETY: the caller's contract.
        unsafe { self.0.add(i) }
    }
}
// SAFETY: the tasks that hold it write disjoint elements (see `winograd_inputs`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

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
    gemm_to(dst, dst_rs, col0, m, n, k, a, b, b_rs, true);
}

/// [`gemm_into`], adding to `dst` when `accumulate`, else overwriting it.
#[allow(clippy::too_many_arguments)]
fn gemm_to(
    dst: &mut [f32], dst_rs: usize, col0: usize, m: usize, n: usize, k: usize, a: &[f32], b: &[f32],
    b_rs: usize, accumulate: bool,
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
            accumulate,
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

/// An int8 convolution (`Precision::Q8`'s UNet): the product of the pixels' patches
/// (rows of K = kh * kw * cin, channels last) and the weight's int8 rows (the same order,
/// reordered at load), on the VNNI GEMM where it runs. Each pixel's patch is gathered from
/// a channels-last copy of the input (kh * kw runs of cin values) as the GEMM packs its
/// row, so the patches never exist whole (an implicit GEMM); the product's rows (pixels,
/// out_channels) are then laid back into channel planes with the bias. Elsewhere the
/// patches are gathered whole and multiplied by the int8 product's per-row path: the same
/// integers. Twin of `rusting_brain_core::ops::conv::conv2d_q8`, to the bit.
pub fn conv2d_q8(
    out: &mut [f32], inp: &[f32], packed: &[f32], scales: &[f32], bias: Option<&[f32]>, spec: &Conv2dSpec,
) -> Result<()> {
    spec.check_q8_lens(out.len(), inp.len(), packed.len(), scales.len(), bias.map(|b| b.len()))?;
    if out.is_empty() {
        return Ok(());
    }
    Q8_CONV.with(|cell| match cell.try_borrow_mut() {
        Ok(mut kept) => {
            let (nhwc, prod) = &mut *kept;
            conv2d_q8_with(out, inp, packed, scales, bias, spec, (nhwc, prod))
        }
        Err(_) => conv2d_q8_with(out, inp, packed, scales, bias, spec, (&mut Vec::new(), &mut Vec::new())),
    })
}

thread_local! {
    /// [`conv2d_q8`]'s channels-last input and its product's rows, kept by the calling
    /// thread between convolutions: fresh ones were a page fault every 4 KiB, a tenth of a
    /// 3x3 convolution of 320 channels at 64 x 64.
    static Q8_CONV: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// [`conv2d_q8`] on the buffers given (resized; every value used is written).
#[allow(clippy::too_many_arguments)]
fn conv2d_q8_with(
    out: &mut [f32], inp: &[f32], packed: &[f32], scales: &[f32], bias: Option<&[f32]>, spec: &Conv2dSpec,
    (nhwc, prod): (&mut Vec<f32>, &mut Vec<f32>),
) -> Result<()> {
    let ((oh, ow), k) =
        spec.check_q8_lens(out.len(), inp.len(), packed.len(), scales.len(), bias.map(|b| b.len()))?;
    let (cin, cout, h, w) = (spec.in_channels, spec.out_channels, spec.height, spec.width);
    let (kh, kw) = spec.kernel;
    let planes = oh * ow;
    let m = spec.batch * planes;
    // (batch, h, w, cin): a tap's cin values in one run. Blocks of 64 pixels: each channel's
    // run read whole, the block's rows (64 x cin) written in cache (a channel at a time
    // over all pixels read each value from another page).
    const PIXELS: usize = 64;
    let hw = h * w;
    nhwc.resize(inp.len(), 0.0);
    nhwc.par_chunks_mut(hw * cin)
        .zip(inp.par_chunks(cin * hw))
        .flat_map(|(dst, src)| {
            dst.par_chunks_mut(PIXELS * cin).enumerate().map(move |(blk, d)| (src, blk, d))
        })
        .for_each(|(src, blk, dst)| {
            let p0 = blk * PIXELS;
            let pixels = dst.len() / cin;
            for c in 0..cin {
                for (t, &v) in src[c * hw + p0..c * hw + p0 + pixels].iter().enumerate() {
                    dst[t * cin + c] = v;
                }
            }
        });
    let row = |i: usize, buf: &mut [f32]| {
        let (b, p) = (i / planes, i % planes);
        let (y, x) = (p / ow, p % ow);
        for ki in 0..kh {
            let iy = (y * spec.stride.0 + ki * spec.dilation.0) as isize - spec.padding.0 as isize;
            for kj in 0..kw {
                let ix = (x * spec.stride.1 + kj * spec.dilation.1) as isize - spec.padding.1 as isize;
                let dst = &mut buf[(ki * kw + kj) * cin..(ki * kw + kj + 1) * cin];
                if (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix) {
                    let at = ((b * h + iy as usize) * w + ix as usize) * cin;
                    dst.copy_from_slice(&nhwc[at..at + cin]);
                } else {
                    dst.fill(0.0);
                }
            }
        }
    };
    // (pixels, out_channels); every value is written.
    prod.resize(m * cout, 0.0);
    if super::int8_gemm::takes(m, k) {
        super::int8_gemm::gemm_rows(prod, &row, super::q8::as_i8(packed), scales, (m, cout, k), 0.0);
    } else {
        let mut patches = vec![0f32; m * k];
        patches.par_chunks_mut(k).enumerate().for_each(|(i, r)| row(i, r));
        super::q8::q8_matmul(prod, &patches, packed, scales, m, cout, k, 0.0)?;
    }
    // Back to planes, sixteen channels and 64 pixels at a time: the product's rows are read
    // a 64-byte line each and the planes written in runs.
    const CH: usize = 16;
    let prod = &*prod;
    out.par_chunks_mut(cout * planes)
        .enumerate()
        .flat_map(|(b, image)| {
            image.par_chunks_mut(CH * planes).enumerate().map(move |(g, part)| (b, g, part))
        })
        .for_each(|(b, g, part)| {
            let o0 = g * CH;
            let chans = part.len() / planes;
            for p0 in (0..planes).step_by(64) {
                let p1 = (p0 + 64).min(planes);
                for c in 0..chans {
                    let add = bias.map(|bias| bias[o0 + c]);
                    let plane = &mut part[c * planes..(c + 1) * planes];
                    for p in p0..p1 {
                        let v = prod[(b * planes + p) * cout + o0 + c];
                        plane[p] = match add {
                            Some(a) => v + a,
                            None => v,
                        };
                    }
                }
            }
        });
    Ok(())
}

impl ConvOps for CpuBackend {
    fn conv2d(
        &self, out: &mut Vec<f32>, inp: &Vec<f32>, weight: &Vec<f32>, bias: Option<&Vec<f32>>,
        spec: &Conv2dSpec,
    ) -> Result<()> {
        conv2d(out, inp, weight, bias.map(|b| &b[..]), spec)
    }

    fn conv2d_q8(
        &self, out: &mut Vec<f32>, inp: &Vec<f32>, packed: &Vec<f32>, scales: &Vec<f32>,
        bias: Option<&Vec<f32>>, spec: &Conv2dSpec,
    ) -> Result<()> {
        conv2d_q8(out, inp, packed, scales, bias.map(|b| &b[..]), spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The int8 convolution is core's definition to the bit on both paths (the VNNI GEMM
    /// from 32 pixels, the per-row product below), and as near the f32 convolution as
    /// int8 rounding of both operands allows: measured 5.4e-3 to 1.07e-2 of the outputs'
    /// scale on these shapes (with the taps of the reordering transposed, 0.99); the bound
    /// 1.6 times the worst.
    #[test]
    fn int8_convolution_is_the_definition_and_near_f32() {
        use rusting_brain_core::ops::conv::{conv2d_q8 as reference_q8, q8_weight_channels_last};
        use rusting_brain_core::ops::q8::quantize_rows;
        let mut rng = rusting_brain_core::Rng::new(17);
        for (batch, cin, cout, h, w, k, stride, pad) in [
            (2, 64, 40, 9, 11, 3, 1, 1),
            (1, 7, 5, 6, 5, 3, 1, 1),
            (1, 13, 33, 12, 10, 3, 2, 1),
            (2, 20, 3, 8, 8, 1, 1, 0),
            (1, 3, 8, 3, 3, 3, 1, 1),
        ] {
            let spec = Conv2dSpec::new(batch, cin, cout, h, w, k).stride(stride).padding(pad);
            let (ni, nw, no, _) = spec.check().unwrap();
            let x = rng.normal_vec(ni, 1.0);
            let g = rng.normal_vec(nw, 0.3);
            let b = rng.normal_vec(cout, 1.0);
            let (packed, scales) = quantize_rows(&g, cout, nw / cout).unwrap();
            let packed = q8_weight_channels_last(&packed, &spec).unwrap();
            let name = format!("{batch}x{cin}->{cout} {h}x{w} k{k} s{stride}");
            for bias in [Some(&b[..]), None] {
                let mut want = vec![0.0f32; no];
                reference_q8(&mut want, &x, &packed, &scales, bias, &spec).unwrap();
                let mut got = vec![f32::NAN; no];
                conv2d_q8(&mut got, &x, &packed, &scales, bias, &spec).unwrap();
                for (i, (a, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.to_bits(), e.to_bits(), "{name}: output {i}: {a} against {e}");
                }
            }
            let mut f32_out = vec![0.0f32; no];
            rusting_brain_core::ops::conv::conv2d(&mut f32_out, &x, &g, Some(&b), &spec).unwrap();
            let mut got = vec![0.0f32; no];
            conv2d_q8(&mut got, &x, &packed, &scales, Some(&b), &spec).unwrap();
            let e = rusting_brain_test_support::rel_to_scale(&name, &got, &f32_out);
            println!("{name}: int8 {e:.2e} of the outputs' scale from f32");
            assert!(e < 0.017, "{name}: int8 {e:e} of the outputs' scale from f32");
        }
        // One group only, and the lengths checked.
        let grouped = Conv2dSpec::new(1, 4, 4, 3, 3, 1).groups(2);
        assert!(conv2d_q8(&mut [0.0; 36], &[0.0; 36], &[0.0; 4], &[0.0; 4], None, &grouped).is_err());
        let spec = Conv2dSpec::new(1, 4, 4, 3, 3, 1);
        assert!(conv2d_q8(&mut [0.0; 36], &[0.0; 36], &[0.0; 3], &[0.0; 4], None, &spec).is_err());
        assert!(conv2d_q8(&mut [0.0; 36], &[0.0; 36], &[0.0; 4], &[0.0; 3], None, &spec).is_err());
        assert!(conv2d_q8(&mut [0.0; 35], &[0.0; 36], &[0.0; 4], &[0.0; 4], None, &spec).is_err());
    }

    /// Mixed precision through Winograd rounds the transforms to bf16 rather than the
    /// operands: its outputs are not the definition's (operands rounded, f64 sums) but as
    /// near the f32 convolution. Measured on these shapes: against the definition at most
    /// 4.8e-3 of the outputs' scale; against f32 at most 4.0e-3 where the definition itself
    /// is 1.9e-3 to 2.4e-3 away (1.9 times it at worst). The bounds: 8e-3 from the
    /// definition, and 2.5 times the definition's distance from f32 (a wrong transform or
    /// band costs 0.1 and more).
    #[test]
    fn winograd_in_mixed_precision_stays_near() {
        if !bf16::available() {
            return;
        }
        let mut rng = rusting_brain_core::Rng::new(12);
        for (batch, cin, cout, h, w) in [(2, 64, 8, 9, 11), (1, 200, 5, 6, 5), (2, 16, 16, 7, 8)] {
            let spec =
                Conv2dSpec::new(batch, cin, cout, h, w, 3).padding(1).precision(OperandPrecision::Bf16);
            let x = rng.normal_vec(batch * cin * h * w, 1.0);
            let g = rng.normal_vec(cout * cin * 9, 0.3);
            let b = rng.normal_vec(cout, 1.0);
            let mut want = vec![0.0f32; batch * cout * h * w];
            rusting_brain_core::ops::conv::conv2d(&mut want, &x, &g, Some(&b), &spec).unwrap();
            let mut f32_out = vec![0.0f32; want.len()];
            let spec32 = Conv2dSpec { precision: OperandPrecision::F32, ..spec };
            rusting_brain_core::ops::conv::conv2d(&mut f32_out, &x, &g, Some(&b), &spec32).unwrap();
            let definition = rusting_brain_test_support::rel_to_scale("bf16 definition", &want, &f32_out);
            let per_row = 16 * (cin + cout) * w.div_ceil(2);
            for band in [1, 3, 1000] {
                let mut got = vec![f32::NAN; want.len()];
                winograd_banded(&mut got, &x, &g, Some(&b), &spec, band * per_row);
                let name = format!("bf16 batch {batch} {cin}->{cout} {h}x{w}, bands of {band}");
                let e = rusting_brain_test_support::rel_to_scale(&name, &got, &want);
                let e32 = rusting_brain_test_support::rel_to_scale(&name, &got, &f32_out);
                assert!(e < 8e-3, "{name}: {e:e} of the outputs' scale from the definition");
                assert!(e32 < 2.5 * definition, "{name}: {e32:e} from f32, the definition {definition:e}");
            }
        }
    }

    /// Winograd against core's direct reference (f64) on awkward shapes: odd sizes (tiles
    /// hanging over the picture's edge), a bias and none, and bands of one to a few tile
    /// rows, which start and end inside an image and cross from one image to the next.
    #[test]
    fn winograd_matches_the_direct_reference_in_any_bands() {
        let mut rng = rusting_brain_core::Rng::new(11);
        for (batch, cin, cout, h, w, bias) in
            [(2, 5, 7, 9, 11, true), (3, 4, 3, 6, 5, false), (1, 3, 2, 1, 1, true), (2, 6, 4, 7, 8, true)]
        {
            let spec = Conv2dSpec::new(batch, cin, cout, h, w, 3).padding(1);
            let x = rng.normal_vec(batch * cin * h * w, 1.0);
            let g = rng.normal_vec(cout * cin * 9, 0.3);
            let b = rng.normal_vec(cout, 1.0);
            let bias = bias.then_some(&b[..]);
            let mut want = vec![0.0f64; batch * cout * h * w];
            let up = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
            let b64 = bias.map(up);
            rusting_brain_core::ops::conv::conv2d(&mut want, &up(&x), &up(&g), b64.as_deref(), &spec)
                .unwrap();
            let per_row = 16 * (cin + cout) * w.div_ceil(2);
            for band in [1, 2, 3, 1000] {
                let mut got = vec![f32::NAN; want.len()];
                winograd_banded(&mut got, &x, &g, bias, &spec, band * per_row);
                for (i, (&g, &r)) in got.iter().zip(&want).enumerate() {
                    // Sums of 9 cin products of unit-sized values, through transforms of
                    // additions and halvings: f32 rounding, a few 1e-6 of the magnitudes.
                    assert!(
                        (g as f64 - r).abs() <= 1e-5 * (1.0 + r.abs()) * (cin as f64).sqrt(),
                        "batch {batch} {cin}->{cout} {h}x{w}, bands of {band} rows: element {i} is {g}, the reference {r}"
                    );
                }
            }
        }
    }
}
