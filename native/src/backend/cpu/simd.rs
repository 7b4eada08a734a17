//! The inner loops of the CPU backend, compiled three times (AVX-512, AVX2+FMA, baseline)
//! and picked at run time, so one binary runs fast on any x86-64 and on aarch64 without
//! `-C target-cpu=native`.
//!
//! Each kernel is one `#[inline(always)]` body written with independent accumulator lanes
//! (so LLVM can vectorize a reduction without reassociating it), instantiated inside
//! `#[target_feature]` wrappers. Each has a plain twin in `rusting_brain_core::ops` and
//! the backend tests compare them.

use std::sync::OnceLock;

use rusting_brain_core::ops::optim::AdamConstants;
use rusting_brain_core::ops::unary::Unary;

/// The instruction set the kernels run with, detected once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F (with VNNI and BF16 where present).
    Avx512,
    /// AVX2 with FMA.
    Avx2Fma,
    /// SSE2 on x86-64, NEON (which always has FMA) on aarch64.
    Baseline,
}

impl Isa {
    /// The name printed in benchmark tables and logs.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512f",
            Isa::Avx2Fma => "avx2+fma",
            Isa::Baseline if cfg!(target_arch = "aarch64") => "neon",
            Isa::Baseline => "baseline",
        }
    }
}

/// The instruction set the kernels run with: the best this CPU has, or a lower one asked
/// for with `RB_CPU_ISA` (`avx512`, `avx2`, `baseline`), so tests and benchmarks can run
/// every path on one machine. A path the CPU lacks is never taken: the request is lowered
/// to what the CPU has. The f32 GEMMs are the `gemm` crate's, which picks its own kernels
/// at run time and has no such switch.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let detected = detected_isa();
        match requested_isa() {
            Some(want) if rank(want) < rank(detected) => want,
            _ => detected,
        }
    })
}

fn rank(isa: Isa) -> u8 {
    match isa {
        Isa::Baseline => 0,
        Isa::Avx2Fma => 1,
        Isa::Avx512 => 2,
    }
}

/// `RB_CPU_ISA`, when set to a path name; anything else is reported once and ignored.
fn requested_isa() -> Option<Isa> {
    let value = std::env::var("RB_CPU_ISA").ok()?;
    match value.trim().to_ascii_lowercase().as_str() {
        "avx512" | "avx512f" => Some(Isa::Avx512),
        "avx2" | "avx2+fma" => Some(Isa::Avx2Fma),
        "baseline" | "portable" | "neon" => Some(Isa::Baseline),
        "" | "native" | "auto" => None,
        other => {
            eprintln!(
                "rusting_brain: RB_CPU_ISA={other:?} is not one of avx512, avx2, baseline, native; using the CPU's best"
            );
            None
        }
    }
}

fn detected_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            return Isa::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return Isa::Avx2Fma;
        }
    }
    Isa::Baseline
}

/// `a * b + c`, fused where the instruction set has FMA (never a slow libm call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

const LANES: usize = 16;
const BASE_FMA: bool = cfg!(target_arch = "aarch64");

/// Defines `pub fn $name(args) -> ret` that dispatches to `$body::<FMA>` compiled for the
/// detected instruction set. The `unsafe` calls are sound because each wrapper is only
/// called after `isa()` detected its features on this CPU.
macro_rules! dispatch {
    ($(#[$doc:meta])* $name:ident => $body:ident ( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)?) => {
        $(#[$doc])*
        #[inline]
        pub fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? { $body::<true>($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? { $body::<true>($($arg),*) }
                match isa() {
                    // SAFETY: isa() returned this variant only after run-time detection
                    // found these features on the running CPU.
                    Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    Isa::Avx2Fma => return unsafe { avx2($($arg),*) },
                    Isa::Baseline => {}
                }
            }
            $body::<BASE_FMA>($($arg),*)
        }
    };
}

/// Elements per step of the reductions: four vectors of 16, so four independent FMA
/// chains hide the FMA latency (one chain would run at a quarter of the machine's rate).
const STEP: usize = 4 * LANES;

/// Fixed-size views, so the inner loops have no bounds checks and vectorize fully.
#[inline(always)]
fn block(x: &[f32]) -> &[f32; STEP] {
    x.try_into().expect("chunks_exact yields STEP elements")
}

#[inline(always)]
fn lanes(x: &[f32]) -> &[f32; LANES] {
    x.try_into().expect("chunks_exact yields LANES elements")
}

#[inline(always)]
fn block_mut(x: &mut [f32]) -> &mut [f32; STEP] {
    x.try_into().expect("chunks_exact yields STEP elements")
}

#[inline(always)]
fn fold(acc: &[f32; STEP]) -> f32 {
    let mut v = [0.0f32; LANES];
    for l in 0..LANES {
        v[l] = (acc[l] + acc[LANES + l]) + (acc[2 * LANES + l] + acc[3 * LANES + l]);
    }
    hsum(&v)
}

#[inline(always)]
fn dot_body<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; STEP];
    let (ca, cb) = (a.chunks_exact(STEP), b.chunks_exact(STEP));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        let (x, y) = (block(x), block(y));
        for l in 0..STEP {
            acc[l] = madd::<FMA>(x[l], y[l], acc[l]);
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ta.iter().zip(tb) {
        tail = madd::<FMA>(*x, *y, tail);
    }
    fold(&acc) + tail
}

#[inline(always)]
fn dot4_body<const FMA: bool>(x: &[f32], r0: &[f32], r1: &[f32], r2: &[f32], r3: &[f32]) -> [f32; 4] {
    // Four rows against one vector: four independent memory streams in flight (one
    // sequential stream per core leaves bandwidth unused) and x loaded once for all four.
    let n = x.len().min(r0.len()).min(r1.len()).min(r2.len()).min(r3.len());
    let (x, r0, r1, r2, r3) = (&x[..n], &r0[..n], &r1[..n], &r2[..n], &r3[..n]);
    let (mut a0, mut a1, mut a2, mut a3) = ([0.0f32; 32], [0.0f32; 32], [0.0f32; 32], [0.0f32; 32]);
    let chunks = n / 32;
    for c in 0..chunks {
        let at = |v: &[f32]| -> [f32; 32] { v[c * 32..c * 32 + 32].try_into().expect("32 elements") };
        let (xs, v0, v1, v2, v3) = (at(x), at(r0), at(r1), at(r2), at(r3));
        for l in 0..32 {
            a0[l] = madd::<FMA>(xs[l], v0[l], a0[l]);
            a1[l] = madd::<FMA>(xs[l], v1[l], a1[l]);
            a2[l] = madd::<FMA>(xs[l], v2[l], a2[l]);
            a3[l] = madd::<FMA>(xs[l], v3[l], a3[l]);
        }
    }
    let finish = |a: &[f32; 32], r: &[f32]| {
        let mut v = [0.0f32; LANES];
        for l in 0..LANES {
            v[l] = a[l] + a[LANES + l];
        }
        let mut tail = 0.0f32;
        for i in chunks * 32..n {
            tail = madd::<FMA>(x[i], r[i], tail);
        }
        hsum(&v) + tail
    };
    [finish(&a0, r0), finish(&a1, r1), finish(&a2, r2), finish(&a3, r3)]
}

#[inline(always)]
fn dot_i8_body<const FMA: bool>(x: &[i8], w: &[i8]) -> i32 {
    let n = x.len().min(w.len());
    let (x, w) = (&x[..n], &w[..n]);
    let mut acc = [0i32; STEP];
    let (cx, cw) = (x.chunks_exact(STEP), w.chunks_exact(STEP));
    let (tx, tw) = (cx.remainder(), cw.remainder());
    for (xs, ws) in cx.zip(cw) {
        let xs: &[i8; STEP] = xs.try_into().expect("chunks_exact yields STEP elements");
        let ws: &[i8; STEP] = ws.try_into().expect("chunks_exact yields STEP elements");
        for l in 0..STEP {
            acc[l] += xs[l] as i32 * ws[l] as i32;
        }
    }
    let tail: i32 = tx.iter().zip(tw).map(|(&a, &b)| a as i32 * b as i32).sum();
    acc.iter().sum::<i32>() + tail
}

/// sum(x * w) over int8 with AVX-512 VNNI: `vpdpbusd` multiplies unsigned by signed bytes,
/// so x is biased to `x + 128` (a sign-bit flip) and `128 * sum(w)`, from a second
/// `vpdpbusd` against ones, is taken off. Exact in i32 for rows up to ~10^6 values.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni (checked by the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot_i8_vnni(x: &[i8], w: &[i8]) -> i32 {
    use std::arch::x86_64::*;
    let n = x.len().min(w.len());
    let chunks = n / 64;
    let mut acc = _mm512_setzero_si512();
    let mut wsum = _mm512_setzero_si512();
    let flip = _mm512_set1_epi8(i8::MIN);
    let ones = _mm512_set1_epi8(1);
    for c in 0..chunks {
        // SAFETY: c * 64 + 64 <= n <= both lengths, so each 64-byte load is in bounds;
        // unaligned loads need no alignment.
        let (xv, wv) = unsafe {
            (
                _mm512_loadu_si512(x.as_ptr().add(c * 64) as *const __m512i),
                _mm512_loadu_si512(w.as_ptr().add(c * 64) as *const __m512i),
            )
        };
        acc = _mm512_dpbusd_epi32(acc, _mm512_xor_si512(xv, flip), wv);
        wsum = _mm512_dpbusd_epi32(wsum, ones, wv);
    }
    let mut total = _mm512_reduce_add_epi32(acc) - 128 * _mm512_reduce_add_epi32(wsum);
    for i in chunks * 64..n {
        total += x[i] as i32 * w[i] as i32;
    }
    total
}

/// `[x . r0, x . r1, x . r2, x . r3]` over int8, exact in i32, with `xsum = sum(x)` given
/// (computed once per activation row): four weight rows share each load of `x` and the
/// function's entry, which is what a decode-sized product spends its time on.
#[inline]
pub fn dot4_i8(x: &[i8], xsum: i32, rows: [&[i8]; 4]) -> [i32; 4] {
    #[cfg(target_arch = "x86_64")]
    if has_vnni() {
        // SAFETY: has_vnni() checked avx512f, avx512bw and avx512vnni on this CPU.
        return unsafe { dot4_i8_vnni(x, xsum, rows) };
    }
    let _ = xsum;
    rows.map(|r| dot_i8_generic(x, r))
}

