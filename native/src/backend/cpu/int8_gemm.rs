//! Int8 GEMM on CPUs with AVX-512 VNNI, for int8 weights with one scale a row (W8A8):
//! `vpdpbusd` multiplies four unsigned bytes by four signed ones and adds the four products
//! to an i32 lane, 64 multiply-adds an instruction where `vdpbf16ps` does 32 and an f32 FMA
//! 16. This is what makes an image model's `Precision::Q8` its fastest path at prompt and
//! image sizes, where the blocked GEMM (13-bit activations, a scale every 32 values) runs
//! at about half the BF16 GEMM's rate.
//!
//! Numerics: exactly core's `q8_matmul` with one block a row. Each activation row is
//! rounded to int8 with its own scale (`simd::quantize_i8`, the reference's rounding bit
//! for bit), stored as `q + 128` (unsigned, as the instruction wants it); the i32 sums are
//! exact (|q + 128| <= 255 and |w| <= 127, so up to [`MAX_K`] values a row cannot
//! overflow), and the weights' column sums times 128 are taken off before the one
//! conversion `d as f32 * sx * sw`, in the reference's order. So every output is the
//! reference's to the bit, whatever the thread count.
//!
//! Layout: A as rows of k/4 words (four bytes of a row, k padded with zeros to a multiple
//! of 4); B (the weight, n rows of k) as panels of 32 weight rows, each a run of k/4 steps
//! of 32 words (word c of step p: bytes 4p..4p+4 of row 32q + c, which is the weight's
//! own storage word p: packing is a transpose of words). A micro-tile of 8 rows x 32
//! columns holds 16 i32 accumulators over the whole of k (a panel at k = 12,288 is 384 KiB,
//! which L2 serves: a step reads 128 bytes of it for 16 instructions), so
//! there is no k slicing and the sums need no partial stores. Buffers are kept between
//! products and not cleared: rows past m and columns past n reach only outputs that are
//! not stored, and every other word is written.
//!
//! AMX: where the CPU has AMX-INT8 and Linux grants the tile data (`simd::has_amx_int8`),
//! the same packed operands go through tiles instead: `tdpbusd` is `vpdpbusd`'s
//! instruction on a 16 x 64-byte tile pair (1,024 multiply-adds where VNNI does 64). A is
//! packed in groups of 16 rows, step by step (k padded with zero words to a multiple of
//! 16; a tile is 16 rows of a step's 16 words, 1 KiB in order: strided rows of A left the
//! tile loads waiting on memory); B tiles are 16 steps of 16 of a panel's words, which is
//! the panel's own layout at a stride of 128 bytes. A block of 32 rows x 32 columns holds four i32
//! tiles over the whole of k, then goes through the same finishing code as VNNI's
//! registers. The sums are the same integers, so the outputs are the same bits.
//!
//! Reference twin: `rusting_brain_core::ops::q8::q8_matmul` (one scale a row);
//! `tests/backend_vs_reference.rs` and the tests below.

#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

use std::cell::RefCell;

use rayon::prelude::*;

use super::simd;

/// Rows of a micro-tile.
const MR: usize = 8;
/// Rows of an AMX block: two tiles of 16 rows.
#[cfg(target_arch = "x86_64")]
const AMX_MR: usize = super::amx::ROWS;
#[cfg(not(target_arch = "x86_64"))]
const AMX_MR: usize = 32;
/// Words of a row an AMX step takes: a tile row is 64 bytes.
const AMX_KW: usize = 16;
/// Columns of a micro-tile and of a packed B panel (two vectors of 16 lanes).
const NR: usize = 32;
/// The longest rows whose sums stay exact in i32: 255 x 127 x 66,311 < 2^31.
pub const MAX_K: usize = 65_536;
/// Below this many rows the product stays on the 4 x 4 tiles of the per-row path: packing
/// the weights costs a pass over them, which a few rows do not repay. Four tiles of rows
/// (one task's worth), not a measured crossing: image models' products have hundreds of
/// rows and more, and LMs' weights are in blocks, which this GEMM does not take.
pub const MIN_ROWS: usize = 32;
/// Packed B past which the tasks grow (as the BF16 GEMM's do; the L3 of a Zen 4 CCD is 32
/// MiB): B then comes from memory fewer times.
const BIG_B_BYTES: usize = 16 << 20;
/// Below this many multiply-adds the product runs on one thread.
const PARALLEL_MACS: usize = 64 * 64 * 64;

