//! BF16 GEMM on CPUs with AVX512_BF16: `vdpbf16ps` multiplies two pairs of bf16 values
//! and adds both products to an f32 lane, 32 multiply-adds an instruction where an f32 FMA
//! does 16, so `set_mixed_precision(true)` is faster and not only rounder.
//!
//! Numerics: the operands are rounded to bf16 as the reference rounds them (`round_bf16`:
//! nearest, ties to even; `core::ops::matmul`), while packing (`vcvtne2ps2bf16`, or the
//! same rounding in integer operations for the ends of rows). Products of
//! two bf16 values are exact in f32, and the instruction adds them into the f32
//! accumulator with round-to-nearest, so the result differs from the reference (the same
//! exact products summed in f64) by f32 summation error alone, as the f32 GEMM's does.
//! The instruction treats subnormal inputs and results as zero: bf16 operands below 2^-126
//! (1.2e-38) count as 0. Each output is summed along k by one thread, in order, so the bits
//! do not depend on the thread count.
//!
//! Layout: op(A) as u32 words, each the bf16 pair `(a[i][2p], a[i][2p+1])` (low half
//! first, as the instruction pairs them): row by row (k/2 words a row) when A is stored as
//! op(A), so packing is a contiguous conversion; in tiles of 8 rows, k/2 steps of 8 words,
//! when A is stored transposed, where a step of 8 rows is what memory holds together.
//! op(B) as panels of 32 columns, each a run of k/2 steps of 32 such pairs. A micro-tile
//! of 8 rows x 32 columns holds 16 accumulators; a step loads two B vectors and broadcasts
//! one A word per row; 128 steps at a time, so the panel's slice stays in L1 across a
//! task's tiles. The buffers are not cleared between products: rows of A past m and
//! columns of B past n only reach outputs that are not stored, and every other word is
//! written.
//!
//! Reference twin: `rusting_brain_core::ops::matmul::matmul` with `OperandPrecision::Bf16`;
//! `tests/backend_vs_reference.rs`.

// Off x86-64 `available()` is false and nothing else here runs.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]

use std::cell::RefCell;
use std::sync::OnceLock;

use rayon::prelude::*;
#[cfg(test)]
use rusting_brain_core::ops::matmul::round_bf16;
use rusting_brain_core::ops::matmul::MatmulSpec;

use super::simd;

/// Rows of a micro-tile.
const MR: usize = 8;
/// Columns of a micro-tile and of a packed B panel (two vectors of 16 lanes).
const NR: usize = 32;
/// Rows of C a parallel task takes: every B panel's slice is reused across them from L1,
/// and a task reads the whole of packed B once. Four tiles while packed B stays in the
/// last-level cache; past `BIG_B_BYTES`, up to 32 tiles, so B comes from memory fewer
/// times (FLUX.2-klein's 3072 x 27648 weights pack to 170 MB: at four tiles a task, a
/// 1536-token product read them 48 times), while a few tasks a thread keep the threads
/// evenly busy. On 2 Zen 4 cores (`bench_gemm`, alternating builds) 1536 x 27648 x 3072
/// went from 297-331 to 383-394 GFLOP/s and 1536 x 3072 x 12288 from 318-329 to 343-390;
/// on B in cache 32-row tasks stayed the faster (1024 cubed 365 against 299 at 256 rows).
fn rows_per_task(m: usize, b_bytes: usize, big_b: usize) -> usize {
    if b_bytes <= big_b {
        return 4 * MR;
    }
    m.div_ceil(2 * rayon::current_num_threads().max(1)).next_multiple_of(MR).clamp(4 * MR, 32 * MR)
}

/// Packed B past which [`rows_per_task`] grows the tasks (the L3 of a Zen 4 CCD is 32 MiB).
const BIG_B_BYTES: usize = 16 << 20;
/// Steps (pairs of k) a tile runs before moving on: a panel's slice (KC x NR words, 16 KiB)
/// and four tiles' slices (4 x KC x MR words) fit in L1 together.
const KC: usize = 128;
/// Below this many multiply-adds the product runs on one thread.
const PARALLEL_MACS: usize = 64 * 64 * 64;