/// `dot4_i8` with VNNI: `vpdpbusd` multiplies unsigned by signed bytes, so here the
/// weights are the unsigned side, biased to `w + 128` (a sign-bit flip), and the bias's
/// contribution `128 * sum(x)` comes off at the end -- one product per row instead of the
/// two `dot_i8_vnni` needs, since `sum(x)` is shared by every row.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni (checked by the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot4_i8_vnni(x: &[i8], xsum: i32, rows: [&[i8]; 4]) -> [i32; 4] {
    use std::arch::x86_64::*;
    let n = rows.iter().fold(x.len(), |m, r| m.min(r.len()));
    let chunks = n / 64;
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_si512(); 4];
    // The caller walks a matrix four rows at a time, so the next call reads the rows one
    // quad further on: ask for them now. Rows of ~0.5-1.5 KB are too short for the
    // hardware prefetcher to lock on, and without this a core streamed int8 weights at a
    // third of its read bandwidth. A prefetch of an address past the matrix is harmless.
    let quad = (rows[1].as_ptr() as usize)
        .wrapping_sub(rows[0].as_ptr() as usize)
        .wrapping_mul(4);
    for c in 0..chunks {
        for r in &rows {
            let ahead = r.as_ptr().wrapping_add(c * 64).wrapping_add(quad);
            _mm_prefetch::<_MM_HINT_T0>(ahead);
        }
        // SAFETY: c * 64 + 64 <= n <= every length, so each 64-byte load is in bounds;
        // unaligned loads need no alignment.
        let xv = unsafe { _mm512_loadu_si512(x.as_ptr().add(c * 64) as *const __m512i) };
        for (a, r) in acc.iter_mut().zip(&rows) {
            // SAFETY: as above.
            let wv = unsafe { _mm512_loadu_si512(r.as_ptr().add(c * 64) as *const __m512i) };
            *a = _mm512_dpbusd_epi32(*a, _mm512_xor_si512(wv, flip), xv);
        }
    }
    // Only the bytes the chunks covered carry the bias.
    let covered: i32 = if chunks * 64 == x.len() {
        xsum
    } else {
        x[..chunks * 64].iter().map(|&v| v as i32).sum()
    };
    let mut out = [0i32; 4];
    for (o, (a, r)) in out.iter_mut().zip(acc.iter().zip(&rows)) {
        let mut total = _mm512_reduce_add_epi32(*a) - 128 * covered;
        for i in chunks * 64..n {
            total += x[i] as i32 * r[i] as i32;
        }
        *o = total;
    }
    out
}

/// An activation row rounded to int8 ([`quantize_i8`]): the values, their sum and the
/// row's scale, what every int8 product of the row needs.
pub struct Int8Row<'a> {
    /// The rounded values.
    pub q: &'a [i8],
    /// Their sum (the bias of VNNI's unsigned operand comes off with it).
    pub sum: i32,
    /// What one unit of `q` is worth.
    pub scale: f32,
}

impl<'a> Int8Row<'a> {
    /// The row `q` with scale `scale`, its sum taken here.
    pub fn new(q: &'a [i8], scale: f32) -> Self {
        let sum = q.iter().map(|&v| v as i32).sum();
        Int8Row { q, sum, scale }
    }
}

/// A decode product's rows: `out[r] = (x . w_r) * sx * scales[r]`, plus `beta * out[r]`
/// when `beta` is not zero, for the weight rows `w_r = w[r * stride..r * stride + k]`,
/// `r < out.len()`, with `x`, `sx` and `k` from the rounded row `a`: to the bit what
/// core's `q8_matmul` stores (the integer sums are exact, the scaling is the same two
/// products and one add, not fused).
///
/// With VNNI, sixteen rows a pass: one load of `x` serves sixteen weight rows, the sixteen
/// accumulators are folded into one vector by a transposing tree, and the scaling is one
/// vector op per step. Row at a time, the folds and the scalar scaling cost as much as the
/// products at the widths of a small model (k = 256: four 64-byte steps a row).
pub fn q8_rows(out: &mut [f32], a: &Int8Row, w: &[i8], stride: usize, scales: &[f32], beta: f32) {
    let (x, xsum, sx) = (a.q, a.sum, a.scale);
    let (n, k) = (out.len(), x.len());
    assert!(
        stride >= k && scales.len() >= n,
        "q8_rows: a row or a scale short"
    );
    assert!(
        n == 0 || w.len() >= (n - 1) * stride + k,
        "q8_rows: the weights end early"
    );
    // Rows in whole sixteen-row passes on VNNI; the rest (all of them elsewhere) below.
    let done = if cfg!(target_arch = "x86_64") && has_vnni() {
        n / 16 * 16
    } else {
        0
    };
    #[cfg(target_arch = "x86_64")]
    if done > 0 {
        // SAFETY: has_vnni() checked avx512f, avx512bw and avx512vnni; the asserts above
        // put every row `r < done` of `k` bytes inside `w` and its scale inside `scales`.
        unsafe { q8_rows16_vnni(&mut out[..done], a, w, stride, scales, beta) };
    }
    let row = |j: usize| &w[j * stride..j * stride + k];
    let store = |o: &mut f32, acc: i32, j: usize| {
        let v = acc as f32 * sx * scales[j];
        *o = if beta == 0.0 { v } else { v + beta * *o };
    };
    let rest = &mut out[done..];
    let quads = rest.len() / 4;
    for q in 0..quads {
        let j = done + 4 * q;
        let acc = dot4_i8(x, xsum, [row(j), row(j + 1), row(j + 2), row(j + 3)]);
        for (u, a) in acc.into_iter().enumerate() {
            store(&mut rest[4 * q + u], a, j + u);
        }
    }
    for u in 4 * quads..rest.len() {
        store(&mut rest[u], dot_i8(x, row(done + u)), done + u);
    }
}

/// [`q8_rows`] on VNNI for `out.len()` a multiple of 16, the weights as the unsigned side
/// (biased by 128, taken off with `xsum`) as in `dot4_i8_vnni`.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni; rows `0..out.len()` of `a.q.len()`
/// bytes at `stride` must lie inside `w`, and `scales` must have `out.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn q8_rows16_vnni(out: &mut [f32], a: &Int8Row, w: &[i8], stride: usize, scales: &[f32], beta: f32) {
    use std::arch::x86_64::*;
    let (x, xsum, sx) = (a.q, a.sum, a.scale);
    let k = x.len();
    let (full, tail) = (k / 64, k % 64);
    // A short last step reads only its bytes; the zeroed rest adds 128 * 0 to every sum.
    let tail_mask: __mmask64 = if tail == 0 { 0 } else { (1u64 << tail) - 1 };
    let flip = _mm512_set1_epi8(i8::MIN);
    let bias = _mm512_set1_epi32(128 * xsum);
    let (vsx, vbeta) = (_mm512_set1_ps(sx), _mm512_set1_ps(beta));
    let xp = x.as_ptr();
    for (b, o16) in out.chunks_exact_mut(16).enumerate() {
        let base = w.as_ptr().wrapping_add(b * 16 * stride);
        let mut acc = [[_mm512_setzero_si512(); 4]; 4];
        // Row 4 g + u of the block starts at group[g] + u * stride: four pointers and the
        // stride's multiples, which the addressing modes take as they are (sixteen row
        // pointers did not fit the registers, and every load reloaded its own).
        let group = [0, 1, 2, 3].map(|g| base.wrapping_add(4 * g * stride));
        // The next block's bytes (the rows are contiguous), sixteen lines a step: rows of a
        // few hundred bytes are too short for the hardware prefetcher to lock on. A
        // prefetch past the matrix is harmless.
        let next = base.wrapping_add(16 * stride);
        let step = |acc: &mut [[__m512i; 4]; 4], c: usize, mask: __mmask64| {
            // SAFETY: bytes c * 64.. under `mask` are inside x (k bytes) and inside each row.
            let xv = unsafe { _mm512_maskz_loadu_epi8(mask, xp.add(c * 64)) };
            let ahead = next.wrapping_add(c * 1024);
            for (g, a4) in acc.iter_mut().enumerate() {
                let p = group[g].wrapping_add(c * 64);
                for (u, a) in a4.iter_mut().enumerate() {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add((4 * g + u) * 64));
                    // SAFETY: as above, for row 16 b + 4 g + u (< out.len()).
                    let wv = unsafe { _mm512_maskz_loadu_epi8(mask, p.wrapping_add(u * stride)) };
                    *a = _mm512_dpbusd_epi32(*a, _mm512_xor_si512(wv, flip), xv);
                }
            }
        };
        for c in 0..full {
            step(&mut acc, c, !0);
        }
        if tail != 0 {
            step(&mut acc, full, tail_mask);
        }
        // Row 4 g + u's total in lane 4 g + u.
        let totals = _mm512_sub_epi32(fold16_i32(&acc), bias);
        // SAFETY: scales has out.len() >= 16 b + 16 values; o16 is 16 writable floats.
        unsafe {
            let sc = _mm512_loadu_ps(scales.as_ptr().add(b * 16));
            let mut v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(totals), vsx), sc);
            if beta != 0.0 {
                v = _mm512_add_ps(v, _mm512_mul_ps(vbeta, _mm512_loadu_ps(o16.as_ptr())));
            }
            _mm512_storeu_ps(o16.as_mut_ptr(), v);
        }
    }
}

/// Sixteen i32 accumulators (four groups of four) to one vector of their sixteen totals,
/// `acc[g][u]`'s in lane `4 g + u`, by a transposing tree rather than a horizontal
/// reduction each (which cost as much as the products at k = 256): within a group,
/// interleave-and-add so each 128-bit lane holds partial sums of its four; across groups,
/// 128-bit lane shuffles and adds. Integer sums: any order gives the same value.
///
/// # Safety
/// The CPU must have avx512f (checked by the callers).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn fold16_i32(acc: &[[std::arch::x86_64::__m512i; 4]; 4]) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let pair =
        |a: __m512i, b: __m512i| _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    let group = |a: &[__m512i; 4]| {
        let (t01, t23) = (pair(a[0], a[1]), pair(a[2], a[3]));
        _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23))
    };
    let halves = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0x44>(a, b),
            _mm512_shuffle_i32x4::<0xEE>(a, b),
        )
    };
    let u = acc.each_ref().map(group);
    let (v01, v23) = (halves(u[0], u[1]), halves(u[2], u[3]));
    _mm512_add_epi32(
        _mm512_shuffle_i32x4::<0x88>(v01, v23),
        _mm512_shuffle_i32x4::<0xDD>(v01, v23),
    )
}