/// Whether this GEMM runs here: VNNI is in use (`RB_CPU_ISA`, `RB_CPU_VNNI=0` can turn it
/// off).
pub fn available() -> bool {
    simd::has_vnni()
}

/// Whether [`gemm()`] takes a product of `m` rows of `k` (a per-row int8 weight).
pub fn takes(m: usize, k: usize) -> bool {
    available() && m >= MIN_ROWS && (1..=MAX_K).contains(&k)
}

/// Rows of C a parallel task takes (see `bf16::rows_per_task`), a multiple of the blocks'
/// `mr` rows: four of VNNI's tiles, or one of AMX's blocks (32 rows either way), so a
/// task's packed A (32 rows of k bytes) stays in L2 across the panels; past `big_b` bytes
/// of packed B, more rows, so B comes from memory fewer times.
fn rows_per_task(m: usize, b_bytes: usize, big_b: usize, mr: usize) -> usize {
    let least = (4 * MR).max(mr);
    if b_bytes <= big_b {
        return least;
    }
    m.div_ceil(2 * rayon::current_num_threads().max(1)).next_multiple_of(mr).clamp(least, 32 * MR)
}

/// `out (m x n) = x (m x k) W^T + beta * out` for `w` the weight's bytes (n rows of
/// `stride` bytes, the first k of each the values) and `scales` one a row, with
/// [`takes`]`(m, k)` true and the operands cut to this product.
pub fn gemm(
    out: &mut [f32], x: &[f32], w: &[i8], scales: &[f32], (m, n, k): (usize, usize, usize), beta: f32,
) {
    assert!(x.len() >= m * k);
    let pack = |i: usize, words: &mut [u32]| pack_a_row(words, &x[i * k..(i + 1) * k]);
    gemm_tasks(out, &pack, w, scales, (m, n, k), beta, (BIG_B_BYTES, simd::has_amx_int8()))
}

/// [`gemm()`] with row `i` of x (its `k` values) written by `row(i, buf)` into a buffer of
/// the calling thread's: a convolution's activation rows, each pixel's patch gathered
/// from a channels-last input as it is packed, so the patches never exist whole.
pub fn gemm_rows(
    out: &mut [f32], row: &(dyn Fn(usize, &mut [f32]) + Sync), w: &[i8], scales: &[f32],
    (m, n, k): (usize, usize, usize), beta: f32,
) {
    let pack = |i: usize, words: &mut [u32]| {
        PATCH.with(|cell| {
            let mut buf = cell.borrow_mut();
            buf.resize(k, 0.0);
            row(i, &mut buf);
            pack_a_row(words, &buf)
        })
    };
    gemm_tasks(out, &pack, w, scales, (m, n, k), beta, (BIG_B_BYTES, simd::has_amx_int8()))
}