/// Whether the BF16 products run here: AVX-512 is the path in use (`RB_CPU_ISA` did not
/// lower it), the CPU has AVX512_BF16, and `RB_CPU_BF16=0` did not turn it off.
pub fn available() -> bool {
    static BF16: OnceLock<bool> = OnceLock::new();
    *BF16.get_or_init(|| {
        let off = std::env::var("RB_CPU_BF16").is_ok_and(|v| v.trim() == "0");
        #[cfg(target_arch = "x86_64")]
        {
            !off && simd::isa() == simd::Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = off;
            false
        }
    })
}

/// The bf16 bits of `x` rounded as the reference rounds it (`round_bf16`, which is the
/// `half` crate's conversion: nearest, ties to even, a NaN kept as a quiet NaN), in integer
/// operations the packing loops inline.
#[inline(always)]
pub(crate) fn bits(x: f32) -> u32 {
    let b = x.to_bits();
    if x.is_nan() {
        return (b >> 16) | 0x40;
    }
    // Round up when the dropped half is over one half, or exactly one half with the kept
    // part odd.
    let up = (b & 0x8000) != 0 && (b & 0x1_7fff) != 0;
    (b >> 16) + up as u32
}

/// One problem, `c = alpha * op(A) op(B) + beta * c`, with `m, n, k >= 1` and the
/// operands already cut to this problem (as `spec.check` proved). Only where
/// [`available`] said so.
pub fn gemm(c: &mut [f32], a: &[f32], b: &[f32], spec: &MatmulSpec) {
    if simd::has_amx_bf16() {
        gemm_amx(c, a, b, spec, BIG_B_BYTES);
    } else {
        gemm_tasks(c, a, b, spec, BIG_B_BYTES);
    }
}

