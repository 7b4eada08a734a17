//! Scaled dot-product attention on the CPU, any lengths, masks and bias. Twin of
//! `rusting_brain_core::ops::sdpa::sdpa`.
//!
//! One task per (batch, head, block of `Q_BLOCK` queries): the block's scores against
//! every key (`Q_BLOCK x kv_len`), masked, biased and soft-maxed in place (unnormalized),
//! then times V, each output row times its 1 / sum. On AVX-512 both products are this
//! file's tiles over K^T and V packed once a call (`Packed`; bf16 pairs for `vdpbf16ps`
//! in mixed precision); elsewhere GEMMs through `gemm_views`. The scratch is that one tile
//! per thread, never the whole `(q_len, kv_len)` matrix of a head: at 4,608 tokens (FLUX
//! at 1024 x 1024) a head's matrix is 85 MB, a tile 4.7 MB; the packed K and V are one
//! more copy of k and v.

use rayon::prelude::*;
use rusting_brain_core::ops::sdpa::SdpaSpec;
use rusting_brain_core::Result;

use super::attention::{gemm_views, with_tiles, View};
use super::matmul::round_all;
use super::simd;
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::SdpaOps;
use rusting_brain_core::ops::matmul::{round_bf16, OperandPrecision};

/// Queries per task: enough rows for the GEMMs to run at speed (at 4,608 tokens, 24 heads
/// of 128: 64 rows ran at 123 GFLOP/s on 2 Xeon cores, 128 at 149, 256 at 159; see
/// bench_image), few enough that the tile stays in the last-level cache.
pub(crate) const Q_BLOCK: usize = 256;
/// Queries per task on AMX tiles: the products cost little there, the passes over the
/// block's scores (copy-out, softmax, bf16 pairs) the most, and 64 rows x 4,096 keys (1
/// MiB) stay in L2 where 256 rows (4 MiB) went out to L3.
const Q_BLOCK_AMX: usize = 64;

/// The scratch one task holds, in floats (for the memory report of the benchmarks).
pub fn tile_floats(spec: &SdpaSpec) -> usize {
    Q_BLOCK.min(spec.q_len) * (spec.kv_len + spec.head_dim)
}