/// [`gemm()`] with A's rows packed by `pack_a(i, words)` (which returns the row's scale),
/// tasks that grow past `big_b` bytes of packed B, and AMX tiles when `amx` (which the
/// caller has from `simd::has_amx_int8`).
#[allow(clippy::too_many_arguments)]
fn gemm_tasks(
    out: &mut [f32], pack_a: &(dyn Fn(usize, &mut [u32]) -> f32 + Sync), w: &[i8], scales: &[f32],
    (m, n, k): (usize, usize, usize), beta: f32, (big_b, amx): (usize, bool),
) {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(available() && (1..=MAX_K).contains(&k), "the int8 GEMM runs only where takes() said so");
        assert!(!amx || simd::has_amx_int8(), "AMX tiles are used only where has_amx_int8() said so");
        let stride = w.len() / n.max(1);
        assert!(stride >= 4 * k.div_ceil(4) && out.len() >= m * n && scales.len() >= n);
        let kq = k.div_ceil(4);
        // Words a packed row takes: AMX steps through whole tile rows of 16 words.
        let (mr, lda) = if amx { (AMX_MR, kq.next_multiple_of(AMX_KW)) } else { (MR, kq) };
        let parallel = m * n * k >= PARALLEL_MACS && rayon::current_num_threads() > 1;
        let tiles = m.div_ceil(mr);
        let panels = n.div_ceil(NR);
        with_buffers(
            tiles * mr * lda,
            panels * lda * NR,
            tiles * mr,
            panels * NR,
            |apack, bpack, sx, col128| {
                // A: each row rounded to int8 with its own scale, then stored as q + 128;
                // the words past kq zero (they meet whatever B's padding holds). For AMX,
                // groups of 16 rows stored step by step (16 rows of a step's 16 words, then
                // the next step's), so a tile is 1 KiB read in order; for VNNI, rows.
                let group = if amx { AMX_KW } else { 1 };
                let pack_a = |(g, (block, s)): (usize, (&mut [u32], &mut [f32]))| {
                    if group == 1 {
                        if g < m {
                            s[0] = pack_a(g, &mut block[..kq]);
                            block[kq..].fill(0);
                        }
                        return;
                    }
                    A_ROW.with(|cell| {
                        let mut words = cell.borrow_mut();
                        words.resize(lda, 0);
                        for (r, s) in s.iter_mut().enumerate().take(m.saturating_sub(g * group)) {
                            *s = pack_a(g * group + r, &mut words[..kq]);
                            words[kq..].fill(0);
                            super::amx::scatter_row(block, r, &words);
                        }
                    })
                };
                // B: panels of NR weight rows, each kq steps of NR words, and 128 times each
                // row's sum (what the + 128 of A's bytes added to every output of the column).
                let pack_b = |(q, (panel, sums)): (usize, (&mut [u32], &mut [i32]))| {
                    pack_b_panel(panel, sums, q, w, stride, (n, k));
                };
                if parallel {
                    let a_rows = apack.par_chunks_mut(group * lda).zip(sx.par_chunks_mut(group));
                    a_rows.enumerate().with_min_len(16 / group).for_each(pack_a);
                    bpack
                        .par_chunks_mut(lda * NR)
                        .zip(col128.par_chunks_mut(NR))
                        .enumerate()
                        .for_each(pack_b);
                } else {
                    apack.chunks_mut(group * lda).zip(sx.chunks_mut(group)).enumerate().for_each(pack_a);
                    bpack.chunks_mut(lda * NR).zip(col128.chunks_mut(NR)).enumerate().for_each(pack_b);
                }
                let (apack, bpack, sx, col128) = (&*apack, &*bpack, &*sx, &*col128);

                // A task: `rows_per_task` rows of C; for each panel, each block of the task's
                // rows in turn (the panel stays in L2 across them).
                let rows_per_task = rows_per_task(m, bpack.len() * 4, big_b, mr);
                let task = |(t, c): (usize, &mut [f32])| {
                    let first = t * rows_per_task;
                    let task_rows = c.len() / n;
                    // The tile configuration is the thread's: set for the task, released
                    // after it (so a switched-out thread has no tile state to save).
                    // SAFETY: `amx` was checked against has_amx_int8() above.
                    let _tiles = amx.then(|| unsafe { super::amx::Tiles::configure() });
                    for (q, panel) in bpack.chunks(lda * NR).enumerate() {
                        let cols = NR.min(n - q * NR);
                        for r0 in (0..task_rows).step_by(mr) {
                            let row = first + r0;
                            let rows = mr.min(task_rows - r0);
                            let a = &apack[row * lda..(row + mr) * lda];
                            let scaled = (
                                &sx[row..row + mr],
                                &col128[q * NR..(q + 1) * NR],
                                &scales[q * NR..q * NR + cols],
                            );
                            let c = &mut c[r0 * n + q * NR..];
                            if amx {
                                // SAFETY: the tiles are configured for this thread; the block's
                                // mr rows of lda words are in `apack` from row * lda (it holds
                                // whole blocks), lda is a multiple of AMX_KW, the panel holds lda
                                // steps of NR words, and `out` reaches row rows - 1, column
                                // cols - 1 at stride n.
                                unsafe { amx_block(c, n, (rows, cols), a, lda, panel, scaled, beta) };
                            } else {
                                // SAFETY: available() proved AVX-512F, BW and VNNI; the tile's MR
                                // rows of kq words are in `apack` from row * kq (it holds whole
                                // tiles), the panel holds kq steps of NR words, and `out` reaches
                                // row rows - 1, column cols - 1 at stride n.
                                unsafe { tile(c, n, (rows, cols), a, lda, panel, scaled, beta) };
                            }
                        }
                    }
                };
                if parallel {
                    out[..m * n].par_chunks_mut(rows_per_task * n).enumerate().for_each(task);
                } else {
                    out[..m * n].chunks_mut(rows_per_task * n).enumerate().for_each(task);
                }
            },
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (out, pack_a, w, scales, m, n, k, beta, big_b, amx);
        unreachable!("available() is false off x86_64");
    }
}