/// [`gemm`] on AMX-BF16 tiles (see `super::amx`): op(A) packed in groups of 16 rows step
/// by step (k/2 words a row padded with zeros to a multiple of 16), op(B) in the same
/// panels as [`gemm_tasks`]'s with zero steps after k/2 (a NaN left there by an earlier
/// product would meet A's zeros and reach every sum), blocks of 32 rows x 32 columns over
/// the whole of k. The same rounded operands and exact products as the AVX512_BF16 tiles;
/// only the order of the f32 additions differs, and each output is still summed by one
/// thread in a fixed order, so the bits do not depend on the thread count.
#[cfg(target_arch = "x86_64")]
fn gemm_amx(c: &mut [f32], a: &[f32], b: &[f32], spec: &MatmulSpec, big_b: usize) {
    use super::amx;
    assert!(available() && simd::has_amx_bf16(), "the AMX GEMM runs only where has_amx_bf16() said so");
    let (m, n, k) = (spec.m, spec.n, spec.k);
    let kp = k.div_ceil(2);
    let lda = kp.next_multiple_of(amx::STEP_WORDS);
    let parallel = m * n * k >= PARALLEL_MACS && rayon::current_num_threads() > 1;
    let blocks = m.div_ceil(amx::ROWS);
    let panels = n.div_ceil(NR);
    with_buffers(blocks * amx::ROWS * lda, panels * lda * NR, |apack, bpack| {
        // A: a group of 16 rows at a time, each row's words (the pair (a[i][2p],
        // a[i][2p + 1]) for step p) gathered, zero past kp, then put in the group's steps.
        let pack_a = |(g, group): (usize, &mut [u32])| {
            let mut words = vec![0u32; lda];
            for r in 0..amx::GROUP.min(m.saturating_sub(g * amx::GROUP)) {
                let i = g * amx::GROUP + r;
                let mut p = 0;
                if !spec.trans_a {
                    // A stored as op(A): 32 floats a conversion, as `pack_a_rows`.
                    let row = &a[i * k..(i + 1) * k];
                    while p + 16 <= k / 2 {
                        // SAFETY: available() proved AVX-512F and AVX512_BF16; floats 2p..2p + 32
                        // are in the row, words p..p + 16 in `words`.
                        unsafe {
                            let run = words_of_run(row.as_ptr().add(2 * p));
                            std::arch::x86_64::_mm512_storeu_si512(words.as_mut_ptr().add(p).cast(), run);
                        }
                        p += 16;
                    }
                }
                for (p, w) in words[..kp].iter_mut().enumerate().skip(p) {
                    let at = |kk: usize| if spec.trans_a { a[kk * m + i] } else { a[i * k + kk] };
                    let hi = if 2 * p + 1 < k { bits(at(2 * p + 1)) } else { 0 };
                    *w = bits(at(2 * p)) | hi << 16;
                }
                amx::scatter_row(group, r, &words);
            }
        };
        // B: the panels of `gemm_tasks`, steps kp..lda zero.
        // SAFETY: available() proved AVX-512F and AVX512_BF16; each call gets its own panel.
        let pack_b = |(q, panel): (usize, &mut [u32])| unsafe {
            pack_b_panel(panel, q, b, spec);
            panel[kp * NR..].fill(0);
        };
        if parallel {
            apack.par_chunks_mut(amx::GROUP * lda).enumerate().for_each(pack_a);
            bpack.par_chunks_mut(lda * NR).enumerate().for_each(pack_b);
        } else {
            apack.chunks_mut(amx::GROUP * lda).enumerate().for_each(pack_a);
            bpack.chunks_mut(lda * NR).enumerate().for_each(pack_b);
        }
        let (apack, bpack) = (&*apack, &*bpack);
        let rows_per_task = rows_per_task(m, bpack.len() * 4, big_b).next_multiple_of(amx::ROWS);
        let task = |(t, c): (usize, &mut [f32])| {
            let first = t * rows_per_task;
            let task_rows = c.len() / n;
            let mut sums = amx::Sums([0; amx::ROWS * 32]);
            // SAFETY: has_amx_bf16() granted the tiles (asserted above).
            let _tiles = unsafe { amx::Tiles::configure() };
            for (q, panel) in bpack.chunks(lda * NR).enumerate() {
                let cols = NR.min(n - q * NR);
                for r0 in (0..task_rows).step_by(amx::ROWS) {
                    let row = first + r0;
                    let a = &apack[row * lda..(row + amx::ROWS) * lda];
                    let bt =
                        amx::BTiles { at: panel.as_ptr(), stride: NR * 4, step: amx::STEP_WORDS * NR * 4 };
                    // SAFETY: the tiles are configured and AMX-BF16 is there; both groups of
                    // the block hold lda / 16 steps (apack holds whole blocks), the panel lda
                    // steps of NR words.
                    unsafe {
                        amx::block(
                            amx::Out::sums(&mut sums),
                            a,
                            bt,
                            lda / amx::STEP_WORDS,
                            2,
                            amx::Kind::Bf16,
                        )
                    };
                    for r in 0..amx::ROWS.min(task_rows - r0) {
                        let dst = &mut c[(r0 + r) * n + q * NR..(r0 + r) * n + q * NR + cols];
                        for (x, &v) in dst.iter_mut().zip(&sums.0[r * 32..]) {
                            let v = spec.alpha * f32::from_bits(v);
                            *x = if spec.beta != 0.0 { v + spec.beta * *x } else { v };
                        }
                    }
                }
            }
        };
        if parallel {
            c.par_chunks_mut(rows_per_task * n).enumerate().for_each(task);
        } else {
            c.chunks_mut(rows_per_task * n).enumerate().for_each(task);
        }
    });
}