/// Scaled dot-product attention on the CPU, blocked over queries (see [`SdpaSpec`] for the
/// layout, masks and bias): the fused kernel whose reference twin is core's `ops::sdpa`.
#[allow(clippy::too_many_arguments)]
pub fn sdpa(
    out: &mut [f32], q: &[f32], k: &[f32], v: &[f32], key_mask: Option<&[bool]>, bias: Option<&[f32]>,
    spec: &SdpaSpec,
) -> Result<()> {
    spec.check(out.len(), q.len(), k.len(), v.len(), key_mask.map(|m| m.len()), bias.map(|b| b.len()))?;
    let (d, hq, tk) = (spec.head_dim, spec.heads, spec.kv_len);
    if out.is_empty() {
        return Ok(());
    }
    let bf16 = spec.precision == OperandPrecision::Bf16;
    let amx = cfg!(target_arch = "x86_64") && bf16 && simd::has_amx_bf16() && super::bf16::available();
    let q_block = if amx { Q_BLOCK_AMX } else { Q_BLOCK };
    let blocks = spec.q_len.div_ceil(q_block);
    let tasks: Vec<(usize, usize, usize)> = (0..spec.batch)
        .flat_map(|b| (0..hq).flat_map(move |h| (0..blocks).map(move |blk| (b, h, blk))))
        .collect();
    // On AVX-512 the two products run on this file's tiles over K^T and V packed once per
    // key/value head (see `Packed`), as bf16 pairs for `vdpbf16ps` in mixed precision where
    // the CPU has AVX512_BF16; elsewhere on `gemm_views`, which packs per task (in mixed
    // precision over rounded copies of q, k and v, and rounded probabilities).
    #[cfg(target_arch = "x86_64")]
    let packed = (simd::isa() == simd::Isa::Avx512 && tk > 0 && (!bf16 || super::bf16::available()))
        .then(|| Packed::new(k, v, spec, bf16, amx));
    #[cfg(not(target_arch = "x86_64"))]
    let packed: Option<Packed> = None;
    let rounded;
    let (q, k, v) = if bf16 && packed.is_none() {
        rounded = (round_all(q), round_all(k), round_all(v));
        (&rounded.0[..], &rounded.1[..], &rounded.2[..])
    } else {
        (q, k, v)
    };
    // Each task's output rows (strided over the heads in `out`) come back as a block, to be
    // placed afterwards: tasks never share a write.
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(b, h, blk)| {
            let t0 = blk * q_block;
            let rows = q_block.min(spec.q_len - t0);
            let kvh = h / spec.group();
            let mut o = vec![0.0f32; rows * d];
            if tk == 0 {
                return o;
            }
            let q0 = spec.q_index(b, t0, h);
            let qv = View { data: &q[q0..], rs: hq * d, cs: 1 };
            let kv0 = spec.kv_index(b, 0, kvh);
            let stride = spec.kv_heads * d;
            with_tiles(rows * tk, |s, inv| {
                if let Some(packed) = &packed {
                    packed.scores(s, &q[q0..], hq * d, rows, b * spec.kv_heads + kvh);
                } else {
                    // K^T: (d, kv_len) read from the (kv_len, d) rows.
                    gemm_views(s, rows, tk, d, qv, View { data: &k[kv0..], rs: 1, cs: stride }, 0.0);
                }
                // Without a bias, the scale joins the exponential (exp(scale s - scale max),
                // the same softmax for a positive scale) instead of a pass of its own; each
                // row's 1 / sum scales its output (P stays unnormalized, as mixed precision
                // rounds it) instead of P.
                let fold_scale = bias.is_none() && spec.scale > 0.0;
                for (r, row) in s.chunks_mut(tk).enumerate() {
                    let t = t0 + r;
                    if !fold_scale {
                        simd::scale(row, spec.scale);
                    }
                    if let Some(bias) = bias {
                        let bi = (h * spec.q_len + t) * tk;
                        simd::axpy(row, 1.0, &bias[bi..bi + tk]);
                    }
                    row[spec.visible(t)..].fill(f32::NEG_INFINITY);
                    if let Some(mask) = key_mask {
                        for (x, &open) in row.iter_mut().zip(&mask[b * tk..(b + 1) * tk]) {
                            if !open {
                                *x = f32::NEG_INFINITY;
                            }
                        }
                    }
                    let max = simd::max(row);
                    inv[r] = 0.0;
                    if max == f32::NEG_INFINITY {
                        // No key visible: a zero row of P, so zeros out, as the reference.
                        row.fill(0.0);
                        continue;
                    }
                    let sum = if fold_scale {
                        simd::exp_affine_sum(row, spec.scale, spec.scale * max)
                    } else {
                        simd::exp_sub_sum(row, max)
                    };
                    inv[r] = 1.0 / sum;
                }
                if let Some(packed) = &packed {
                    packed.values(&mut o, s, &inv[..rows], b * spec.kv_heads + kvh);
                    return;
                }
                if bf16 {
                    s.iter_mut().for_each(|x| *x = round_bf16(*x));
                }
                let vv = View { data: &v[kv0..], rs: stride, cs: 1 };
                gemm_views(&mut o, rows, d, tk, View { data: s, rs: tk, cs: 1 }, vv, 0.0);
                for (row, &f) in o.chunks_mut(d).zip(inv.iter()) {
                    simd::scale(row, f);
                }
            });
            o
        })
        .collect();
    for (&(b, h, blk), o) in tasks.iter().zip(&results) {
        for (r, src) in o.chunks(d).enumerate() {
            let i = spec.q_index(b, blk * q_block + r, h);
            out[i..i + d].copy_from_slice(src);
        }
    }
    Ok(())
}

/// Keys a packed K^T panel holds (four vectors of 16 lanes).
const PANEL: usize = 64;

/// K^T and V of every (batch, key/value head), packed once a call for the AVX-512 tiles:
/// K^T as panels of `PANEL` keys, each `d` rows of `PANEL` floats (a tile's loads for one
/// step of the dot product are one contiguous run; a plain (d, kv_len) matrix put those
/// rows kv_len floats apart, every one in the same L1 set at 4,096 keys), keys past
/// kv_len zero; V as rows of `dp` floats (d rounded up to 16, zeros after d) so a row's
/// vectors load without masks. Packing costs two reads of K and V, against `q_len / 6`
/// and `q_len / 8` passes over them by the products.
///
/// In mixed precision the same layouts hold bf16 pairs along each product's sum, as
/// `vdpbf16ps` reads them (the low half first): K^T's rows are pairs of head dimensions
/// (`(k[j][2c], k[j][2c + 1])`), V's rows pairs of keys (`(v[2j][c], v[2j + 1][c])`), each
/// rounded as core's `round_bf16`, a missing half zero.
struct Packed {
    kt: Vec<u32>,
    v: Vec<u32>,
    /// Where the packed words start in `kt` and `v` (on a 64-byte line for AMX).
    kt_at: usize,
    v_at: usize,
    bf16: bool,
    /// Both products on AMX-BF16 tiles (see [`Packed::scores_amx`]): the steps along each
    /// sum padded with zeros to a multiple of 16, a tile's rows.
    amx: bool,
    d: usize,
    dp: usize,
    tk: usize,
    panels: usize,
}

