//! The low-rank adapter product of LoRA and its backward.
//!
//! A projection `y = x W^T` with an adapter computes `y = x W^T + scale * (x A^T) B^T`,
//! where `A (rank, d_in)` and `B (d_out, rank)` are the adapter and `W` stays frozen. The
//! model runs `W`'s product as any other and this pair adds the adapter's part:
//!
//! - forward: `t = x A^T` `(rows, rank)`, kept for the backward pass; `y += scale * t B^T`;
//! - backward, from `dy`: `dB += scale * dy^T t`, `dt = scale * dy B`, `dA += dt^T x`,
//!   `dx += dt A`.
//!
//! `x`/`dx`, `y`/`dy` and `t`/`dt` may be row windows of longer buffers (a mixture-of-experts
//! block runs each expert on a run of grouped rows): the offsets in [`LoraSpec`] say where
//! the first row starts. `A`, `B`, `dA`, `dB` are whole.

use crate::backend::MatmulOps;
use crate::backend::OperandPrecision;
use crate::error::check_len;
use crate::ops::matmul::MatmulSpec;
use crate::reference::in_f64;
use crate::reference::wide;
use crate::reference::ReferenceBackend;
use crate::{CoreError, Real, Result};
use alloc::vec::Vec;

/// The shape of one adapter product.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoraSpec {
    /// Rows of `x` (tokens, or one expert's routed rows).
    pub rows: usize,
    /// Width of `x`.
    pub d_in: usize,
    /// Width of `y`.
    pub d_out: usize,
    /// The adapter's rank.
    pub rank: usize,
    /// `alpha / rank`, or `alpha / sqrt(rank)` with rank-stabilized scaling.
    pub scale: f32,
    /// Element offsets of the first row in `x` (and `dx`), `y` (and `dy`), `t` (and `dt`).
    pub x_offset: usize,
    /// See `x_offset`.
    pub y_offset: usize,
    /// See `x_offset`.
    pub t_offset: usize,
    /// Operand precision of a backend's products (the reference computes in f64).
    pub precision: OperandPrecision,
}

impl LoraSpec {
    /// `dx`, or `sink` grown to `x`'s extent when the caller wants no input gradient (the
    /// first adapted layer): the host backends' backward always has somewhere to write it.
    pub fn dx_or_sink<'a>(&self, dx: Option<&'a mut Vec<f32>>, sink: &'a mut Vec<f32>) -> &'a mut Vec<f32> {
        dx.unwrap_or_else(|| {
            sink.resize(self.x_offset + self.rows * self.d_in, 0.0);
            sink
        })
    }
    /// An adapter product over whole buffers at f32.
    pub fn new(rows: usize, d_in: usize, d_out: usize, rank: usize, scale: f32) -> Self {
        LoraSpec {
            rows,
            d_in,
            d_out,
            rank,
            scale,
            x_offset: 0,
            y_offset: 0,
            t_offset: 0,
            precision: OperandPrecision::F32,
        }
    }
    /// The same product on a run of rows starting at these element offsets.
    pub fn offsets(mut self, x: usize, y: usize, t: usize) -> Self {
        self.x_offset = x;
        self.y_offset = y;
        self.t_offset = t;
        self
    }
    /// Sets the products' operand precision.
    pub fn precision(mut self, p: OperandPrecision) -> Self {
        self.precision = p;
        self
    }

    /// Checks every buffer length: `x`, `y`, `t` must cover their windows, `a` and `b` be
    /// exactly `(rank, d_in)` and `(d_out, rank)`.
    pub fn check(&self, op: &'static str, x: usize, y: usize, t: usize, a: usize, b: usize) -> Result<()> {
        if self.rank == 0 {
            return Err(CoreError::InvalidDimension {
                op,
                message: "a LoRA adapter needs rank at least 1".into(),
            });
        }
        if !self.scale.is_finite() {
            return Err(CoreError::InvalidArgument {
                op,
                message: alloc::format!("LoRA scale {} is not finite", self.scale),
            });
        }
        check_len(op, "A", a, self.rank * self.d_in)?;
        check_len(op, "B", b, self.d_out * self.rank)?;
        for (what, len, offset, width) in [
            ("x", x, self.x_offset, self.d_in),
            ("y", y, self.y_offset, self.d_out),
            ("t", t, self.t_offset, self.rank),
        ] {
            let end = offset + self.rows * width;
            if len < end {
                return Err(CoreError::ShapeMismatch { op, what, expected: end, actual: len });
            }
        }
        Ok(())
    }
}

