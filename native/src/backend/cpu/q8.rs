//! Int8 products on the CPU: each activation row is rounded to int8 (its own scale), then
//! int8 x int8 dot products in i32 — AVX-512 VNNI `vpdpbusd` where the CPU has it, widening
//! SIMD loops elsewhere — exactly the integers the reference computes. The weights cross
//! the memory bus at one byte each, which is what decoding is bound by.
//! Twin of `rusting_brain_core::ops::q8`.

use rayon::prelude::*;
use rusting_brain_core::error::{check_len, check_range, product};
use rusting_brain_core::ops::attention::AttentionSpec;
use rusting_brain_core::ops::embedding::check_ids;
use rusting_brain_core::ops::q4::is_q4;
use rusting_brain_core::ops::q8::{blocks_of, check_q8, check_q8_matmul, packed_cols, Q8_BLOCK};
use rusting_brain_core::ops::rope::RopeSpec;
use rusting_brain_core::Result;

use super::shared_buf::SharedBuf;
use super::{simd, team};
use crate::backend::cpu::fused_swiglu_row;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::MatmulSpec;
use rusting_brain_core::backend::Q8Attention;
use rusting_brain_core::backend::Q8Ops;
use rusting_brain_core::backend::Q8Product;

/// int8 weights below which a decode product stays on the calling thread: handing half of
/// a 32 KiB matrix to the other core costs about what reading it does.
pub(crate) const TEAM_MIN_BYTES: usize = 1 << 15;

/// The int8 values packed in `x` (four per slot, memory order).
pub(super) fn as_i8(x: &[f32]) -> &[i8] {
    // SAFETY: `i8` has alignment 1 and every bit pattern is a valid `i8`; the new slice
    // covers exactly the `4 * x.len()` bytes of `x` and borrows it for the same lifetime.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const i8, x.len() * 4) }
}

/// Rounds `w` (rows x cols) to int8 in blocks of `Q8_BLOCK` along each row, to the bit
/// what core's `q8::quantize_blocks` gives: the packed values (four a slot, padding bytes
/// 0) and the scales (rows x blocks). Each block goes through [`simd::quantize_i8_into`]
/// (AVX-512 where the CPU has it), so rounding a 494M-parameter checkpoint at load is not
/// bound by a scalar `roundf`.
pub fn quantize_blocks(w: &[f32], rows: usize, cols: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    quantize(w, rows, cols, Q8_BLOCK)
}

/// [`quantize_blocks`] with one scale a row: core's `q8::quantize_rows` to the bit.
pub fn quantize_rows(w: &[f32], rows: usize, cols: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    quantize(w, rows, cols, cols.max(1))
}

fn quantize(w: &[f32], rows: usize, cols: usize, block: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    const OP: &str = "quantize";
    check_len(OP, "w", w.len(), product(OP, &[rows, cols])?)?;
    if let Some(v) = w.iter().find(|v| !v.is_finite()) {
        return Err(rusting_brain_core::CoreError::NonFinite { op: OP, value: *v as f64 });
    }
    let (pc, nb) = (packed_cols(cols), blocks_of(cols, block));
    let mut packed = vec![0.0f32; rows * pc];
    let mut scales = vec![0.0f32; rows * nb];
    if cols == 0 {
        return Ok((packed, scales));
    }
    let (mut q, mut part) = (Vec::with_capacity(cols), Vec::with_capacity(block.min(cols)));
    for ((row, slots), sc) in
        w.chunks_exact(cols).zip(packed.chunks_exact_mut(pc)).zip(scales.chunks_exact_mut(nb))
    {
        q.clear();
        for (chunk, s) in row.chunks(block).zip(sc.iter_mut()) {
            *s = simd::quantize_i8_into(chunk, &mut part);
            q.extend_from_slice(&part);
        }
        for (slot, four) in slots.iter_mut().zip(q.chunks(4)) {
            let mut bytes = [0u8; 4];
            for (b, &v) in bytes.iter_mut().zip(four) {
                *b = v as u8;
            }
            *slot = f32::from_ne_bytes(bytes);
        }
    }
    Ok((packed, scales))
}

thread_local! {
    /// Kept row buffers: one a row lent at once (the fused feed-forward rounds its second
    /// row while the first is still lent).
    static ROW_BUFS: std::cell::RefCell<Vec<simd::QuantRow>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An activation row rounded to int8 in blocks of `block` in one of this thread's
/// buffers, lent for one call and returned on drop (a decode step rounds ~25 rows).
struct RowBuf(simd::QuantRow);

impl RowBuf {
    /// `x` rounded as `r` says: 13-bit values in blocks where `r.wide` (what 4-bit weights
    /// meet at any width), else as `simd::QuantRow::of` rounds it.
    fn rounded(x: &[f32], r: Rounding) -> Self {
        let mut q = ROW_BUFS.try_with(|b| b.try_borrow_mut().ok()?.pop()).ok().flatten().unwrap_or_default();
        if r.wide {
            q.fill_wide(x, r.block);
        } else {
            q.fill(x, r.block);
        }
        RowBuf(q)
    }

    fn row(&self) -> simd::Int8Row<'_> {
        self.0.row()
    }
}

impl Drop for RowBuf {
    fn drop(&mut self) {
        let kept = std::mem::take(&mut self.0);
        let _ = ROW_BUFS.try_with(|b| {
            if let Ok(mut b) = b.try_borrow_mut() {
                if b.len() < 4 {
                    b.push(kept);
                }
            }
        });
    }
}

/// How a decode product's activation row is rounded: in blocks of `block`, as 13-bit
/// values when `wide` (4-bit weights) and as `QuantRow::fill` decides otherwise. Two
/// weights can share one rounded row when their roundings are equal (a blocked int8
/// weight wider than one block rounds to exactly what a 4-bit one of the same width does).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Rounding {
    block: usize,
    wide: bool,
}

/// A quantized weight `(n, k)` as the decode kernels read it, int8 or 4-bit: its packed
/// rows (`stride` bytes apart) and its scales (`per_row` a row).
#[derive(Clone, Copy)]
struct QRows<'a> {
    packed: &'a [f32],
    scales: &'a [f32],
    stride: usize,
    per_row: usize,
    q4: bool,
}