impl Packed {
    /// Words a K^T panel row and a V row span: f32 bits, or bf16 pairs.
    fn steps(&self) -> (usize, usize) {
        if self.bf16 {
            (self.d.div_ceil(2), self.tk.div_ceil(2))
        } else {
            (self.d, self.tk)
        }
    }

    /// [`Packed::steps`] as stored: padded to a multiple of 16 for AMX.
    fn stored_steps(&self) -> (usize, usize) {
        let (kt_rows, v_rows) = self.steps();
        if self.amx {
            (kt_rows.next_multiple_of(16), v_rows.next_multiple_of(16))
        } else {
            (kt_rows, v_rows)
        }
    }

    // Off x86-64 nothing packs (the tiles are AVX-512's), but the type stays for the callers.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn new(k: &[f32], v: &[f32], spec: &SdpaSpec, bf16: bool, amx: bool) -> Packed {
        let (d, tk) = (spec.head_dim, spec.kv_len);
        let dp = d.next_multiple_of(16);
        let panels = tk.div_ceil(PANEL);
        let heads = spec.batch * spec.kv_heads;
        let mut packed =
            Packed { kt: Vec::new(), v: Vec::new(), kt_at: 0, v_at: 0, bf16, amx, d, dp, tk, panels };
        let (_, v_rows) = packed.steps();
        // Zeros past the steps (the vectors below start zeroed): AMX's padding.
        let (kt_rows, v_stored) = packed.stored_steps();
        let (kt_head, v_head) = (panels * kt_rows * PANEL, v_stored * dp);
        // On 64-byte lines where AMX reads them (see `amx::aligned`).
        let (mut kt_buf, mut v_buf) = (Vec::new(), Vec::new());
        let (kt, vp) = if amx {
            (
                super::amx::aligned(&mut kt_buf, heads * kt_head),
                super::amx::aligned(&mut v_buf, heads * v_head),
            )
        } else {
            kt_buf.resize(heads * kt_head, 0);
            v_buf.resize(heads * v_head, 0);
            (&mut kt_buf[..], &mut v_buf[..])
        };
        let (kt_addr, v_addr) = (kt.as_ptr() as usize, vp.as_ptr() as usize);
        let word =
            |lo: f32, hi: Option<&f32>| super::bf16::bits(lo) | hi.map_or(0, |&h| super::bf16::bits(h) << 16);
        kt.par_chunks_mut(kt_head).zip(vp.par_chunks_mut(v_head)).enumerate().for_each(|(bh, (kt, vp))| {
            let (b, kvh) = (bh / spec.kv_heads, bh % spec.kv_heads);
            let row = |j: usize| &k[spec.kv_index(b, j, kvh)..spec.kv_index(b, j, kvh) + d];
            let vrow = |j: usize| &v[spec.kv_index(b, j, kvh)..spec.kv_index(b, j, kvh) + d];
            for j in 0..tk {
                let (panel, lane) = (j / PANEL, j % PANEL);
                let at = |c: usize| (panel * kt_rows + c) * PANEL + lane;
                if bf16 {
                    for (c, pair) in row(j).chunks(2).enumerate() {
                        kt[at(c)] = word(pair[0], pair.get(1));
                    }
                } else {
                    for (c, &x) in row(j).iter().enumerate() {
                        kt[at(c)] = x.to_bits();
                    }
                }
            }
            if bf16 {
                for jp in 0..v_rows {
                    let hi = (2 * jp + 1 < tk).then(|| vrow(2 * jp + 1));
                    for (c, &lo) in vrow(2 * jp).iter().enumerate() {
                        vp[jp * dp + c] = word(lo, hi.map(|h| &h[c]));
                    }
                }
            } else {
                for j in 0..tk {
                    for (c, &x) in vrow(j).iter().enumerate() {
                        vp[j * dp + c] = x.to_bits();
                    }
                }
            }
        });
        packed.kt_at = (kt_addr - kt_buf.as_ptr() as usize) / 4;
        packed.v_at = (v_addr - v_buf.as_ptr() as usize) / 4;
        (packed.kt, packed.v) = (kt_buf, v_buf);
        packed
    }

    /// `s (rows, tk) = q (rows, d; rows q_rs apart) K^T` for packed head `bh`.
    fn scores(&self, s: &mut [f32], q: &[f32], q_rs: usize, rows: usize, bh: usize) {
        let (d, tk) = (self.d, self.tk);
        let (kt_rows, _) = self.stored_steps();
        assert!(s.len() >= rows * tk && (rows - 1) * q_rs + d <= q.len(), "sdpa: score tile out of bounds");
        let head = self.panels * kt_rows * PANEL;
        let kt = &self.kt[self.kt_at + bh * head..self.kt_at + (bh + 1) * head];
        #[cfg(target_arch = "x86_64")]
        if self.amx {
            return self.scores_amx(s, q, q_rs, rows, kt);
        }
        #[cfg(target_arch = "x86_64")]
        with_words(if self.bf16 { rows * kt_rows } else { 0 }, |qw| {
            if self.bf16 {
                // The block's query rows as bf16 pairs, kt_rows words a row.
                for (r, w) in qw.chunks_mut(kt_rows).enumerate() {
                    for (w, pair) in w.iter_mut().zip(q[r * q_rs..r * q_rs + d].chunks(2)) {
                        *w = super::bf16::bits(pair[0])
                            | pair.get(1).map_or(0, |&h| super::bf16::bits(h) << 16);
                    }
                }
            }
            for r0 in (0..rows).step_by(6) {
                let (qr, sr) = (&q[r0 * q_rs..], &mut s[r0 * tk..]);
                let qw = &qw[(r0 * kt_rows).min(qw.len())..];
                macro_rules! tile {
                    ($r:literal) => {
                        if self.bf16 {
                            scores_tile_bf16::<$r>(sr, qw, kt_rows, kt, tk)
                        } else {
                            scores_tile::<$r>(sr, qr, q_rs, d, kt, tk)
                        }
                    };
                }
                // SAFETY: Packed exists only where isa() is Avx512 (and AVX512_BF16 when
                // bf16); the assert above proves rows r0.. of q (d values each, q_rs
                // apart) and of s (tk each) in bounds, `qw` holds those rows' kt_rows
                // words, and `kt` this head's `panels` panels of kt_rows x PANEL.
                unsafe {
                    match 6.min(rows - r0) {
                        6 => tile!(6),
                        5 => tile!(5),
                        4 => tile!(4),
                        3 => tile!(3),
                        2 => tile!(2),
                        _ => tile!(1),
                    }
                }
            }
        });
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("packed attention is AVX-512's ({kt:?})");
    }

    /// `o (rows, d) = diag(inv) p (rows, tk) V` for packed head `bh` (`inv`: one factor a
    /// row, the softmax's 1 / sum).
    fn values(&self, o: &mut [f32], p: &[f32], inv: &[f32], bh: usize) {
        let (d, dp, tk, rows) = (self.d, self.dp, self.tk, inv.len());
        let (_, v_rows) = self.stored_steps();
        assert!(o.len() >= rows * d && p.len() >= rows * tk, "sdpa: value tile out of bounds");
        let v = &self.v[self.v_at + bh * v_rows * dp..self.v_at + (bh + 1) * v_rows * dp];
        #[cfg(target_arch = "x86_64")]
        if self.amx {
            return self.values_amx(o, p, inv, v);
        }
        #[cfg(target_arch = "x86_64")]
        with_words(if self.bf16 { rows * v_rows } else { 0 }, |pw| {
            if self.bf16 {
                // The probabilities as bf16 pairs of keys, v_rows words a row.
                for (r, w) in pw.chunks_mut(v_rows).enumerate() {
                    probability_words(&p[r * tk..(r + 1) * tk], w);
                }
            }
            // Column tiles of up to four vectors; rows in groups that keep the accumulators
            // (rows x vectors) within the 32 registers.
            for c0 in (0..d).step_by(64) {
                let cols = 64.min(d - c0);
                macro_rules! run {
                    ($nv:literal, $r:literal) => {
                        for r0 in (0..rows).step_by($r) {
                            let (pr, or, ir) = (&p[r0 * tk..], &mut o[r0 * d..], &inv[r0..]);
                            let pw = &pw[(r0 * v_rows).min(pw.len())..];
                            macro_rules! tile {
                                ($rr:literal) => {
                                    if self.bf16 {
                                        values_tile_bf16::<$rr, $nv>(or, d, pw, v_rows, ir, v, dp, c0, cols)
                                    } else {
                                        values_tile::<$rr, $nv>(or, d, pr, tk, ir, v, dp, c0, cols)
                                    }
                                };
                            }
                            // SAFETY: isa() is Avx512 (and AVX512_BF16 when bf16); the
                            // assert above proves rows r0.. of p and o in bounds, `pw` holds
                            // those rows' v_rows words, and `v` holds v_rows rows of
                            // dp >= c0 + 16 nv words.
                            unsafe {
                                match $r.min(rows - r0) {
                                    8 => tile!(8),
                                    7 => tile!(7),
                                    6 => tile!(6),
                                    5 => tile!(5),
                                    4 => tile!(4),
                                    3 => tile!(3),
                                    2 => tile!(2),
                                    _ => tile!(1),
                                }
                            }
                        }
                    };
                }
                match cols.div_ceil(16) {
                    1 => run!(1, 8),
                    2 => run!(2, 8),
                    3 => run!(3, 8),
                    _ => run!(4, 6),
                }
            }
        });
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("packed attention is AVX-512's ({v:?}, {o:?}, {p:?})");
    }

    /// [`Packed::scores`] on AMX-BF16 tiles: the block's queries as bf16 pairs in groups of
    /// 16 rows (`amx::scatter_row`; dimensions past d zero, as K^T's rows past d are), 32
    /// queries by 32 keys a block over the d / 32 steps, each block's sums copied into
    /// `s`.
    #[cfg(target_arch = "x86_64")]
    fn scores_amx(&self, s: &mut [f32], q: &[f32], q_rs: usize, rows: usize, kt: &[u32]) {
        use super::amx;
        let (d, tk) = (self.d, self.tk);
        let (kt_rows, _) = self.stored_steps();
        let blocks = rows.div_ceil(amx::ROWS);
        with_words(blocks * amx::ROWS * kt_rows, |qw| {
            let mut words = vec![0u32; kt_rows];
            for r in 0..rows {
                for (w, pair) in words.iter_mut().zip(q[r * q_rs..r * q_rs + d].chunks(2)) {
                    *w = super::bf16::bits(pair[0]) | pair.get(1).map_or(0, |&h| super::bf16::bits(h) << 16);
                }
                let group = &mut qw[r / amx::GROUP * amx::GROUP * kt_rows..][..amx::GROUP * kt_rows];
                amx::scatter_row(group, r % amx::GROUP, &words);
            }
            // Rows past `rows` in the last block hold what the buffer held: their sums are
            // not copied out.
            let mut sums = amx::Sums([0; amx::ROWS * 32]);
            // SAFETY: Packed sets `amx` only where has_amx_bf16() granted the tiles.
            let _tiles = unsafe { amx::Tiles::configure() };
            for r0 in (0..rows).step_by(amx::ROWS) {
                let a = &qw[r0 * kt_rows..(r0 + amx::ROWS) * kt_rows];
                for j0 in (0..tk).step_by(32) {
                    let cols = 32.min(tk - j0);
                    // Keys j0.. of their panel: rows of PANEL words, 16 rows a step.
                    let (panel, lane) = (j0 / PANEL, j0 % PANEL);
                    let at = kt[(panel * kt_rows) * PANEL + lane..].as_ptr();
                    let b = amx::BTiles { at, stride: PANEL * 4, step: 16 * PANEL * 4 };
                    // Both calls below: the tiles are configured and AMX-BF16 is there;
                    // both groups of A hold kt_rows / 16 steps; the panel's kt_rows rows of
                    // PANEL words from `lane` (+ 32 <= PANEL) are inside this head's K^T.
                    // A whole block is stored straight into the scores, one at an edge
                    // through `sums`.
                    if cols == 32 && rows - r0 >= amx::ROWS {
                        let at = s[r0 * tk + j0..].as_mut_ptr().cast::<u32>();
                        let out = amx::Out { at, stride: tk * 4 };
                        // SAFETY: as above; rows r0..r0 + 32, columns j0..j0 + 32 of `s`
                        // (rows tk floats apart) are inside it.
                        unsafe { amx::block(out, a, b, kt_rows / 16, 2, amx::Kind::Bf16) };
                        continue;
                    }
                    let out = amx::Out::sums(&mut sums);
                    // SAFETY: as above; `sums` holds the block.
                    unsafe { amx::block(out, a, b, kt_rows / 16, cols.div_ceil(16), amx::Kind::Bf16) };
                    for r in 0..amx::ROWS.min(rows - r0) {
                        let dst = &mut s[(r0 + r) * tk + j0..(r0 + r) * tk + j0 + cols];
                        for (x, &bits) in dst.iter_mut().zip(&sums.0[r * 32..]) {
                            *x = f32::from_bits(bits);
                        }
                    }
                }
            }
        });
    }

    /// [`Packed::values`] on AMX-BF16 tiles: the probabilities as bf16 pairs of keys in
    /// groups of 16 rows (pairs past the keys zero, as V's rows there are), 32 rows by 32
    /// columns of V a block over tk / 32 steps, each row times its `inv`.
    #[cfg(target_arch = "x86_64")]
    fn values_amx(&self, o: &mut [f32], p: &[f32], inv: &[f32], v: &[u32]) {
        use super::amx;
        let (d, dp, tk, rows) = (self.d, self.dp, self.tk, inv.len());
        let (_, v_rows) = self.stored_steps();
        let blocks = rows.div_ceil(amx::ROWS);
        with_words(blocks * amx::ROWS * v_rows, |pw| {
            let mut words = vec![0u32; v_rows];
            for r in 0..rows {
                probability_words(&p[r * tk..(r + 1) * tk], &mut words);
                let group = &mut pw[r / amx::GROUP * amx::GROUP * v_rows..][..amx::GROUP * v_rows];
                amx::scatter_row(group, r % amx::GROUP, &words);
            }
            let mut sums = amx::Sums([0; amx::ROWS * 32]);
            // SAFETY: Packed sets `amx` only where has_amx_bf16() granted the tiles.
            let _tiles = unsafe { amx::Tiles::configure() };
            for r0 in (0..rows).step_by(amx::ROWS) {
                let a = &pw[r0 * v_rows..(r0 + amx::ROWS) * v_rows];
                for c0 in (0..d).step_by(32) {
                    let cols = 32.min(d - c0);
                    let b = amx::BTiles { at: v[c0..].as_ptr(), stride: dp * 4, step: 16 * dp * 4 };
                    let out = amx::Out::sums(&mut sums);
                    // SAFETY: the tiles are configured and AMX-BF16 is there; both groups
                    // of A hold v_rows / 16 steps; V holds v_rows rows of dp words, and a
                    // second column tile is read only when cols > 16, where c0 + 32 <= dp;
                    // `sums` holds the block.
                    unsafe { amx::block(out, a, b, v_rows / 16, cols.div_ceil(16), amx::Kind::Bf16) };
                    for r in 0..amx::ROWS.min(rows - r0) {
                        let f = inv[r0 + r];
                        let dst = &mut o[(r0 + r) * d + c0..(r0 + r) * d + c0 + cols];
                        for (x, &bits) in dst.iter_mut().zip(&sums.0[r * 32..]) {
                            *x = f * f32::from_bits(bits);
                        }
                    }
                }
            }
        });
    }
}

