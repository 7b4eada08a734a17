//! General matrix multiply: `C = alpha * op(A) * op(B) + beta * C`, batched.

use crate::backend::Memory;
use crate::error::{check_len, check_range, product};
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{Real, Result};
use alloc::vec::Vec;

/// The element type GEMM operands are rounded to before multiplying. Accumulation is always
/// in the caller's type (f32 on backends), like cuBLAS's BF16 GEMM with FP32 compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OperandPrecision {
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
///
/// Without a [`Window`] each buffer holds exactly its operand. With one, the operands start
/// at the window's offsets inside larger buffers (a mixture-of-experts layer multiplies each
/// expert's block of rows of one grouped buffer this way).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatmulSpec {
    /// Rows of `A` and `C`.
    pub m: usize,
    /// Columns of `B` and `C`.
    pub n: usize,
    /// Columns of `A`, rows of `B`: the summed dimension.
    pub k: usize,
    /// `A` is stored transposed, `(k, m)`.
    pub trans_a: bool,
    /// `B` is stored transposed, `(n, k)`.
    pub trans_b: bool,
    /// Multiplies the product.
    pub alpha: f32,
    /// Multiplies the old `C` (0: overwrite, never read).
    pub beta: f32,
    /// The products' precision (F32, or BF16 operands with f32 sums).
    pub precision: OperandPrecision,
    /// Independent products, each operand's blocks one after another.
    pub batch: usize,
    /// Where the operands start inside larger buffers.
    pub window: Option<Window>,
}

/// `A`, `B` and `C` of one product and its spec without a window; see
/// [`MatmulSpec::operands`].
pub type Operands<'a, T> = (&'a [T], &'a [T], &'a mut [T], MatmulSpec);

/// Element offsets of `A`, `B` and `C` inside their buffers; see [`MatmulSpec::window`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// Offset of `A`.
    pub a: usize,
    /// Offset of `B`.
    pub b: usize,
    /// Offset of `C`.
    pub c: usize,
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
            precision: OperandPrecision::F32,
            batch: 1,
            window: None,
        }
    }
    /// Whether this product takes one activation row that is the whole input, `x` of
    /// `x_len` values: `m = 1`, no window, `k = x_len` (a decode step's products, which
    /// backends fuse).
    pub fn one_row_of(&self, x_len: usize) -> bool {
        self.m == 1 && self.window.is_none() && self.k == x_len
    }
    /// Reads `A` as stored `(k, m)`.
    pub fn trans_a(mut self, t: bool) -> Self {
        self.trans_a = t;
        self
    }
    /// Reads `B` as stored `(n, k)` (a PyTorch `Linear` weight).
    pub fn trans_b(mut self, t: bool) -> Self {
        self.trans_b = t;
        self
    }
    /// Sets `alpha`.
    pub fn alpha(mut self, alpha: f32) -> Self {
        self.alpha = alpha;
        self
    }
    /// Sets `beta`.
    pub fn beta(mut self, beta: f32) -> Self {
        self.beta = beta;
        self
    }
    /// `beta = 1`: add the product into `C` (gradient accumulation).
    pub fn accumulate(self) -> Self {
        self.beta(1.0)
    }
    /// Sets the products' precision.
    pub fn precision(mut self, p: OperandPrecision) -> Self {
        self.precision = p;
        self
    }
    /// `batch` independent products.
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch;
        self
    }
    /// The operands start `a`, `b`, `c` elements into their buffers, which may be longer
    /// than the operands (one problem only: `batch` must be 1).
    pub fn window(mut self, a: usize, b: usize, c: usize) -> Self {
        self.window = Some(Window { a, b, c });
        self
    }
    /// Checks the three buffer lengths (exact, or covering the window); returns
    /// `(len_a, len_b, len_c)` of one problem.
    pub fn check(&self, op: &'static str, a: usize, b: usize, c: usize) -> Result<(usize, usize, usize)> {
        let la = product(op, &[self.m, self.k])?;
        let lb = product(op, &[self.k, self.n])?;
        let lc = product(op, &[self.m, self.n])?;
        match self.window {
            None => {
                check_len(op, "a", a, product(op, &[la, self.batch])?)?;
                check_len(op, "b", b, product(op, &[lb, self.batch])?)?;
                check_len(op, "c", c, product(op, &[lc, self.batch])?)?;
            }
            Some(w) => {
                if self.batch != 1 {
                    return Err(crate::CoreError::InvalidDimension {
                        op,
                        message: alloc::format!(
                            "a windowed product is one problem, not a batch of {}",
                            self.batch
                        ),
                    });
                }
                check_range(op, "a", a, w.a, la)?;
                check_range(op, "b", b, w.b, lb)?;
                check_range(op, "c", c, w.c, lc)?;
            }
        }
        Ok((la, lb, lc))
    }
    /// Checks the buffers and cuts them to the operands: the whole buffers, or the window's
    /// parts. The returned spec has no window, so a kernel written for whole operands runs
    /// it unchanged.
    pub fn operands<'a, T>(
        &self, op: &'static str, a: &'a [T], b: &'a [T], c: &'a mut [T],
    ) -> Result<Operands<'a, T>> {
        let (la, lb, lc) = self.check(op, a.len(), b.len(), c.len())?;
        match self.window {
            None => Ok((a, b, c, *self)),
            Some(w) => Ok((
                &a[w.a..w.a + la],
                &b[w.b..w.b + lb],
                &mut c[w.c..w.c + lc],
                MatmulSpec { window: None, ..*self },
            )),
        }
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

/// `x` rounded to the operand precision `p`.
pub(crate) fn operand<T: Real>(x: T, p: OperandPrecision) -> T {
    match p {
        OperandPrecision::F32 => x,
        OperandPrecision::Bf16 => T::from_f32(round_bf16(x.to_f32())),
    }
}

/// Reference GEMM. `a`, `b`, `c` as described on [`MatmulSpec`].
pub fn matmul<T: Real>(c: &mut [T], a: &[T], b: &[T], spec: &MatmulSpec) -> Result<()> {
    let (a, b, c, spec) = spec.operands("matmul", a, b, c)?;
    let spec = &spec;
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
                let old = if spec.beta == 0.0 { T::ZERO } else { beta * c[i * n + j] };
                c[i * n + j] = alpha * acc + old;
            }
        }
    }
    Ok(())
}

/// General matrix products: see [`crate::ops::matmul`].
pub trait MatmulOps: Memory {
    /// See [`crate::ops::matmul::matmul`].
    fn matmul(
        &self, c: &mut Self::Buffer, a: &Self::Buffer, b: &Self::Buffer, spec: &MatmulSpec,
    ) -> Result<()>;
}

impl MatmulOps for ReferenceBackend {
    fn matmul(&self, c: &mut Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, spec: &MatmulSpec) -> Result<()> {
        in_f64([c], |[c]| matmul(c, &wide(a), &wide(b), spec))
    }
}