/// `t = x A^T` (overwritten), then `y += scale * t B^T`.
pub fn lora_forward<T: Real>(
    y: &mut [T], t: &mut [T], x: &[T], a: &[T], b: &[T], s: &LoraSpec,
) -> Result<()> {
    s.check("lora_forward", x.len(), y.len(), t.len(), a.len(), b.len())?;
    lora_down(t, x, a, s)?;
    lora_up(y, t, b, s)
}

/// The first half of [`lora_forward`]: `t = x A^T`.
pub fn lora_down<T: Real>(t: &mut [T], x: &[T], a: &[T], s: &LoraSpec) -> Result<()> {
    s.check("lora_down", x.len(), s.y_offset + s.rows * s.d_out, t.len(), a.len(), s.d_out * s.rank)?;
    let (r, di) = (s.rank, s.d_in);
    for i in 0..s.rows {
        let xi = &x[s.x_offset + i * di..][..di];
        for j in 0..r {
            let mut acc = T::ZERO;
            for k in 0..di {
                acc += xi[k] * a[j * di + k];
            }
            t[s.t_offset + i * r + j] = acc;
        }
    }
    Ok(())
}

/// The second half of [`lora_forward`]: `y += scale * t B^T`.
pub fn lora_up<T: Real>(y: &mut [T], t: &[T], b: &[T], s: &LoraSpec) -> Result<()> {
    s.check("lora_up", s.x_offset + s.rows * s.d_in, y.len(), t.len(), s.rank * s.d_in, b.len())?;
    let (r, dout) = (s.rank, s.d_out);
    let scale = T::from_f32(s.scale);
    for i in 0..s.rows {
        let ti = &t[s.t_offset + i * r..][..r];
        for o in 0..dout {
            let mut acc = T::ZERO;
            for j in 0..r {
                acc += ti[j] * b[o * r + j];
            }
            y[s.y_offset + i * dout + o] += scale * acc;
        }
    }
    Ok(())
}

/// From `dy`: `dB += scale * dy^T t`, `dt = scale * dy B` (overwritten), `dA += dt^T x`,
/// `dx += dt A`. `t` is what [`lora_forward`] kept.
#[allow(clippy::too_many_arguments)]
pub fn lora_backward<T: Real>(
    dx: &mut [T], da: &mut [T], db: &mut [T], dt: &mut [T], dy: &[T], x: &[T], t: &[T], a: &[T], b: &[T],
    s: &LoraSpec,
) -> Result<()> {
    let op = "lora_backward";
    s.check(op, x.len(), dy.len(), t.len(), a.len(), b.len())?;
    s.check(op, dx.len(), dy.len(), dt.len(), da.len(), db.len())?;
    let (r, di, dout) = (s.rank, s.d_in, s.d_out);
    let scale = T::from_f32(s.scale);
    for i in 0..s.rows {
        let dyi = &dy[s.y_offset + i * dout..][..dout];
        let ti = &t[s.t_offset + i * r..][..r];
        for o in 0..dout {
            for j in 0..r {
                db[o * r + j] += scale * dyi[o] * ti[j];
            }
        }
        for j in 0..r {
            let mut acc = T::ZERO;
            for o in 0..dout {
                acc += dyi[o] * b[o * r + j];
            }
            dt[s.t_offset + i * r + j] = scale * acc;
        }
        let xi = &x[s.x_offset + i * di..][..di];
        for j in 0..r {
            let g = dt[s.t_offset + i * r + j];
            for k in 0..di {
                da[j * di + k] += g * xi[k];
                dx[s.x_offset + i * di + k] += g * a[j * di + k];
            }
        }
    }
    Ok(())
}

/// `W += scale * B A`: the adapter folded into the `(d_out, d_in)` weight it adapts.
pub fn lora_merge<T: Real>(
    w: &mut [T], a: &[T], b: &[T], d_out: usize, d_in: usize, rank: usize, scale: f32,
) -> Result<()> {
    let s = LoraSpec::new(0, d_in, d_out, rank, scale);
    s.check("lora_merge", 0, 0, 0, a.len(), b.len())?;
    check_len("lora_merge", "W", w.len(), d_out * d_in)?;
    let scale = T::from_f32(scale);
    for o in 0..d_out {
        for k in 0..d_in {
            let mut acc = T::ZERO;
            for j in 0..rank {
                acc += b[o * rank + j] * a[j * d_in + k];
            }
            w[o * d_in + k] += scale * acc;
        }
    }
    Ok(())
}