/// A row of probabilities as bf16 pairs of keys (`words[j]` = `(row[2j], row[2j + 1])`, a
/// missing half zero), 32 floats a conversion; only where AVX512_BF16 is (mixed-precision
/// packing exists only there).
#[cfg(target_arch = "x86_64")]
fn probability_words(row: &[f32], words: &mut [u32]) {
    let full = row.len() / 32;
    for i in 0..full {
        // SAFETY: the callers pack bf16 only where AVX512_BF16 is there; the 32 floats from
        // 32 i are in the row, the 16 words in `words` (it holds row.len() / 2 rounded up).
        unsafe {
            let w = super::bf16::words_of_run(row.as_ptr().add(32 * i));
            std::arch::x86_64::_mm512_storeu_si512(words.as_mut_ptr().add(16 * i).cast(), w);
        }
    }
    for (w, pair) in words[16 * full..].iter_mut().zip(row[32 * full..].chunks(2)) {
        *w = super::bf16::bits(pair[0]) | pair.get(1).map_or(0, |&h| super::bf16::bits(h) << 16);
    }
}

thread_local! {
    /// The bf16 pairs of a task's queries or probabilities, kept between calls (a block's
    /// probabilities are megabytes: a fresh allocation a task would fault its pages in).
    static WORDS: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` words of this thread's kept buffer (contents left over: the callers
/// write every word they read).
#[cfg(target_arch = "x86_64")]
fn with_words<R>(len: usize, f: impl FnOnce(&mut [u32]) -> R) -> R {
    // On a 64-byte line: AMX's tile loads read these words (see `amx::aligned`).
    WORDS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut w) => f(super::amx::aligned(&mut w, len)),
        Err(_) => f(super::amx::aligned(&mut Vec::new(), len)),
    })
}

/// `R` rows of scores, `s[r][j] = sum_c q[r][c] kt[c][j]`, keys in panels of 64: per
/// panel, `R x 4` accumulators over the `d` steps, c in order (one sum in a fixed order
/// per score), stored masked past `tk`.
///
/// # Safety
/// AVX-512F; `q` holds R rows of d values `q_rs` apart, `s` R rows of `tk`, `kt`
/// `tk.div_ceil(64)` panels of d x 64.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scores_tile<const R: usize>(
    s: &mut [f32], q: &[f32], q_rs: usize, d: usize, kt: &[u32], tk: usize,
) {
    use std::arch::x86_64::*;
    for (panel, j0) in (0..tk).step_by(PANEL).enumerate() {
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        let base = kt.as_ptr().add(panel * d * PANEL).cast::<f32>();
        for c in 0..d {
            let kp = base.add(c * PANEL);
            let kv = [
                _mm512_loadu_ps(kp),
                _mm512_loadu_ps(kp.add(16)),
                _mm512_loadu_ps(kp.add(32)),
                _mm512_loadu_ps(kp.add(48)),
            ];
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = _mm512_set1_ps(*q.get_unchecked(r * q_rs + c));
                for (acc, &kv) in acc.iter_mut().zip(&kv) {
                    *acc = _mm512_fmadd_ps(a, kv, *acc);
                }
            }
        }
        store_tile(&acc, s.as_mut_ptr().add(j0), tk, (tk - j0).min(PANEL), None);
    }
}

/// `R` rows of outputs, columns `c0..c0 + cols` (`cols <= 16 NV`): `o[r][c] = inv[r]
/// sum_j p[r][j] v[j][c]`, j in order, `R x NV` accumulators.
///
/// # Safety
/// AVX-512F; `p` holds R rows of `tk` values `ldp` apart, `inv` R values, `o` R rows of
/// `ldo`, `v` `tk` rows of `ldv >= c0 + 16 NV` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn values_tile<const R: usize, const NV: usize>(
    o: &mut [f32], ldo: usize, p: &[f32], ldp: usize, inv: &[f32], v: &[u32], ldv: usize, c0: usize,
    cols: usize,
) {
    use std::arch::x86_64::*;
    let tk = v.len() / ldv;
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for j in 0..tk {
        let vp = v.as_ptr().add(j * ldv + c0).cast::<f32>();
        let mut vv = [_mm512_setzero_ps(); NV];
        for (x, vv) in vv.iter_mut().enumerate() {
            *vv = _mm512_loadu_ps(vp.add(16 * x));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = _mm512_set1_ps(*p.get_unchecked(r * ldp + j));
            for (acc, &vv) in acc.iter_mut().zip(&vv) {
                *acc = _mm512_fmadd_ps(a, vv, *acc);
            }
        }
    }
    store_tile(&acc, o.as_mut_ptr().add(c0), ldo, cols, Some(inv));
}

