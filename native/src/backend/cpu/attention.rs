//! Causal GQA attention on the CPU. Twin of `rusting_brain_core::ops::attention` (same
//! layouts, same saved log-sum-exp).
//!
//! Forward: one task per query row (b, t), all heads; scores, softmax and the weighted sum
//! of values in SIMD loops, one scratch row per task.
//! Backward, in two race-free passes so no two tasks write the same gradient row:
//! 1. per query row: dq = scale * sum_j dS_tj k_j,
//! 2. per key row: dk_j = scale * sum_t dS_tj q_t and dv_j = sum_t P_tj dout_t,
//!
//! recomputing P from the saved log-sum-exp in each pass (the flash-attention trade:
//! twice the QK^T work for no (T, T) buffer).

use rayon::prelude::*;
use rusting_brain_core::ops::attention::AttentionSpec;
use rusting_brain_core::Result;

use super::shared_buf::SharedBuf;
use super::{simd, team};
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::{AttentionOps, AttentionRows};

/// Scores times head size below which a decode step's attention stays on one thread. Eight
/// heads over 20 keys already gain from the split (one call: 1.45 -> 1.18 us at head size
/// 32, 1.94 -> 1.43 us at 64); a handful of keys does not.
const TEAM_MIN: usize = 1 << 11;

thread_local! {
    /// A decode step's scores for one query row, kept by each thread of the team.
    static SCORES: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub fn attention_forward(
    out: &mut [f32], lse: &mut [f32], q: &[f32], k: &[f32], v: &[f32], spec: &AttentionSpec,
) -> Result<()> {
    let (nq, _, _) = spec.check("attention_forward")?;
    spec.check_forward(out.len(), lse.len(), q.len(), k.len(), v.len())?;
    let (d, hq) = (spec.head_dim, spec.q_heads);
    if nq == 0 {
        return Ok(());
    }
    if use_blocked(spec) {
        attention_forward_blocked(out, lse, q, k, v, spec);
        return Ok(());
    }
    let parts = team::parts();
    let rows = spec.batch * spec.q_len;
    if rows == 1 && parts > 1 && hq >= 2 && spec.kv_len * hq * d >= TEAM_MIN {
        // Decoding one token: the heads split over the spinning team (rayon would have
        // one task, the row, and its workers sleep between decode calls anyway).
        let per = hq.div_ceil(parts);
        let blocks = out.chunks_mut(per * d).zip(lse.chunks_mut(per));
        team::run_blocks(blocks, |p, (o, l)| {
            with_scores(|scores| row_heads(spec, q, k, v, 0, p * per, o, l, scores))
        });
    } else {
        out.par_chunks_mut(hq * d).zip(lse.par_chunks_mut(hq)).enumerate().for_each_init(
            || Vec::with_capacity(spec.kv_len),
            |scores, (row, (o, l))| row_heads(spec, q, k, v, row, 0, o, l, scores),
        );
    }
    Ok(())
}

/// `f` with this thread's kept scores buffer (a fresh one if it is lent already).
pub(crate) fn with_scores<R>(f: impl FnOnce(&mut Vec<f32>) -> R) -> R {
    SCORES.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scores) => f(&mut scores),
        Err(_) => f(&mut Vec::new()),
    })
}

