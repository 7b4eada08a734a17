//! General matrix multiply: `C = alpha * op(A) * op(B) + beta * C`, batched.

use crate::error::{check_len, product};
use crate::{Real, Result};

/// The element type GEMM operands are rounded to before multiplying. Accumulation is always
/// in the caller's type (f32 on backends), like cuBLAS's BF16 GEMM with FP32 compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// Operands used as they are.
    #[default]
    F32,
    /// Operands rounded to bfloat16 (round to nearest even) before the products.
    Bf16,
}

/// Shape and scaling of a (batched) matrix product, row-major throughout.
///
/// For each of `batch` problems, stored back to back:
/// - `A` is `(m, k)`, or stored as `(k, m)` when `trans_a`,
/// - `B` is `(k, n)`, or stored as `(n, k)` when `trans_b` (a PyTorch `Linear` weight),
/// - `C` is `(m, n)`.
///
/// With `beta == 0` the old contents of `C` are never read, so NaN garbage there is harmless.
/// With `k == 0` the product is zero and `C = beta * C`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatmulSpec {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
    pub precision: Precision,
    pub batch: usize,
}

impl MatmulSpec {
    /// `C = A * B` with `A: (m, k)`, `B: (k, n)`.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        MatmulSpec {
            m,
            n,
            k,
            trans_a: false,
            trans_b: false,
            alpha: 1.0,
            beta: 0.0,
            precision: Precision::F32,
            batch: 1,
        }
    }
    pub fn trans_a(mut self, t: bool) -> Self {
        self.trans_a = t;
        self
    }
    pub fn trans_b(mut self, t: bool) -> Self {
        self.trans_b = t;
        self
    }
    pub fn alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }
    pub fn beta(mut self, beta: f32) -> Self {
        self.beta = beta;
        self
    }
    /// `beta = 1`: add the product into `C` (gradient accumulation).
    pub fn accumulate(self) -> Self {
        self.beta(1.0)
    }
    pub fn precision(mut self, p: Precision) -> Self {
        self.precision = p;
        self
    }
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }
    /// Checks the three buffer lengths; returns `(len_a, len_b, len_c)` of one problem.
    pub fn check(&self, op: &'static str, a: usize, b: usize, c: usize) -> Result<(usize, usize, usize)> {
        let la = product(op, &[self.m, self.k])?;
        let lb = product(op, &[self.k, self.n])?;
        let lc = product(op, &[self.m, self.n])?;
        check_len(op, "a", a, product(op, &[la, self.batch])?)?;
        check_len(op, "b", b, product(op, &[lb, self.batch])?)?;
        check_len(op, "c", c, product(op, &[lc, self.batch])?)?;
        Ok((la, lb, lc))
    }
    /// Floating-point operations of the whole product (2 per multiply-add).
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// Rounds to the nearest bfloat16 and back (ties to even; NaN stays NaN).
pub fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

fn operand<T: Real>(x: T, p: Precision) -> T {
    match p {
        Precision::F32 => x,
        Precision::Bf16 => T::from_f32(round_bf16(x.to_f32())),
    }
}

/// Reference GEMM. `a`, `b`, `c` as described on [`MatmulSpec`].
pub fn matmul<T: Real>(c: &mut [T], a: &[T], b: &[T], spec: &MatmulSpec) -> Result<()> {
    let (la, lb, lc) = spec.check("matmul", a.len(), b.len(), c.len())?;
    let MatmulSpec { m, n, k, .. } = *spec;
    let alpha = T::from_f32(spec.alpha);
    let beta = T::from_f32(spec.beta);
    for batch in 0..spec.batch {
        let a = &a[batch * la..(batch + 1) * la];
        let b = &b[batch * lb..(batch + 1) * lb];
        let c = &mut c[batch * lc..(batch + 1) * lc];
        for i in 0..m {
            for j in 0..n {
                let mut acc = T::ZERO;
                for p in 0..k {
                    let av = if spec.trans_a { a[p * m + i] } else { a[i * k + p] };
                    let bv = if spec.trans_b { b[j * k + p] } else { b[p * n + j] };
                    acc += operand(av, spec.precision) * operand(bv, spec.precision);
                }
                let old = if spec.beta == 0.0 {
                    T::ZERO
                } else {
                    beta * c[i * n + j]
                };
                c[i * n + j] = alpha * acc + old;
            }
        }
    }
    Ok(())
}