/// One row of A: `x` rounded to int8 (the reference's rounding), stored as `q + 128` four
/// bytes a word, the last word's bytes past k zero (they meet B's zero padding, so either
/// way they add nothing). Returns the row's scale.
fn pack_a_row(words: &mut [u32], x: &[f32]) -> f32 {
    ROUNDED.with(|cell| {
        let mut q = cell.borrow_mut();
        let scale = simd::quantize_i8_into(x, &mut q);
        let full = x.len() / 4;
        for (word, four) in words.iter_mut().zip(q.chunks_exact(4)) {
            // q + 128 in each byte: flipping the sign bit of a two's complement byte.
            *word = u32::from_le_bytes([four[0] as u8, four[1] as u8, four[2] as u8, four[3] as u8])
                ^ 0x8080_8080;
        }
        if full < words.len() {
            let mut bytes = [0u8; 4];
            for (b, &v) in bytes.iter_mut().zip(&q[4 * full..]) {
                *b = (v as u8) ^ 0x80;
            }
            words[full] = u32::from_le_bytes(bytes);
        }
        scale
    })
}

/// Panel `q` of B: weight rows `32q..32q + 32` (those past n left as they are), word `c`
/// of step `p` the bytes `4p..4p + 4` of row `32q + c`, which are the weight's own storage
/// word `p` (bytes past k there meet A's zero bytes and add nothing), and `sums[c]` 128
/// times that row's sum over its k values.
fn pack_b_panel(
    panel: &mut [u32], sums: &mut [i32], q: usize, w: &[i8], stride: usize, (n, k): (usize, usize),
) {
    let kq = k.div_ceil(4);
    for c in 0..NR.min(n - q * NR) {
        let row = &w[(q * NR + c) * stride..(q * NR + c) * stride + 4 * kq];
        for (p, four) in row.chunks_exact(4).enumerate() {
            panel[p * NR + c] =
                u32::from_le_bytes([four[0] as u8, four[1] as u8, four[2] as u8, four[3] as u8]);
        }
        sums[c] = 128 * row[..k].iter().map(|&v| v as i32).sum::<i32>();
    }
}

