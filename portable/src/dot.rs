//! The inner loops every hot primitive of this backend runs: an f32 dot product over eight
//! fixed lanes (one row, or four rows sharing one operand), attention's weighted sum of
//! rows and running maximum, and an exact int8 dot product of blocks of rows.
//!
//! Each f32 helper has a definition in plain Rust (the `_scalar` functions) whose order of
//! additions is the contract: the dot keeps eight partial sums (element `i` goes to lane
//! `i % 8`) added in one fixed tree, the weighted sum adds each key's term in key order
//! from 0. On wasm32 with `+simd128` each has a SIMD128 form doing the same operations
//! on the same lanes (LLVM had vectorized the plain dot product as lanes of one, two, four
//! and one), so a native build gives the browser's bits; the WASI run of the tests checks
//! the two forms against each other bit for bit. The int8 dot is an exact integer, so its
//! SIMD128 form and the scalar one agree by construction; the tests run both (natively
//! and under WASI) against the same reference.

/// Lanes of the f32 dot product.
const LANES: usize = 8;

/// `sum a[i] * b[i]` over the shorter length, in eight lanes added in a fixed order.
#[inline(always)]
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd128::dot_f32(&a[..n], &b[..n])
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        dot_f32_scalar(&a[..n], &b[..n])
    }
}

/// The eight lanes of [`dot_f32`] in plain Rust: the definition the SIMD128 forms keep bit
/// for bit. Equal lengths.
#[cfg_attr(all(target_arch = "wasm32", target_feature = "simd128"), allow(dead_code))]
#[inline(always)]
pub(crate) fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes_tail_sum(lanes, ra, rb)
}

/// The last `len % 8` products into the first lanes, then the lanes' fixed tree.
#[inline(always)]
fn lanes_tail_sum(mut lanes: [f32; LANES], ra: &[f32], rb: &[f32]) -> f32 {
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        lanes[l] += x * y;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
}

/// [`dot_f32`] of `a` with four rows (each at least `a`'s length): the same four numbers,
/// bit for bit, with `a` loaded once for the four (attention's scores, four keys a pass).
#[inline(always)]
pub(crate) fn dot4_f32(a: &[f32], rows: [&[f32]; 4]) -> [f32; 4] {
    let n = a.len();
    let rows = rows.map(|r| &r[..n]);
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd128::dot4_f32(a, rows)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        rows.map(|r| dot_f32_scalar(a, r))
    }
}

/// `o[c] = sum_j p[j] * v[base + j * stride + c]` for every `c < o.len()`, each sum from
/// 0 in key order (as `o.fill(0)` then one [`axpy_f32`] a key would give): attention's
/// weighted sum of value rows.
///
/// # Panics
///
/// When a row runs past `v` (the caller sizes them from a checked spec).
pub(crate) fn weighted_rows(o: &mut [f32], p: &[f32], v: &[f32], base: usize, stride: usize) {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd128::weighted_rows(o, p, v, base, stride)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        weighted_rows_scalar(o, p, v, base, stride)
    }
}

/// [`weighted_rows`] as its definition: one `axpy` a key.
#[cfg_attr(all(target_arch = "wasm32", target_feature = "simd128"), allow(dead_code))]
pub(crate) fn weighted_rows_scalar(o: &mut [f32], p: &[f32], v: &[f32], base: usize, stride: usize) {
    let d = o.len();
    o.fill(0.0);
    for (j, &pj) in p.iter().enumerate() {
        axpy_f32(o, pj, &v[base + j * stride..][..d]);
    }
}

/// The largest value of `x`, NaNs skipped (`-inf` when there is none): attention's
/// running maximum, which a comparison per score made a branch per score.
#[inline]
pub(crate) fn max_f32(x: &[f32]) -> f32 {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd128::max_f32(x)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        max_f32_scalar(f32::NEG_INFINITY, x)
    }
}