/// Low-rank adapters, forward and backward: see [`crate::ops::lora`].
pub trait LoraOps: MatmulOps {
    /// `t = x A^T` (overwritten, kept for the backward pass), then `y += scale * t B^T`.
    /// The default is two of the backend's own GEMMs ([`lora_forward_by_gemm`]); a backend
    /// with a one-pass kernel overrides it.
    #[allow(clippy::too_many_arguments)]
    fn lora_forward(
        &self, y: &mut Self::Buffer, t: &mut Self::Buffer, x: &Self::Buffer, a: &Self::Buffer,
        b: &Self::Buffer, s: &LoraSpec,
    ) -> Result<()> {
        lora_forward_by_gemm(self, y, t, x, a, b, s)
    }
    /// From `dy`: `dB += scale * dy^T t`, `dt = scale * dy B` (scratch, overwritten),
    /// `dA += dt^T x`, and `dx += dt A` when `dx` is given.
    #[allow(clippy::too_many_arguments)]
    fn lora_backward(
        &self, dx: Option<&mut Self::Buffer>, da: &mut Self::Buffer, db: &mut Self::Buffer,
        dt: &mut Self::Buffer, dy: &Self::Buffer, x: &Self::Buffer, t: &Self::Buffer, a: &Self::Buffer,
        b: &Self::Buffer, s: &LoraSpec,
    ) -> Result<()> {
        let op = "lora_backward";
        s.check(op, self.len(x), self.len(dy), self.len(t), self.len(a), self.len(b))?;
        s.check(op, self.len(x), self.len(dy), self.len(dt), self.len(da), self.len(db))?;
        if let Some(dx) = &dx {
            s.check(op, self.len(dx), self.len(dy), self.len(t), self.len(a), self.len(b))?;
        }
        if s.rows == 0 {
            return Ok(());
        }
        let mm = |m, n, k| MatmulSpec::new(m, n, k).precision(s.precision);
        let (rows, r, di, dout) = (s.rows, s.rank, s.d_in, s.d_out);
        let (xo, yo, to) = (s.x_offset, s.y_offset, s.t_offset);
        self.matmul(
            db,
            dy,
            t,
            &mm(dout, r, rows).trans_a(true).alpha(s.scale).accumulate().window(yo, to, 0),
        )?;
        self.matmul(dt, dy, b, &mm(rows, r, dout).alpha(s.scale).window(yo, 0, to))?;
        self.matmul(da, dt, x, &mm(r, di, rows).trans_a(true).accumulate().window(to, xo, 0))?;
        if let Some(dx) = dx {
            self.matmul(dx, dt, a, &mm(rows, di, r).accumulate().window(to, 0, xo))?;
        }
        Ok(())
    }
}

impl LoraOps for ReferenceBackend {
    fn lora_forward(
        &self, y: &mut Vec<f32>, t: &mut Vec<f32>, x: &Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, s: &LoraSpec,
    ) -> Result<()> {
        s.check("lora_forward", x.len(), y.len(), t.len(), a.len(), b.len())?;
        // t rounds to f32 as a backend stores it; y's sum then runs over the stored t.
        in_f64([t], |[t]| lora_down(t, &wide(x), &wide(a), s))?;
        let t = wide(t);
        in_f64([y], |[y]| lora_up(y, &t, &wide(b), s))
    }
    fn lora_backward(
        &self, dx: Option<&mut Vec<f32>>, da: &mut Vec<f32>, db: &mut Vec<f32>, dt: &mut Vec<f32>,
        dy: &Vec<f32>, x: &Vec<f32>, t: &Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, s: &LoraSpec,
    ) -> Result<()> {
        in_f64([s.dx_or_sink(dx, &mut Vec::new()), da, db, dt], |[dx, da, db, dt]| {
            lora_backward(dx, da, db, dt, &wide(dy), &wide(x), &wide(t), &wide(a), &wide(b), s)
        })
    }
}