/// One query row's heads `h0..h0 + l.len()` (`row` is `(b, t)` flattened): scores
/// against the visible keys, softmax, weighted sum of values; `o` holds those heads'
/// outputs, `l` their log-sum-exps. Heads that share a key/value head go together, up to
/// four at once, so each cache row is read once for all of them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_heads(
    spec: &AttentionSpec, q: &[f32], k: &[f32], v: &[f32], row: usize, h0: usize, o: &mut [f32],
    l: &mut [f32], scores: &mut Vec<f32>,
) {
    let d = spec.head_dim;
    let scale = 1.0 / (d as f32).sqrt();
    let (b, t) = (row / spec.q_len, row % spec.q_len);
    let n = spec.visible(t);
    let group = spec.group();
    let mut u = 0;
    while u < l.len() {
        let h = h0 + u;
        let kvh = h / group;
        let run = (group - h % group).min(l.len() - u).min(4);
        scores.resize(run * n, 0.0);
        let s = &mut scores[..run * n];
        let qi = spec.q_index(b, t, h);
        // Key/value rows of this group are `stride` apart in the cache.
        let (first, stride) = (spec.kv_index(b, 0, kvh), spec.kv_heads * d);
        let span = (n - 1) * stride + d;
        simd::dot_rows_heads(s, n, &q[qi..qi + run * d], run, &k[first..first + span], stride, scale);
        let mut inv = [0.0f32; 4];
        for (i, si) in s.chunks_exact_mut(n).enumerate() {
            let max = simd::max(si);
            let sum = simd::exp_sub_sum(si, max);
            l[u + i] = max + sum.ln();
            inv[i] = 1.0 / sum;
        }
        let oh = &mut o[u * d..(u + run) * d];
        oh.fill(0.0);
        simd::axpy_rows_heads(oh, s, n, &inv[..run], &v[first..first + span], stride);
        u += run;
    }
}

