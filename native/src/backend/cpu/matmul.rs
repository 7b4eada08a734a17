//! GEMM on the CPU: the `gemm` crate (faer's kernels, AVX-512 where detected) for general
//! shapes, our BF16 GEMM (`bf16.rs`) for BF16 products where the CPU has AVX512_BF16, and
//! our own GEMV for the decode-shaped products (m = 1 or n = 1), where a packed GEMM spends
//! its time packing and runs at a few GFLOP/s.
//!
//! Reference twin: `rusting_brain_core::ops::matmul::matmul`; tests/backend_vs_reference.rs.

use rayon::prelude::*;
use rusting_brain_core::ops::matmul::{round_bf16, MatmulSpec, OperandPrecision};
use rusting_brain_core::Result;

use super::{bf16, simd, team};
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::MatmulOps;

/// Below this many multiply-adds the product runs on one thread: splitting costs more.
const PARALLEL_MACS: f64 = 64.0 * 64.0 * 64.0;
/// Matrix elements below which a GEMV stays on one thread: waking rayon's workers costs
/// more than reading a matrix under ~1 MiB (seen as 30% of a decode step in the
/// scheduler before this threshold).
pub(crate) const PARALLEL_GEMV: usize = 1 << 18;
/// Matrix elements above which a GEMV with rows to spare is split across the team.
const TEAM_GEMV: usize = 1 << 14;
/// Rows of `x` up to which `x W^T` runs as [`dot_rows_many`] (a decode step of that many
/// sequences), so each row gets the bits it gets alone.
pub(crate) const FEW_ROWS: usize = 32;

pub fn matmul(c: &mut [f32], a: &[f32], b: &[f32], spec: &MatmulSpec) -> Result<()> {
    let (a, b, c, spec) = spec.operands("matmul", a, b, c)?;
    let spec = &spec;
    let (la, lb, lc) = spec.check("matmul", a.len(), b.len(), c.len())?;
    if lc == 0 {
        return Ok(());
    }
    if spec.precision == OperandPrecision::Bf16 && spec.k > 0 && spec.m > 1 && spec.n > 1 && bf16::available()
    {
        // AVX512_BF16: the operands are rounded while packing, and the products run at
        // twice the f32 FMA's multiply-adds an instruction.
        for batch in 0..spec.batch {
            bf16::gemm(
                &mut c[batch * lc..(batch + 1) * lc],
                &a[batch * la..(batch + 1) * la],
                &b[batch * lb..(batch + 1) * lb],
                spec,
            );
        }
        return Ok(());
    }
    let rounded;
    let (a, b) = match spec.precision {
        OperandPrecision::F32 => (a, b),
        OperandPrecision::Bf16 => {
            // BF16 operands with f32 accumulation: products of two bf16 values are exact in
            // f32, so rounding the operands and running the f32 kernel is numerically the
            // same as a bf16 GEMM with f32 compute. Where the CPU has no AVX512_BF16 (and
            // for the matrix-vector shapes) this saves no time; it exists so mixed
            // precision means one thing on every backend.
            rounded = (round_all(a), round_all(b));
            (&rounded.0[..], &rounded.1[..])
        }
    };
    for batch in 0..spec.batch {
        let (a, b, c) = (
            &a[batch * la..(batch + 1) * la],
            &b[batch * lb..(batch + 1) * lb],
            &mut c[batch * lc..(batch + 1) * lc],
        );
        if spec.k == 0 {
            epilogue_only(c, spec.beta);
        } else if spec.m == 1 || spec.n == 1 {
            gemv(c, a, b, spec);
        } else if spec.trans_b && !spec.trans_a && spec.m <= FEW_ROWS {
            dot_rows_many(c, b, a, spec);
        } else {
            gemm_crate(c, a, b, spec);
        }
    }
    Ok(())
}

pub(crate) fn round_all(x: &[f32]) -> Vec<f32> {
    x.par_iter().with_min_len(4096).map(|&v| round_bf16(v)).collect()
}

fn epilogue_only(c: &mut [f32], beta: f32) {
    if beta == 0.0 {
        c.fill(0.0);
    } else {
        simd::scale(c, beta);
    }
}

