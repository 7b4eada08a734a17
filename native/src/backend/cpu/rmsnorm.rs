//! RMSNorm on the CPU: rows in parallel, SIMD reductions. Twin of
//! `rusting_brain_core::ops::rmsnorm`.

use rayon::prelude::*;
use rusting_brain_core::ops::rmsnorm::{check_rmsnorm_backward, check_rmsnorm_forward};
use rusting_brain_core::Result;

use super::{rows_per_task, simd, team};
use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::RmsnormOps;

#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_forward(
    out: &mut [f32], rstd: &mut [f32], inp: &[f32], weight: &[f32], rows: usize, dim: usize, eps: f32,
) -> Result<()> {
    check_rmsnorm_forward(out.len(), rstd.len(), inp.len(), weight.len(), rows, dim)?;
    let band = |first: usize, o: &mut [f32], r: &mut [f32]| {
        let x = &inp[first * dim..first * dim + o.len()];
        for ((o, r), x) in o.chunks_exact_mut(dim).zip(r.iter_mut()).zip(x.chunks_exact(dim)) {
            let s = 1.0 / (simd::sum_sq(x) / dim as f32 + eps).sqrt();
            *r = s;
            // Zipped, not indexed: three slices indexed by `i` kept their bounds checks and
            // the loop scalar (a decode step's norms are a row each).
            for ((o, &x), &w) in o.iter_mut().zip(x).zip(weight) {
                *o = x * s * w;
            }
        }
    };
    // Bands of rows over the spinning team (see `team`): a prompt's rows are
    // microseconds of work, less than waking rayon's workers.
    let parts = team::parts();
    if parts < 2 || rows < 2 || out.len() < rows_per_task(dim) * dim {
        band(0, out, rstd);
    } else {
        let per = rows.div_ceil(parts);
        let blocks = out.chunks_mut(per * dim).zip(rstd.chunks_mut(per));
        team::run_blocks(blocks, |p, (o, r)| band(p * per, o, r));
    }
    Ok(())
}

/// dinp overwritten; dweight accumulated from per-task partial sums, added in task order so
/// the result does not depend on the thread count.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_backward(
    dinp: &mut [f32], dweight: &mut [f32], dout: &[f32], inp: &[f32], weight: &[f32], rstd: &[f32],
    rows: usize, dim: usize,
) -> Result<()> {
    check_rmsnorm_backward([&*dinp, &*dweight, dout, inp, weight, rstd].map(|b| b.len()), rows, dim)?;
    let per = rows_per_task(dim);
    let partials: Vec<Vec<f32>> = dinp
        .par_chunks_mut(per * dim)
        .zip(dout.par_chunks(per * dim))
        .zip(inp.par_chunks(per * dim))
        .zip(rstd.par_chunks(per))
        .map(|(((dx, dy), x), r)| {
            let mut dw = vec![0.0f32; dim];
            let mut g = vec![0.0f32; dim];
            for (((dx, dy), x), &s) in
                dx.chunks_exact_mut(dim).zip(dy.chunks_exact(dim)).zip(x.chunks_exact(dim)).zip(r)
            {
                for i in 0..dim {
                    g[i] = weight[i] * dy[i];
                }
                let mean = simd::dot(&g, x) * s / dim as f32;
                for i in 0..dim {
                    let xhat = x[i] * s;
                    dx[i] = s * (g[i] - xhat * mean);
                    dw[i] += dy[i] * xhat;
                }
            }
            dw
        })
        .collect();
    for p in &partials {
        simd::axpy(dweight, 1.0, p);
    }
    Ok(())
}

impl RmsnormOps for CpuBackend {
    fn rmsnorm_forward(
        &self, out: &mut Vec<f32>, rstd: &mut Vec<f32>, inp: &Vec<f32>, weight: &Vec<f32>, rows: usize,
        dim: usize, eps: f32,
    ) -> Result<()> {
        rmsnorm_forward(out, rstd, inp, weight, rows, dim, eps)
    }
    fn rmsnorm_backward(
        &self, dinp: &mut Vec<f32>, dweight: &mut Vec<f32>, dout: &Vec<f32>, inp: &Vec<f32>,
        weight: &Vec<f32>, rstd: &Vec<f32>, rows: usize, dim: usize,
    ) -> Result<()> {
        rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, rows, dim)
    }
}