#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    dq: &mut [f32], dk: &mut [f32], dv: &mut [f32], dout: &[f32], q: &[f32], k: &[f32], v: &[f32],
    out: &[f32], lse: &[f32], spec: &AttentionSpec,
) -> Result<()> {
    let (nq, nkv, nl) = spec.check("attention_backward")?;
    spec.check_backward([&*dq, &*dk, &*dv, dout, q, k, v, out, lse].map(|b| b.len()))?;
    if use_blocked(spec) && nq > 0 {
        attention_backward_blocked(dq, dk, dv, dout, q, k, v, out, lse, spec);
        return Ok(());
    }
    let (d, hq, hkv) = (spec.head_dim, spec.q_heads, spec.kv_heads);
    let scale = 1.0 / (d as f32).sqrt();
    // delta[b, t, h] = dot(dout, out): the row sums of P * dP.
    let mut delta = vec![0.0f32; nl];
    delta.par_chunks_mut(hq.max(1)).enumerate().for_each(|(row, dl)| {
        for (h, x) in dl.iter_mut().enumerate() {
            let i = row * hq * d + h * d;
            *x = simd::dot(&dout[i..i + d], &out[i..i + d]);
        }
    });
    let lse_at = |b: usize, t: usize, h: usize| lse[(b * spec.q_len + t) * hq + h];
    let delta_at = |b: usize, t: usize, h: usize| delta[(b * spec.q_len + t) * hq + h];

    // Pass 1: dq, one task per query row.
    if nq > 0 {
        dq.par_chunks_mut(hq * d).enumerate().for_each(|(row, dqr)| {
            let (b, t) = (row / spec.q_len, row % spec.q_len);
            dqr.fill(0.0);
            for h in 0..hq {
                let kvh = h / spec.group();
                let qi = spec.q_index(b, t, h);
                let (qrow, dorow) = (&q[qi..qi + d], &dout[qi..qi + d]);
                let (l, dl) = (lse_at(b, t, h), delta_at(b, t, h));
                let dqh = &mut dqr[h * d..(h + 1) * d];
                for j in 0..spec.visible(t) {
                    let ki = spec.kv_index(b, j, kvh);
                    let p = simd::exp(scale * simd::dot(qrow, &k[ki..ki + d]) - l);
                    let ds = p * (simd::dot(dorow, &v[ki..ki + d]) - dl) * scale;
                    simd::axpy(dqh, ds, &k[ki..ki + d]);
                }
            }
        });
    }

    // Pass 2: dk and dv, one task per key row (b, j); rows past kv_len stay zero.
    if nkv > 0 {
        let offset = spec.kv_len - spec.q_len; // absolute position of query row 0
        dk.par_chunks_mut(hkv * d).zip(dv.par_chunks_mut(hkv * d)).enumerate().for_each(
            |(row, (dkr, dvr))| {
                let (b, j) = (row / spec.kv_capacity, row % spec.kv_capacity);
                dkr.fill(0.0);
                dvr.fill(0.0);
                if j >= spec.kv_len {
                    return;
                }
                // Query t sees key j when offset + t >= j.
                let first_t = j.saturating_sub(offset);
                for kvh in 0..hkv {
                    let ki = spec.kv_index(b, j, kvh);
                    let (krow, vrow) = (&k[ki..ki + d], &v[ki..ki + d]);
                    let dkh = &mut dkr[kvh * d..(kvh + 1) * d];
                    for h in kvh * spec.group()..(kvh + 1) * spec.group() {
                        for t in first_t..spec.q_len {
                            let qi = spec.q_index(b, t, h);
                            let (qrow, dorow) = (&q[qi..qi + d], &dout[qi..qi + d]);
                            let p = simd::exp(scale * simd::dot(qrow, krow) - lse_at(b, t, h));
                            let ds = p * (simd::dot(dorow, vrow) - delta_at(b, t, h)) * scale;
                            simd::axpy(dkh, ds, qrow);
                            simd::axpy(&mut dvr[kvh * d..(kvh + 1) * d], p, dorow);
                        }
                    }
                }
            },
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Blocked path for prefill/training shapes: per (batch, head) the scores are one GEMM,
// the softmax runs over rows of a (q_len, kv_len) tile, and the weighted sum is another
// GEMM. Row-at-a-time dot products cost a function call and a horizontal sum per (query,
// key) pair; here the inner loops are GEMM micro-kernels (our own on AVX-512 for these
// small tiles, the `gemm` crate's elsewhere), with K^T and V^T formed once per head.
// ---------------------------------------------------------------------------------------

/// A row-major matrix view into a slice: element (i, j) at `i * rs + j * cs`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    pub(crate) data: &'a [f32],
    pub(crate) rs: usize,
    pub(crate) cs: usize,
}

/// `dst (m x n, contiguous) = lhs (m x k) rhs (k x n) + beta * dst`, single-threaded (the
/// callers already run one tile per rayon task).
pub(crate) fn gemm_views(dst: &mut [f32], m: usize, n: usize, k: usize, lhs: View, rhs: View, beta: f32) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(dst.len() >= m * n, "gemm_views: destination too small");
    if k == 0 {
        if beta == 0.0 {
            dst[..m * n].fill(0.0);
        } else {
            dst[..m * n].iter_mut().for_each(|v| *v *= beta);
        }
        return;
    }
    // The largest index each view reads must be inside its slice.
    assert!((m - 1) * lhs.rs + (k - 1) * lhs.cs < lhs.data.len(), "gemm_views: lhs view out of bounds");
    assert!((k - 1) * rhs.rs + (n - 1) * rhs.cs < rhs.data.len(), "gemm_views: rhs view out of bounds");
    #[cfg(target_arch = "x86_64")]
    if simd::isa() == simd::Isa::Avx512 && m * n * k <= SMALL_GEMM_MACS {
        small_gemm(dst, m, n, k, lhs, rhs, beta);
        return;
    }
    // SAFETY: the asserts above prove every element the strides address lies inside `lhs`,
    // `rhs` and `dst`; `dst` is a unique borrow, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            beta != 0.0,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            beta,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Multiply-adds up to which `gemm_views` runs its own AVX-512 kernel: an attention
/// tile (32 queries x 256 keys x 32 dims is 262,144) is too small for the `gemm` crate's
/// packing and dispatch to pay off (it ran at about a quarter of its large-matrix rate).
#[cfg(target_arch = "x86_64")]
const SMALL_GEMM_MACS: usize = 1 << 21;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// `small_gemm`'s copy of a right-hand side whose rows are not contiguous (K^T, V^T).
    static RHS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `gemm_views` for small products on AVX-512: the right-hand side as contiguous rows
/// (copied into a per-thread buffer when its columns are the contiguous direction), then
/// tiles of 8 rows x 32 columns, each row of B broadcast-multiplied into 16 accumulators,
/// k in order, so every output is one sum in a fixed order.
#[cfg(target_arch = "x86_64")]
fn small_gemm(dst: &mut [f32], m: usize, n: usize, k: usize, lhs: View, rhs: View, beta: f32) {
    let mut run = |b: &[f32], ldb: usize| {
        for i0 in (0..m).step_by(8) {
            let rows = 8.min(m - i0);
            let out = &mut dst[i0 * n..(i0 + rows) * n];
            // SAFETY: isa() is Avx512, so the CPU has AVX-512F; gemm_views proved lhs
            // rows i0..i0 + rows and all k columns in bounds, `b` holds k rows of ldb >= n,
            // and `out` holds rows x n.
            unsafe {
                match rows {
                    8 => small_tile::<8>(out, n, k, lhs, i0, b, ldb, beta),
                    7 => small_tile::<7>(out, n, k, lhs, i0, b, ldb, beta),
                    6 => small_tile::<6>(out, n, k, lhs, i0, b, ldb, beta),
                    5 => small_tile::<5>(out, n, k, lhs, i0, b, ldb, beta),
                    4 => small_tile::<4>(out, n, k, lhs, i0, b, ldb, beta),
                    3 => small_tile::<3>(out, n, k, lhs, i0, b, ldb, beta),
                    2 => small_tile::<2>(out, n, k, lhs, i0, b, ldb, beta),
                    _ => small_tile::<1>(out, n, k, lhs, i0, b, ldb, beta),
                }
            }
        }
    };
    if rhs.cs == 1 {
        run(rhs.data, rhs.rs);
    } else {
        RHS.with(|cell| {
            let mut b = cell.borrow_mut();
            b.clear();
            b.resize(k * n, 0.0);
            for j in 0..n {
                for p in 0..k {
                    b[p * n + j] = rhs.data[p * rhs.rs + j * rhs.cs];
                }
            }
            run(&b, n);
        });
    }
}

/// Rows `i0..i0 + R` of `lhs` times `b` (k rows, `ldb` apart) into `out` (R x n):
/// `out = lhs b + beta * out` (`out` not read when beta is 0), 32 columns at a time.
///
/// # Safety
/// AVX-512F; `lhs` holds rows i0..i0 + R with k columns, `b` k rows of at least n
/// elements `ldb` apart, `out` R x n elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn small_tile<const R: usize>(
    out: &mut [f32], n: usize, k: usize, lhs: View, i0: usize, b: &[f32], ldb: usize, beta: f32,
) {
    use std::arch::x86_64::*;
    let mask = |lanes: usize| -> __mmask16 { ((1u32 << lanes.min(16)) - 1) as u16 };
    for j0 in (0..n).step_by(32) {
        let lanes = (n - j0).min(32);
        let (m0, m1) = (mask(lanes), mask(lanes.saturating_sub(16)));
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for p in 0..k {
            // Masked-off lanes are not read (AVX-512 suppresses their faults); the pointer
            // arithmetic wraps so no out-of-bounds pointer is formed by `add`.
            let bp = b.as_ptr().wrapping_add(p * ldb + j0);
            let b0 = _mm512_maskz_loadu_ps(m0, bp);
            let b1 = _mm512_maskz_loadu_ps(m1, bp.wrapping_add(16));
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = _mm512_set1_ps(*lhs.data.get_unchecked((i0 + r) * lhs.rs + p * lhs.cs));
                acc[0] = _mm512_fmadd_ps(a, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(a, b1, acc[1]);
            }
        }
        let beta_v = _mm512_set1_ps(beta);
        for (r, acc) in acc.iter().enumerate() {
            for (h, (&sum, mh)) in acc.iter().zip([m0, m1]).enumerate() {
                if mh == 0 {
                    continue;
                }
                let dst = out.as_mut_ptr().add(r * n + j0 + 16 * h);
                let v = if beta == 0.0 {
                    sum
                } else {
                    _mm512_fmadd_ps(beta_v, _mm512_maskz_loadu_ps(mh, dst), sum)
                };
                _mm512_mask_storeu_ps(dst, mh, v);
            }
        }
    }
}

thread_local! {
    /// Per-thread score tiles, kept between calls: a (q_len, kv_len) tile is 256 KiB at
    /// 256 x 256, past malloc's mmap threshold, so allocating it per call costs page faults
    /// on every step.
    static TILES: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Runs `f` with two zeroed-length-agnostic scratch tiles of `len` floats each (contents
/// are garbage; callers overwrite them with beta = 0 GEMMs).
pub(crate) fn with_tiles<R>(len: usize, f: impl FnOnce(&mut [f32], &mut [f32]) -> R) -> R {
    TILES.with(|t| {
        let mut t = t.borrow_mut();
        if t.0.len() < len {
            t.0.resize(len, 0.0);
            t.1.resize(len, 0.0);
        }
        let (a, b) = &mut *t;
        f(&mut a[..len], &mut b[..len])
    })
}

/// The blocked path runs for prefill-sized query blocks. A decode row stays on the row
/// path at every cache length: since the scores and value sums became one SIMD call per
/// head and the heads split over the thread team, it beats the per-head GEMMs (which
/// wake rayon and pack a one-row operand) at 528 cached positions by 4x and more
/// (bench_decode -- 16 512: Q8 attention 382 -> see docs/optimize-plan.md).
pub(crate) fn use_blocked(spec: &AttentionSpec) -> bool {
    spec.q_len >= 16
}

/// Views of head `h` of batch `b`: q/out rows have stride `q_heads * d`, k/v rows
/// `kv_heads * d`.
fn q_view<'a>(x: &'a [f32], spec: &AttentionSpec, b: usize, h: usize) -> View<'a> {
    let start = spec.q_index(b, 0, h);
    View { data: &x[start..], rs: spec.q_heads * spec.head_dim, cs: 1 }
}

fn kv_view<'a>(x: &'a [f32], spec: &AttentionSpec, b: usize, kvh: usize) -> View<'a> {
    let start = spec.kv_index(b, 0, kvh);
    View { data: &x[start..], rs: spec.kv_heads * spec.head_dim, cs: 1 }
}