thread_local! {
    /// A row's int8 values on their way into A's words.
    static ROUNDED: RefCell<Vec<i8>> = const { RefCell::new(Vec::new()) };
    /// A row's packed words on their way into AMX's groups of 16 rows.
    static A_ROW: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    /// A row [`gemm_rows`] has written, on its way to being rounded.
    static PATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The packed operands, A's scales and B's column sums, kept by the calling thread
    /// between products (see `bf16::with_buffers`).
    static BUFFERS: RefCell<Buffers> = const { RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new())) };
}

/// Packed A, packed B, A's row scales and B's column sums times 128.
type Buffers = (Vec<u32>, Vec<u32>, Vec<f32>, Vec<i32>);

/// Runs `f` on buffers of the lengths given: this thread's kept ones, or new ones if they
/// are in use (a product started inside another's task).
fn with_buffers<R>(
    a_len: usize, b_len: usize, sx_len: usize, sums_len: usize,
    f: impl FnOnce(&mut [u32], &mut [u32], &mut [f32], &mut [i32]) -> R,
) -> R {
    // The packed operands on 64-byte lines, as AMX's tile loads want them.
    use super::amx::aligned;
    BUFFERS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut kept) => {
            let (a, b, sx, sums) = &mut *kept;
            sx.resize(sx_len, 0.0);
            sums.resize(sums_len, 0);
            f(aligned(a, a_len), aligned(b, b_len), sx, sums)
        }
        Err(_) => f(
            aligned(&mut Vec::new(), a_len),
            aligned(&mut Vec::new(), b_len),
            &mut vec![0.0; sx_len],
            &mut vec![0; sums_len],
        ),
    })
}

/// One micro-tile: rows `0..rows` and columns `0..cols` of `out` (stride `ldc`) from MR
/// rows of A (`lda` words apart, `steps = lda` words each) and the panel; `sx` the rows'
/// scales, `col128` 128 times the columns' weight sums, `sw` the columns' scales.
///
/// # Safety
/// The CPU has AVX-512F, BW and VNNI; `a` holds MR * lda words, `panel` lda * NR, `col128`
/// NR; `sx` MR; `out` `(rows - 1) * ldc + cols`; `sw` cols.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    out: &mut [f32], ldc: usize, (rows, cols): (usize, usize), a: &[u32], lda: usize, panel: &[u32],
    (sx, col128, sw): (&[f32], &[i32], &[f32]), beta: f32,
) {
    use std::arch::x86_64::*;
    debug_assert!(a.len() >= MR * lda && panel.len() >= lda * NR && col128.len() >= NR);
    debug_assert!((1..=MR).contains(&rows) && out.len() >= (rows - 1) * ldc + cols && sw.len() >= cols);
    let mut acc = [[_mm512_setzero_si512(); 2]; MR];
    let (ap, bp) = (a.as_ptr(), panel.as_ptr());
    for p in 0..lda {
        // SAFETY (every load): p < lda, so the panel's words p * NR .. p * NR + 32 and
        // A's word r * lda + p are inside the slices, as the contract states.
        let b0 = _mm512_loadu_si512(bp.add(p * NR).cast());
        let b1 = _mm512_loadu_si512(bp.add(p * NR + 16).cast());
        for (r, acc) in acc.iter_mut().enumerate() {
            let w = _mm512_set1_epi32(*ap.add(r * lda + p) as i32);
            acc[0] = _mm512_dpbusd_epi32(acc[0], w, b0);
            acc[1] = _mm512_dpbusd_epi32(acc[1], w, b1);
        }
    }
    // SAFETY: as this function's contract.
    unsafe { finish(out, ldc, (rows, cols), |r, h| acc[r][h], (sx, col128, sw), beta) }
}

