//! The dense-network activations and losses on the CPU: the reference functions run on
//! blocks of rows in parallel (they are element- or row-wise, so a block is a valid
//! problem of its own). Loss sums come back per block and are added in block order.
//! Twin of `rusting_brain_core::ops::{activation, loss}`.

use rayon::prelude::*;
use rusting_brain_core::error::check_rows;
use rusting_brain_core::ops::loss::check_loss;
use rusting_brain_core::ops::{activation as act_ref, loss as loss_ref};
use rusting_brain_core::{Activation, Loss, Result};

use super::rows_per_task;

fn lens(op: &'static str, rows: usize, cols: usize, bufs: &[(&'static str, usize)]) -> Result<usize> {
    check_rows(op, rows, cols, bufs)?;
    Ok(rows_per_task(cols) * cols)
}

pub fn activation_forward(
    act: Activation, out: &mut [f32], inp: &[f32], rows: usize, cols: usize,
) -> Result<()> {
    let per = lens("activation_forward", rows, cols, &[("inp", inp.len()), ("out", out.len())])?;
    out.par_chunks_mut(per)
        .zip(inp.par_chunks(per))
        .try_for_each(|(o, x)| act_ref::activation_forward(act, o, x, x.len() / cols, cols))
}

#[allow(clippy::too_many_arguments)]
pub fn activation_backward(
    act: Activation, dinp: &mut [f32], dout: &[f32], inp: &[f32], out: &[f32], rows: usize, cols: usize,
) -> Result<()> {
    let per = lens(
        "activation_backward",
        rows,
        cols,
        &[("dinp", dinp.len()), ("dout", dout.len()), ("inp", inp.len()), ("out", out.len())],
    )?;
    dinp.par_chunks_mut(per)
        .zip(dout.par_chunks(per))
        .zip(inp.par_chunks(per).zip(out.par_chunks(per)))
        .try_for_each(|((dx, dy), (x, y))| {
            act_ref::activation_backward(act, dx, dy, x, y, x.len() / cols, cols)
        })
}

pub fn loss_forward(loss: Loss, pred: &[f32], target: &[f32], rows: usize, cols: usize) -> Result<f64> {
    check_loss("loss_forward", pred.len(), target.len(), None, rows, cols)?;
    let per = rows_per_task(cols) * cols;
    if rows == 0 {
        return Ok(0.0);
    }
    // Each block's mean times its row count is its share of the total (all three losses
    // divide by a multiple of the row count), so sum(share) / rows is the overall mean.
    let shares: Vec<Result<f64>> = pred
        .par_chunks(per)
        .zip(target.par_chunks(per))
        .map(|(p, y)| {
            let r = p.len() / cols;
            loss_ref::loss_forward(loss, p, y, r, cols).map(|m| m * r as f64)
        })
        .collect();
    let mut total = 0.0;
    for s in shares {
        total += s?;
    }
    Ok(total / rows as f64)
}

fn scaled_blocks(
    dpred: &mut [f32], pred: &[f32], target: &[f32], rows: usize, cols: usize, per: usize,
    f: impl Fn(&mut [f32], &[f32], &[f32], usize) -> Result<()> + Sync,
) -> Result<()> {
    // The reference divides by the block's own row count; rescale to the whole batch.
    dpred.par_chunks_mut(per).zip(pred.par_chunks(per).zip(target.par_chunks(per))).try_for_each(
        |(d, (p, y))| {
            let r = p.len() / cols;
            f(d, p, y, r)?;
            let s = r as f32 / rows as f32;
            d.iter_mut().for_each(|v| *v *= s);
            Ok(())
        },
    )
}

pub fn loss_backward(
    loss: Loss, dpred: &mut [f32], pred: &[f32], target: &[f32], rows: usize, cols: usize,
) -> Result<()> {
    check_loss("loss_backward", pred.len(), target.len(), Some(("dpred", dpred.len())), rows, cols)?;
    let per = rows_per_task(cols) * cols;
    if rows == 0 {
        return Ok(());
    }
    scaled_blocks(dpred, pred, target, rows, cols, per, |d, p, y, r| {
        loss_ref::loss_backward(loss, d, p, y, r, cols)
    })
}

pub fn fused_output_backward(
    loss: Loss, dlogits: &mut [f32], pred: &[f32], target: &[f32], rows: usize, cols: usize,
) -> Result<()> {
    let grad = Some(("dlogits", dlogits.len()));
    check_loss("fused_output_backward", pred.len(), target.len(), grad, rows, cols)?;
    let per = rows_per_task(cols) * cols;
    if rows == 0 {
        return Ok(());
    }
    scaled_blocks(dlogits, pred, target, rows, cols, per, |d, p, y, r| {
        loss_ref::fused_output_backward(loss, d, p, y, r, cols)
    })
}