/// `out[i][j] = xs[i] . rows[j]` over int8 for four activation rows and four weight rows,
/// exact in i32, with `xsums[i] = sum(xs[i])`: the tile of the int8 GEMM that prompt
/// processing runs. Each 64-byte load of a weight row serves four activation rows (the
/// row-at-a-time `dot4_i8` reloads the weights for every row), and the sixteen sums are
/// folded together at the end instead of one horizontal reduction each.
#[inline]
pub fn dot4x4_i8(xs: [&[i8]; 4], xsums: [i32; 4], rows: [&[i8]; 4]) -> [[i32; 4]; 4] {
    #[cfg(target_arch = "x86_64")]
    if has_vnni() {
        // SAFETY: has_vnni() checked avx512f, avx512bw and avx512vnni on this CPU.
        return unsafe { dot4x4_i8_vnni(xs, xsums, rows) };
    }
    let _ = xsums;
    xs.map(|x| rows.map(|r| dot_i8_generic(x, r)))
}

/// The sixteen sums of a 4 x 4 tile over the first `chunks` 64-byte chunks, with the
/// weights made unsigned (+128: the bias `128 * sum(x)` is still in them), folded into one
/// vector (`fold16_i32`'s lane order: activation row `i`, weight row `j` in lane `4 i + j`).
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni; every row of `xs` and `rows` holds
/// at least `64 * chunks` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn tile_sums_vnni(xs: [&[i8]; 4], rows: [&[i8]; 4], chunks: usize) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [[_mm512_setzero_si512(); 4]; 4];
    for c in 0..chunks {
        // SAFETY: c * 64 + 64 <= 64 * chunks bytes are in every row (the contract);
        // unaligned loads need no alignment.
        let w = rows.map(|r| unsafe {
            _mm512_xor_si512(_mm512_loadu_si512(r.as_ptr().add(c * 64) as *const __m512i), flip)
        });
        for (a, x) in acc.iter_mut().zip(&xs) {
            // SAFETY: as above.
            let xv = unsafe { _mm512_loadu_si512(x.as_ptr().add(c * 64) as *const __m512i) };
            for (aj, wj) in a.iter_mut().zip(&w) {
                *aj = _mm512_dpbusd_epi32(*aj, *wj, xv);
            }
        }
    }
    // SAFETY: avx512f (the contract).
    unsafe { fold16_i32(&acc) }
}

/// The int8 GEMM's 4 x 4 tile and its outputs: `out[u * stride + v] = (xs[u] . rows[v]) as
/// f32 * sx[u] * scales[v]`, plus `beta * out[u * stride + v]` when `beta` is not 0 (the
/// old value is not read otherwise), for `u, v < 4`; `xsums[u] = sum(xs[u])`. The plain
/// form is [`dot4x4_i8`] and a store per element; with VNNI and rows a whole number of
/// 64 bytes long the sixteen outputs are converted, scaled and stored as vectors, in the
/// same operations on each element (the per-element stores had been a sixth of a prompt's
/// processing).
///
/// # Panics
/// When `out` has fewer than `3 * stride + 4` elements or `scales` fewer than 4.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn tile4x4_i8(
    out: &mut [f32], stride: usize, xs: [&[i8]; 4], xsums: [i32; 4], sx: [f32; 4], rows: [&[i8]; 4],
    scales: &[f32], beta: f32,
) {
    let scales: &[f32; 4] = scales[..4].try_into().expect("four scales");
    let _ = &out[3 * stride..3 * stride + 4];
    #[cfg(target_arch = "x86_64")]
    {
        let n = xs[0].len();
        if has_vnni() && n.is_multiple_of(64) && rows.iter().chain(&xs).all(|r| r.len() == n) {
            // SAFETY: has_vnni() checked the features; the rows are n = 64 * (n / 64)
            // bytes long; `out` holds 3 * stride + 4 elements (checked above).
            return unsafe { tile4x4_i8_vnni(out, stride, xs, xsums, sx, rows, scales, beta) };
        }
    }
    let acc = dot4x4_i8(xs, xsums, rows);
    for (u, acc_u) in acc.iter().enumerate() {
        for (v, &a) in acc_u.iter().enumerate() {
            let o = &mut out[u * stride + v];
            let y = a as f32 * sx[u] * scales[v];
            *o = if beta == 0.0 { y } else { y + beta * *o };
        }
    }
}

/// [`tile4x4_i8`] with VNNI: the folded sums less the bias, converted (round to nearest, as
/// `as f32`), times `sx` then the scales, each activation row's four outputs one 128-bit
/// store.
///
/// # Safety
/// avx512f, avx512bw and avx512vnni; every row of `xs` and `rows` is `64 * k` bytes long
/// for some k; `out` holds at least `3 * stride + 4` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile4x4_i8_vnni(
    out: &mut [f32], stride: usize, xs: [&[i8]; 4], xsums: [i32; 4], sx: [f32; 4], rows: [&[i8]; 4],
    scales: &[f32; 4], beta: f32,
) {
    use std::arch::x86_64::*;
    // SAFETY: the contract: every row is 64 * (len / 64) bytes.
    let all = unsafe { tile_sums_vnni(xs, rows, xs[0].len() / 64) };
    let b = xsums.map(|x| x.wrapping_mul(128));
    let bias = _mm512_setr_epi32(
        b[0], b[0], b[0], b[0], b[1], b[1], b[1], b[1], b[2], b[2], b[2], b[2], b[3], b[3], b[3], b[3],
    );
    let s = sx;
    let sxv = _mm512_setr_ps(
        s[0], s[0], s[0], s[0], s[1], s[1], s[1], s[1], s[2], s[2], s[2], s[2], s[3], s[3], s[3], s[3],
    );
    // SAFETY: `scales` is four floats.
    let scv = _mm512_broadcast_f32x4(unsafe { _mm_loadu_ps(scales.as_ptr()) });
    let y = _mm512_mul_ps(
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(all, bias)), sxv),
        scv,
    );
    let rows4 = [
        _mm512_extractf32x4_ps::<0>(y),
        _mm512_extractf32x4_ps::<1>(y),
        _mm512_extractf32x4_ps::<2>(y),
        _mm512_extractf32x4_ps::<3>(y),
    ];
    let betav = _mm_set1_ps(beta);
    for (u, yu) in rows4.into_iter().enumerate() {
        // SAFETY: u * stride + 4 <= 3 * stride + 4 <= out.len() (the contract).
        unsafe {
            let p = out.as_mut_ptr().add(u * stride);
            let v = if beta == 0.0 {
                yu
            } else {
                _mm_add_ps(yu, _mm_mul_ps(betav, _mm_loadu_ps(p)))
            };
            _mm_storeu_ps(p, v);
        }
    }
}

/// `dot4x4_i8` with VNNI, the weights as the unsigned side as in `dot4_i8_vnni`.
///
/// # Safety
/// The CPU must have avx512f, avx512bw and avx512vnni (checked by the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot4x4_i8_vnni(xs: [&[i8]; 4], xsums: [i32; 4], rows: [&[i8]; 4]) -> [[i32; 4]; 4] {
    use std::arch::x86_64::*;
    let n = rows.iter().chain(&xs).fold(usize::MAX, |m, r| m.min(r.len()));
    let chunks = n / 64;
    // SAFETY: the caller's contract (avx512f, avx512bw, avx512vnni); chunks * 64 <= n.
    let all = unsafe { tile_sums_vnni(xs, rows, chunks) };
    let mut totals = [[0i32; 4]; 4];
    // SAFETY: `totals` is 64 writable bytes; unaligned stores need no alignment.
    unsafe { _mm512_storeu_si512(totals.as_mut_ptr() as *mut __m512i, all) };
    let mut out = [[0i32; 4]; 4];
    for (i, (o, sums)) in out.iter_mut().zip(totals).enumerate() {
        let x = xs[i];
        // Only the bytes the chunks covered carry the bias.
        let covered: i32 = if chunks * 64 == x.len() {
            xsums[i]
        } else {
            x[..chunks * 64].iter().map(|&v| v as i32).sum()
        };
        for (j, (oj, s)) in o.iter_mut().zip(sums).enumerate() {
            let r = rows[j];
            let mut total = s - 128 * covered;
            for t in chunks * 64..n {
                total += x[t] as i32 * r[t] as i32;
            }
            *oj = total;
        }
    }
    out
}

/// An activation row rounded to int8 with its own scale, to the bit what core's
/// `quantize_activations` gives (the reference twin; tests compare them on ties, NaN and
/// tails). A scalar `roundf` per value cost as much as the int8 products it feeds at
/// decode time.
pub fn quantize_i8(x: &[f32]) -> (Vec<i8>, f32) {
    let mut out = Vec::new();
    let scale = quantize_i8_into(x, &mut out);
    (out, scale)
}

/// [`quantize_i8`] into `out` (resized to `x.len()`), returning the scale: a decode step
/// rounds ~25 activation rows, and on the AVX-512 path a kept buffer spares an allocation
/// each (the other paths return core's new vector in its place).
pub fn quantize_i8_into(x: &[f32], out: &mut Vec<i8>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa(), Isa::Avx512) {
        // SAFETY: isa() reported avx512f on this CPU (run-time detection).
        return unsafe { quantize_i8_avx512(x, out) };
    }
    let (q, scale) = rusting_brain_core::ops::q8::quantize_activations(x);
    *out = q;
    scale
}