/// [`max_f32`]'s definition from `m`: a comparison, not `f32::max` (a library call on
/// wasm), so a NaN never replaces the maximum.
#[inline(always)]
pub(crate) fn max_f32_scalar(m: f32, x: &[f32]) -> f32 {
    x.iter().fold(m, |m, &v| if v > m { v } else { m })
}

/// `y += alpha * x` over the shorter length (vectorizes as it stands: no sum crosses lanes).
#[inline]
pub(crate) fn axpy_f32(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += alpha * x;
    }
}

/// The packed int8 values of a weight buffer as bytes: core stores four int8 values per
/// f32 slot in memory order (`f32::from_ne_bytes`), so the slots' bytes are the values in
/// column order on any host.
pub(crate) fn as_i8(packed: &[f32]) -> &[i8] {
    // SAFETY: the pointer and length cover exactly the bytes of `packed`, which stay
    // borrowed for the result's lifetime; i8 has alignment 1 and every bit pattern is a
    // valid i8.
    unsafe { core::slice::from_raw_parts(packed.as_ptr().cast::<i8>(), core::mem::size_of_val(packed)) }
}

/// The bytes of packed 4-bit weights (two values a byte, `ops::q4`'s order).
pub(crate) fn as_u8(packed: &[f32]) -> &[u8] {
    // SAFETY: as `as_i8`: the same bytes, u8 has alignment 1 and takes every bit pattern.
    unsafe { core::slice::from_raw_parts(packed.as_ptr().cast::<u8>(), core::mem::size_of_val(packed)) }
}

/// `sum w[i] * x[i]` over the shorter length, exact in i32 for activations `x` within
/// +-127 (core's quantizer clamps there) and any weight byte (-128 can come from a file),
/// up to 2^17 terms.
#[inline]
pub(crate) fn dot_i8(w: &[i8], x: &[i8]) -> i32 {
    let n = w.len().min(x.len());
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd128::dot_i8(&w[..n], &x[..n])
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        dot_i8_scalar(&w[..n], &x[..n])
    }
}

/// [`dot_i8`] of `R` weight rows (a multiple of 4) with the same activations, `x` loaded
/// once for all of them: `[w[0] . x, .., w[R-1] . x]` over `x`'s length, which no row is
/// shorter than.
#[inline(always)]
pub(crate) fn dot_rows_i8<const R: usize>(w: [&[i8]; R], x: &[i8]) -> [i32; R] {
    let n = x.len();
    let w = w.map(|r| &r[..n]);
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd128::dot_rows_i8(w, x)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        w.map(|r| dot_i8_scalar(r, x))
    }
}

/// `acc[j] = w[j * stride..][..x.len()] . x` for every `j < acc.len()`: a block of weight
/// rows `stride` bytes apart (`stride >= x.len()`), four rows a pass through
/// [`dot_rows_i8`] and the last ones alone. One call a block, not a call a four rows: at
/// the demo model's sizes the per-call work of the four-row form (its slices, its result
/// through memory, the caller's stores) was a tenth of the browser's decode.
///
/// # Panics
///
/// When `w` holds fewer than `acc.len()` rows (the caller sizes it from checked shapes).
pub(crate) fn dot_row_block_i8(acc: &mut [i32], w: &[i8], stride: usize, x: &[i8]) {
    let n = x.len();
    let row = |j: usize| &w[j * stride..j * stride + n];
    let mut groups = acc.chunks_exact_mut(4);
    let mut j = 0;
    for g in &mut groups {
        g.copy_from_slice(&dot_rows_i8::<4>([row(j), row(j + 1), row(j + 2), row(j + 3)], x));
        j += 4;
    }
    for a in groups.into_remainder() {
        *a = dot_i8(row(j), x);
        j += 1;
    }
}