/// A tile's accumulators to `R` rows `ld` apart from `dst`, the first `lanes` columns of
/// each (the rest masked off), each row times `scale[r]` when given.
///
/// # Safety
/// AVX-512F; `dst` reaches `(R - 1) ld + lanes` floats; `scale` holds R values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn store_tile<const R: usize, const N: usize>(
    acc: &[[std::arch::x86_64::__m512; N]; R], dst: *mut f32, ld: usize, lanes: usize, scale: Option<&[f32]>,
) {
    use std::arch::x86_64::*;
    for (r, acc) in acc.iter().enumerate() {
        let f = scale.map(|s| _mm512_set1_ps(*s.get_unchecked(r)));
        for (x, &sum) in acc.iter().enumerate() {
            let n = lanes.saturating_sub(16 * x).min(16);
            if n > 0 {
                let m = ((1u32 << n) - 1) as u16;
                let v = f.map_or(sum, |f| _mm512_mul_ps(f, sum));
                _mm512_mask_storeu_ps(dst.add(r * ld + 16 * x), m, v);
            }
        }
    }
}

/// Sixteen words as the bf16 pairs `vdpbf16ps` multiplies.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn as_bh(x: std::arch::x86_64::__m512i) -> std::arch::x86_64::__m512bh {
    // SAFETY: both are 64 bytes of plain bits; every bit pattern is a valid value of each.
    unsafe { std::mem::transmute::<std::arch::x86_64::__m512i, std::arch::x86_64::__m512bh>(x) }
}