/// # Safety
/// The CPU must have avx512f (checked by the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn quantize_i8_avx512(x: &[f32], out: &mut Vec<i8>) -> f32 {
    use std::arch::x86_64::*;
    let chunks = x.len() / 16;
    let load = |c: usize| {
        // SAFETY: c < chunks, so the 16 floats at c * 16 lie inside x.
        unsafe { _mm512_loadu_ps(x.as_ptr().add(c * 16)) }
    };
    // max(|v|, m) returns m when v is NaN, as f32::max does in the reference's fold.
    let mut m = _mm512_setzero_ps();
    for c in 0..chunks {
        m = _mm512_max_ps(_mm512_abs_ps(load(c)), m);
    }
    let absmax = x[chunks * 16..]
        .iter()
        .fold(_mm512_reduce_max_ps(m), |m, v| m.max(v.abs()));
    let scale = absmax / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    // Every byte is written below.
    out.resize(x.len(), 0);
    let (vinv, half, lo, hi) = (
        _mm512_set1_ps(inv),
        _mm512_set1_ps(0.5),
        _mm512_set1_ps(-127.0),
        _mm512_set1_ps(127.0),
    );
    let (sign, one) = (
        _mm512_set1_epi32(i32::MIN),
        _mm512_castps_si512(_mm512_set1_ps(1.0)),
    );
    for c in 0..chunks {
        let y = _mm512_mul_ps(load(c), vinv);
        // roundf (half away from zero) exactly: truncate, then step away from zero when the
        // dropped fraction is at least one half; y - trunc(y) is exact below 2^23, and
        // above it y is already an integer.
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(y, t)), half);
        let step = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_and_si512(_mm512_castps_si512(y), sign),
            one,
        ));
        let r = _mm512_mask_add_ps(t, away, t, step);
        // NaN stays NaN through the clamp (max and min return their second operand on
        // NaN), converts to 0x8000_0000 and truncates to the byte 0, as `NaN as i8` does.
        let r = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
        let bytes = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(r));
        // SAFETY: the 16 bytes at c * 16 lie inside out (out.len() == x.len()).
        unsafe { _mm_storeu_si128(out.as_mut_ptr().add(c * 16) as *mut __m128i, bytes) };
    }
    for (o, &v) in out[chunks * 16..].iter_mut().zip(&x[chunks * 16..]) {
        *o = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// Whether `dot_i8` runs on VNNI here: the CPU has it, the AVX-512 path is in use, and
/// `RB_CPU_VNNI=0` did not turn it off.
pub fn has_vnni() -> bool {
    static VNNI: OnceLock<bool> = OnceLock::new();
    *VNNI.get_or_init(|| {
        let off = std::env::var("RB_CPU_VNNI").is_ok_and(|v| v.trim() == "0");
        #[cfg(target_arch = "x86_64")]
        {
            !off && isa() == Isa::Avx512
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = off;
            false
        }
    })
}

/// sum(x * w) over int8, exact in i32: VNNI where the CPU has it, else widening SIMD loops.
#[inline]
pub fn dot_i8(x: &[i8], w: &[i8]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if has_vnni() {
        // SAFETY: has_vnni() checked avx512f, avx512bw and avx512vnni on this CPU.
        return unsafe { dot_i8_vnni(x, w) };
    }
    dot_i8_generic(x, w)
}

#[inline(always)]
fn hsum(acc: &[f32; LANES]) -> f32 {
    // Pairwise halving (8, 4, 2, 1 lanes apart), so the result does not depend on which
    // lane held what; written with fixed-size arrays so it compiles to a few shuffles and
    // adds (the attention scores at decode time take one per key).
    let h8: [f32; 8] = std::array::from_fn(|i| acc[i] + acc[i + 8]);
    let h4: [f32; 4] = std::array::from_fn(|i| h8[i] + h8[i + 4]);
    let h2 = [h4[0] + h4[2], h4[1] + h4[3]];
    h2[0] + h2[1]
}

#[inline(always)]
fn sum_sq_body<const FMA: bool>(a: &[f32]) -> f32 {
    dot_body::<FMA>(a, a)
}

#[inline(always)]
fn dot_rows_body<const FMA: bool>(out: &mut [f32], q: &[f32], rows: &[f32], stride: usize, scale: f32) {
    let d = q.len();
    // One vector of accumulators, not `dot`'s four: a head is 32-128 wide, under `dot`'s
    // 64-element step, which would leave it all to the scalar tail.
    let (cq, tq) = (q.chunks_exact(LANES), q.chunks_exact(LANES).remainder());
    for (j, o) in out.iter_mut().enumerate() {
        let r = &rows[j * stride..j * stride + d];
        let mut acc = [0.0f32; LANES];
        for (x, y) in cq.clone().zip(r.chunks_exact(LANES)) {
            // As arrays: over slices LLVM vectorized this two lanes at a time (a decode
            // step's attention ran at a quarter of the vector width).
            let (x, y) = (lanes(x), lanes(y));
            for l in 0..LANES {
                acc[l] = madd::<FMA>(x[l], y[l], acc[l]);
            }
        }
        let mut tail = 0.0f32;
        for (x, y) in tq.iter().zip(&r[d - tq.len()..]) {
            tail = madd::<FMA>(*x, *y, tail);
        }
        *o = scale * (hsum(&acc) + tail);
    }
}

#[inline(always)]
fn axpy_rows_body<const FMA: bool>(out: &mut [f32], p: &[f32], inv: f32, rows: &[f32], stride: usize) {
    let d = out.len();
    let row = |j: usize| &rows[j * stride..j * stride + d];
    // Four rows a pass, each element taking their terms in order (the same operations as
    // four axpys): `out` is loaded and stored once a pass instead of once a row.
    let mut groups = p.chunks_exact(4);
    let mut j = 0;
    for g in groups.by_ref() {
        let a = [g[0] * inv, g[1] * inv, g[2] * inv, g[3] * inv];
        let terms = out
            .iter_mut()
            .zip(row(j))
            .zip(row(j + 1))
            .zip(row(j + 2))
            .zip(row(j + 3));
        for ((((o, &r0), &r1), &r2), &r3) in terms {
            let t = madd::<FMA>(a[0], r0, *o);
            let t = madd::<FMA>(a[1], r1, t);
            let t = madd::<FMA>(a[2], r2, t);
            *o = madd::<FMA>(a[3], r3, t);
        }
        j += 4;
    }
    for &pj in groups.remainder() {
        axpy_body::<FMA>(out, pj * inv, row(j));
        j += 1;
    }
}

#[inline(always)]
fn axpy_body<const FMA: bool>(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = madd::<FMA>(alpha, x, *y);
    }
}

#[inline(always)]
fn sum_rows_body<const FMA: bool>(out: &mut [f32], mat: &[f32], x: &[f32], width: usize) {
    let rows = x.len().min(mat.len() / width.max(1));
    let strips = width / STEP;
    // A 64-column strip at a time, its sums in registers across all rows: nothing is
    // stored until the strip is done, and no store can alias the rows being read.
    for s in 0..strips {
        let j0 = s * STEP;
        let mut acc = [0.0f32; STEP];
        for (p, &xp) in x[..rows].iter().enumerate() {
            let row = block(&mat[p * width + j0..p * width + j0 + STEP]);
            for l in 0..STEP {
                acc[l] = madd::<FMA>(xp, row[l], acc[l]);
            }
        }
        out[j0..j0 + STEP].copy_from_slice(&acc);
    }
    for j in strips * STEP..width.min(out.len()) {
        let mut a = 0.0f32;
        for (p, &xp) in x[..rows].iter().enumerate() {
            a = madd::<FMA>(xp, mat[p * width + j], a);
        }
        out[j] = a;
    }
}

#[inline(always)]
fn adam_body<const FMA: bool>(
    p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: &AdamConstants<f32>,
) {
    // `rusting_brain_core::ops::optim::adam_element`, operation for operation (the tests
    // check the results are bit-identical), written with std's `f32::sqrt` — an LLVM
    // intrinsic with a vector form, where core's no_std `libm` sqrt keeps the loop scalar —
    // and with the decay mode decided outside the loop so the body is branch-free.
    let c = *c;
    let decay = 1.0 - c.lr * c.weight_decay;
    let it = p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut());
    if c.decoupled {
        for (((p, &g), m), v) in it {
            let g = g * c.grad_scale;
            *p *= decay;
            *m = c.beta1 * *m + c.one_minus_beta1 * g;
            *v = c.beta2 * *v + c.one_minus_beta2 * g * g;
            *p -= c.step_size * *m / (v.sqrt() / c.bias_correction2_sqrt + c.eps);
        }
    } else {
        for (((p, &g), m), v) in it {
            let g = g * c.grad_scale + c.weight_decay * *p;
            *m = c.beta1 * *m + c.one_minus_beta1 * g;
            *v = c.beta2 * *v + c.one_minus_beta2 * g * g;
            *p -= c.step_size * *m / (v.sqrt() / c.bias_correction2_sqrt + c.eps);
        }
    }
}

#[inline(always)]
fn scale_body<const FMA: bool>(x: &mut [f32], alpha: f32) {
    for v in x.iter_mut() {
        *v *= alpha;
    }
}

#[inline(always)]
fn max_body<const FMA: bool>(x: &[f32]) -> f32 {
    // The larger of two, the earlier one on a tie (a NaN is tracked on the side).
    let pick = |a: f32, b: f32| if b > a { b } else { a };
    let mut acc = [f32::NEG_INFINITY; STEP];
    let mut nan = [false; STEP];
    let chunks = x.chunks_exact(STEP);
    let tail = chunks.remainder();
    for v in chunks {
        let v = block(v);
        for l in 0..STEP {
            nan[l] |= v[l].is_nan();
            acc[l] = pick(acc[l], v[l]);
        }
    }
    // Down to one vector by halves, then the tail a vector at a time, then its last
    // elements: the scalar loop over 64 lanes and a tail of up to 63 was most of the time
    // of a decode step's short rows (a row of 80 scores).
    let mut any_nan = nan.iter().any(|&b| b);
    let half: [f32; 2 * LANES] = std::array::from_fn(|l| pick(acc[l], acc[l + 2 * LANES]));
    let mut m: [f32; LANES] = std::array::from_fn(|l| pick(half[l], half[l + LANES]));
    let vectors = tail.chunks_exact(LANES);
    let rest = vectors.remainder();
    for v in vectors {
        let v = lanes(v);
        for l in 0..LANES {
            any_nan |= v[l].is_nan();
            m[l] = pick(m[l], v[l]);
        }
    }
    let mut best = f32::NEG_INFINITY;
    for &v in rest.iter().chain(m.iter()) {
        any_nan |= v.is_nan();
        best = pick(best, v);
    }
    if any_nan {
        f32::NAN
    } else {
        best
    }
}