impl<'a> QRows<'a> {
    /// The weight `w` of a product `out (n) = x (k) W^T`, checked as `q8_matmul` checks
    /// it, and the rounding its activation row needs.
    fn of(w: (&'a [f32], &'a [f32]), out: usize, x: usize, n: usize, k: usize) -> Result<(Self, Rounding)> {
        let (packed, scales) = w;
        if is_q4(n, k, packed.len(), scales.len()) {
            rusting_brain_core::ops::q4::check_q4_matmul(out, x, packed.len(), scales.len(), 1, n, k)?;
            let stride = 4 * rusting_brain_core::ops::q4::q4_packed_cols(k);
            let per_row = rusting_brain_core::ops::q4::q4_row_scales(k);
            let block = rusting_brain_core::ops::q4::Q4_BLOCK;
            return Ok((QRows { packed, scales, stride, per_row, q4: true }, Rounding { block, wide: true }));
        }
        let block = check_q8_matmul(out, x, packed.len(), scales.len(), 1, n, k)?;
        let (stride, per_row) = (packed_cols(k) * 4, blocks_of(k, block));
        let wide = per_row > 1;
        Ok((QRows { packed, scales, stride, per_row, q4: false }, Rounding { block, wide }))
    }

    /// Rows `first..first + out.len()` of the product of `act` (`beta` as `q8_rows`).
    fn rows(&self, out: &mut [f32], act: &simd::Int8Row<'_>, first: usize, beta: f32) {
        let (at, sc) = (first * self.stride, &self.scales[first * self.per_row..]);
        if self.q4 {
            simd::q4_rows(out, act, &super::q4::as_u8(self.packed)[at..], self.stride, sc, beta)
        } else {
            simd::q8_rows(out, act, &as_i8(self.packed)[at..], self.stride, sc, beta)
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub fn q8_matmul(
    out: &mut [f32], x: &[f32], packed: &[f32], scales: &[f32], m: usize, n: usize, k: usize, beta: f32,
) -> Result<()> {
    if m == 1 {
        // Decode (int8 or 4-bit): each part of the team (both cores here) streams a
        // contiguous block of weight rows once, sixteen rows a pass; small matrices stay on
        // the calling thread.
        let (w, rounding) = QRows::of((packed, scales), out.len(), x.len(), n, k)?;
        let xq = RowBuf::rounded(x, rounding);
        let act = xq.row();
        let bytes = if w.q4 { n * k / 2 } else { n * k };
        let parts = team::parts();
        if parts > 1 && bytes >= TEAM_MIN_BYTES && n >= 16 * parts {
            let per = n.div_ceil(parts).div_ceil(16) * 16;
            team::run_blocks(out.chunks_mut(per), |p, o| w.rows(o, &act, p * per, beta));
        } else {
            w.rows(out, &act, 0, beta);
        }
        return Ok(());
    }
    if takes_wide_rows(n, k, packed.len(), scales.len()) {
        return rounded_rows(x, k, |shared| gemm(out, x, (packed, scales), (m, n, k), beta, shared));
    }
    gemm(out, x, (packed, scales), (m, n, k), beta, None)
}

/// Whether a weight's products take their activation rows rounded to 13 bits in blocks of
/// 32 (4-bit and blocked int8 weights): rows rounded once ([`rounded_rows`]) then serve
/// every such weight.
fn takes_wide_rows(n: usize, k: usize, packed: usize, scales: usize) -> bool {
    is_q4(n, k, packed, scales)
        || check_q8("q8_matmul", packed, scales, n, k).is_ok_and(|b| blocks_of(k, b) > 1)
}

/// [`q8_matmul`] for `m > 1`, with `x`'s rows as [`rounded_rows`] hands them to the
/// 4-bit and blocked GEMMs (`None`: each part rounds its own).
fn gemm(
    out: &mut [f32], x: &[f32], (packed, scales): (&[f32], &[f32]), (m, n, k): (usize, usize, usize),
    beta: f32, shared: Option<&[simd::QuantRow]>,
) -> Result<()> {
    if is_q4(n, k, packed.len(), scales.len()) {
        return super::q4::q4_gemm(out, x, packed, scales, (m, n, k), beta, shared);
    }
    let block = check_q8_matmul(out.len(), x.len(), packed.len(), scales.len(), m, n, k)?;
    let (pc, nb) = (packed_cols(k), blocks_of(k, block));
    let w = as_i8(packed);
    let row = |j: usize| &w[j * pc * 4..j * pc * 4 + k];
    let store = |o: &mut f32, acc: i32, sx: f32, j: usize| {
        let v = acc as f32 * sx * scales[j];
        *o = if beta == 0.0 { v } else { v + beta * *o };
    };
    if nb > 1 {
        q8_gemm_blocked(out, x, w, scales, (m, n, k), beta, shared);
    } else if super::int8_gemm::takes(m, k) {
        // Image sizes and long prompts: the packed VNNI GEMM (8 x 32 tiles over the whole
        // of k), the same integers at about twice the 4 x 4 tiles' rate.
        super::int8_gemm::gemm(out, x, w, scales, (m, n, k), beta);
    } else {
        // Prompt processing and batches: an int8 GEMM. Each part of the team takes a band
        // of activation rows, rounds them to int8 once, then runs 4 x 4 tiles (four
        // activation rows against four weight rows) so each weight load serves four rows;
        // the four weight rows stay in L1 while the band's rows stream past them.
        let band = |o: &mut [f32], first: usize| {
            let rows = o.len() / n;
            let quantized: Vec<(Vec<i8>, f32, i32)> = x[first * k..(first + rows) * k]
                .chunks_exact(k)
                .map(|xi| {
                    let (q, s) = simd::quantize_i8(xi);
                    let sum = q.iter().map(|&v| v as i32).sum();
                    (q, s, sum)
                })
                .collect();
            let quads = rows / 4;
            for jq in 0..n / 4 {
                let j = 4 * jq;
                let w4 = [row(j), row(j + 1), row(j + 2), row(j + 3)];
                for iq in 0..quads {
                    let i = 4 * iq;
                    let a = &quantized[i..i + 4];
                    simd::tile4x4_i8(
                        &mut o[i * n + j..],
                        n,
                        [&a[0].0, &a[1].0, &a[2].0, &a[3].0],
                        [a[0].2, a[1].2, a[2].2, a[3].2],
                        [a[0].1, a[1].1, a[2].1, a[3].1],
                        w4,
                        &scales[j..j + 4],
                        beta,
                    );
                }
                for (i, (xq, sx, xsum)) in quantized.iter().enumerate().skip(4 * quads) {
                    let acc = simd::dot4_i8(xq, *xsum, w4);
                    for (v, (y, a)) in o[i * n + j..i * n + j + 4].iter_mut().zip(acc).enumerate() {
                        store(y, a, *sx, j + v);
                    }
                }
            }
            for j in n / 4 * 4..n {
                for (i, (xq, sx, _)) in quantized.iter().enumerate() {
                    store(&mut o[i * n + j], simd::dot_i8(xq, row(j)), *sx, j);
                }
            }
        };
        run_bands(out, (m, n, k), band);
    }
    Ok(())
}

/// An int8 GEMM's bands of activation rows over the team: each part a band of whole
/// quads of rows (`band(out_rows, first_row)`); small products stay on the calling thread.
fn run_bands(out: &mut [f32], (m, n, k): (usize, usize, usize), band: impl Fn(&mut [f32], usize) + Sync) {
    let parts = team::parts();
    if parts > 1 && m >= 8 && n * k >= TEAM_MIN_BYTES {
        let per = m.div_ceil(parts).div_ceil(4) * 4;
        team::run_blocks(out.chunks_mut(per * n), |p, o| band(o, p * per));
    } else {
        band(out, 0);
    }
}

/// Prompts shorter than this split the weight rows over the team rather than the
/// activation rows: every part then lays out only its share of the weights
/// ([`simd::Panel16`]) for all the prompt's rows, where row bands had each part lay out
/// all of them for half the rows (SmolLM2-135M, 16 tokens, Zen 4: see docs/baseline.md).
pub(super) const SPLIT_WEIGHTS_BELOW: usize = 64;

/// A blocked or 4-bit GEMM's work over the team: `part(o, stride, first_row, cols)` fills
/// outputs `(i, j)` for the prompt's rows `first_row..` (as many as `o` holds at `stride`
/// a row) and weight rows `j` in `cols`, at `o[i * stride + j - cols.start]`. Prompts of at
/// least [`SPLIT_WEIGHTS_BELOW`] rows split into bands of rows (in place); shorter ones
/// split the weight rows in runs of sixteen, each part into a buffer of its own that is
/// copied out after (two parts must not hold the same rows of `out`); small products stay
/// on the calling thread.
pub(super) fn run_parts(
    out: &mut [f32], (m, n, k): (usize, usize, usize), beta: f32,
    part: impl Fn(&mut [f32], usize, usize, std::ops::Range<usize>) + Sync,
) {
    let parts = team::parts();
    if parts < 2 || m < 2 || n * k < TEAM_MIN_BYTES {
        return part(out, n, 0, 0..n);
    }
    if m >= SPLIT_WEIGHTS_BELOW || n < 32 * parts {
        let per = m.div_ceil(parts).div_ceil(4) * 4;
        return team::run_blocks(out.chunks_mut(per * n), |p, o| part(o, n, p * per, 0..n));
    }
    let per = n.div_ceil(parts).div_ceil(16) * 16;
    // Each part's buffer comes from a pool kept between calls: a step over sixteen
    // requests runs some two hundred of these products, and fresh zeroed buffers were a
    // few percent of it. A part writes every element of its buffer, so only `beta`'s
    // inputs are copied in.
    with_kept(&SHARES, |pool| {
        let mut shares: Vec<(std::ops::Range<usize>, Vec<f32>)> = (0..parts)
            .map(|p| (p * per).min(n)..((p + 1) * per).min(n))
            .filter(|cols| !cols.is_empty())
            .map(|cols| {
                let w = cols.len();
                let mut buf = pool.pop().unwrap_or_default();
                buf.resize(m * w, 0.0);
                if beta != 0.0 {
                    for (i, b) in buf.chunks_exact_mut(w).enumerate() {
                        b.copy_from_slice(&out[i * n + cols.start..i * n + cols.end]);
                    }
                }
                (cols, buf)
            })
            .collect();
        team::run_blocks(shares.iter_mut(), |_, (cols, buf)| part(buf, cols.len(), 0, cols.clone()));
        for (cols, buf) in shares {
            for (i, b) in buf.chunks_exact(cols.len()).enumerate() {
                out[i * n + cols.start..i * n + cols.end].copy_from_slice(b);
            }
            pool.push(buf);
        }
    });
}

thread_local! {
    /// [`run_parts`]' buffers of the parts' outputs, kept for the calling thread's next
    /// product.
    static SHARES: std::cell::RefCell<Vec<Vec<f32>>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A short product's activation rows, rounded once by the calling thread for every
    /// part ([`rounded_rows`]).
    static ROUNDED: std::cell::RefCell<Vec<simd::QuantRow>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A part's band of rows rounded where the rows are not shared, and its panel
    /// ([`simd::Panel16`]), kept between calls.
    static PART: std::cell::RefCell<(Vec<simd::QuantRow>, simd::Panel16)> =
        std::cell::RefCell::new((Vec::new(), simd::Panel16::default()));
}

/// `f` with this thread's kept buffers in `key`, or fresh ones where they are lent
/// already (a product run inside another's part).
fn with_kept<T: Default + 'static, R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<T>>, f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut kept) => f(&mut kept),
        Err(_) => f(&mut T::default()),
    })
}