#[cfg(not(target_arch = "x86_64"))]
fn gemm_amx(_: &mut [f32], _: &[f32], _: &[f32], _: &MatmulSpec, _: usize) {
    unreachable!("AMX is x86-64's");
}

/// [`gemm`] with tasks that grow past `big_b` bytes of packed B (see [`rows_per_task`]).
fn gemm_tasks(c: &mut [f32], a: &[f32], b: &[f32], spec: &MatmulSpec, big_b: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(available(), "the BF16 GEMM runs only where available() said so");
        let (m, n, k) = (spec.m, spec.n, spec.k);
        let kp = k.div_ceil(2);
        let parallel = m * n * k >= PARALLEL_MACS && rayon::current_num_threads() > 1;

        // A: tiles of MR rows (the last one's rows past m left as they are), each row k/2
        // words when A is op(A), or
        // k/2 steps of MR words when A is transposed (step p of row r: the pair
        // (a[r][2p], a[r][2p+1]); the high half is zero when k is odd).
        let tiles = m.div_ceil(MR);
        let panels = n.div_ceil(NR);
        with_buffers(tiles * kp * MR, panels * kp * NR, |apack, bpack| {
            // SAFETY (both packs): available() proved AVX-512F and AVX512_BF16; each call
            // gets its own tile or panel, sized as the function requires.
            // A transposed is packed A_GROUP tiles at a time (see `pack_a_group_transposed`).
            let a_unit = if spec.trans_a { A_GROUP } else { 1 } * kp * MR;
            let pack_a = |(t, tiles): (usize, &mut [u32])| unsafe {
                if spec.trans_a {
                    pack_a_group_transposed(tiles, t * A_GROUP, a, spec)
                } else {
                    pack_a_rows(tiles, t, a, spec)
                }
            };
            // B: panels of NR columns (columns past n left as they are), each k/2 steps of
            // NR words.
            let pack_b = |(q, panel): (usize, &mut [u32])| unsafe { pack_b_panel(panel, q, b, spec) };
            if parallel {
                apack.par_chunks_mut(a_unit).enumerate().for_each(pack_a);
                bpack.par_chunks_mut(kp * NR).enumerate().for_each(pack_b);
            } else {
                apack.chunks_mut(a_unit).enumerate().for_each(pack_a);
                bpack.chunks_mut(kp * NR).enumerate().for_each(pack_b);
            }

            // A task: `task_rows` rows of C (rows_per_task). For each panel, KC steps at a time (a panel's
            // slice and the task's tiles' slices stay in L1 together), each tile in turn; the
            // first slice applies beta, the later ones add to what the first wrote.
            let rows_per_task = rows_per_task(m, bpack.len() * 4, big_b);
            let task = |(t, c): (usize, &mut [f32])| {
                let first = t * rows_per_task;
                let task_rows = c.len() / n;
                for (q, panel) in bpack.chunks(kp * NR).enumerate() {
                    let cols = NR.min(n - q * NR);
                    for p0 in (0..kp).step_by(KC) {
                        let steps = KC.min(kp - p0);
                        let (beta, read) = if p0 == 0 { (spec.beta, spec.beta != 0.0) } else { (1.0, true) };
                        for r0 in (0..task_rows).step_by(MR) {
                            let t = (first + r0) / MR;
                            let slice = &panel[p0 * NR..(p0 + steps) * NR];
                            let out = &mut c[r0 * n + q * NR..];
                            let rows = MR.min(task_rows - r0);
                            let (alpha, tile_start) = (spec.alpha, t * kp * MR);
                            // SAFETY: available() proved AVX-512F and AVX512_BF16; the tile's
                            // words (MR rows of kp, or kp steps of MR) are in `apack` from
                            // tile_start, `slice` holds `steps` steps of NR, and `out` reaches
                            // row rows - 1, column cols - 1 at stride n.
                            unsafe {
                                if spec.trans_a {
                                    let a = &apack[tile_start + p0 * MR..tile_start + (p0 + steps) * MR];
                                    tile::<false>(out, n, rows, cols, a, 0, slice, steps, alpha, beta, read)
                                } else {
                                    let a = &apack[tile_start + p0..tile_start + kp * MR];
                                    tile::<true>(out, n, rows, cols, a, kp, slice, steps, alpha, beta, read)
                                }
                            };
                        }
                    }
                }
            };
            if parallel {
                c.par_chunks_mut(rows_per_task * n).enumerate().for_each(task);
            } else {
                c.chunks_mut(rows_per_task * n).enumerate().for_each(task);
            }
        });
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (c, a, b, spec, big_b);
        unreachable!("available() is false off x86_64");
    }
}