/// `e^x` for f32 in a form LLVM vectorizes: range reduction `x = k ln2 + r` with a two-part
/// ln2, a degree-6 polynomial for `e^r` on |r| <= ln2/2, and `2^k` built from the exponent
/// bits. Relative error under 2e-7 (about 2 ulp) over the normal range; below -87.3 it
/// returns 0 (no subnormals), above 88.7 +Inf, and NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // `max`/`min` rather than `clamp`: they send NaN to a bound (its result is replaced
    // below), so `xc` is always finite and in range.
    #[allow(
        clippy::manual_clamp,
        reason = "clamp keeps NaN, which the conversion below must not see"
    )]
    let xc = x.max(-87.33).min(88.72);
    let k = (xc * LOG2E).round();
    let r = (xc - k * LN2_HI) - k * LN2_LO;
    // Taylor coefficients 1/n!; on |r| <= 0.347 the degree-6 remainder is < 1e-7.
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // 2^k in two halves: k reaches 128 near the top of the range, one past the largest
    // normal exponent, so a single scale factor would overflow to Inf too early.
    // SAFETY: k is a whole number in -126..=128 (xc is finite and clamped), so it converts
    // exactly. The checked `as i32` (saturating, NaN to 0) is not vectorized by LLVM: it
    // became sixteen scalar conversions a vector, most of the cost of every exp loop.
    let k: i32 = unsafe { k.to_int_unchecked() };
    let (k1, k2) = (k / 2, k - k / 2);
    let y = p * f32::from_bits(((k1 + 127) as u32) << 23) * f32::from_bits(((k2 + 127) as u32) << 23);
    if x.is_nan() {
        x
    } else if x < -87.33 {
        0.0
    } else if x > 88.72 {
        f32::INFINITY
    } else {
        y
    }
}

#[inline(always)]
fn exp_sub_sum_body<const FMA: bool>(x: &mut [f32], shift: f32) -> f32 {
    exp_map_sum(x, |v| v - shift)
}

#[inline(always)]
fn exp_affine_sum_body<const FMA: bool>(x: &mut [f32], scale: f32, shift: f32) -> f32 {
    exp_map_sum(x, |v| scale * v - shift)
}

/// x = exp(f(x)) in place, returning the sum of the new values: STEP-wide partial sums
/// folded by `fold`, then the tail's in order.
#[inline(always)]
fn exp_map_sum(x: &mut [f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; STEP];
    let mut chunks = x.chunks_exact_mut(STEP);
    for v in chunks.by_ref() {
        let v = block_mut(v);
        for l in 0..STEP {
            v[l] = exp(f(v[l]));
            acc[l] += v[l];
        }
    }
    // The tail's exps in a loop of their own (it vectorizes; with the sum in it, it ran
    // one element at a time), then their sum in order as before.
    let rest = chunks.into_remainder();
    for v in rest.iter_mut() {
        *v = exp(f(*v));
    }
    let tail = rest.iter().fold(0.0f32, |t, &v| t + v);
    fold(&acc) + tail
}

#[inline(always)]
fn exp_affine_body<const FMA: bool>(x: &mut [f32], scale: f32, shift: f32) {
    for v in x.iter_mut() {
        *v = exp(scale * *v - shift);
    }
}

#[inline(always)]
fn softmax_grad_body<const FMA: bool>(dp: &mut [f32], p: &[f32], delta: f32, scale: f32) {
    for (d, &pj) in dp.iter_mut().zip(p) {
        *d = pj * (*d - delta) * scale;
    }
}

#[inline(always)]
fn silu_one(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

#[inline(always)]
fn swiglu_body<const FMA: bool>(out: &mut [f32], gate: &[f32], up: &[f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu_one(g) * u;
    }
}

#[inline(always)]
fn swiglu_backward_body<const FMA: bool>(
    dgate: &mut [f32], dup: &mut [f32], dout: &[f32], gate: &[f32], up: &[f32],
) {
    for i in 0..dgate
        .len()
        .min(dup.len())
        .min(dout.len())
        .min(gate.len())
        .min(up.len())
    {
        let g = gate[i];
        let s = 1.0 / (1.0 + exp(-g));
        dgate[i] = dout[i] * up[i] * (s * (1.0 + g * (1.0 - s)));
        dup[i] = dout[i] * (g * s);
    }
}

dispatch!(
    /// x = exp(scale * x - shift), element-wise: attention's probabilities recomputed from
    /// the scores and the saved log-sum-exp.
    exp_affine => exp_affine_body(x: &mut [f32], scale: f32, shift: f32)
);
dispatch!(
    /// dp = p * (dp - delta) * scale over the shorter length: the gradient of softmax's
    /// input from its output's, with delta = sum(p * dp) of the row.
    softmax_grad => softmax_grad_body(dp: &mut [f32], p: &[f32], delta: f32, scale: f32)
);
dispatch!(
    /// sum(a * b) over the shorter length.
    dot => dot_body(a: &[f32], b: &[f32]) -> f32
);
dispatch!(
    /// [dot(x, r0), dot(x, r1), dot(x, r2), dot(x, r3)].
    dot4 => dot4_body(x: &[f32], r0: &[f32], r1: &[f32], r2: &[f32], r3: &[f32]) -> [f32; 4]
);
dispatch!(
    /// sum(x * w) over int8 in i32, without VNNI (see `dot_i8`).
    dot_i8_generic => dot_i8_body(x: &[i8], w: &[i8]) -> i32
);
dispatch!(
    /// sum(a^2).
    sum_sq => sum_sq_body(a: &[f32]) -> f32
);
dispatch!(
    /// [`dot_rows`] for any ISA and head width.
    dot_rows_any => dot_rows_body(out: &mut [f32], q: &[f32], rows: &[f32], stride: usize, scale: f32)
);

/// `out[j] = scale * dot(q, rows[j * stride..][..q.len()])` for every `j < out.len()`: one
/// head's attention scores against a strided KV cache, in one dispatched call (the per-row
/// `dot` calls cost more than their 32-wide work at decode time).
#[inline]
pub fn dot_rows(out: &mut [f32], q: &[f32], rows: &[f32], stride: usize, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && !q.is_empty() && q.len().is_multiple_of(LANES) {
        // SAFETY: isa() is Avx512 only after run-time detection found avx512f.
        return unsafe { dot_rows_avx512(out, q, rows, stride, scale) };
    }
    dot_rows_any(out, q, rows, stride, scale)
}

/// [`dot_rows_body`] on AVX-512 for heads a multiple of 16 wide, in the same operations (one
/// FMA chain per key, then `hsum`'s halvings 8, 4, 2 and 1 lanes apart, plus the empty
/// tail's 0), so the same bits. The generic body came out two lanes wide: LLVM shaped its
/// vectors by the reduction tree, and the scores took half a decode step's attention.
///
/// # Safety
/// The CPU must have avx512f.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_rows_avx512(out: &mut [f32], q: &[f32], rows: &[f32], stride: usize, scale: f32) {
    use std::arch::x86_64::*;
    let d = q.len();
    let (zero, vscale) = (_mm512_setzero_ps(), _mm512_set1_ps(scale));
    // Sixteen keys a pass: sixteen FMA chains, then their sixteen `hsum`s at once
    // (`fold16`, the same bits); the scores come out as one vector.
    let full = out.len() / 16 * 16;
    for (b, o16) in out[..full].chunks_exact_mut(16).enumerate() {
        let base = &rows[b * 16 * stride..];
        let mut acc = [zero; 16];
        for c in (0..d).step_by(LANES) {
            // SAFETY: c + 16 <= d elements are in `q`; key b * 16 + r < out.len() has its
            // d elements inside `rows` (the caller's span).
            let x = unsafe { _mm512_loadu_ps(q.as_ptr().add(c)) };
            for (r, a) in acc.iter_mut().enumerate() {
                let y = unsafe { _mm512_loadu_ps(base[r * stride + c..r * stride + c + LANES].as_ptr()) };
                *a = _mm512_fmadd_ps(x, y, *a);
            }
        }
        let sums = fold16(&acc);
        let v = _mm512_mul_ps(vscale, _mm512_add_ps(sums, zero));
        // SAFETY: o16 is 16 writable floats.
        unsafe { _mm512_storeu_ps(o16.as_mut_ptr(), v) };
    }
    for (j, o) in out.iter_mut().enumerate().skip(full) {
        let r = &rows[j * stride..j * stride + d];
        let mut acc = zero;
        for c in (0..d).step_by(LANES) {
            // SAFETY: c + 16 <= d elements are in `q` and `r` (d is a multiple of 16).
            let (x, y) = unsafe {
                (
                    _mm512_loadu_ps(q.as_ptr().add(c)),
                    _mm512_loadu_ps(r.as_ptr().add(c)),
                )
            };
            acc = _mm512_fmadd_ps(x, y, acc);
        }
        let hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
        let h8 = _mm256_add_ps(_mm512_castps512_ps256(acc), hi8);
        let h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
        let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
        let h1 = _mm_add_ss(h2, _mm_movehdup_ps(h2));
        *o = scale * (_mm_cvtss_f32(h1) + 0.0);
    }
}
/// `[hsum(acc[0]), .., hsum(acc[15])]` as one vector: sixteen horizontal sums at once by a
/// transposing tree whose every add joins the same two partial sums as `hsum` does (lanes
/// 8, 4, 2, then 1 apart), so each lane has `hsum`'s bits. Sum by sum, the four dependent
/// horizontal steps and the scalar stores were most of the attention scores' time.
///
/// # Safety
/// The CPU must have avx512f.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn fold16(acc: &[std::arch::x86_64::__m512; 16]) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // Lanes 8 apart (128-bit blocks 0 + 2, 1 + 3), two sums a vector.
    let s8: [__m512; 8] = std::array::from_fn(|p| {
        let (a, b) = (acc[2 * p], acc[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    });
    // Lanes 4 apart (blocks 0 + 1 of each sum's half), four sums a vector, one a block.
    let s4: [__m512; 4] = std::array::from_fn(|p| {
        let (a, b) = (s8[2 * p], s8[2 * p + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    });
    // Lanes 2 apart, then 1 apart: block k of the result holds sums k, 4 + k, 8 + k,
    // 12 + k.
    let s2: [__m512; 2] = std::array::from_fn(|p| {
        let (a, b) = (_mm512_castps_pd(s4[2 * p]), _mm512_castps_pd(s4[2 * p + 1]));
        _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        )
    });
    let s1 = _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(s2[0], s2[1]),
        _mm512_shuffle_ps::<0xDD>(s2[0], s2[1]),
    );
    // Sum i sits in lane 4 (i % 4) + i / 4.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, s1)
}

/// Attention scores of `h` query heads that share their keys (a GQA group):
/// `out[i * n + j] = scale * dot(q[i * d..][..d], rows[j * stride..][..d])` for `i < h`,
/// `j < n`, with `d = q.len() / h`. The same numbers as [`dot_rows`] head by head (each
/// score is one FMA chain and `hsum`'s tree either way); on AVX-512 each key row is read
/// once for up to four heads instead of once a head: at decode time the rows come from L2
/// or further, and reading them once a head was most of the scores' time.
pub fn dot_rows_heads(
    out: &mut [f32], n: usize, q: &[f32], h: usize, rows: &[f32], stride: usize, scale: f32,
) {
    let d = q.len().checked_div(h).unwrap_or(0);
    assert!(
        out.len() >= h * n && q.len() == h * d,
        "dot_rows_heads: {h} heads of {d} against {n} keys"
    );
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && d > 0 && d.is_multiple_of(LANES) && n > 0 {
        let mut i = 0;
        while i < h {
            let take = (h - i).min(4);
            let (o, qs) = (&mut out[i * n..(i + take) * n], &q[i * d..(i + take) * d]);
            // SAFETY: isa() is Avx512 only after run-time detection found avx512f.
            unsafe {
                match take {
                    4 => dot_rows_heads_avx512::<4>(o, n, qs, rows, stride, scale),
                    3 => dot_rows_heads_avx512::<3>(o, n, qs, rows, stride, scale),
                    2 => dot_rows_heads_avx512::<2>(o, n, qs, rows, stride, scale),
                    _ => dot_rows_avx512(o, qs, rows, stride, scale),
                }
            }
            i += take;
        }
        return;
    }
    for i in 0..h {
        dot_rows(
            &mut out[i * n..(i + 1) * n],
            &q[i * d..(i + 1) * d],
            rows,
            stride,
            scale,
        );
    }
}

/// [`dot_rows_heads`] for `H` heads (2 to 4) on AVX-512: `16 / H` keys a pass, each key's
/// row loaded once a 16-lane step and multiplied into every head's chain, the `H * (16 /
/// H)` sums folded at once by `fold16`. Keys past the last whole pass go through
/// [`dot_rows_avx512`]'s key-by-key tail, which gives the same bits.
///
/// # Safety
/// The CPU must have avx512f; `q.len()` is `H` heads of a multiple of 16 lanes, `out` holds
/// `H * n` scores and `rows` the `n` key rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_rows_heads_avx512<const H: usize>(
    out: &mut [f32], n: usize, q: &[f32], rows: &[f32], stride: usize, scale: f32,
) {
    use std::arch::x86_64::*;
    let d = q.len() / H;
    let kb = LANES / H;
    let (zero, vscale) = (_mm512_setzero_ps(), _mm512_set1_ps(scale));
    let full = n / kb * kb;
    let mut lanes = [0.0f32; LANES];
    for j0 in (0..full).step_by(kb) {
        // acc[i * kb + r]: head i against key j0 + r.
        let mut acc = [zero; LANES];
        for c in (0..d).step_by(LANES) {
            // SAFETY: c + 16 <= d elements are in each head's query.
            let qs: [__m512; H] =
                std::array::from_fn(|i| unsafe { _mm512_loadu_ps(q.as_ptr().add(i * d + c)) });
            for r in 0..kb {
                let at = (j0 + r) * stride + c;
                let y = _mm512_loadu_ps(rows[at..at + LANES].as_ptr());
                for (i, x) in qs.iter().enumerate() {
                    acc[i * kb + r] = _mm512_fmadd_ps(*x, y, acc[i * kb + r]);
                }
            }
        }
        let v = _mm512_mul_ps(vscale, _mm512_add_ps(fold16(&acc), zero));
        // SAFETY: `lanes` is 16 floats.
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
        for i in 0..H {
            out[i * n + j0..i * n + j0 + kb].copy_from_slice(&lanes[i * kb..(i + 1) * kb]);
        }
    }
    if full < n {
        for i in 0..H {
            let o = &mut out[i * n + full..(i + 1) * n];
            dot_rows_avx512(o, &q[i * d..(i + 1) * d], &rows[full * stride..], stride, scale);
        }
    }
}