/// `x`'s rows (`k` values each) rounded in blocks of 32 ([`simd::QuantRow::fill_wide`])
/// into `rows`, reusing its buffers.
fn round_rows(x: &[f32], k: usize, rows: &mut [simd::QuantRow]) {
    for (q, xi) in rows.iter_mut().zip(x.chunks_exact(k)) {
        q.fill_wide(xi, Q8_BLOCK);
    }
}

/// Runs `f` with a blocked or 4-bit GEMM's activation rows `x` (`k` values each) rounded
/// in blocks of 32 by the calling thread, when there are fewer than
/// [`SPLIT_WEIGHTS_BELOW`] of them: [`run_parts`] then splits the weight rows, and every
/// part needs every row (each part rounded them all before). Longer prompts split the
/// rows into bands, each part rounding its own ([`part_rows`]): `f` gets `None`.
pub(super) fn rounded_rows<T>(x: &[f32], k: usize, f: impl FnOnce(Option<&[simd::QuantRow]>) -> T) -> T {
    let m = x.len() / k.max(1);
    if m >= SPLIT_WEIGHTS_BELOW || k == 0 {
        return f(None);
    }
    with_kept(&ROUNDED, |rows| {
        if rows.len() < m {
            rows.resize_with(m, Default::default);
        }
        let parts = team::parts();
        if parts > 1 && m >= 2 * parts && m * k >= ROUND_SPLIT_MIN {
            // Half the rows a core: the other core waited through all of it (a tenth of
            // a 16-request step on SmolLM2 went to rounding on one core).
            let per = m.div_ceil(parts);
            team::run_blocks(rows[..m].chunks_mut(per).zip(x.chunks(per * k)), |_, (qs, xs)| {
                round_rows(xs, k, qs)
            });
        } else {
            round_rows(x, k, &mut rows[..m]);
        }
        f(Some(&rows[..m]))
    })
}

