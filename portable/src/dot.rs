//! The two inner loops every hot primitive of this backend runs: an f32 dot product over
//! eight fixed lanes and an exact int8 dot product.
//!
//! The f32 dot keeps eight partial sums (element `i` goes to lane `i % 8`) and adds them in
//! one fixed tree, written in plain Rust: the compiler turns the lanes into two SIMD128
//! vectors on wasm32 (SSE on x86), and since the order of every addition is in the source,
//! a native build gives the same bits as the browser's. The int8 dot is an exact integer,
//! so its SIMD128 form (wasm32 with `+simd128`) and the scalar one agree by construction;
//! the tests run both (natively and under WASI) against the same reference.

/// Lanes of the f32 dot product.
const LANES: usize = 8;

/// `sum a[i] * b[i]` over the shorter length, in eight lanes added in a fixed order.
#[inline(always)]
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut lanes = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            lanes[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        lanes[l] += x * y;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
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
        // The activations are widened to i16 once a step for all the rows; each row then
        // costs two widenings and two i16 dot products (`i32x4.dot_i16x8_s`, one pmaddwd on
        // x86), where `mac`'s widening multiplies redo the activations' half for every row.
        // Integer sums: the same numbers in any order.
        let step = |acc: &mut [v128; R], s: usize| {
            // SAFETY: the callers pass s < steps, so 16 * s + 16 <= n bytes are in `x` and
            // in every row.
            let b = unsafe { v128_load(x.as_ptr().add(16 * s).cast::<v128>()) };
            let (b_lo, b_hi) = (i16x8_extend_low_i8x16(b), i16x8_extend_high_i8x16(b));
            for (acc, row) in acc.iter_mut().zip(&w) {
                let a = unsafe { v128_load(row.as_ptr().add(16 * s).cast::<v128>()) };
                let lo = i32x4_dot_i16x8(i16x8_extend_low_i8x16(a), b_lo);
                let hi = i32x4_dot_i16x8(i16x8_extend_high_i8x16(a), b_hi);
                *acc = i32x4_add(*acc, i32x4_add(lo, hi));
            }
        };
        // Two steps an iteration: the browsers' wasm compilers do not unroll loops.
        let mut s = 0;
        while s + 2 <= steps {
            step(&mut acc, s);
            step(&mut acc, s + 1);
            s += 2;
        }
        if s < steps {
            step(&mut acc, s);
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
            let sums = i32x4_add(
                i32x4_shuffle::<0, 1, 4, 5>(lo01, lo23),
                i32x4_shuffle::<2, 3, 6, 7>(lo01, lo23),
            );
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
            let rows: Vec<Vec<i8>> = (0..8)
                .map(|_| (0..n + 3).map(|_| (rng.below(256) as i32 - 128) as i8).collect())
                .collect();
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
            let w: Vec<i8> = (0..13 * stride)
                .map(|_| (rng.below(256) as i32 - 128) as i8)
                .collect();
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
