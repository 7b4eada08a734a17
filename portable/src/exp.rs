//! `exp` for f32 without a branch per value, so the loops that call it (SiLU, attention's
//! weights) vectorize: `libm::expf` is exact to within an ulp but a branchy library call,
//! and was a tenth of the page's decode time.
//!
//! exp(x) = 2^n * e^r with n = round(x / ln 2) and |r| <= ln 2 / 2 (Cody–Waite: ln 2 split
//! in two so n * ln2_hi is exact), e^r by its Taylor series to r^7 (truncation error below
//! 2^-27 relative there), and 2^n built from exponent bits in two halves so n = 128 does
//! not overflow the field. Overflow gives +inf, results below f32's normal range give 0
//! (core's gives a subnormal there, under 1.2e-38), NaN stays NaN.

const LOG2_E: f32 = core::f32::consts::LOG2_E;
/// ln 2 in two parts: the high part has few enough bits that n * LN2_HI is exact for |n| <= 128.
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
/// Largest x with a finite exp(x), and the smallest with a normal one.
const HI: f32 = 88.722_83;
const LO: f32 = -87.336_55;
/// Adding and subtracting 1.5 * 2^23 rounds an f32 below 2^22 to the nearest integer.
const ROUND: f32 = 12_582_912.0;

/// 2^n for -126 <= n <= 127 (an f32 with that exponent field).
#[inline(always)]
fn pow2(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// e^x, within 1 ulp of the exact value over f32's normal range (0.81 measured); see the
/// module docs.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    let xc = x.clamp(LO, HI);
    let n = (xc * LOG2_E + ROUND) - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // n is within [-126, 128] after the clamp (NaN converts to 0 and stays in p).
    let n = n as i32;
    let half = n >> 1;
    let y = p * pow2(half) * pow2(n - half);
    let y = if x > HI { f32::INFINITY } else { y };
    if x < LO {
        0.0
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f64) -> f64 {
        // Distance in units of b's last place, b exact (f64).
        let ulp = f32::EPSILON as f64 * (b.abs().max(f32::MIN_POSITIVE as f64));
        (a as f64 - b).abs() / ulp
    }

    /// Within 1 ulp of the f64 exp on a dense sweep of the whole normal range (every
    /// 1/1024 from LO to HI, and the values near the ends and near 0), with the edges exact:
    /// +inf past HI, 0 below LO, NaN for NaN, 1 at 0.
    #[test]
    fn exp_is_within_two_ulp_over_the_normal_range() {
        let mut worst = 0.0f64;
        let mut x = LO;
        while x <= HI {
            worst = worst.max(ulps(exp_f32(x), (x as f64).exp()));
            x += 1.0 / 1024.0;
        }
        for x in [LO, HI, -1e-30, 1e-30, 1e-7, -1e-7, 0.34657, -0.34657, 0.5, -0.5, 20.0, -20.0] {
            worst = worst.max(ulps(exp_f32(x), (x as f64).exp()));
        }
        println!("exp: worst {worst:.2} ulp");
        assert!(worst <= 1.0, "worst {worst} ulp");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(-88.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
    }
}