/// [`scores_tile`] on bf16 pairs: `qw` holds R rows of `steps` words (pairs of the
/// query's dimensions), `kt` panels of `steps` x 64 words; `vdpbf16ps` adds each step's
/// two products to the f32 accumulators.
///
/// # Safety
/// AVX-512F and AVX512_BF16; `qw` holds R rows of `steps` words, `s` R rows of `tk`, `kt`
/// `tk.div_ceil(64)` panels of steps x 64 words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn scores_tile_bf16<const R: usize>(s: &mut [f32], qw: &[u32], steps: usize, kt: &[u32], tk: usize) {
    use std::arch::x86_64::*;
    for (panel, j0) in (0..tk).step_by(PANEL).enumerate() {
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        let base = kt.as_ptr().add(panel * steps * PANEL);
        for c in 0..steps {
            let kp = base.add(c * PANEL);
            let kv: [__m512bh; 4] = [
                as_bh(_mm512_loadu_si512(kp.cast())),
                as_bh(_mm512_loadu_si512(kp.add(16).cast())),
                as_bh(_mm512_loadu_si512(kp.add(32).cast())),
                as_bh(_mm512_loadu_si512(kp.add(48).cast())),
            ];
            for (r, acc) in acc.iter_mut().enumerate() {
                let a: __m512bh = as_bh(_mm512_set1_epi32(*qw.get_unchecked(r * steps + c) as i32));
                for (acc, &kv) in acc.iter_mut().zip(&kv) {
                    *acc = _mm512_dpbf16_ps(*acc, a, kv);
                }
            }
        }
        store_tile(&acc, s.as_mut_ptr().add(j0), tk, (tk - j0).min(PANEL), None);
    }
}

