//! `exp` and the maps built on it: softmax's sums and gradient, SiLU, SwiGLU and the
//! image models' unary activations.

use super::*;

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
    #[allow(clippy::manual_clamp, reason = "clamp keeps NaN, which the conversion below must not see")]
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
pub(super) fn exp_sub_sum_body<const FMA: bool>(x: &mut [f32], shift: f32) -> f32 {
    exp_map_sum(x, |v| v - shift)
}

#[inline(always)]
pub(super) fn exp_affine_sum_body<const FMA: bool>(x: &mut [f32], scale: f32, shift: f32) -> f32 {
    exp_map_sum(x, |v| scale * v - shift)
}

/// x = exp(f(x)) in place, returning the sum of the new values: STEP-wide partial sums
/// folded by `fold`, then the tail's in order.
#[inline(always)]
pub(super) fn exp_map_sum(x: &mut [f32], f: impl Fn(f32) -> f32) -> f32 {
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
pub(super) fn exp_affine_body<const FMA: bool>(x: &mut [f32], scale: f32, shift: f32) {
    for v in x.iter_mut() {
        *v = exp(scale * *v - shift);
    }
}

#[inline(always)]
pub(super) fn softmax_grad_body<const FMA: bool>(dp: &mut [f32], p: &[f32], delta: f32, scale: f32) {
    for (d, &pj) in dp.iter_mut().zip(p) {
        *d = pj * (*d - delta) * scale;
    }
}

#[inline(always)]
pub(super) fn silu_one(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

#[inline(always)]
pub(super) fn swiglu_body<const FMA: bool>(out: &mut [f32], gate: &[f32], up: &[f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu_one(g) * u;
    }
}

#[inline(always)]
pub(super) fn swiglu_backward_body<const FMA: bool>(
    dgate: &mut [f32], dup: &mut [f32], dout: &[f32], gate: &[f32], up: &[f32],
) {
    for i in 0..dgate.len().min(dup.len()).min(dout.len()).min(gate.len()).min(up.len()) {
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
pub(super) fn unary_body<const FMA: bool>(out: &mut [f32], inp: &[f32], op: Unary) {
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
pub(super) fn unary_in_place_body<const FMA: bool>(x: &mut [f32], op: Unary) {
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