/// sum(w * x) of int8 weights and 13-bit activations (core's `q8::quantize_activations_wide`),
/// exact in i32: a block's worth. On wasm32 with SIMD128, eight pairs a step through
/// `i32x4.dot_i16x8_s` after widening the weights.
pub(crate) fn dot_i8_i16(w: &[i8], x: &[i16]) -> i32 {
    let n = w.len().min(x.len());
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        simd128::dot_i8_i16(&w[..n], &x[..n])
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    {
        w[..n].iter().zip(&x[..n]).map(|(&a, &b)| a as i32 * b as i32).sum()
    }
}

/// One 64-value group of a 4-bit weight row (32 bytes: value `l` in byte `l`'s low nibble,
/// `32 + l` in its high one) against its 13-bit activations: `(sum of low nibbles times
/// x0, sum of high nibbles times x1)`, exact in i32. `x0` and `x1` hold up to 32 values
/// (fewer at a row's end, where the bytes past them hold zeros).
pub(crate) fn dot_nibbles_i16(group: &[u8], x0: &[i16], x1: &[i16]) -> (i32, i32) {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if group.len() >= 32 && x0.len() == 32 && x1.len() == 32 {
        return simd128::dot_nibbles_i16(group, x0, x1);
    }
    let low = x0.iter().zip(group).map(|(&v, &b)| v as i32 * (b & 15) as i32).sum();
    let high = x1.iter().zip(group).map(|(&v, &b)| v as i32 * (b >> 4) as i32).sum();
    (low, high)
}

