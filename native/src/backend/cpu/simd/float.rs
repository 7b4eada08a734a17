//! The f32 loops: dot products, sums of squares, axpy, row sums, Adam, scaling, maxima.

use super::*;

#[inline(always)]
pub(super) fn dot_body<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
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
pub(super) fn dot4_body<const FMA: bool>(
    x: &[f32], r0: &[f32], r1: &[f32], r2: &[f32], r3: &[f32],
) -> [f32; 4] {
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
pub(super) fn sum_sq_body<const FMA: bool>(a: &[f32]) -> f32 {
    dot_body::<FMA>(a, a)
}

#[inline(always)]
pub(super) fn axpy_body<const FMA: bool>(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = madd::<FMA>(alpha, x, *y);
    }
}

#[inline(always)]
pub(super) fn sum_rows_body<const FMA: bool>(out: &mut [f32], mat: &[f32], x: &[f32], width: usize) {
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
pub(super) fn adam_body<const FMA: bool>(
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
pub(super) fn scale_body<const FMA: bool>(x: &mut [f32], alpha: f32) {
    for v in x.iter_mut() {
        *v *= alpha;
    }
}

#[inline(always)]
pub(super) fn max_body<const FMA: bool>(x: &[f32]) -> f32 {
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

dispatch!(
    /// sum(a * b) over the shorter length.
    dot => dot_body(a: &[f32], b: &[f32]) -> f32
);

dispatch!(
    /// [dot(x, r0), dot(x, r1), dot(x, r2), dot(x, r3)].
    dot4 => dot4_body(x: &[f32], r0: &[f32], r1: &[f32], r2: &[f32], r3: &[f32]) -> [f32; 4]
);

dispatch!(
    /// sum(a^2).
    sum_sq => sum_sq_body(a: &[f32]) -> f32
);

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