/// Activation values from which [`rounded_rows`] splits its rows over the team.
const ROUND_SPLIT_MIN: usize = 4096;

/// A part's rows `first..first + rows` of `x`, rounded: from `shared` where the caller
/// rounded them ([`rounded_rows`]), else rounded into the part's own buffers; with the
/// part's panel.
pub(super) fn part_rows<T>(
    x: &[f32], k: usize, shared: Option<&[simd::QuantRow]>, (first, rows): (usize, usize),
    f: impl FnOnce(&[simd::QuantRow], &mut simd::Panel16) -> T,
) -> T {
    with_kept(&PART, |(own, panel)| match shared {
        Some(all) => f(&all[first..first + rows], panel),
        None => {
            if own.len() < rows {
                own.resize_with(rows, Default::default);
            }
            round_rows(&x[first * k..(first + rows) * k], k, &mut own[..rows]);
            f(&own[..rows], panel)
        }
    })
}

/// [`q8_matmul`]'s GEMM on blocked weights (`m > 1`): each part of the team takes a band of
/// activation rows (a short prompt's parts a share of the weight rows: [`run_parts`]) and
/// rounds them block by block once, then runs sixteen weight rows at a time laid across
/// the lanes ([`simd::Panel16`]) or 4 x 4 tiles ([`simd::tile4x4_blocked`]); the weight
/// rows stay in L1 while the rows stream past them.
fn q8_gemm_blocked(
    out: &mut [f32], x: &[f32], w: &[i8], scales: &[f32], (m, n, k): (usize, usize, usize), beta: f32,
    shared: Option<&[simd::QuantRow]>,
) {
    let (stride, nb) = (packed_cols(k) * 4, blocks_of(k, Q8_BLOCK));
    let row = |j: usize| &w[j * stride..j * stride + k];
    // Outputs (i, j) at o[i * os + j - c0] for weight rows j in cols (see run_parts).
    let part = |o: &mut [f32], os: usize, first: usize, cols: std::ops::Range<usize>| {
        let (c0, c1) = (cols.start, cols.end);
        let rows = o.len() / os;
        part_rows(x, k, shared, (first, rows), |quantized, panel| {
            // Sixteen weight rows at a time laid out across the vector lanes (VNNI):
            // each activation row meets them with broadcast quads and no fold. The
            // layout costs a transpose per two blocks of sixteen rows; fewer rows
            // than PANEL_MIN_ROWS, and CPUs without VNNI, take 4 x 4 tiles.
            let mut done = c0;
            if rows >= PANEL_MIN_ROWS && simd::has_vnni() {
                done = c0 + (c1 - c0) / 16 * 16;
                for j in (c0..done).step_by(16) {
                    panel.fill(&w[j * stride..], stride, k, &scales[j * nb..(j + 16) * nb], rows);
                    simd::panel16_rows(&mut o[j - c0..], os, quantized, panel, beta);
                }
            }
            if done == c1 {
                return;
            }
            let acts: Vec<simd::Int8Row<'_>> = quantized.iter().map(|q| q.row()).collect();
            let quads = rows / 4;
            let four = done + (c1 - done) / 4 * 4;
            for j in (done..four).step_by(4) {
                let w4 = [row(j), row(j + 1), row(j + 2), row(j + 3)];
                let ws = &scales[j * nb..(j + 4) * nb];
                for iq in 0..quads {
                    let i = 4 * iq;
                    let a4 = [&acts[i], &acts[i + 1], &acts[i + 2], &acts[i + 3]];
                    simd::tile4x4_blocked(&mut o[i * os + j - c0..], os, a4, w4, ws, beta);
                }
                for (i, a) in acts.iter().enumerate().skip(4 * quads) {
                    let at = i * os + j - c0;
                    simd::q8_rows(&mut o[at..at + 4], a, &w[j * stride..], stride, ws, beta);
                }
            }
            for j in four..c1 {
                for (i, a) in acts.iter().enumerate() {
                    let at = i * os + j - c0;
                    simd::q8_rows(&mut o[at..at + 1], a, row(j), stride, &scales[j * nb..], beta);
                }
            }
        })
    };
    run_parts(out, (m, n, k), beta, part);
}

/// Activation rows a band from which the blocked GEMM lays its weights across the lanes
/// ([`simd::Panel16`]) instead of running 4 x 4 tiles: a 16-token prompt's bands of 8 ran
/// at 1.2x the tiles with the transposing fill (SmolLM2-135M, AVX-512 VNNI). Two and three
/// rows (a server's decode step over two or three requests) took 4 x 4 tiles' leftover
/// path, four weight rows at a time below the sixteen the VNNI kernel takes: 34 and 53 ms
/// a step on SmolLM2 against 14 and 16 with the panels (7 for one row).
pub(super) const PANEL_MIN_ROWS: usize = 2;

/// One int8 product of [`q8_matmul_many`] at one activation row: its output `(n)`,
/// weight `(n, k)` (packed values and row scales) and beta.
pub struct DecodeProduct<'a> {
    pub out: &'a mut [f32],
    pub packed: &'a [f32],
    pub scales: &'a [f32],
    pub beta: f32,
}

/// One part's share of a product in [`q8_matmul_many`]: its output rows, the weight, the
/// weight row they start at, and beta.
type RowsJob<'a> = (&'a mut [f32], QRows<'a>, usize, f32);

/// The most products [`q8_matmul_many`] takes in one job (attention's q, k and v are
/// three); the backend runs longer lists product by product.
pub const MANY_MAX: usize = 4;