/// The weighted sums of values of `h` heads that share their value rows:
/// `out[i * d..][..d] += sum_j (p[i * n + j] * inv[i]) * rows[j * stride..][..d]`, in order
/// of `j`, with `d = out.len() / h`. The same numbers as [`axpy_rows`] head by head; on
/// AVX-512 each value row is read once for every head, and the heads' independent FMA
/// chains overlap (one head's chain was bound by the FMA latency, a key every four cycles).
pub fn axpy_rows_heads(out: &mut [f32], p: &[f32], n: usize, inv: &[f32], rows: &[f32], stride: usize) {
    let h = inv.len();
    let d = out.len().checked_div(h).unwrap_or(0);
    assert!(
        p.len() >= h * n && out.len() == h * d,
        "axpy_rows_heads: {h} heads of {d} over {n} rows"
    );
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && d > 0 && d.is_multiple_of(LANES) && d <= 4 * LANES {
        let per = 16 / (d / LANES); // heads whose accumulators fit in 16 registers
        let mut i = 0;
        while i < h {
            let take = (h - i).min(per).min(4);
            let o = &mut out[i * d..(i + take) * d];
            let (ps, iv) = (&p[i * n..(i + take) * n], &inv[i..i + take]);
            // SAFETY: isa() is Avx512 only after run-time detection found avx512f.
            unsafe {
                match take {
                    4 => axpy_rows_heads_avx512::<4>(o, ps, n, iv, rows, stride),
                    3 => axpy_rows_heads_avx512::<3>(o, ps, n, iv, rows, stride),
                    2 => axpy_rows_heads_avx512::<2>(o, ps, n, iv, rows, stride),
                    _ => axpy_rows_avx512(o, &ps[..n], iv[0], rows, stride),
                }
            }
            i += take;
        }
        return;
    }
    for i in 0..h {
        axpy_rows(
            &mut out[i * d..(i + 1) * d],
            &p[i * n..(i + 1) * n],
            inv[i],
            rows,
            stride,
        );
    }
}

/// [`axpy_rows_heads`] for `H` heads (2 to 4) of 16 to 64 lanes on AVX-512: every head's
/// outputs in registers from the first row to the last, `_mm512_set1_ps(p * inv)` and one
/// FMA a vector as [`axpy_rows_avx512`] does (same bits).
///
/// # Safety
/// The CPU must have avx512f; `out` is `H` heads of 16 to 64 lanes (a multiple of 16), `p`
/// holds `H * n` weights and `rows` the `n` value rows.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_rows_heads_avx512<const H: usize>(
    out: &mut [f32], p: &[f32], n: usize, inv: &[f32], rows: &[f32], stride: usize,
) {
    use std::arch::x86_64::*;
    let d = out.len() / H;
    let vecs = d / LANES;
    // acc[i * 4 + v]: head i's lanes 16 v..16 v + 16.
    let mut acc = [_mm512_setzero_ps(); 16];
    for i in 0..H {
        for v in 0..vecs {
            // SAFETY: v < vecs, so head i's lane 16 v + 16 <= d.
            acc[i * 4 + v] = unsafe { _mm512_loadu_ps(out.as_ptr().add(i * d + v * LANES)) };
        }
    }
    for j in 0..n {
        let a: [__m512; H] = std::array::from_fn(|i| _mm512_set1_ps(p[i * n + j] * inv[i]));
        let r = &rows[j * stride..j * stride + d];
        for v in 0..vecs {
            // SAFETY: inside the row's d elements.
            let y = unsafe { _mm512_loadu_ps(r.as_ptr().add(v * LANES)) };
            for (i, a) in a.iter().enumerate() {
                acc[i * 4 + v] = _mm512_fmadd_ps(*a, y, acc[i * 4 + v]);
            }
        }
    }
    for i in 0..H {
        for v in 0..vecs {
            // SAFETY: as for the loads.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(i * d + v * LANES), acc[i * 4 + v]) };
        }
    }
}

dispatch!(
    /// [`axpy_rows`] for any ISA and width.
    axpy_rows_any => axpy_rows_body(out: &mut [f32], p: &[f32], inv: f32, rows: &[f32], stride: usize)
);

/// `out += sum_j (p[j] * inv) * rows[j * stride..][..out.len()]`, in order of `j`: the
/// weighted sum of values, one `axpy` per row as before, in one dispatched call.
#[inline]
pub fn axpy_rows(out: &mut [f32], p: &[f32], inv: f32, rows: &[f32], stride: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa() == Isa::Avx512 && !out.is_empty() && out.len().is_multiple_of(LANES) && out.len() <= 8 * LANES {
        // SAFETY: isa() is Avx512 only after run-time detection found avx512f.
        return unsafe { axpy_rows_avx512(out, p, inv, rows, stride) };
    }
    axpy_rows_any(out, p, inv, rows, stride)
}

/// [`axpy_rows_body`] on AVX-512 for a head of 16 to 128 lanes (a multiple of 16), its
/// outputs in registers from the first row to the last: the same FMAs in the same order
/// (same bits), without the store and reload of `out` every four rows.
///
/// # Safety
/// The CPU must have avx512f.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_rows_avx512(out: &mut [f32], p: &[f32], inv: f32, rows: &[f32], stride: usize) {
    use std::arch::x86_64::*;
    let vecs = out.len() / LANES;
    let mut acc = [_mm512_setzero_ps(); 8];
    for (v, a) in acc.iter_mut().enumerate().take(vecs) {
        // SAFETY: v < vecs, so 16 v + 16 <= out.len().
        *a = unsafe { _mm512_loadu_ps(out.as_ptr().add(v * LANES)) };
    }
    for (j, &pj) in p.iter().enumerate() {
        let a = _mm512_set1_ps(pj * inv);
        let r = &rows[j * stride..j * stride + out.len()];
        for (v, acc) in acc.iter_mut().enumerate().take(vecs) {
            // SAFETY: as above, inside the row's out.len() elements.
            *acc = _mm512_fmadd_ps(a, unsafe { _mm512_loadu_ps(r.as_ptr().add(v * LANES)) }, *acc);
        }
    }
    for (v, a) in acc.iter().enumerate().take(vecs) {
        // SAFETY: as for the loads.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(v * LANES), *a) };
    }
}