/// `f` of every tile, in order, the tiles split in contiguous bands over the thread team
/// rather than rayon: prompt processing runs its products on the team, whose helpers spin
/// for a while after each job, and a rayon worker started beside them would share the
/// cores with that spinning instead of getting one.
fn on_team<T: Sync, R: Send>(tiles: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let mut out: Vec<Option<R>> = (0..tiles.len()).map(|_| None).collect();
    team::bands(&mut out, 1, 2, |first, band| {
        for (i, r) in band.iter_mut().enumerate() {
            *r = Some(f(&tiles[first + i]));
        }
    });
    out.into_iter().map(|r| r.expect("team::bands runs every band")).collect()
}

/// `dst` (cols x rows, contiguous) = the transpose of the first `rows` x `cols` of `v`.
fn transpose_into(dst: &mut [f32], v: View, rows: usize, cols: usize) {
    for i in 0..rows {
        for j in 0..cols {
            dst[j * rows + i] = v.data[i * v.rs + j * v.cs];
        }
    }
}

/// Per-thread buffers of the blocked passes, kept between calls (a step's attention ran a
/// few hundred allocations of 32 KiB and more, each touching fresh pages).
#[derive(Default)]
struct Scratch {
    kt: Vec<f32>,
    vt: Vec<f32>,
    p: Vec<f32>,
    dp: Vec<f32>,
    rows: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// The first `len` elements of `v`, grown if needed (contents unspecified).
fn sized(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

fn transpose(v: View) -> View {
    View { data: v.data, rs: v.cs, cs: v.rs }
}

/// `dot(a, b)` for one head's row: sixteen lanes of partial sums. `simd::dot` steps 64
/// elements at a time, so a 32-wide head ran in its scalar tail, one dependent add per
/// element (3% of the attention's time).
fn short_dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Query rows per block of the blocked forward pass: a block's scores reach only the keys
/// its last row sees, so the masked half of a prompt's (q_len x kv_len) scores is mostly
/// never formed (at 128 new positions, 62% of the products and exponentials).
const QUERY_BLOCK: usize = 32;

pub(crate) fn attention_forward_blocked(
    out: &mut [f32], lse: &mut [f32], q: &[f32], k: &[f32], v: &[f32], spec: &AttentionSpec,
) {
    let (d, hq, tq, tk) = (spec.head_dim, spec.q_heads, spec.q_len, spec.kv_len);
    let scale = 1.0 / (d as f32).sqrt();
    let tiles: Vec<(usize, usize)> = (0..spec.batch).flat_map(|b| (0..hq).map(move |h| (b, h))).collect();
    let (out_w, lse_w) = (SharedBuf::new(out), SharedBuf::new(lse));
    on_team(&tiles, |&(b, h)| {
        let kvh = h / spec.group();
        let (qh, kh, vh) = (q_view(q, spec, b, h), kv_view(k, spec, b, kvh), kv_view(v, spec, b, kvh));
        SCRATCH.with(|cell| {
            let sc = &mut *cell.borrow_mut();
            // K^T (d x tk) once for every query block.
            let kt = sized(&mut sc.kt, d * tk);
            transpose_into(kt, kh, tk, d);
            let kt = View { data: kt, rs: tk, cs: 1 };
            let blk = QUERY_BLOCK.min(tq);
            let scores = sized(&mut sc.p, blk * tk);
            let o = sized(&mut sc.rows, blk * d);
            for t0 in (0..tq).step_by(blk) {
                let rows = blk.min(tq - t0);
                let width = spec.visible(t0 + rows - 1);
                let s = &mut scores[..rows * width];
                let q_rows = View { data: &qh.data[t0 * qh.rs..], ..qh };
                gemm_views(s, rows, width, d, q_rows, kt, 0.0);
                // Each row's exps unnormalized; the weighted sum is divided by the row's sum
                // afterwards (d values a row instead of `width`).
                let mut inv = [0.0f32; QUERY_BLOCK];
                for (r, row) in s.chunks_exact_mut(width).enumerate() {
                    let t = t0 + r;
                    let vis = spec.visible(t);
                    // The largest scaled score is `scale` times the largest raw one: rounding
                    // keeps the order, so these are the exps of scaling first.
                    let max = scale * simd::max(&row[..vis]);
                    let sum = simd::exp_affine_sum(&mut row[..vis], scale, max);
                    inv[r] = 1.0 / sum;
                    row[vis..].fill(0.0);
                    // SAFETY: lse element (b, t, h) is written by this (b, h) task alone.
                    unsafe { lse_w.put((b * tq + t) * hq + h, &[max + sum.ln()], 1.0) };
                }
                let p = View { data: s, rs: width, cs: 1 };
                gemm_views(&mut o[..rows * d], rows, d, width, p, vh, 0.0);
                for (r, row) in o[..rows * d].chunks_exact(d).enumerate() {
                    // SAFETY: output row (b, t0 + r, head h) is written by this task alone.
                    unsafe { out_w.put(spec.q_index(b, t0 + r, h), row, inv[r]) };
                }
            }
        });
    });
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_backward_blocked(
    dq: &mut [f32], dk: &mut [f32], dv: &mut [f32], dout: &[f32], q: &[f32], k: &[f32], v: &[f32],
    out: &[f32], lse: &[f32], spec: &AttentionSpec,
) {
    let (d, hq, hkv, tq, tk) = (spec.head_dim, spec.q_heads, spec.kv_heads, spec.q_len, spec.kv_len);
    let scale = 1.0 / (d as f32).sqrt();
    // One task per (b, kv head): it owns that head's dK and dV and the dQ rows of every
    // query head of its group, so no two tasks write the same gradient element.
    let tiles: Vec<(usize, usize)> = (0..spec.batch).flat_map(|b| (0..hkv).map(move |g| (b, g))).collect();
    let (dq_w, dk_w, dv_w) = (SharedBuf::new(dq), SharedBuf::new(dk), SharedBuf::new(dv));
    on_team(&tiles, |&(b, kvh)| {
        let (kv_k, kv_v) = (kv_view(k, spec, b, kvh), kv_view(v, spec, b, kvh));
        SCRATCH.with(|cell| {
            let sc = &mut *cell.borrow_mut();
            // K^T and V^T (d x tk) once for every head of the group and every query block.
            let kt = sized(&mut sc.kt, d * tk);
            transpose_into(kt, kv_k, tk, d);
            let vt = sized(&mut sc.vt, d * tk);
            transpose_into(vt, kv_v, tk, d);
            let (kt, vt) = (View { data: kt, rs: tk, cs: 1 }, View { data: vt, rs: tk, cs: 1 });
            let dk_t = sized(&mut sc.dk, tk * d);
            dk_t.fill(0.0);
            let dv_t = sized(&mut sc.dv, tk * d);
            dv_t.fill(0.0);
            // Query blocks as in the forward pass: a block's products reach only the keys
            // its last row sees (dK and dV beyond them get nothing from it).
            let blk = QUERY_BLOCK.min(tq);
            let (p_all, dp_all) = (sized(&mut sc.p, blk * tk), sized(&mut sc.dp, blk * tk));
            let dq_rows = sized(&mut sc.rows, blk * d);
            for h in kvh * spec.group()..(kvh + 1) * spec.group() {
                let (qh, doh) = (q_view(q, spec, b, h), q_view(dout, spec, b, h));
                for t0 in (0..tq).step_by(blk) {
                    let rows = blk.min(tq - t0);
                    let width = spec.visible(t0 + rows - 1);
                    let (p, dp) = (&mut p_all[..rows * width], &mut dp_all[..rows * width]);
                    let qv = View { data: &qh.data[t0 * qh.rs..], ..qh };
                    let dov = View { data: &doh.data[t0 * doh.rs..], ..doh };
                    // P = exp(scale * Q K^T - lse), causal
                    gemm_views(p, rows, width, d, qv, kt, 0.0);
                    for (r, row) in p.chunks_exact_mut(width).enumerate() {
                        let t = t0 + r;
                        let vis = spec.visible(t);
                        simd::exp_affine(&mut row[..vis], scale, lse[(b * tq + t) * hq + h]);
                        row[vis..].fill(0.0);
                    }
                    let pv = View { data: p, rs: width, cs: 1 };
                    // dV += P^T dO
                    gemm_views(&mut dv_t[..width * d], width, d, rows, transpose(pv), dov, 1.0);
                    // dP = dO V^T; dS = P * (dP - delta) * scale, delta_t = dot(dO_t, O_t)
                    gemm_views(dp, rows, width, d, dov, vt, 0.0);
                    for (r, (pr, dr)) in p.chunks_exact(width).zip(dp.chunks_exact_mut(width)).enumerate() {
                        let i = spec.q_index(b, t0 + r, h);
                        let delta = short_dot(&dout[i..i + d], &out[i..i + d]);
                        simd::softmax_grad(dr, pr, delta, scale);
                    }
                    // dQ rows = dS K; dK += dS^T Q
                    let ds = View { data: dp, rs: width, cs: 1 };
                    let dq_blk = &mut dq_rows[..rows * d];
                    gemm_views(dq_blk, rows, d, width, ds, kv_k, 0.0);
                    for (r, row) in dq_blk.chunks_exact(d).enumerate() {
                        // SAFETY: dQ row (b, t0 + r, head h) belongs to this task's group.
                        unsafe { dq_w.put(spec.q_index(b, t0 + r, h), row, 1.0) };
                    }
                    gemm_views(&mut dk_t[..width * d], width, d, rows, transpose(ds), qv, 1.0);
                }
            }
            // Rows past kv_len get no gradient.
            for j in 0..spec.kv_capacity {
                let i = spec.kv_index(b, j, kvh);
                // SAFETY: dK and dV rows (b, j, kvh) are written by this task alone.
                unsafe {
                    if j < tk {
                        dk_w.put(i, &dk_t[j * d..(j + 1) * d], 1.0);
                        dv_w.put(i, &dv_t[j * d..(j + 1) * d], 1.0);
                    } else {
                        dk_w.zero(i, d);
                        dv_w.zero(i, d);
                    }
                }
            }
        });
    });
}

/// [`AttentionOps::attention_rows`] as one job: the query rows split over the team, each
/// row's heads computed as `attention_forward` computes one query's (`row_heads`: a
/// head's numbers do not depend on which heads share the call), so the definition's bits.
/// A step over sixteen requests ran its attention as sixteen calls a layer, each handing
/// the heads to the team; one hand-off a layer leaves the team waiting less.
pub fn attention_rows(a: AttentionRows<'_, Vec<f32>>) -> Result<()> {
    let n = a.rows.len();
    let rows = (0..n).map(|i| a.row(i)).collect::<Result<Vec<_>>>()?;
    if n == 0 {
        return Ok(());
    }
    let (qd, hq) = (a.spec.q_heads * a.spec.head_dim, a.spec.q_heads);
    let q = &a.q[..n * qd];
    let run = |first: usize, o: &mut [f32]| {
        let mut lse = vec![0.0f32; hq];
        with_scores(|scores| {
            for (j, oj) in o.chunks_exact_mut(qd).enumerate() {
                let i = first + j;
                let (spec, k, v) = &rows[i];
                row_heads(spec, &q[i * qd..(i + 1) * qd], k, v, 0, 0, oj, &mut lse, scores);
            }
        })
    };
    let out = &mut a.out[..n * qd];
    let parts = team::parts();
    if parts > 1 && n >= 2 {
        let per = n.div_ceil(parts);
        team::run_blocks(out.chunks_mut(per * qd).enumerate(), |_, (p, o)| run(*p * per, o));
    } else {
        run(0, out);
    }
    Ok(())
}

impl AttentionOps for CpuBackend {
    fn attention_forward(
        &self, out: &mut Vec<f32>, lse: &mut Vec<f32>, q: &Vec<f32>, k: &Vec<f32>, v: &Vec<f32>,
        spec: &AttentionSpec,
    ) -> Result<()> {
        attention_forward(out, lse, q, k, v, spec)
    }
    fn attention_rows(&self, a: AttentionRows<'_, Vec<f32>>) -> Result<()> {
        attention_rows(a)
    }
    fn attention_backward(
        &self, dq: &mut Vec<f32>, dk: &mut Vec<f32>, dv: &mut Vec<f32>, dout: &Vec<f32>, q: &Vec<f32>,
        k: &Vec<f32>, v: &Vec<f32>, out: &Vec<f32>, lse: &Vec<f32>, spec: &AttentionSpec,
    ) -> Result<()> {
        attention_backward(dq, dk, dv, dout, q, k, v, out, lse, spec)
    }
}