/// Rows `0..rows`, columns `0..cols` of `out` (stride `ldc`) from the i32 sums `acc(r, h)`
/// (row r, columns 16h..16h + 16 of the block): `(sum - col128) as f32 * sx * sw`, in the
/// reference's order, plus `beta` times what `out` held.
///
/// # Safety
/// The CPU has AVX-512F; `col128` holds NR values, `sx` rows, `sw` cols, and `out`
/// `(rows - 1) * ldc + cols`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn finish(
    out: &mut [f32], ldc: usize, (rows, cols): (usize, usize),
    acc: impl Fn(usize, usize) -> std::arch::x86_64::__m512i, (sx, col128, sw): (&[f32], &[i32], &[f32]),
    beta: f32,
) {
    use std::arch::x86_64::*;
    let beta_v = _mm512_set1_ps(beta);
    for h in 0..2 {
        let lanes = cols.saturating_sub(16 * h).min(16);
        if lanes == 0 {
            continue;
        }
        let mask = ((1u32 << lanes) - 1) as u16;
        // SAFETY: col128 holds NR values; sw's masked lanes are columns < cols.
        let bias = _mm512_loadu_si512(col128.as_ptr().add(16 * h).cast());
        let swv = _mm512_maskz_loadu_ps(mask, sw.as_ptr().add(16 * h));
        for (r, &sx) in sx.iter().enumerate().take(rows) {
            // d as f32 * sx * sw, in the reference's order (the conversion rounds to
            // nearest, as `as f32` does).
            let d = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc(r, h), bias));
            let mut v = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(sx)), swv);
            // SAFETY: the masked lanes are columns 16h .. 16h + lanes < cols of row r.
            let dst = out.as_mut_ptr().add(r * ldc + 16 * h);
            if beta != 0.0 {
                v = _mm512_add_ps(v, _mm512_mul_ps(beta_v, _mm512_maskz_loadu_ps(mask, dst)));
            }
            _mm512_mask_storeu_ps(dst, mask, v);
        }
    }
}