/// Several int8 products of one activation row `x` (`k` values), at most [`MANY_MAX`]:
/// `x` is rounded once and every matrix's rows are split over the team in one job
/// (attention's q, k and v at decode: one hand-off instead of three, and the two small
/// ones no longer run alone). The lists live on the stack: they were four allocations a
/// call.
pub fn q8_matmul_many(x: &[f32], products: [Option<DecodeProduct<'_>>; MANY_MAX]) -> Result<()> {
    let k = x.len();
    let mut rounding = None;
    let mut weights: [Option<QRows<'_>>; MANY_MAX] = [None; MANY_MAX];
    for (p, w) in products.iter().zip(&mut weights) {
        let Some(p) = p else { continue };
        let n = p.out.len();
        let (q, r) = QRows::of((p.packed, p.scales), n, k, n, k)?;
        if rounding.is_some_and(|a| a != r) {
            // Weights whose activations round differently (per-row int8 beside blocked or
            // 4-bit ones): one rounding cannot serve them all.
            for p in products.into_iter().flatten() {
                let n = p.out.len();
                q8_matmul(p.out, x, p.packed, p.scales, 1, n, k, p.beta)?;
            }
            return Ok(());
        }
        rounding = Some(r);
        *w = Some(q);
    }
    let Some(rounding) = rounding else { return Ok(()) };
    let xq = RowBuf::rounded(x, rounding);
    let act = xq.row();
    let bytes: usize = products.iter().flatten().map(|p| p.out.len() * k).sum();
    let parts = team::parts();
    let split = if parts > 1 && bytes >= TEAM_MIN_BYTES { parts } else { 1 };
    // Every matrix split the same way, part p taking its share of each one's rows (whole
    // sixteen-row passes): the rows of the part's outputs, from row `first` of its weight.
    let mut pieces: [Option<_>; MANY_MAX] = std::array::from_fn(|_| None);
    for ((piece, p), w) in pieces.iter_mut().zip(products).zip(weights) {
        if let (Some(p), Some(w)) = (p, w) {
            let per = p.out.len().div_ceil(split).div_ceil(16).max(1) * 16;
            *piece = Some((p.out.chunks_mut(per), w, p.beta, per));
        }
    }
    let blocks = (0..split).map(|part| {
        pieces.each_mut().map(|piece| {
            let (chunks, w, beta, per) = piece.as_mut()?;
            chunks.next().map(|out| (out, *w, part * *per, *beta))
        })
    });
    let job = |_: usize, list: &mut [Option<RowsJob<'_>>; MANY_MAX]| {
        for (out, w, first, beta) in list.iter_mut().flatten() {
            w.rows(out, &act, *first, *beta);
        }
    };
    if split > 1 {
        team::run_blocks(blocks, job);
    } else {
        blocks.for_each(|mut b| job(0, &mut b));
    }
    Ok(())
}

/// Rows `first..first + o.len()` of a SwiGLU at one rounded row `act`: the gate's and
/// up's int8 products (weight rows `stride` bytes apart), then `o = silu(g) * u`. What
/// each part of [`q8_swiglu`] and of [`q8_mlp`]'s first phase runs.
fn swiglu_rows(
    act: &simd::Int8Row<'_>, first: usize, [o, g, u]: [&mut [f32]; 3], gate_w: QRows<'_>, up_w: QRows<'_>,
) {
    gate_w.rows(g, act, first, 0.0);
    up_w.rows(u, act, first, 0.0);
    simd::swiglu(o, g, u);
}

/// A SwiGLU's int8 products and gating at one activation row `x` (`d` values):
/// `gate = x Wg^T`, `up = x Wu^T` (`f` values each), `out = silu(gate) * up`, as one job of
/// the team, each part taking the same rows of both products and gating them.
pub fn q8_swiglu(
    out: &mut [f32], gate: &mut [f32], up: &mut [f32], x: &[f32], gate_w: (&[f32], &[f32]),
    up_w: (&[f32], &[f32]),
) -> Result<()> {
    let (f, d) = (out.len(), x.len());
    let (gq, rounding) = QRows::of(gate_w, gate.len(), d, f, d)?;
    let (uq, r_up) = QRows::of(up_w, up.len(), d, f, d)?;
    if r_up != rounding {
        q8_matmul(gate, x, gate_w.0, gate_w.1, 1, f, d, 0.0)?;
        q8_matmul(up, x, up_w.0, up_w.1, 1, f, d, 0.0)?;
        simd::swiglu(out, gate, up);
        return Ok(());
    }
    let xq = RowBuf::rounded(x, rounding);
    let act = xq.row();
    let rows = |first: usize, o: &mut [f32], g: &mut [f32], u: &mut [f32]| {
        swiglu_rows(&act, first, [o, g, u], gq, uq)
    };
    let parts = team::parts();
    if parts > 1 && 2 * f * d >= TEAM_MIN_BYTES && f >= 16 * parts {
        let per = f.div_ceil(parts).div_ceil(16) * 16;
        let blocks = out.chunks_mut(per).zip(gate.chunks_mut(per)).zip(up.chunks_mut(per));
        team::run_blocks(blocks, |p, ((o, g), u)| rows(p * per, o, g, u));
    } else {
        rows(0, out, gate, up);
    }
    Ok(())
}

/// A SwiGLU feed-forward at one activation row `x` (`d` values), added to `out`:
/// `gate = x Wg^T`, `up = x Wu^T`, `s = silu(gate) * up` (`f` values each), then
/// `out += s Wd^T`. One job of the team in two phases: each part its rows of gate, up and
/// s, then, once every part's rows of `s` are there, each part rounds all of `s` and
/// takes its rows of the down product. The same calls on the same rows as [`q8_swiglu`]
/// then [`q8_matmul`] (same bits), with one hand-off and no serial rounding of `s`
/// between them.
#[allow(clippy::too_many_arguments)]
pub fn q8_mlp(
    out: &mut [f32], gate: &mut [f32], up: &mut [f32], s: &mut [f32], x: &[f32], gate_w: (&[f32], &[f32]),
    up_w: (&[f32], &[f32]), down_w: (&[f32], &[f32]),
) -> Result<()> {
    let (f, d) = (s.len(), x.len());
    let (gq, rounding) = QRows::of(gate_w, gate.len(), d, f, d)?;
    let (uq, r_up) = QRows::of(up_w, up.len(), d, f, d)?;
    let same = r_up == rounding;
    let (dq, rounding_f) = QRows::of(down_w, out.len(), f, d, f)?;
    let parts = team::parts();
    if !same || parts < 2 || 3 * f * d < TEAM_MIN_BYTES || f < 16 * parts || d < 16 * parts {
        q8_swiglu(s, gate, up, x, gate_w, up_w)?;
        return q8_matmul(out, s, down_w.0, down_w.1, 1, d, f, 1.0);
    }
    let xq = RowBuf::rounded(x, rounding);
    let act = xq.row();
    // Whole sixteen-row passes a part, as the unfused calls split them.
    let (per_f, per_d) = (f.div_ceil(parts).div_ceil(16) * 16, d.div_ceil(parts).div_ceil(16) * 16);
    let (gate, up, s, out) =
        (SharedBuf::new(gate), SharedBuf::new(up), SharedBuf::new(s), SharedBuf::new(out));
    team::run_phased(2, &|p, phase| {
        if phase == 0 {
            let (first, end) = ((p * per_f).min(f), ((p + 1) * per_f).min(f));
            if first == end {
                return;
            }
            // SAFETY: in phase 0 part p alone touches rows first..end of gate, up and s.
            let (g, u, o) = unsafe { (gate.band(first, end), up.band(first, end), s.band(first, end)) };
            swiglu_rows(&act, first, [o, g, u], gq, uq);
        } else {
            let (first, end) = ((p * per_d).min(d), ((p + 1) * per_d).min(d));
            if first == end {
                return;
            }
            // SAFETY: in phase 1 every part only reads s (written in phase 0, before the
            // barrier) and part p alone writes rows first..end of out.
            let (sq, o) = unsafe { (RowBuf::rounded(s.all(), rounding_f), out.band(first, end)) };
            dq.rows(o, &sq.row(), first, 1.0);
        }
    });
    Ok(())
}

/// The operands of [`q8_attention_row`]: core's `Q8Attention` as slices.
pub struct DecodeAttention<'a> {
    pub x: &'a mut [f32],
    pub h: &'a [f32],
    pub q: &'a mut [f32],
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    pub cache_k: &'a mut [f32],
    pub cache_v: &'a mut [f32],
    pub pos: usize,
    pub att: &'a mut [f32],
    pub lse: &'a mut [f32],
    /// `[Wq, Wk, Wv, Wo]` as (packed values, row scales).
    pub weights: [(&'a [f32], &'a [f32]); 4],
    pub rope_q: &'a RopeSpec,
    pub rope_k: &'a RopeSpec,
    pub spec: &'a AttentionSpec,
}

/// Whether [`q8_attention_row`] takes these specs: one position of one sequence, rotated
/// with the attention's heads (the job rotates head by head).
pub fn attention_row_fits(spec: &AttentionSpec, rope_q: &RopeSpec, rope_k: &RopeSpec) -> bool {
    let laid_out = |r: &RopeSpec, heads: usize| {
        r.batch == 1 && r.seq == 1 && r.heads == heads && r.head_dim == spec.head_dim
    };
    spec.batch == 1 && spec.q_len == 1 && laid_out(rope_q, spec.q_heads) && laid_out(rope_k, spec.kv_heads)
}

/// The attention half of a decode step at one position, as one job of the team in four
/// phases: (0) each part its rows of q, k and v; (1) its query heads rotated, and its
/// key/value heads rotated and written into the cache; (2) its query heads' attention over
/// the cache; (3) its rows of Wo's product, added to `x`. The same calls on the same rows
/// as `q8_matmul_many`, `rope_forward`, `copy_range`, `attention_forward` and `q8_matmul`
/// (same bits), with one hand-off instead of three and the rotations and copies off the
/// calling thread. Every check those calls make is made first.
pub fn q8_attention_row(a: DecodeAttention<'_>) -> Result<()> {
    const OP: &str = "q8_attention";
    let spec = a.spec;
    let (hd, hq, hkv) = (spec.head_dim, spec.q_heads, spec.kv_heads);
    let (d, q_dim, kv_dim) = (a.h.len(), hq * hd, hkv * hd);
    let [wq, wk, wv, wo] = a.weights;
    let (qq, rounding) = QRows::of(wq, a.q.len(), d, q_dim, d)?;
    let (kq, r_k) = QRows::of(wk, a.k.len(), d, kv_dim, d)?;
    let (vq, r_v) = QRows::of(wv, a.v.len(), d, kv_dim, d)?;
    let same = r_k == rounding && r_v == rounding;
    a.rope_q.check("rope_forward", a.q.len())?;
    a.rope_k.check("rope_forward", a.k.len())?;
    let at = a.pos.checked_mul(kv_dim).ok_or_else(|| rusting_brain_core::CoreError::InvalidArgument {
        op: OP,
        message: format!("position {} is past any cache", a.pos),
    })?;
    check_range("copy_range", "dst", a.cache_k.len(), at, kv_dim)?;
    check_range("copy_range", "dst", a.cache_v.len(), at, kv_dim)?;
    spec.check("attention_forward")?;
    spec.check_forward(a.att.len(), a.lse.len(), a.q.len(), a.cache_k.len(), a.cache_v.len())?;
    let (oq, rounding_o) = QRows::of(wo, a.x.len(), q_dim, d, q_dim)?;
    if !same || !attention_row_fits(spec, a.rope_q, a.rope_k) {
        return Err(rusting_brain_core::CoreError::InvalidArgument {
            op: OP,
            message: "one position of one sequence, rotated with the attention's heads, and q, k and v \
                      rounded alike"
                .into(),
        });
    }
    let parts = team::parts();
    let xq = RowBuf::rounded(a.h, rounding);
    let act = xq.row();
    let (rows_q, first_q) = super::rope::table(a.rope_q);
    let (rows_k, first_k) = super::rope::table(a.rope_k);
    let (table_q, table_k) = (&rows_q[first_q * hd..], &rows_k[first_k * hd..]);
    let band = |n: usize, unit: usize, p: usize| {
        let per = n.div_ceil(parts).div_ceil(unit).max(1) * unit;
        ((p * per).min(n), ((p + 1) * per).min(n))
    };
    let (q, k, v) = (SharedBuf::new(a.q), SharedBuf::new(a.k), SharedBuf::new(a.v));
    let (kc, vc) = (SharedBuf::new(a.cache_k), SharedBuf::new(a.cache_v));
    let (att, lse, x) = (SharedBuf::new(a.att), SharedBuf::new(a.lse), SharedBuf::new(a.x));
    team::run_phased(4, &|p, phase| match phase {
        0 => {
            for (out, w, n) in [(&q, qq, q_dim), (&k, kq, kv_dim), (&v, vq, kv_dim)] {
                let (first, end) = band(n, 16, p);
                if first < end {
                    // SAFETY: in phase 0 part p alone writes these rows of q, k and v.
                    w.rows(unsafe { out.band(first, end) }, &act, first, 0.0);
                }
            }
        }
        1 => {
            let (h0, h1) = band(hq, 1, p);
            if h0 < h1 {
                let heads = RopeSpec { heads: h1 - h0, ..*a.rope_q };
                // SAFETY: in phase 1 part p alone touches its query heads.
                super::rope::rotate_with(unsafe { q.band(h0 * hd, h1 * hd) }, &heads, table_q, 1.0);
            }
            let (g0, g1) = band(hkv, 1, p);
            if g0 < g1 {
                let heads = RopeSpec { heads: g1 - g0, ..*a.rope_k };
                // SAFETY: in phase 1 part p alone touches its key/value heads, in the new
                // rows and in the cache's row at `pos`.
                unsafe {
                    let kh = k.band(g0 * hd, g1 * hd);
                    super::rope::rotate_with(kh, &heads, table_k, 1.0);
                    kc.band(at + g0 * hd, at + g1 * hd).copy_from_slice(kh);
                    vc.band(at + g0 * hd, at + g1 * hd).copy_from_slice(v.band(g0 * hd, g1 * hd));
                }
            }
        }
        2 => {
            let (h0, h1) = band(hq, 1, p);
            if h0 < h1 {
                // SAFETY: in phase 2 every part reads q and the caches (written before the
                // barrier) and part p alone writes its heads' outputs.
                let (qa, ka, va, o, l) =
                    unsafe { (q.all(), kc.all(), vc.all(), att.band(h0 * hd, h1 * hd), lse.band(h0, h1)) };
                super::attention::with_scores(|s| {
                    super::attention::row_heads(spec, qa, ka, va, 0, h0, o, l, s)
                });
            }
        }
        _ => {
            let (first, end) = band(d, 16, p);
            if first < end {
                // SAFETY: in phase 3 every part reads att (written before the barrier) and
                // part p alone writes these rows of x.
                let (aq, o) = unsafe { (RowBuf::rounded(att.all(), rounding_o), x.band(first, end)) };
                oq.rows(o, &aq.row(), first, 1.0);
            }
        }
    });
    Ok(())
}

pub fn q8_embedding(
    out: &mut [f32], packed: &[f32], scales: &[f32], ids: &[u32], vocab: usize, dim: usize,
) -> Result<()> {
    const OP: &str = "q8_embedding";
    if is_q4(vocab, dim, packed.len(), scales.len()) {
        // A few rows a call (one a decode step): core's lookup as it is.
        return rusting_brain_core::ops::q4::q4_embedding(out, packed, scales, ids, vocab, dim);
    }
    let block = check_q8(OP, packed.len(), scales.len(), vocab, dim)?;
    check_len(OP, "out", out.len(), product(OP, &[ids.len(), dim])?)?;
    check_ids(OP, ids, vocab)?;
    let (pc, nb) = (packed_cols(dim), blocks_of(dim, block));
    let w = as_i8(packed);
    out.par_chunks_mut(dim).zip(ids.par_iter()).for_each(|(o, &id)| {
        let id = id as usize;
        let q = &w[id * pc * 4..id * pc * 4 + dim];
        let sc = &scales[id * nb..(id + 1) * nb];
        for ((ob, qb), &s) in o.chunks_mut(block).zip(q.chunks(block)).zip(sc) {
            for (v, &b) in ob.iter_mut().zip(qb) {
                *v = b as f32 * s;
            }
        }
    });
    Ok(())
}

impl Q8Ops for CpuBackend {
    fn q8_matmul(
        &self, out: &mut Vec<f32>, x: &Vec<f32>, packed: &Vec<f32>, scales: &Vec<f32>, spec: &MatmulSpec,
    ) -> Result<()> {
        let (x, out) = rusting_brain_core::ops::q8::q8_operands(spec, x, out)?;
        q8_matmul(out, x, packed, scales, spec.m, spec.n, spec.k, spec.beta)
    }
    fn q8_matmul_many(&self, x: &Vec<f32>, products: &mut [Q8Product<'_, Vec<f32>>]) -> Result<()> {
        // Several rows of `x` (a step over several requests, a prompt): the rows rounded
        // once for every product that takes them so.
        if let Some(&Q8Product { spec: MatmulSpec { m, k, .. }, .. }) = products.first() {
            let rows_of_x = |p: &Q8Product<'_, Vec<f32>>| {
                p.spec.m == m && p.spec.k == k && p.spec.window.is_none() && x.len() == m * k
            };
            let wide =
                |p: &Q8Product<'_, Vec<f32>>| takes_wide_rows(p.spec.n, k, p.packed.len(), p.scales.len());
            if m > 1 && products.iter().all(|p| rows_of_x(p) && wide(p)) {
                return rounded_rows(x, k, |shared| {
                    for p in products.iter_mut() {
                        let (x, out) = rusting_brain_core::ops::q8::q8_operands(&p.spec, x, p.out)?;
                        let (n, beta) = (p.spec.n, p.spec.beta);
                        gemm(out, x, (p.packed, p.scales), (m, n, k), beta, shared)?;
                    }
                    Ok(())
                });
            }
        }
        // One activation row over all of `x` (a decode step's projections): one job.
        // Anything else runs product by product.
        if products.len() > MANY_MAX || !products.iter().all(|p| p.spec.one_row_of(x.len())) {
            return rusting_brain_core::backend::q8_matmul_each(self, x, products);
        }
        let mut rows: [Option<DecodeProduct<'_>>; MANY_MAX] = Default::default();
        for (p, row) in products.iter_mut().zip(&mut rows) {
            // The checks q8_matmul makes of the spec (trans_b, alpha, batch).
            let (_, out) = rusting_brain_core::ops::q8::q8_operands(&p.spec, x, p.out)?;
            check_len("q8_matmul_many", "out", out.len(), p.spec.n)?;
            *row = Some(DecodeProduct { out, packed: p.packed, scales: p.scales, beta: p.spec.beta });
        }
        q8_matmul_many(x, rows)
    }
    fn q8_swiglu(
        &self, out: &mut Vec<f32>, gate: &mut Vec<f32>, up: &mut Vec<f32>, x: &Vec<f32>,
        gate_w: (&Vec<f32>, &Vec<f32>), up_w: (&Vec<f32>, &Vec<f32>), spec: &MatmulSpec,
    ) -> Result<()> {
        if !fused_swiglu_row(("q8_swiglu", "out"), spec, x, out, gate, up)? {
            let (m, n, k) = (spec.m, spec.n, spec.k);
            let wide = |w: (&Vec<f32>, &Vec<f32>)| takes_wide_rows(n, k, w.0.len(), w.1.len());
            if m > 1 && spec.window.is_none() && x.len() == m * k && wide(gate_w) && wide(up_w) {
                // Several rows: rounded once for both products, then the definition's
                // steps.
                rounded_rows(x, k, |shared| {
                    for (o, w) in [(&mut *gate, gate_w), (&mut *up, up_w)] {
                        let (x, o) = rusting_brain_core::ops::q8::q8_operands(spec, x, o)?;
                        gemm(o, x, (w.0, w.1), (m, n, k), spec.beta, shared)?;
                    }
                    Ok::<(), rusting_brain_core::CoreError>(())
                })?;
                return rusting_brain_core::backend::SwigluOps::swiglu_forward(self, out, gate, up);
            }
            return rusting_brain_core::backend::q8_swiglu_unfused(
                self, out, gate, up, x, gate_w, up_w, spec,
            );
        }
        q8_swiglu(out, gate, up, x, (gate_w.0, gate_w.1), (up_w.0, up_w.1))
    }
    fn q8_attention(&self, a: Q8Attention<'_, Vec<f32>>) -> Result<()> {
        // One position of one sequence, over the team: one phased job. Anything else (a
        // prompt, one thread, a model too small to split) as the calls one by one.
        let s = a.spec;
        let bytes =
            (s.q_heads.saturating_add(s.kv_heads)).saturating_mul(s.head_dim).saturating_mul(2 * a.h.len());
        if !attention_row_fits(s, a.rope_q, a.rope_k) || team::parts() < 2 || bytes < TEAM_MIN_BYTES {
            return rusting_brain_core::backend::q8_attention_unfused(self, a);
        }
        let [wq, wk, wv, wo] = a.weights;
        q8_attention_row(DecodeAttention {
            x: a.x,
            h: a.h,
            q: a.q,
            k: a.k,
            v: a.v,
            cache_k: a.cache_k,
            cache_v: a.cache_v,
            pos: a.pos,
            att: a.att,
            lse: a.lse,
            weights: [(wq.0, wq.1), (wk.0, wk.1), (wv.0, wv.1), (wo.0, wo.1)],
            rope_q: a.rope_q,
            rope_k: a.rope_k,
            spec: s,
        })
    }
    fn q8_mlp(
        &self, out: &mut Vec<f32>, [gate, up, s]: [&mut Vec<f32>; 3], x: &Vec<f32>,
        gate_w: (&Vec<f32>, &Vec<f32>), up_w: (&Vec<f32>, &Vec<f32>), down_w: (&Vec<f32>, &Vec<f32>),
        spec: &MatmulSpec,
    ) -> Result<()> {
        // One activation row (a decode step's feed-forward): one phased job. Anything
        // else as the two calls.
        if !fused_swiglu_row(("q8_mlp", "s"), spec, x, s, gate, up)? {
            return rusting_brain_core::backend::q8_mlp_unfused(
                self,
                out,
                [gate, up, s],
                x,
                gate_w,
                up_w,
                down_w,
                spec,
            );
        }
        check_len("q8_mlp", "out", out.len(), spec.k)?;
        q8_mlp(out, gate, up, s, x, (gate_w.0, gate_w.1), (up_w.0, up_w.1), (down_w.0, down_w.1))
    }
    fn q8_embedding(
        &self, out: &mut Vec<f32>, packed: &Vec<f32>, scales: &Vec<f32>, ids: &[u32], vocab: usize,
        dim: usize,
    ) -> Result<()> {
        q8_embedding(out, packed, scales, ids, vocab, dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusting_brain_core::Rng;

    /// Bit for bit core's `quantize_rows` on awkward widths (a partly filled last slot,
    /// under and over one AVX-512 vector), zero and subnormal rows, and values that land
    /// on ties after scaling; a non-finite value is refused by both.
    #[test]
    fn quantizing_matches_the_reference_bit_for_bit() {
        let mut rng = Rng::new(17);
        for (rows, cols) in [(1, 1), (3, 3), (2, 5), (7, 16), (5, 17), (4, 33), (3, 127), (2, 1000)] {
            let mut w = rng.normal_vec(rows * cols, 2.0);
            // Row 0 ties: absmax 127 makes the scale 1, so v * inv is v itself.
            if cols >= 3 {
                w[0] = 127.0;
                w[1] = 2.5;
                w[2] = -0.5;
            }
            if rows >= 3 {
                w[cols..2 * cols].fill(0.0);
                w[2 * cols..3 * cols].iter_mut().for_each(|v| *v *= 1e-40);
            }
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            // One scale a row (the block is the row), and blocks of 32.
            let (p, s) = quantize(&w, rows, cols, cols).unwrap();
            let (rp, rs) = rusting_brain_core::ops::q8::quantize_rows(&w, rows, cols).unwrap();
            assert_eq!(bits(&p), bits(&rp), "{rows} x {cols} packed");
            assert_eq!(bits(&s), bits(&rs), "{rows} x {cols} scales");
            let (p, s) = quantize_blocks(&w, rows, cols).unwrap();
            let (rp, rs) = rusting_brain_core::ops::q8::quantize_blocks(&w, rows, cols).unwrap();
            assert_eq!(bits(&p), bits(&rp), "{rows} x {cols} packed in blocks");
            assert_eq!(bits(&s), bits(&rs), "{rows} x {cols} block scales");
        }
        let mut w = vec![1.0f32; 6];
        w[4] = f32::NAN;
        assert!(quantize_blocks(&w, 2, 3).is_err());
        assert!(rusting_brain_core::ops::q8::quantize_blocks(&w, 2, 3).is_err());
        assert!(quantize_blocks(&w, 2, 4).is_err());
    }
}