dispatch!(
    /// y += alpha * x over the shorter length.
    axpy => axpy_body(y: &mut [f32], alpha: f32, x: &[f32])
);
dispatch!(
    /// `out[j] = sum_p x[p] * mat[p * width + j]` for `j < width` (overwritten); `mat` holds
    /// x.len() rows of `width`.
    sum_rows => sum_rows_body(out: &mut [f32], mat: &[f32], x: &[f32], width: usize)
);
dispatch!(
    /// One Adam step over matching slices (see `rusting_brain_core::ops::optim`).
    adam => adam_body(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], c: &AdamConstants<f32>)
);
dispatch!(
    /// x *= alpha.
    scale => scale_body(x: &mut [f32], alpha: f32)
);
dispatch!(
    /// The maximum, or NaN if any element is NaN (-inf for an empty slice).
    max => max_body(x: &[f32]) -> f32
);
dispatch!(
    /// x = exp(x - shift) in place; returns the sum of the new values.
    exp_sub_sum => exp_sub_sum_body(x: &mut [f32], shift: f32) -> f32
);
dispatch!(
    /// x = exp(scale * x - shift) in place; returns the sum of the new values (summed as
    /// in [`exp_sub_sum`]).
    exp_affine_sum => exp_affine_sum_body(x: &mut [f32], scale: f32, shift: f32) -> f32
);
/// `f(x)` for the image models' activations. The exp-based ones use the fast `exp`; the
/// exact GELU keeps libm's
/// `erff`, which no cheap polynomial matches to the reference's 1e-7.
#[inline(always)]
fn unary_body<const FMA: bool>(out: &mut [f32], inp: &[f32], op: Unary) {
    match op {
        Unary::Silu => {
            for (o, &x) in out.iter_mut().zip(inp) {
                *o = silu_one(x);
            }
        }
        Unary::QuickGelu => {
            for (o, &x) in out.iter_mut().zip(inp) {
                *o = x / (1.0 + exp(-1.702 * x));
            }
        }
        Unary::GeluTanh => {
            for (o, &x) in out.iter_mut().zip(inp) {
                // x / 2 (1 + tanh u) = x sigmoid(2u): no cancellation where tanh u -> -1.
                let u = 0.797_884_6 * (x + 0.044715 * x * x * x);
                *o = x / (1.0 + exp(-2.0 * u));
            }
        }
        Unary::Gelu => {
            for (o, &x) in out.iter_mut().zip(inp) {
                *o = 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2));
            }
        }
    }
}

#[inline(always)]
fn unary_in_place_body<const FMA: bool>(x: &mut [f32], op: Unary) {
    // Through a small stack block, so the one-pass body above serves both.
    let mut tmp = [0.0f32; 256];
    for chunk in x.chunks_mut(256) {
        let t = &mut tmp[..chunk.len()];
        t.copy_from_slice(chunk);
        unary_body::<FMA>(chunk, t, op);
    }
}