thread_local! {
    /// The packed operands' buffers, kept by the calling thread between products: a fresh
    /// allocation of megabytes is a fresh mapping on most allocators, and its page faults
    /// cost as much as the packing.
    static BUFFERS: RefCell<[Vec<u32>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

/// Runs `f` on buffers of `a_len` and `b_len` words: this thread's kept ones (holding
/// whatever the last product left), or new ones if they are in use (a product started by
/// a task this thread picked up while waiting inside another). Clearing them cost 7-11% of
/// a training step's products, and the packers write every word that reaches a stored
/// output.
fn with_buffers<R>(a_len: usize, b_len: usize, f: impl FnOnce(&mut [u32], &mut [u32]) -> R) -> R {
    // On 64-byte lines, as AMX's tile loads want them.
    use super::amx::aligned;
    BUFFERS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut kept) => {
            let [a, b] = &mut *kept;
            f(aligned(a, a_len), aligned(b, b_len))
        }
        Err(_) => f(aligned(&mut Vec::new(), a_len), aligned(&mut Vec::new(), b_len)),
    })
}

/// Sixteen words from 32 consecutive floats: word j is the pair (x[2j], x[2j+1]).
/// Rounding is the hardware's: nearest, ties to even, NaN kept quiet, as [`bits`]; a
/// subnormal becomes zero, as `vdpbf16ps` would read it anyway.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn words_of_run(x: *const f32) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    std::mem::transmute(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x.add(16)), _mm512_loadu_ps(x)))
}

/// Sixteen words from two rows of 16 floats (lanes outside `mask` read as zero): word j is
/// the pair (lo[j], hi[j]); `hi` None gives zero high halves.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn words_of_rows(lo: *const f32, hi: Option<*const f32>, mask: u16) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let half = |x: *const f32| {
        let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, x)));
        _mm512_cvtepu16_epi32(h)
    };
    let low = half(lo);
    match hi {
        Some(hi) => _mm512_or_si512(low, _mm512_slli_epi32::<16>(half(hi))),
        None => low,
    }
}

/// The k/2 words of one contiguous row of k floats (the pair (row[2p], row[2p + 1]) for
/// step p; a zero high half when k is odd), word p stored at `out[p * stride]`.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16; `out` reaches index (k/2 rounded up - 1) * stride.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn scatter_row(row: &[f32], out: &mut [u32], stride: usize) {
    use std::arch::x86_64::*;
    let (full, kp) = (row.len() / 2, row.len().div_ceil(2));
    let mut p = 0;
    let mut words = [0u32; 16];
    while p + 16 <= full {
        _mm512_storeu_si512(words.as_mut_ptr().cast(), words_of_run(row.as_ptr().add(2 * p)));
        for (j, &w) in words.iter().enumerate() {
            out[(p + j) * stride] = w;
        }
        p += 16;
    }
    for p in p..kp {
        let hi = row.get(2 * p + 1).map_or(0, |&v| bits(v));
        out[p * stride] = bits(row[2 * p]) | hi << 16;
    }
}