/// [`LoraOps::lora_forward`] as two of `backend`'s GEMMs, the scale folded into the
/// second's alpha: at the ranks adapters use (4 to 64) both products are bound by reading
/// `x` and writing `y`, which a GEMM already does once each.
pub fn lora_forward_by_gemm<B: MatmulOps + ?Sized>(
    backend: &B, y: &mut B::Buffer, t: &mut B::Buffer, x: &B::Buffer, a: &B::Buffer, b: &B::Buffer,
    s: &LoraSpec,
) -> Result<()> {
    let len = |buf| backend.len(buf);
    s.check("lora_forward", len(x), len(y), len(t), len(a), len(b))?;
    if s.rows == 0 {
        return Ok(());
    }
    let mm = |m, n, k| MatmulSpec::new(m, n, k).precision(s.precision);
    backend.matmul(t, x, a, &mm(s.rows, s.rank, s.d_in).trans_b(true).window(s.x_offset, 0, s.t_offset))?;
    backend.matmul(
        y,
        t,
        b,
        &mm(s.rows, s.d_out, s.rank)
            .trans_b(true)
            .alpha(s.scale)
            .accumulate()
            .window(s.t_offset, 0, s.y_offset),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;

    fn randn(rng: &mut crate::Rng, n: usize) -> Vec<f64> {
        rng.normal_vec(n, 1.0).into_iter().map(|v| v as f64).collect()
    }

    /// The loss `sum(y * g)` for a fixed `g`, as a function of x, A and B.
    fn loss(x: &[f64], a: &[f64], b: &[f64], g: &[f64], s: &LoraSpec) -> f64 {
        let mut y = vec![0.0; g.len()];
        let mut t = vec![0.0; s.rows * s.rank];
        lora_forward(&mut y, &mut t, x, a, b, s).unwrap();
        y.iter().zip(g).map(|(y, g)| y * g).sum()
    }

    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = crate::Rng::new(7);
        let s = LoraSpec::new(3, 5, 4, 2, 1.5);
        let (x, a, b, g) =
            (randn(&mut rng, 15), randn(&mut rng, 10), randn(&mut rng, 8), randn(&mut rng, 12));
        let mut t = vec![0.0; 6];
        let mut y = vec![0.0; 12];
        lora_forward(&mut y, &mut t, &x, &a, &b, &s).unwrap();
        let (mut dx, mut da, mut db, mut dt) = (vec![0.0; 15], vec![0.0; 10], vec![0.0; 8], vec![0.0; 6]);
        lora_backward(&mut dx, &mut da, &mut db, &mut dt, &g, &x, &t, &a, &b, &s).unwrap();
        let h = 1e-6;
        for (which, grad) in [(0, &dx), (1, &da), (2, &db)] {
            for i in 0..grad.len() {
                let mut p = [x.clone(), a.clone(), b.clone()];
                p[which][i] += h;
                let up = loss(&p[0], &p[1], &p[2], &g, &s);
                p[which][i] -= 2.0 * h;
                let down = loss(&p[0], &p[1], &p[2], &g, &s);
                let fd = (up - down) / (2.0 * h);
                assert!((fd - grad[i]).abs() < 1e-6 * (1.0 + fd.abs()), "{which}[{i}]: {fd} vs {}", grad[i]);
            }
        }
    }

    #[test]
    fn merged_weight_predicts_the_same() {
        let mut rng = crate::Rng::new(3);
        let (rows, di, dout, r) = (4, 6, 5, 3);
        let s = LoraSpec::new(rows, di, dout, r, 0.75);
        let (x, a, b, mut w) = (
            randn(&mut rng, rows * di),
            randn(&mut rng, r * di),
            randn(&mut rng, dout * r),
            randn(&mut rng, dout * di),
        );
        let mut y = vec![0.0; rows * dout];
        for i in 0..rows {
            for o in 0..dout {
                y[i * dout + o] = (0..di).map(|k| x[i * di + k] * w[o * di + k]).sum();
            }
        }
        lora_forward(&mut y, &mut vec![0.0; rows * r], &x, &a, &b, &s).unwrap();
        lora_merge(&mut w, &a, &b, dout, di, r, 0.75).unwrap();
        for i in 0..rows {
            for o in 0..dout {
                let merged: f64 = (0..di).map(|k| x[i * di + k] * w[o * di + k]).sum();
                assert!((merged - y[i * dout + o]).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn windows_and_shapes_are_checked() {
        let s = LoraSpec::new(2, 3, 4, 2, 1.0).offsets(3, 0, 2);
        let (x, a, b) = (vec![1.0f64; 9], vec![1.0; 6], vec![1.0; 8]);
        let (mut y, mut t) = (vec![0.0; 8], vec![0.0; 6]);
        lora_forward(&mut y, &mut t, &x, &a, &b, &s).unwrap();
        // t = [3, 3] per row, y = 6 per element.
        assert_eq!(&t[2..], &[3.0; 4]);
        assert!(y.iter().all(|&v| v == 6.0));
        let short_x = vec![1.0; 8];
        assert!(lora_forward(&mut y, &mut t, &short_x, &a, &b, &s).is_err());
        assert!(lora_forward(&mut y, &mut t, &x, &a[..5], &b, &s).is_err());
        let zero_rank = LoraSpec::new(2, 3, 4, 0, 1.0);
        assert!(lora_forward(&mut y, &mut t, &x, &[], &[], &zero_rank).is_err());
    }
}