dispatch!(
    /// out = silu(gate) * up.
    swiglu => swiglu_body(out: &mut [f32], gate: &[f32], up: &[f32])
);
dispatch!(
    /// out = f(inp) for one of the image models' activations.
    unary => unary_body(out: &mut [f32], inp: &[f32], op: Unary)
);
dispatch!(
    /// x = f(x) in place.
    unary_in_place => unary_in_place_body(x: &mut [f32], op: Unary)
);
dispatch!(
    /// dgate = dout * up * silu'(gate), dup = dout * silu(gate).
    swiglu_backward => swiglu_backward_body(dgate: &mut [f32], dup: &mut [f32], dout: &[f32], gate: &[f32], up: &[f32])
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_i8_matches_the_reference_bit_for_bit() {
        use rusting_brain_core::ops::q8::quantize_activations;
        let mut rng = rusting_brain_core::Rng::new(7);
        // One buffer through every length, longer and shorter than the last.
        let mut kept = vec![99i8; 2000];
        for n in [0usize, 1, 3, 15, 16, 17, 33, 127, 1000, 256] {
            let mut x: Vec<f32> = (0..n).map(|_| rng.normal() as f32 * 3.0).collect();
            if n >= 16 {
                // Exact ties after scaling by 127 / absmax = 1: x.5 rounds away from zero,
                // and the largest float below one half rounds to zero.
                x[0] = 127.0;
                x[1] = 2.5;
                x[2] = -2.5;
                x[3] = 0.5;
                x[4] = -0.5;
                x[5] = 0.49999997;
                x[6] = -0.0;
                x[7] = f32::NAN;
                x[n - 1] = -1.5;
            }
            let want = quantize_activations(&x);
            assert_eq!(quantize_i8(&x), want, "n = {n}");
            let scale = quantize_i8_into(&x, &mut kept);
            assert_eq!((kept.clone(), scale), want, "n = {n}, kept buffer");
        }
        // Every value tiny enough that 1 / scale overflows to infinity.
        let tiny = [1e-40f32, -3e-41, 0.0, 2e-45].repeat(5);
        assert_eq!(quantize_i8(&tiny), quantize_activations(&tiny));
    }

    #[test]
    fn fast_exp_is_within_two_ulp_of_libm_over_the_range() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.5 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_37;
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
        // The same edge values through the vectorized loops (a NaN lane must not disturb
        // its neighbours, and the range bounds hold per lane).
        let edges = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            100.0,
            -100.0,
            88.72,
            88.73,
            -87.33,
            -87.34,
            0.5,
            -0.0,
        ];
        for n in [11, 16, 40, 64, 100] {
            let v: Vec<f32> = (0..n)
                .map(|i| edges[i % edges.len()] + (i / edges.len()) as f32 * 0.25)
                .collect();
            // Through each of the three exp loops.
            let (mut a, mut b, mut c) = (v.clone(), v.clone(), v.clone());
            exp_affine(&mut a, 1.0, 0.0);
            exp_affine_sum(&mut b, 1.0, 0.0);
            exp_sub_sum(&mut c, 0.0);
            for (name, got) in [("exp_affine", &a), ("exp_affine_sum", &b), ("exp_sub_sum", &c)] {
                for (i, (&g, &x)) in got.iter().zip(&v).enumerate() {
                    let want = exp(x);
                    assert!(
                        g == want || (g.is_nan() && want.is_nan()),
                        "{name}, n {n} at {i}: exp({x}) = {g}, want {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn max_propagates_nan_and_handles_tails() {
        let mut v: Vec<f32> = (0..37).map(|i| i as f32).collect();
        assert_eq!(max(&v), 36.0);
        v[20] = f32::NAN;
        assert!(max(&v).is_nan());
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    /// The max at every tail length around the vector and step widths, wherever the largest
    /// value sits, and a NaN anywhere.
    #[test]
    fn max_is_the_largest_at_every_length() {
        let mut rng = rusting_brain_core::Rng::new(12);
        for n in (1..=140).chain([257, 1000]) {
            let v: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
            let want = v
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
            assert_eq!(max(&v), want, "n = {n}");
            for at in [0, n / 2, n - 1] {
                let mut w = v.clone();
                w[at] = f32::NAN;
                assert!(max(&w).is_nan(), "n = {n}, NaN at {at}");
            }
        }
    }

    /// The attention's row helpers give the same bits as their definitions on every path:
    /// the scores as `scale * dot` with `dot_rows_body`'s one chain per key, the weighted sum
    /// as one `axpy` per row in order, the exps' sum as 64-wide chunks then the tail in
    /// order; head widths on and off the 16-lane multiple, key counts around the passes.
    #[test]
    fn attention_row_helpers_match_their_definitions_bit_for_bit() {
        let mut rng = rusting_brain_core::Rng::new(13);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for d in [16usize, 24, 32, 48, 64, 80, 128] {
            for keys in [1usize, 3, 4, 7, 80, 131] {
                let stride = 2 * d + 5;
                let q: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
                let rows: Vec<f32> = (0..keys * stride).map(|_| rng.normal() as f32).collect();
                let mut got = vec![0.0f32; keys];
                dot_rows(&mut got, &q, &rows, stride, 0.17);
                let mut want = vec![0.0f32; keys];
                dot_rows_body::<true>(&mut want, &q, &rows, stride, 0.17);
                if isa() == Isa::Baseline {
                    dot_rows_body::<BASE_FMA>(&mut want, &q, &rows, stride, 0.17);
                }
                assert_eq!(bits(&got), bits(&want), "scores, d {d}, {keys} keys");
                for (j, w) in want.iter().enumerate() {
                    let plain: f64 = q
                        .iter()
                        .zip(&rows[j * stride..])
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum();
                    assert!(
                        (*w as f64 - 0.17 * plain).abs() < 1e-5 * (1.0 + plain.abs()),
                        "score {j}"
                    );
                }

                let p: Vec<f32> = (0..keys).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
                let mut got: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
                let start = got.clone();
                let mut want = got.clone();
                axpy_rows(&mut got, &p, 0.3, &rows, stride);
                for (j, &pj) in p.iter().enumerate() {
                    axpy(&mut want, pj * 0.3, &rows[j * stride..j * stride + d]);
                }
                assert_eq!(bits(&got), bits(&want), "weighted sum, d {d}, {keys} keys");
                for (i, w) in want.iter().enumerate() {
                    let plain: f64 = start[i] as f64
                        + p.iter()
                            .enumerate()
                            .map(|(j, &pj)| (pj * 0.3) as f64 * rows[j * stride + i] as f64)
                            .sum::<f64>();
                    assert!(
                        (*w as f64 - plain).abs() < 1e-5 * (1.0 + plain.abs()),
                        "weighted sum {i}, d {d}, {keys} keys: {w} against {plain}"
                    );
                }
            }
        }
        // Sums in STEP-wide lanes, folded, then the tail in order.
        let sum_of = |w: &[f32]| {
            let full = w.len() / STEP * STEP;
            let mut acc = [0.0f32; STEP];
            for c in w[..full].chunks_exact(STEP) {
                for l in 0..STEP {
                    acc[l] += c[l];
                }
            }
            fold(&acc) + w[full..].iter().fold(0.0f32, |t, &v| t + v)
        };
        for n in (1..=140).chain([1000]) {
            let x: Vec<f32> = (0..n).map(|_| rng.normal() as f32 * 4.0).collect();
            let mut got = x.clone();
            let sum = exp_sub_sum(&mut got, 1.5);
            let want: Vec<f32> = x.iter().map(|&v| exp(v - 1.5)).collect();
            assert_eq!(bits(&got), bits(&want), "exps, n {n}");
            assert_eq!(sum.to_bits(), sum_of(&want).to_bits(), "sum, n {n}");
            // The scaled form: each value scaled, then shifted, then exp'd; summed alike.
            let mut scaled = x.clone();
            let scaled_sum = exp_affine_sum(&mut scaled, 0.7, 1.5);
            let want: Vec<f32> = x.iter().map(|&v| exp(0.7 * v - 1.5)).collect();
            assert_eq!(bits(&scaled), bits(&want), "scaled exps, n {n}");
            assert_eq!(scaled_sum.to_bits(), sum_of(&want).to_bits(), "scaled sum, n {n}");
        }
    }

    /// The grouped forms against the one-head calls, bit for bit: one to nine heads (runs
    /// of four, three, two and one), head widths on and off the 16-lane multiple and past
    /// the grouped weighted sum's 64 lanes, key counts around every pass width (16 / H
    /// keys) and the 16-key blocks.
    #[test]
    fn grouped_attention_rows_equal_the_one_head_calls_bit_for_bit() {
        let mut rng = rusting_brain_core::Rng::new(29);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for d in [16usize, 24, 32, 64, 80, 128] {
            for h in 1..=9usize {
                for keys in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 80, 131] {
                    let stride = 2 * d + 3;
                    let q: Vec<f32> = (0..h * d).map(|_| rng.normal() as f32).collect();
                    let rows: Vec<f32> = (0..(keys - 1) * stride + d)
                        .map(|_| rng.normal() as f32)
                        .collect();
                    let mut got = vec![f32::NAN; h * keys];
                    dot_rows_heads(&mut got, keys, &q, h, &rows, stride, 0.21);
                    let mut want = vec![0.0f32; h * keys];
                    for i in 0..h {
                        dot_rows(
                            &mut want[i * keys..(i + 1) * keys],
                            &q[i * d..(i + 1) * d],
                            &rows,
                            stride,
                            0.21,
                        );
                    }
                    assert_eq!(bits(&got), bits(&want), "scores, {h} heads of {d}, {keys} keys");

                    let p: Vec<f32> = (0..h * keys).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
                    let inv: Vec<f32> = (0..h).map(|_| rng.uniform(0.1, 1.0) as f32).collect();
                    let mut got: Vec<f32> = (0..h * d).map(|_| rng.normal() as f32).collect();
                    let mut want = got.clone();
                    axpy_rows_heads(&mut got, &p, keys, &inv, &rows, stride);
                    for i in 0..h {
                        axpy_rows(
                            &mut want[i * d..(i + 1) * d],
                            &p[i * keys..(i + 1) * keys],
                            inv[i],
                            &rows,
                            stride,
                        );
                    }
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "weighted sums, {h} heads of {d}, {keys} keys"
                    );
                }
            }
        }
    }

    #[test]
    fn int8_dot_products_agree_on_every_path_and_length() {
        for n in [0usize, 1, 3, 63, 64, 65, 127, 200, 1000, 4096] {
            let x: Vec<i8> = (0..n).map(|i| ((i * 37 % 255) as i32 - 127) as i8).collect();
            let w: Vec<i8> = (0..n).map(|i| ((i * 91 % 255) as i32 - 127) as i8).collect();
            let want: i32 = x.iter().zip(&w).map(|(&a, &b)| a as i32 * b as i32).sum();
            assert_eq!(dot_i8(&x, &w), want, "n = {n} (vnni: {})", has_vnni());
            assert_eq!(dot_i8_generic(&x, &w), want, "n = {n}, generic");
        }
        // The extremes: -127 x -127 and -127 x 127 over a long row stay exact.
        let x = vec![-127i8; 4096];
        assert_eq!(dot_i8(&x, &x), 4096 * 127 * 127);
        assert_eq!(dot_i8(&x, &vec![127i8; 4096]), -4096 * 127 * 127);
    }

    /// The decode rows against the plain formula, bit for bit: row counts around the
    /// sixteen-row pass, widths around the 64-byte step (a masked last step), a stride
    /// past the width (packed rows are padded), both betas, the extremes included.
    #[test]
    fn decode_rows_match_the_plain_formula_bit_for_bit() {
        for k in [1usize, 5, 63, 64, 65, 130, 256, 704] {
            let stride = k.div_ceil(4) * 4 + 4;
            for n in [0usize, 1, 4, 15, 16, 17, 33, 48, 70] {
                let w: Vec<i8> = (0..n * stride)
                    .map(|i| ((i * 91 + 13) % 255) as i32 - 127)
                    .map(|v| v as i8)
                    .collect();
                let mut x: Vec<i8> = (0..k)
                    .map(|i| (((i * 37 + 5) % 255) as i32 - 127) as i8)
                    .collect();
                if k > 2 {
                    x[k - 1] = -127;
                }
                let xsum: i32 = x.iter().map(|&v| v as i32).sum();
                let scales: Vec<f32> = (0..n).map(|j| 1e-3 * (j as f32 + 0.37)).collect();
                let sx = 0.013f32;
                for beta in [0.0f32, 1.0] {
                    let init: Vec<f32> = (0..n)
                        .map(|j| {
                            if beta == 0.0 {
                                f32::NAN
                            } else {
                                j as f32 * 0.1 - 2.0
                            }
                        })
                        .collect();
                    let mut got = init.clone();
                    let row = Int8Row::new(&x, sx);
                    assert_eq!(row.sum, xsum);
                    q8_rows(&mut got, &row, &w, stride, &scales, beta);
                    for j in 0..n {
                        let row = &w[j * stride..j * stride + k];
                        let acc: i32 = x.iter().zip(row).map(|(&a, &b)| a as i32 * b as i32).sum();
                        let v = acc as f32 * sx * scales[j];
                        let want = if beta == 0.0 { v } else { v + beta * init[j] };
                        assert_eq!(
                            got[j].to_bits(),
                            want.to_bits(),
                            "k {k}, n {n}, row {j}, beta {beta} (vnni: {})",
                            has_vnni()
                        );
                    }
                }
            }
        }
    }

    /// A tile's operands of length `n`: four activation rows, four weight rows (row
    /// `extreme` all -127) and the activation rows' sums.
    fn tile_operands(n: usize, extreme: usize) -> (Vec<Vec<i8>>, Vec<Vec<i8>>, [i32; 4]) {
        let row = |seed: usize| -> Vec<i8> {
            (0..n)
                .map(|i| ((i * seed + seed * 7) % 255) as i32 - 127)
                .map(|v| v as i8)
                .collect()
        };
        let xs: Vec<Vec<i8>> = (0..4).map(|i| row(37 + 2 * i)).collect();
        let mut ws: Vec<Vec<i8>> = (0..4).map(|j| row(91 + 4 * j)).collect();
        ws[extreme].fill(-127);
        let xsums = [0, 1, 2, 3].map(|i| xs[i].iter().map(|&v| v as i32).sum::<i32>());
        (xs, ws, xsums)
    }

    /// The GEMM tile against the plain sums, on lengths around the 64-byte chunk, the
    /// extremes included.
    #[test]
    fn int8_tile_agrees_with_the_plain_sums() {
        for n in [1usize, 63, 64, 65, 130, 512, 1408] {
            let (xs, ws, xsums) = tile_operands(n, 3);
            let got = dot4x4_i8(
                [&xs[0], &xs[1], &xs[2], &xs[3]],
                xsums,
                [&ws[0], &ws[1], &ws[2], &ws[3]],
            );
            for i in 0..4 {
                for j in 0..4 {
                    let want: i32 = xs[i].iter().zip(&ws[j]).map(|(&a, &b)| a as i32 * b as i32).sum();
                    assert_eq!(got[i][j], want, "n = {n}, ({i}, {j}) (vnni: {})", has_vnni());
                }
            }
        }
    }

    /// The tile with its outputs against the plain formula, bit for bit: lengths on and off
    /// the 64-byte chunk (the vector stores and the plain ones), both betas (beta 0 must
    /// not read the NaN already there), a stride past four with the elements between the
    /// tile's rows left as they were, scales that round differently per column.
    #[test]
    fn int8_tile_outputs_match_the_plain_formula_bit_for_bit() {
        for n in [1usize, 63, 64, 65, 128, 704, 1408] {
            let (xs, ws, xsums) = tile_operands(n, 2);
            let sx = [0.013f32, 0.7, 1e-4, 3.3];
            let scales = [1e-3f32 * 0.37, 0.011, 2.5e-3, 0.9];
            let stride = 7;
            for beta in [0.0f32, 1.0, -0.5] {
                let init: Vec<f32> = (0..3 * stride + 4)
                    .map(|e| {
                        if beta == 0.0 && e % stride < 4 {
                            f32::NAN
                        } else {
                            e as f32 * 0.1 - 2.0
                        }
                    })
                    .collect();
                let mut got = init.clone();
                tile4x4_i8(
                    &mut got,
                    stride,
                    [&xs[0], &xs[1], &xs[2], &xs[3]],
                    xsums,
                    sx,
                    [&ws[0], &ws[1], &ws[2], &ws[3]],
                    &scales,
                    beta,
                );
                for (e, (g, old)) in got.iter().zip(&init).enumerate() {
                    let (u, v) = (e / stride, e % stride);
                    let want = if v < 4 {
                        let acc: i32 = xs[u].iter().zip(&ws[v]).map(|(&a, &b)| a as i32 * b as i32).sum();
                        let y = acc as f32 * sx[u] * scales[v];
                        if beta == 0.0 {
                            y
                        } else {
                            y + beta * old
                        }
                    } else {
                        *old
                    };
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "n {n}, beta {beta}, element ({u}, {v}) (vnni: {})",
                        has_vnni()
                    );
                }
            }
        }
    }

    #[test]
    fn dot_matches_a_double_precision_sum_on_odd_lengths() {
        for n in [0usize, 1, 3, 7, 15, 16, 17, 33, 127, 1000] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.3).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - want).abs() < 1e-4, "n = {n}");
        }
    }
}