/// Packs tile `t` of op(A) (MR rows from row t * MR; see [`gemm`]) into `tile` (MR rows
/// of kp words) when A is stored as op(A): each row converted in place of its own, 32
/// floats a step. The rows of the last tile past m are left as they are.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16; `a` is A as `spec` describes it, not transposed;
/// `tile` holds MR * kp words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_a_rows(tile: &mut [u32], t: usize, a: &[f32], spec: &MatmulSpec) {
    use std::arch::x86_64::*;
    debug_assert!(!spec.trans_a);
    let (m, k) = (spec.m, spec.k);
    let kp = k.div_ceil(2);
    for (r, out) in tile.chunks_exact_mut(kp).enumerate().take(MR.min(m - t * MR)) {
        let row = &a[(t * MR + r) * k..(t * MR + r + 1) * k];
        let mut p = 0;
        while p + 16 <= k / 2 {
            _mm512_storeu_si512(out.as_mut_ptr().add(p).cast(), words_of_run(row.as_ptr().add(2 * p)));
            p += 16;
        }
        for p in p..kp {
            let hi = row.get(2 * p + 1).map_or(0, |&v| bits(v));
            out[p] = bits(row[2 * p]) | hi << 16;
        }
    }
}

/// Tiles of a transposed op(A) packed together: each step reads 16 x A_GROUP/2
/// consecutive floats of two stored rows (whole cache lines) instead of 8 per tile.
const A_GROUP: usize = 4;

/// Packs the tiles from `first` (as many as `tiles` holds, at most [`A_GROUP`]) of op(A)
/// when A is stored transposed: op(A)[i][p] = a[p * m + i], so step p of consecutive rows
/// of op(A) is a contiguous run of stored rows 2p and 2p + 1. One tile at a time read 32
/// bytes of each stored row per pass, a stride of m floats apart: at the LM head's
/// gradient (m = 4096, 16 KiB apart) a new page every read and 40% of the product's time.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16; `a` is A as `spec` describes it; `tiles` holds
/// whole tiles (kp * MR words each) starting at tile `first`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_a_group_transposed(tiles: &mut [u32], first: usize, a: &[f32], spec: &MatmulSpec) {
    use std::arch::x86_64::*;
    let (m, k) = (spec.m, spec.k);
    let kp = k.div_ceil(2);
    let count = tiles.len() / (kp * MR);
    let i0 = first * MR;
    for p in 0..kp {
        // Sixteen rows of op(A) a pass: the low eight words go to one tile, the high eight
        // to the next.
        for pair in 0..count.div_ceil(2) {
            let i = i0 + 16 * pair;
            let lanes = m.saturating_sub(i).min(16);
            if lanes == 0 {
                break;
            }
            let mask = ((1u32 << lanes) - 1) as u16;
            let lo = a.as_ptr().add(2 * p * m + i);
            let hi = (2 * p + 1 < k).then(|| a.as_ptr().add((2 * p + 1) * m + i));
            let words = words_of_rows(lo, hi, mask);
            let t = 2 * pair;
            // Lanes past m read as zeros (masked loads); they reach only rows not stored.
            _mm256_storeu_si256(
                tiles.as_mut_ptr().add((t * kp + p) * MR).cast(),
                _mm512_castsi512_si256(words),
            );
            if t + 1 < count {
                _mm256_storeu_si256(
                    tiles.as_mut_ptr().add(((t + 1) * kp + p) * MR).cast(),
                    _mm512_extracti64x4_epi64::<1>(words),
                );
            }
        }
    }
}