/// One problem through `gemm::gemm`, whose convention is `dst = alpha*dst + beta*lhs*rhs`
/// (so our beta is its alpha and our alpha its beta).
fn gemm_crate(c: &mut [f32], a: &[f32], b: &[f32], spec: &MatmulSpec) {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    // Row-major strides of op(A) (m x k) and op(B) (k x n) as stored.
    let (a_cs, a_rs) = if spec.trans_a { (m as isize, 1) } else { (1, k as isize) };
    let (b_cs, b_rs) = if spec.trans_b { (k as isize, 1) } else { (1, n as isize) };
    let parallelism = if (m * n * k) as f64 >= PARALLEL_MACS && rayon::current_num_threads() > 1 {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: `spec.check` proved a.len() == m*k, b.len() == k*n, c.len() == m*n for this
    // problem, and the strides above address exactly those row-major layouts, so every
    // read and write stays in bounds. `c` is a unique borrow, so nothing aliases dst.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            n as isize,
            spec.beta != 0.0,
            a.as_ptr(),
            a_cs,
            a_rs,
            b.as_ptr(),
            b_cs,
            b_rs,
            spec.beta,
            spec.alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// out = alpha * (matrix-vector product) + beta * out, for m == 1 or n == 1.
fn gemv(c: &mut [f32], a: &[f32], b: &[f32], spec: &MatmulSpec) {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    if m == 1 {
        // y(n) = x(k) op(B): B stored (n, k) gives dot products, (k, n) a sum of rows.
        if spec.trans_b {
            dot_rows(c, b, a, k, spec.alpha, spec.beta);
        } else {
            sum_rows(c, b, a, n, spec.alpha, spec.beta);
        }
    } else {
        // c(m) = op(A)(m, k) b(k): A stored (m, k) gives dot products, (k, m) a sum of rows.
        if spec.trans_a {
            sum_rows(c, a, b, m, spec.alpha, spec.beta);
        } else {
            dot_rows(c, a, b, k, spec.alpha, spec.beta);
        }
    }
}

#[inline]
fn store(out: &mut f32, value: f32, alpha: f32, beta: f32) {
    *out = if beta == 0.0 { alpha * value } else { alpha * value + beta * *out };
}

/// out[i] = alpha * dot(mat[i, :], vec) + beta * out[i]; mat: (out.len(), cols).
fn dot_rows(out: &mut [f32], mat: &[f32], vec: &[f32], cols: usize, alpha: f32, beta: f32) {
    // Rows `first..first + o.len()`, four a call.
    let work = |first: usize, o: &mut [f32]| {
        let row = |i: usize| &mat[(first + i) * cols..(first + i + 1) * cols];
        let quads = o.len() / 4;
        for q in 0..quads {
            let i = 4 * q;
            let d = simd::dot4(vec, row(i), row(i + 1), row(i + 2), row(i + 3));
            for u in 0..4 {
                store(&mut o[i + u], d[u], alpha, beta);
            }
        }
        for i in 4 * quads..o.len() {
            store(&mut o[i], simd::dot(row(i), vec), alpha, beta);
        }
    };
    let parts = team::parts();
    if parts > 1 && out.len() * cols >= TEAM_GEMV && out.len() >= 8 * parts {
        // Decode: each part of the spinning team streams a contiguous block of rows (a
        // multiple of four); rayon's workers sleep between the ~90 calls of a decode step,
        // and waking them costs more than these products. Matrices of every size split:
        // one core alone reads the f32 weights at a third of what two do once they have
        // left the cache.
        let per = out.len().div_ceil(parts).div_ceil(4) * 4;
        team::run_blocks(out.chunks_mut(per), |p, o| work(p * per, o));
    } else {
        work(0, out);
    }
}

/// `c (m, n) = alpha * x (m, k) W^T + beta * c` with `W` stored `(n, k)`, for a few rows of
/// `x`: each row meets each quad of `W`'s rows as [`dot_rows`] meets its one vector (the
/// same `dot4`, or `dot` for the last rows, in the same order), so row `i` of `c` holds the
/// bits [`dot_rows`] gives `x`'s row `i` alone whatever `m` is: a server decoding several
/// requests in one step gives each the logits it gets alone, in f32 as in int8. `W` is
/// read once for every row (a quad stays in L1 while the rows pass over it).
fn dot_rows_many(c: &mut [f32], w: &[f32], x: &[f32], spec: &MatmulSpec) {
    let (m, n, k) = (spec.m, spec.n, spec.k);
    // (n, m): W's row j against every row of x, so a team part owns contiguous memory.
    let mut t = vec![0.0f32; n * m];
    let work = |first: usize, o: &mut [f32]| {
        let rows = o.len() / m;
        let row = |i: usize| &w[(first + i) * k..(first + i + 1) * k];
        let quads = rows / 4;
        for q in 0..quads {
            let i = 4 * q;
            for r in 0..m {
                let d = simd::dot4(&x[r * k..(r + 1) * k], row(i), row(i + 1), row(i + 2), row(i + 3));
                for u in 0..4 {
                    o[(i + u) * m + r] = d[u];
                }
            }
        }
        for i in 4 * quads..rows {
            for r in 0..m {
                o[i * m + r] = simd::dot(row(i), &x[r * k..(r + 1) * k]);
            }
        }
    };
    let parts = team::parts();
    if parts > 1 && n * k >= TEAM_GEMV && n >= 8 * parts {
        // As dot_rows splits: blocks of W's rows, a multiple of four each.
        let per = n.div_ceil(parts).div_ceil(4) * 4;
        team::run_blocks(t.chunks_mut(per * m), |p, o| work(p * per, o));
    } else {
        work(0, &mut t);
    }
    for r in 0..m {
        for j in 0..n {
            store(&mut c[r * n + j], t[j * m + r], spec.alpha, spec.beta);
        }
    }
}

/// out = alpha * sum_p vec[p] * mat[p, :] + beta * out; mat: (vec.len(), width).
///
/// Each task takes a contiguous block of rows of `mat` and sums it into a partial row,
/// 64 columns at a time in registers (`simd::sum_rows`); the partials are added in block
/// order, so the result does not depend on the thread count.
fn sum_rows(out: &mut [f32], mat: &[f32], vec: &[f32], width: usize, alpha: f32, beta: f32) {
    let rows_per_block = ((1usize << 16) / width.max(1)).max(4);
    let block = |(b, x): (usize, &[f32])| {
        let p0 = b * rows_per_block;
        let mut acc = vec![0.0f32; width];
        simd::sum_rows(&mut acc, &mat[p0 * width..(p0 + x.len()) * width], x, width);
        acc
    };
    let partials: Vec<Vec<f32>> = if out.len() * vec.len() >= PARALLEL_GEMV {
        vec.par_chunks(rows_per_block).enumerate().map(block).collect()
    } else {
        vec.chunks(rows_per_block).enumerate().map(block).collect()
    };
    let mut sum = vec![0.0f32; width];
    for p in &partials {
        simd::axpy(&mut sum, 1.0, p);
    }
    for (y, &v) in out.iter_mut().zip(&sum) {
        store(y, v, alpha, beta);
    }
}

impl MatmulOps for CpuBackend {
    fn matmul(&self, c: &mut Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, spec: &MatmulSpec) -> Result<()> {
        matmul(c, a, b, spec)
    }
}
