//! The scalar type the reference math is written over.
//!
//! Backends run the reference in `f32`; the tests also run it in `f64`, where central finite
//! differences are sharp enough (error ~1e-8 relative) to catch a wrong backward pass.

use core::fmt::Debug;
use core::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

/// A floating-point scalar: `f32` or `f64`.
pub trait Real:
    Copy
    + Debug
    + Default
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Send
    + Sync
    + 'static
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// Negative infinity (the identity of a running max).
    const NEG_INFINITY: Self;
    /// From f64, rounded to nearest.
    fn from_f64(x: f64) -> Self;
    /// From f32, exactly.
    fn from_f32(x: f32) -> Self;
    /// To f64, exactly.
    fn to_f64(self) -> f64;
    /// To f32, rounded to nearest.
    fn to_f32(self) -> f32;
    /// e^x.
    fn exp(self) -> Self;
    /// The natural logarithm.
    fn ln(self) -> Self;
    /// The square root.
    fn sqrt(self) -> Self;
    /// The sine (radians).
    fn sin(self) -> Self;
    /// The cosine (radians).
    fn cos(self) -> Self;
    /// The hyperbolic tangent.
    fn tanh(self) -> Self;
    /// The error function (exact GELU).
    fn erf(self) -> Self;
    /// x^e.
    fn powf(self, e: Self) -> Self;
    /// |x|.
    fn abs(self) -> Self;
    /// Neither infinite nor NaN.
    fn is_finite(self) -> bool;
    /// The larger; `self` when `other` is NaN or equal.
    fn max(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
    /// The smaller; `self` when `other` is NaN or equal.
    fn min(self, other: Self) -> Self {
        if other < self {
            other
        } else {
            self
        }
    }
    /// From a count, through f64.
    fn from_usize(x: usize) -> Self {
        Self::from_f64(x as f64)
    }
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn exp(self) -> Self {
        libm::expf(self)
    }
    fn ln(self) -> Self {
        libm::logf(self)
    }
    fn sqrt(self) -> Self {
        libm::sqrtf(self)
    }
    fn sin(self) -> Self {
        libm::sinf(self)
    }
    fn cos(self) -> Self {
        libm::cosf(self)
    }
    fn tanh(self) -> Self {
        libm::tanhf(self)
    }
    fn erf(self) -> Self {
        libm::erff(self)
    }
    fn powf(self, e: Self) -> Self {
        libm::powf(self, e)
    }
    fn abs(self) -> Self {
        libm::fabsf(self)
    }
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    fn from_f64(x: f64) -> Self {
        x
    }
    fn from_f32(x: f32) -> Self {
        x as f64
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn exp(self) -> Self {
        libm::exp(self)
    }
    fn ln(self) -> Self {
        libm::log(self)
    }
    fn sqrt(self) -> Self {
        libm::sqrt(self)
    }
    fn sin(self) -> Self {
        libm::sin(self)
    }
    fn cos(self) -> Self {
        libm::cos(self)
    }
    fn tanh(self) -> Self {
        libm::tanh(self)
    }
    fn erf(self) -> Self {
        libm::erf(self)
    }
    fn powf(self, e: Self) -> Self {
        libm::pow(self, e)
    }
    fn abs(self) -> Self {
        libm::fabs(self)
    }
    fn is_finite(self) -> bool {
        f64::is_finite(self)
    }
}