/// Packs panel `q` of op(B) (NR columns from column q * NR; see [`gemm`]) into `panel`
/// (kp * NR words; columns past n are left as they are).
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16; `b` is B as `spec` describes it.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pack_b_panel(panel: &mut [u32], q: usize, b: &[f32], spec: &MatmulSpec) {
    use std::arch::x86_64::*;
    let (n, k) = (spec.n, spec.k);
    let kp = k.div_ceil(2);
    let cols = NR.min(n - q * NR);
    if spec.trans_b {
        // op(B)[p][j] = b[j * k + p]: each column of op(B) is a contiguous row of b; its
        // words go NR apart.
        for jj in 0..cols {
            scatter_row(&b[(q * NR + jj) * k..(q * NR + jj + 1) * k], &mut panel[jj..], NR);
        }
    } else {
        // op(B)[p][j] = b[p * n + j]: rows 2p and 2p + 1 give step p of 16 columns at once.
        for p in 0..kp {
            for h in 0..NR / 16 {
                let lanes = cols.saturating_sub(16 * h).min(16);
                if lanes == 0 {
                    break;
                }
                let mask = ((1u32 << lanes) - 1) as u16;
                let col = q * NR + 16 * h;
                let lo = b.as_ptr().add(2 * p * n + col);
                let hi = (2 * p + 1 < k).then(|| b.as_ptr().add((2 * p + 1) * n + col));
                _mm512_mask_storeu_epi32(
                    panel.as_mut_ptr().add(p * NR + 16 * h).cast(),
                    mask,
                    words_of_rows(lo, hi, mask),
                );
            }
        }
    }
}