/// One block of AMX_MR rows x NR columns on AMX tiles: as [`tile`], the i32 sums from
/// `super::amx::block`.
///
/// # Safety
/// The calling thread's tiles are configured (`amx::Tiles`) and AMX-INT8 granted; the CPU
/// has AVX-512F, BW and VNNI; `lda` is a multiple of AMX_KW; `a` holds AMX_MR * lda words
/// (two groups of 16 rows, each step by step), `panel` lda * NR, `col128` NR, `sx`
/// AMX_MR; `out` `(rows - 1) * ldc + cols`; `sw` cols.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn amx_block(
    out: &mut [f32], ldc: usize, (rows, cols): (usize, usize), a: &[u32], lda: usize, panel: &[u32],
    scaled: (&[f32], &[i32], &[f32]), beta: f32,
) {
    use super::amx;
    use std::arch::x86_64::_mm512_loadu_si512;
    debug_assert!(lda.is_multiple_of(AMX_KW) && a.len() >= AMX_MR * lda && panel.len() >= lda * NR);
    debug_assert!((1..=AMX_MR).contains(&rows) && out.len() >= (rows - 1) * ldc + cols);
    let mut sums = amx::Sums([0; AMX_MR * NR]);
    // The panel's steps are rows of NR words; a step of 16 of them is 16 * NR words on.
    let b = amx::BTiles { at: panel.as_ptr(), stride: NR * 4, step: AMX_KW * NR * 4 };
    // SAFETY: the tiles and AMX-INT8 are the caller's contract; both groups of A hold
    // lda / 16 steps, and the panel lda steps of NR words.
    unsafe { amx::block(amx::Out::sums(&mut sums), a, b, lda / AMX_KW, 2, amx::Kind::U8I8) };
    let sums = &sums.0;
    // SAFETY: row r < AMX_MR, 16h + 16 <= NR: inside `sums`; the rest is the contract.
    unsafe {
        finish(
            out,
            ldc,
            (rows, cols),
            |r, h| _mm512_loadu_si512(sums.as_ptr().add(r * NR + 16 * h).cast()),
            scaled,
            beta,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusting_brain_core::ops::q8;
    use rusting_brain_core::Rng;

    /// Every output is the reference's to the bit, on VNNI and on AMX tiles where the CPU
    /// has them: awkward m, n and k (k not a multiple of four nor of AMX's 64, n off the
    /// panels, m off the tiles, blocks and tasks), beta 0 and not, large values
    /// (sums near the i32 range's edge at the longest k tested), packing buffers left full
    /// of other products' words, and tasks grown by a small `big_b`.
    #[test]
    fn outputs_are_the_references_to_the_bit() {
        if !available() {
            println!("no AVX-512 VNNI here: nothing to check");
            return;
        }
        let mut rng = Rng::new(41);
        for &(m, n, k, big_b) in &[
            (32, 1, 1, BIG_B_BYTES),
            (33, 33, 3, BIG_B_BYTES),
            (40, 31, 17, BIG_B_BYTES),
            (65, 70, 130, BIG_B_BYTES),
            (100, 64, 257, 0),
            (41, 96, 5000, BIG_B_BYTES),
            (130, 45, 64, 0),
            (64, 32, 1024, BIG_B_BYTES),
        ] {
            // VNNI's tiles, and AMX's where the CPU has them (the same bits either way).
            for (beta, amx) in [(0.0f32, false), (0.5, false), (0.0, true), (0.5, true)] {
                if amx && !simd::has_amx_int8() {
                    continue;
                }
                BUFFERS.with(|b| {
                    let mut b = b.borrow_mut();
                    b.0 = vec![0xdead_beef; 1 << 16];
                    b.1 = vec![0x7f7f_7f7f; 1 << 18];
                    b.2 = vec![f32::NAN; 1 << 10];
                    b.3 = vec![i32::MAX; 1 << 10];
                });
                let x = rng.normal_vec(m * k, 3.0);
                let wf = rng.normal_vec(n * k, 0.1);
                let (packed, scales) = q8::quantize_rows(&wf, n, k).unwrap();
                let init = rng.normal_vec(m * n, 1.0);
                let mut want = init.clone();
                q8::q8_matmul(&mut want, &x, &packed, &scales, m, n, k, beta).unwrap();
                let mut got = init.clone();
                // SAFETY: as q8's `as_i8`: bytes of the packed f32 words.
                let w = unsafe { std::slice::from_raw_parts(packed.as_ptr() as *const i8, packed.len() * 4) };
                let pack = |i: usize, words: &mut [u32]| pack_a_row(words, &x[i * k..(i + 1) * k]);
                gemm_tasks(&mut got, &pack, w, &scales, (m, n, k), beta, (big_b, amx));
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "{m}x{n}x{k} beta {beta} amx {amx}: output {i}: {g} against {e}"
                    );
                }
            }
        }
    }

    /// The i32 sums are exact at the longest k taken: every activation and weight at the
    /// extremes of their range, where a wrapped sum would be off by 2^32.
    #[test]
    fn sums_at_the_longest_rows_do_not_wrap() {
        if !available() {
            println!("no AVX-512 VNNI here: nothing to check");
            return;
        }
        let (m, n, k) = (MIN_ROWS, 2, MAX_K);
        let x = vec![1.0f32; m * k];
        let mut wf = vec![1.0f32; n * k];
        wf[k..].iter_mut().for_each(|v| *v = -1.0);
        let (packed, scales) = q8::quantize_rows(&wf, n, k).unwrap();
        let w = unsafe { std::slice::from_raw_parts(packed.as_ptr() as *const i8, packed.len() * 4) };
        let mut got = vec![0.0f32; m * n];
        gemm(&mut got, &x, w, &scales, (m, n, k), 0.0);
        let mut want = vec![0.0f32; m * n];
        q8::q8_matmul(&mut want, &x, &packed, &scales, m, n, k, 0.0).unwrap();
        assert_eq!(got, want);
        assert!((got[0] - k as f32).abs() <= 1e-3 * k as f32 && (got[1] + k as f32).abs() <= 1e-3 * k as f32);
    }
}