/// [`values_tile`] on bf16 pairs: `pw` holds R rows of `steps` words (pairs of keys'
/// probabilities), `v` `steps` rows of `ldv` words (pairs of value rows).
///
/// # Safety
/// AVX-512F and AVX512_BF16; `pw` holds R rows of `steps` words, `inv` R values, `o` R
/// rows of `ldo`, `v` `steps` rows of `ldv >= c0 + 16 NV` words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn values_tile_bf16<const R: usize, const NV: usize>(
    o: &mut [f32], ldo: usize, pw: &[u32], steps: usize, inv: &[f32], v: &[u32], ldv: usize, c0: usize,
    cols: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for j in 0..steps {
        let vp = v.as_ptr().add(j * ldv + c0);
        let mut vv: [__m512bh; NV] = [as_bh(_mm512_setzero_si512()); NV];
        for (x, vv) in vv.iter_mut().enumerate() {
            *vv = as_bh(_mm512_loadu_si512(vp.add(16 * x).cast()));
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let a: __m512bh = as_bh(_mm512_set1_epi32(*pw.get_unchecked(r * steps + j) as i32));
            for (acc, &vv) in acc.iter_mut().zip(&vv) {
                *acc = _mm512_dpbf16_ps(*acc, a, vv);
            }
        }
    }
    store_tile(&acc, o.as_mut_ptr().add(c0), ldo, cols, Some(inv));
}

impl SdpaOps for CpuBackend {
    fn sdpa(
        &self, out: &mut Vec<f32>, q: &Vec<f32>, k: &Vec<f32>, v: &Vec<f32>, key_mask: Option<&[bool]>,
        bias: Option<&Vec<f32>>, spec: &SdpaSpec,
    ) -> Result<()> {
        sdpa(out, q, k, v, key_mask, bias.map(|b| &b[..]), spec)
    }
}