/// One MR x NR tile over `steps` steps: `out[r * ldc + j] = alpha * sum + beta * out[..]`
/// (`out` is read only when `read`) for the first `rows` rows and `cols` columns (the rest
/// of the tile is computed from padding and not stored). Row r's word for step p is
/// `a[r * lda + p]` when `ROW_MAJOR`, else `a[p * MR + r]`.
///
/// # Safety
/// The CPU has AVX-512F and AVX512_BF16; `a` holds (MR - 1) * lda + steps words when
/// `ROW_MAJOR`, else steps * MR; `panel` steps * NR; `out` `(rows - 1) * ldc + cols`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const ROW_MAJOR: bool>(
    out: &mut [f32], ldc: usize, rows: usize, cols: usize, a: &[u32], lda: usize, panel: &[u32],
    steps: usize, alpha: f32, beta: f32, read: bool,
) {
    use std::arch::x86_64::*;
    debug_assert!(panel.len() >= steps * NR);
    debug_assert!(if ROW_MAJOR { a.len() >= (MR - 1) * lda + steps } else { a.len() >= steps * MR });
    debug_assert!(rows >= 1 && out.len() >= (rows - 1) * ldc + cols);
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    let (ap, bp) = (a.as_ptr(), panel.as_ptr());
    for p in 0..steps {
        // SAFETY (every load): p < steps, so p * NR + 32 <= steps * NR words of the panel,
        // and the word of `a` is inside it as the function's contract states.
        let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(p * NR).cast()));
        let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(p * NR + 16).cast()));
        for (r, acc) in acc.iter_mut().enumerate() {
            let at = if ROW_MAJOR { r * lda + p } else { p * MR + r };
            let w: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ap.add(at) as i32));
            acc[0] = _mm512_dpbf16_ps(acc[0], w, b0);
            acc[1] = _mm512_dpbf16_ps(acc[1], w, b1);
        }
    }
    let alpha = _mm512_set1_ps(alpha);
    let beta_v = _mm512_set1_ps(beta);
    for (r, acc) in acc.iter().enumerate().take(rows) {
        for (h, &sum) in acc.iter().enumerate() {
            let lanes = cols.saturating_sub(16 * h).min(16);
            if lanes == 0 {
                continue;
            }
            let mask = ((1u32 << lanes) - 1) as u16;
            // SAFETY: the masked lanes are columns 16h .. 16h + lanes < cols of row r.
            let dst = out.as_mut_ptr().add(r * ldc + 16 * h);
            let mut v = _mm512_mul_ps(alpha, sum);
            if read {
                let old = _mm512_maskz_loadu_ps(mask, dst);
                v = _mm512_add_ps(v, _mm512_mul_ps(beta_v, old));
            }
            _mm512_mask_storeu_ps(dst, mask, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Products on packing buffers full of NaN words, as an earlier product may leave
    /// them (they are not cleared): every word that reaches a stored output is written,
    /// for both layouts of A, both of B, odd k, and m and n off the tile and group sizes.
    #[test]
    fn stale_packing_buffers_never_reach_the_outputs() {
        use rusting_brain_core::backend::MatmulOps;
        use rusting_brain_core::backend::OperandPrecision;
        use rusting_brain_core::{ReferenceBackend, Rng};
        if !available() {
            println!("no AVX512_BF16 here: nothing to check");
            return;
        }
        let mut rng = Rng::new(31);
        // The last with every B counted large: tasks of many rows, the last one short.
        for &(m, n, k, big_b) in &[
            (1, 7, 3, BIG_B_BYTES),
            (9, 33, 17, BIG_B_BYTES),
            (33, 40, 31, BIG_B_BYTES),
            (41, 65, 2, BIG_B_BYTES),
            (64, 64, 300, BIG_B_BYTES),
            (300, 40, 33, 0),
        ] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                // A quiet NaN in both halves of every word, more words than any of these
                // products packs.
                BUFFERS.with(|b| {
                    for v in b.borrow_mut().iter_mut() {
                        v.clear();
                        v.resize(1 << 16, 0x7fc0_7fc0);
                    }
                });
                let (a, b) = (rng.normal_vec(m * k, 1.0), rng.normal_vec(k * n, 1.0));
                let spec = MatmulSpec::new(m, n, k).trans_a(ta).trans_b(tb).precision(OperandPrecision::Bf16);
                let mut want = vec![0.0; m * n];
                ReferenceBackend.matmul(&mut want, &a, &b, &spec).unwrap();
                // The AVX512_BF16 tiles, and the AMX ones where the CPU has them.
                for amx in [false, true] {
                    if amx && !simd::has_amx_bf16() {
                        continue;
                    }
                    BUFFERS.with(|b| {
                        for v in b.borrow_mut().iter_mut() {
                            v.clear();
                            v.resize(1 << 16, 0x7fc0_7fc0);
                        }
                    });
                    let mut got = vec![f32::NAN; m * n];
                    if amx {
                        gemm_amx(&mut got, &a, &b, &spec, big_b);
                    } else {
                        gemm_tasks(&mut got, &a, &b, &spec, big_b);
                    }
                    let name = format!("{m}x{n}x{k} trans {ta} {tb} amx {amx}");
                    // The same rounded operands and exact products; the sums' f32 rounding
                    // alone differs (the reference sums in f64).
                    let err = rusting_brain_test_support::rel_to_scale(&name, &got, &want);
                    assert!(err < 1e-5, "{name}: {err:e} of the scale");
                }
            }
        }
    }

    /// The packing's rounding is the reference's, bit for bit: ties both ways, the values
    /// either side of them, the largest finite value (which rounds to infinity), infinities,
    /// subnormals, zeros of both signs and NaNs with payloads.
    #[test]
    fn packing_rounds_as_the_reference() {
        let mut values =
            vec![0.0f32, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN, f32::MIN_POSITIVE];
        values.extend([
            1e-40f32,
            -3e-39,
            f32::from_bits(1),
            f32::NAN,
            f32::from_bits(0x7fa0_0001),
            f32::from_bits(0xffc0_1234),
        ]);
        let mut state = 0x1234_5678u32;
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            values.push(f32::from_bits(state));
        }
        for hi in [0x3f80u32, 0x3f81, 0x4049, 0xc049, 0x0001, 0x7f7f] {
            for lo in [0x7fffu32, 0x8000, 0x8001, 0x0000, 0xffff] {
                values.push(f32::from_bits(hi << 16 | lo));
            }
        }
        for v in values {
            let want = round_bf16(v).to_bits() >> 16;
            assert_eq!(bits(v), want, "{v:e} ({:#010x})", v.to_bits());
        }
    }
}