/// The scalar form (integer sums in any order are the same number; LLVM vectorizes it
/// where the target has integer SIMD).
#[cfg_attr(all(target_arch = "wasm32", target_feature = "simd128"), allow(dead_code))]
pub(crate) fn dot_i8_scalar(w: &[i8], x: &[i8]) -> i32 {
    w.iter().zip(x).map(|(&a, &b)| a as i32 * b as i32).sum()
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128 {
    use core::arch::wasm32::*;

    /// `acc` plus sixteen int8 products `w * x`: two widening multiplies to i16 (|w * x| <=
    /// 128 * 127 = 16256, so the sum of a low and a high product, at most 32512, still fits
    /// in i16), then a pairwise widening add into the four i32 lanes.
    #[inline(always)]
    fn mac(acc: v128, w: v128, x: v128) -> v128 {
        let pairs = i16x8_add(i16x8_extmul_low_i8x16(w, x), i16x8_extmul_high_i8x16(w, x));
        i32x4_add(acc, i32x4_extadd_pairwise_i16x8(pairs))
    }

    /// [`super::dot_f32_scalar`] with lanes 0-3 and 4-7 as two vectors: the same
    /// operations on the same lanes. Equal lengths.
    #[inline(always)]
    pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let steps = a.len() / 8;
        let (mut lo, mut hi) = (f32x4_splat(0.0), f32x4_splat(0.0));
        for s in 0..steps {
            // SAFETY: 8 * s + 8 <= len floats are in both slices.
            unsafe {
                let (x, y) = (a.as_ptr().add(8 * s), b.as_ptr().add(8 * s));
                lo = f32x4_add(lo, f32x4_mul(v128_load(x.cast()), v128_load(y.cast())));
                hi = f32x4_add(hi, f32x4_mul(v128_load(x.add(4).cast()), v128_load(y.add(4).cast())));
            }
        }
        let lanes = [
            f32x4_extract_lane::<0>(lo),
            f32x4_extract_lane::<1>(lo),
            f32x4_extract_lane::<2>(lo),
            f32x4_extract_lane::<3>(lo),
            f32x4_extract_lane::<0>(hi),
            f32x4_extract_lane::<1>(hi),
            f32x4_extract_lane::<2>(hi),
            f32x4_extract_lane::<3>(hi),
        ];
        super::lanes_tail_sum(lanes, &a[8 * steps..], &b[8 * steps..])
    }

    /// [`super::dot4_f32`]: each row's two lane vectors as in `dot_f32`, then the four
    /// trees at once. The tree `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))` is
    /// `(s0 + s1) + (s2 + s3)` over `s = lo + hi`; shuffles line up the same pairs of
    /// the four rows' `s` so each add is the scalar form's add. Lengths not a multiple
    /// of 8 take `dot_f32` a row.
    #[inline(always)]
    pub(crate) fn dot4_f32(a: &[f32], rows: [&[f32]; 4]) -> [f32; 4] {
        let n = a.len();
        if !n.is_multiple_of(8) {
            return rows.map(|r| dot_f32(a, r));
        }
        let mut lo = [f32x4_splat(0.0); 4];
        let mut hi = [f32x4_splat(0.0); 4];
        for s in 0..n / 8 {
            // SAFETY: 8 * s + 8 <= n floats are in `a` and in every row.
            unsafe {
                let x = a.as_ptr().add(8 * s);
                let (x_lo, x_hi) = (v128_load(x.cast()), v128_load(x.add(4).cast()));
                for r in 0..4 {
                    let y = rows[r].as_ptr().add(8 * s);
                    lo[r] = f32x4_add(lo[r], f32x4_mul(x_lo, v128_load(y.cast())));
                    hi[r] = f32x4_add(hi[r], f32x4_mul(x_hi, v128_load(y.add(4).cast())));
                }
            }
        }
        let s: [v128; 4] = core::array::from_fn(|r| f32x4_add(lo[r], hi[r]));
        // [s0[0] + s0[1], s1[0] + s1[1], s0[2] + s0[3], s1[2] + s1[3]], then rows 2 and 3.
        let pairs = |a, b| f32x4_add(i32x4_shuffle::<0, 4, 2, 6>(a, b), i32x4_shuffle::<1, 5, 3, 7>(a, b));
        let (u, w) = (pairs(s[0], s[1]), pairs(s[2], s[3]));
        let sums = f32x4_add(i32x4_shuffle::<0, 1, 4, 5>(u, w), i32x4_shuffle::<2, 3, 6, 7>(u, w));
        [
            f32x4_extract_lane::<0>(sums),
            f32x4_extract_lane::<1>(sums),
            f32x4_extract_lane::<2>(sums),
            f32x4_extract_lane::<3>(sums),
        ]
    }

    /// [`super::max_f32`] four lanes at a time: `pmax(m, v)` is `m < v ? v : m`, the
    /// scalar form's comparison, so a NaN is skipped in every lane. The same value as the
    /// scalar form; only the sign of a zero maximum can differ (a 0 where the scalar form
    /// keeps a -0), which attention's uses, `score - max` and `max + ln(sum)`, do not
    /// pass on: `exp(+-0) = 1`, and `+-0 + 0 = 0`.
    pub(crate) fn max_f32(x: &[f32]) -> f32 {
        let chunks = x.chunks_exact(4);
        let tail = chunks.remainder();
        let mut m = f32x4_splat(f32::NEG_INFINITY);
        for c in chunks {
            // SAFETY: `c` is four f32s.
            m = f32x4_pmax(m, unsafe { v128_load(c.as_ptr().cast()) });
        }
        let lanes = [
            f32x4_extract_lane::<0>(m),
            f32x4_extract_lane::<1>(m),
            f32x4_extract_lane::<2>(m),
            f32x4_extract_lane::<3>(m),
        ];
        super::max_f32_scalar(super::max_f32_scalar(f32::NEG_INFINITY, &lanes), tail)
    }

    /// [`super::weighted_rows`]: the outputs in registers, 32 columns (eight vectors) at
    /// a time over every key, then four, then the scalar definition for the last
    /// `len % 4`; each column's sum runs in key order from 0, as the definition's.
    pub(crate) fn weighted_rows(o: &mut [f32], p: &[f32], v: &[f32], base: usize, stride: usize) {
        let d = o.len();
        let mut c = 0;
        while c + 32 <= d {
            columns::<8>(&mut o[c..c + 32], p, v, base + c, stride);
            c += 32;
        }
        while c + 4 <= d {
            columns::<1>(&mut o[c..c + 4], p, v, base + c, stride);
            c += 4;
        }
        if c < d {
            super::weighted_rows_scalar(&mut o[c..], p, v, base + c, stride);
        }
    }

    /// `4 * V` columns of [`weighted_rows`] (`o.len() == 4 * V`), kept in `V` vectors.
    #[inline(always)]
    fn columns<const V: usize>(o: &mut [f32], p: &[f32], v: &[f32], base: usize, stride: usize) {
        let mut acc = [f32x4_splat(0.0); V];
        for (j, &pj) in p.iter().enumerate() {
            let row = &v[base + j * stride..][..4 * V];
            let pj = f32x4_splat(pj);
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: 4 * i + 4 <= 4 * V floats are in `row`.
                let x = unsafe { v128_load(row.as_ptr().add(4 * i).cast()) };
                *acc = f32x4_add(*acc, f32x4_mul(pj, x));
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            // SAFETY: as above, in `o`.
            unsafe { v128_store(o.as_mut_ptr().add(4 * i).cast(), *acc) };
        }
    }

    /// [`super::dot_nibbles_i16`] on a whole group: sixteen bytes a step split into their
    /// nibbles (a mask and a shift), each half widened to i16 and met with
    /// `i32x4.dot_i16x8_s` (the nibbles are 0..=15, so as i16 they are themselves).
    pub(crate) fn dot_nibbles_i16(group: &[u8], x0: &[i16], x1: &[i16]) -> (i32, i32) {
        let mask = u8x16_splat(15);
        let (mut low, mut high) = (i32x4_splat(0), i32x4_splat(0));
        for h in 0..2 {
            // SAFETY: the caller's condition: 32 bytes in `group`, 32 values in x0 and x1;
            // the loads have no alignment requirement.
            let (b, x) = unsafe {
                let at = |s: &[i16], i: usize| v128_load(s.as_ptr().add(16 * h + 8 * i).cast::<v128>());
                (
                    v128_load(group.as_ptr().add(16 * h).cast::<v128>()),
                    [at(x0, 0), at(x0, 1), at(x1, 0), at(x1, 1)],
                )
            };
            let (lo, hi) = (v128_and(b, mask), u8x16_shr(b, 4));
            low = i32x4_add(low, i32x4_dot_i16x8(u16x8_extend_low_u8x16(lo), x[0]));
            low = i32x4_add(low, i32x4_dot_i16x8(u16x8_extend_high_u8x16(lo), x[1]));
            high = i32x4_add(high, i32x4_dot_i16x8(u16x8_extend_low_u8x16(hi), x[2]));
            high = i32x4_add(high, i32x4_dot_i16x8(u16x8_extend_high_u8x16(hi), x[3]));
        }
        let sum = |v: v128| {
            i32x4_extract_lane::<0>(v)
                + i32x4_extract_lane::<1>(v)
                + i32x4_extract_lane::<2>(v)
                + i32x4_extract_lane::<3>(v)
        };
        (sum(low), sum(high))
    }

    /// Eight weight/activation pairs a step: the weights widened to i16, then
    /// `i32x4.dot_i16x8_s` (each lane two products, exact). Equal lengths.
    pub(crate) fn dot_i8_i16(w: &[i8], x: &[i16]) -> i32 {
        let n = w.len();
        let steps = n / 8;
        let mut acc = i32x4_splat(0);
        for s in 0..steps {
            // SAFETY: 8 * s + 8 <= n values are in both slices (8 bytes of w, 16 of x);
            // the loads have no alignment requirement.
            let (a, b) = unsafe {
                (
                    i16x8_extend_low_i8x16(v128_load64_zero(w.as_ptr().add(8 * s).cast::<u64>())),
                    v128_load(x.as_ptr().add(8 * s).cast::<v128>()),
                )
            };
            acc = i32x4_add(acc, i32x4_dot_i16x8(a, b));
        }
        let lanes = i32x4_extract_lane::<0>(acc)
            + i32x4_extract_lane::<1>(acc)
            + i32x4_extract_lane::<2>(acc)
            + i32x4_extract_lane::<3>(acc);
        let tail: i32 = w[8 * steps..].iter().zip(&x[8 * steps..]).map(|(&a, &b)| a as i32 * b as i32).sum();
        lanes + tail
    }

    /// Sixteen int8 pairs a step (`mac`). Equal lengths.
    pub(crate) fn dot_i8(w: &[i8], x: &[i8]) -> i32 {
        let n = w.len();
        let steps = n / 16;
        let mut acc = i32x4_splat(0);
        for s in 0..steps {
            // SAFETY: 16 * s + 16 <= n bytes are in both slices; v128_load has no
            // alignment requirement.
            let (a, b) = unsafe {
                (
                    v128_load(w.as_ptr().add(16 * s).cast::<v128>()),
                    v128_load(x.as_ptr().add(16 * s).cast::<v128>()),
                )
            };
            acc = mac(acc, a, b);
        }
        let lanes = i32x4_extract_lane::<0>(acc)
            + i32x4_extract_lane::<1>(acc)
            + i32x4_extract_lane::<2>(acc)
            + i32x4_extract_lane::<3>(acc);
        lanes + super::dot_i8_scalar(&w[16 * steps..], &x[16 * steps..])
    }

    /// `dot_i8` of `R` rows at once (`R` a multiple of 4): one activation load serves
    /// every row. Rows and `x` of equal length.
    #[inline(always)]
    pub(crate) fn dot_rows_i8<const R: usize>(w: [&[i8]; R], x: &[i8]) -> [i32; R] {
        let n = x.len();
        let steps = n / 16;
        let mut acc = [i32x4_splat(0); R];
        // Each row costs two sign-extending loads of eight bytes (`i16x8.load8x8_s`, one
        // `pmovsxbw` from memory on x86) and two i16 dot products (`i32x4.dot_i16x8_s`,
        // one `pmaddwd`); the activations' two loads serve every row. Widening a loaded
        // vector's high half instead costs a shuffle and a shift on x86, and unrolling
        // two steps made V8 spill the accumulators: each was measured slower (docs/
        // baseline.md). Integer sums: the same numbers in any order.
        for s in 0..steps {
            // SAFETY: s < steps, so 16 * s + 16 <= n bytes are in `x` and in every row;
            // the loads have no alignment requirement.
            let (b_lo, b_hi) = unsafe {
                let p = x.as_ptr().add(16 * s);
                (i16x8_load_extend_i8x8(p), i16x8_load_extend_i8x8(p.add(8)))
            };
            for (acc, row) in acc.iter_mut().zip(&w) {
                let (a_lo, a_hi) = unsafe {
                    let p = row.as_ptr().add(16 * s);
                    (i16x8_load_extend_i8x8(p), i16x8_load_extend_i8x8(p.add(8)))
                };
                let lo = i32x4_dot_i16x8(a_lo, b_lo);
                let hi = i32x4_dot_i16x8(a_hi, b_hi);
                *acc = i32x4_add(*acc, i32x4_add(lo, hi));
            }
        }
        let mut out = [0i32; R];
        for (out, acc) in out.chunks_exact_mut(4).zip(acc.chunks_exact(4)) {
            // Four lane sums at once: pairwise shuffles transpose and add four
            // accumulators into one vector [sum(acc0), sum(acc1), sum(acc2), sum(acc3)].
            let lo01 = i32x4_add(
                i32x4_shuffle::<0, 4, 1, 5>(acc[0], acc[1]),
                i32x4_shuffle::<2, 6, 3, 7>(acc[0], acc[1]),
            );
            let lo23 = i32x4_add(
                i32x4_shuffle::<0, 4, 1, 5>(acc[2], acc[3]),
                i32x4_shuffle::<2, 6, 3, 7>(acc[2], acc[3]),
            );
            let sums =
                i32x4_add(i32x4_shuffle::<0, 1, 4, 5>(lo01, lo23), i32x4_shuffle::<2, 3, 6, 7>(lo01, lo23));
            out[0] = i32x4_extract_lane::<0>(sums);
            out[1] = i32x4_extract_lane::<1>(sums);
            out[2] = i32x4_extract_lane::<2>(sums);
            out[3] = i32x4_extract_lane::<3>(sums);
        }
        if 16 * steps < n {
            for (o, row) in out.iter_mut().zip(&w) {
                *o += super::dot_i8_scalar(&row[16 * steps..], &x[16 * steps..]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use rusting_brain_core::Rng;

    /// Every length from 0 to 70 (each tail of the 16-wide steps) and a long one, with
    /// weights over the whole i8 range (-128 included, which a file can hold) and
    /// activations within +-127: the sum equals the i64 one exactly.
    #[test]
    fn int8_dot_is_the_exact_sum_at_every_length() {
        let mut rng = Rng::new(3);
        for n in (0..=70).chain([1000, 4099]) {
            let w: Vec<i8> = (0..n).map(|_| (rng.below(256) as i32 - 128) as i8).collect();
            let x: Vec<i8> = (0..n).map(|_| (rng.below(255) as i32 - 127) as i8).collect();
            let want: i64 = w.iter().zip(&x).map(|(&a, &b)| a as i64 * b as i64).sum();
            assert_eq!(dot_i8(&w, &x) as i64, want, "length {n}");
        }
        // The extremes on every lane: each i16 pair sum at its largest.
        let w = alloc::vec![-128i8; 64];
        let x = alloc::vec![-127i8; 64];
        assert_eq!(dot_i8(&w, &x), 64 * 128 * 127);
        assert_eq!(dot_i8(&w, &x[..63]), 63 * 128 * 127, "the shorter length");
    }

    /// The four- and eight-row forms give each row's own exact sum, at every tail length,
    /// with rows longer than `x` (a packed row's padding) ignored past `x`.
    #[test]
    fn several_row_int8_dot_gives_each_rows_sum() {
        let mut rng = Rng::new(5);
        for n in (0..=40).chain([192, 1000]) {
            let rows: Vec<Vec<i8>> =
                (0..8).map(|_| (0..n + 3).map(|_| (rng.below(256) as i32 - 128) as i8).collect()).collect();
            let x: Vec<i8> = (0..n).map(|_| (rng.below(255) as i32 - 127) as i8).collect();
            let four = dot_rows_i8::<4>(core::array::from_fn(|r| &rows[r][..]), &x);
            let eight = dot_rows_i8::<8>(core::array::from_fn(|r| &rows[r][..]), &x);
            assert_eq!(four[..], eight[..4], "the first four rows at length {n}");
            let got = eight;
            for (r, row) in rows.iter().enumerate() {
                let want: i64 = row[..n].iter().zip(&x).map(|(&a, &b)| a as i64 * b as i64).sum();
                assert_eq!(got[r] as i64, want, "row {r} at length {n}");
            }
        }
    }

    /// A block of rows gives each row's exact sum for every count of rows (each remainder
    /// of the four-row passes), rows `stride` bytes apart with padding past `x`.
    #[test]
    fn a_block_of_rows_gives_each_rows_sum() {
        let mut rng = Rng::new(6);
        for (n, stride) in [(0, 4), (5, 8), (37, 40), (192, 192)] {
            let w: Vec<i8> = (0..13 * stride).map(|_| (rng.below(256) as i32 - 128) as i8).collect();
            let x: Vec<i8> = (0..n).map(|_| (rng.below(255) as i32 - 127) as i8).collect();
            for rows in 0..=13 {
                let mut acc = alloc::vec![i32::MIN; rows];
                dot_row_block_i8(&mut acc, &w, stride, &x);
                for (j, &got) in acc.iter().enumerate() {
                    let row = &w[j * stride..j * stride + n];
                    let want: i64 = row.iter().zip(&x).map(|(&a, &b)| a as i64 * b as i64).sum();
                    assert_eq!(got as i64, want, "row {j} of {rows}, length {n}");
                }
            }
        }
    }

    /// The f32 helpers equal their plain definitions bit for bit (the maximum by value),
    /// at every length around their vector widths: under WASI (SIMD128) this is the
    /// check that the vector forms keep the definitions' order of operations; natively
    /// both sides are the definition. Normal values, whose sums cancel, so another order
    /// of additions changes low bits; NaN and infinities in some inputs.
    #[test]
    fn f32_helpers_equal_their_definitions_bit_for_bit() {
        let mut rng = Rng::new(8);
        let mut mixed = |n: usize| rng.normal_vec(n, 1.0);
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for n in (0..=41).chain([64, 100, 128]) {
            let a = mixed(n);
            let rows: Vec<Vec<f32>> = (0..4).map(|_| mixed(n + 5)).collect();
            let want: Vec<u32> = rows.iter().map(|r| dot_f32_scalar(&a, &r[..n]).to_bits()).collect();
            let four = dot4_f32(&a, core::array::from_fn(|r| &rows[r][..]));
            assert_eq!(bits(&four), want, "four rows at length {n}");
            assert_eq!(dot_f32(&a, &rows[1]).to_bits(), want[1], "one row at length {n}");
            // The weighted sum of 0 to 9 value rows of width n, `stride` apart from `base`.
            for keys in [0, 1, 4, 9] {
                let (base, stride) = (3, n + 2);
                let v = mixed(base + keys * stride);
                let p = mixed(keys);
                let mut got = vec![f32::NAN; n];
                let mut want = vec![f32::NAN; n];
                weighted_rows(&mut got, &p, &v, base, stride);
                weighted_rows_scalar(&mut want, &p, &v, base, stride);
                assert_eq!(bits(&got), bits(&want), "{keys} value rows of width {n}");
            }
            let mut x = mixed(n);
            let want = max_f32_scalar(f32::NEG_INFINITY, &x);
            assert_eq!(max_f32(&x), want, "the largest of {n}");
            if n > 2 {
                x[n / 2] = f32::NAN;
                x[1] = f32::INFINITY;
                assert_eq!(max_f32(&x), f32::INFINITY, "NaN skipped at length {n}");
                let a: Vec<f32> =
                    a.iter().enumerate().map(|(i, &v)| if i == 2 { f32::NAN } else { v }).collect();
                assert!(dot4_f32(&a, core::array::from_fn(|r| &rows[r][..])).iter().all(|v| v.is_nan()));
            }
        }
        assert_eq!(max_f32(&[]), f32::NEG_INFINITY);
        assert_eq!(max_f32(&[f32::NAN; 9]), f32::NEG_INFINITY, "NaNs only");
    }

    /// Within the f32 bound of a sum of n products (n * eps * sum |a b|) of the f64 sum, at
    /// every tail length; an index error would be O(1).
    #[test]
    fn f32_dot_is_the_sum_at_every_length() {
        let mut rng = Rng::new(4);
        for n in (0..=40).chain([127, 1000]) {
            let a = rng.normal_vec(n, 1.0);
            let b = rng.normal_vec(n, 1.0);
            let want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let bound = n as f64
                * f32::EPSILON as f64
                * a.iter().zip(&b).map(|(&x, &y)| (x * y).abs() as f64).sum::<f64>();
            let got = dot_f32(&a, &b) as f64;
            assert!((got - want).abs() <= bound + 1e-30, "length {n}: {got} vs {want}");
        }
        assert_eq!(dot_f32(&[1.0, 2.0, 3.0], &[4.0, 5.0]), 14.0, "the shorter length");
        assert!(dot_f32(&[1.0, f32::NAN], &[1.0, 1.0]).is_nan());
    }
}
