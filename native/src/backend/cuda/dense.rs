//! The dense layers' bias, activations and losses on CUDA (`kernels/cu/elementwise.cu`);
//! twins in `rusting_brain_core::ops::{activation, loss}`.

use super::*;

/// `loss_backward`'s code for the fused softmax/sigmoid + cross-entropy gradient,
/// `(pred - target) / divisor`.
const FUSED_OUTPUT: i32 = 3;

impl CudaBackend {
    /// The gradient of a loss with respect to `pred` (or, fused, to the logits): kernel
    /// `loss_backward` with `code`, scaled by 1 / the loss's divisor.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn loss_gradient(
        &self, op: &'static str, grad_name: &'static str, code: i32, loss: Loss, grad: &mut CudaBuffer,
        pred: &CudaBuffer, target: &CudaBuffer, rows: usize, cols: usize,
    ) -> Result<()> {
        let n = ops::loss::check_loss(op, pred.len, target.len, Some((grad_name, grad.len)), rows, cols)?;
        if rows == 0 || n == 0 {
            return Ok(());
        }
        let inv = 1.0f32 / loss.divisor(rows, cols) as f32;
        launch!(self, "loss_backward", grid(n);
            &mut grad.data, &pred.data, &target.data, &(n as i64), &code, &inv)
    }
}

pub(super) fn add_bias(
    be: &CudaBackend, out: &mut CudaBuffer, bias: &CudaBuffer, rows: usize, cols: usize,
) -> Result<()> {
    ops::elementwise::check_bias("add_bias", ["out", "bias"], out.len, bias.len, rows, cols)?;
    let n = rows * cols;
    if n == 0 {
        return Ok(());
    }
    launch!(be, "add_bias", grid(n); &mut out.data, &bias.data, &(n as i64), &i32_of("cols", cols)?)
}

pub(super) fn bias_backward(
    be: &CudaBackend, dbias: &mut CudaBuffer, dout: &CudaBuffer, rows: usize, cols: usize,
) -> Result<()> {
    ops::elementwise::check_bias("bias_backward", ["dout", "dbias"], dout.len, dbias.len, rows, cols)?;
    if cols == 0 {
        return Ok(());
    }
    be.column_sum(&mut dbias.data, &dout.data, rows, cols)
}

pub(super) fn activation_forward(
    be: &CudaBackend, act: Activation, out: &mut CudaBuffer, inp: &CudaBuffer, rows: usize, cols: usize,
) -> Result<()> {
    let n = ops::activation::check_activation_forward(out.len, inp.len, rows, cols)?;
    if n == 0 {
        return Ok(());
    }
    if act == Activation::Softmax {
        return be.softmax_forward(out, inp, rows, cols);
    }
    let (code, alpha) = act.kernel_code();
    let code = code as i32;
    launch!(be, "activation_forward", grid(n); &mut out.data, &inp.data, &(n as i64), &code, &alpha)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn activation_backward(
    be: &CudaBackend, act: Activation, dinp: &mut CudaBuffer, dout: &CudaBuffer, inp: &CudaBuffer,
    out: &CudaBuffer, rows: usize, cols: usize,
) -> Result<()> {
    let n = ops::activation::check_activation_backward(dinp.len, dout.len, inp.len, out.len, rows, cols)?;
    if n == 0 {
        return Ok(());
    }
    if act == Activation::Softmax {
        return be.softmax_backward(dinp, dout, out, rows, cols);
    }
    let (code, alpha) = act.kernel_code();
    let code = code as i32;
    launch!(be, "activation_backward", grid(n);
        &mut dinp.data, &dout.data, &inp.data, &out.data, &(n as i64), &code, &alpha)
}

pub(super) fn loss_forward(
    be: &CudaBackend, loss: Loss, pred: &CudaBuffer, target: &CudaBuffer, rows: usize, cols: usize,
) -> Result<f64> {
    const OP: &str = "loss_forward";
    let n = ops::loss::check_loss(OP, pred.len, target.len, None, rows, cols)?;
    if rows == 0 || n == 0 {
        return Ok(0.0);
    }
    let mut terms = be.alloc(n)?;
    launch!(be, "loss_terms", grid(n);
        &mut terms.data, &pred.data, &target.data, &(n as i64), &(loss.kernel_code() as i32))?;
    let mut guard = be.dev.partials.lock().map_err(|_| dev_err("scratch lock poisoned"))?;
    let partials = be.scratch(&mut guard, REDUCE_BLOCKS, "reduction scratch")?;
    let cfg = CudaBackend::reduce_cfg(n);
    let blocks = cfg.grid_dim.0 as usize;
    launch!(be, "partial_sums", cfg; &mut *partials, &terms.data, &(n as i64))?;
    let value = be.reduce_host(partials, blocks)? / loss.divisor(rows, cols) as f64;
    if !value.is_finite() {
        return Err(CoreError::NonFinite { op: OP, value });
    }
    Ok(value)
}

pub(super) fn loss_backward(
    be: &CudaBackend, loss: Loss, dpred: &mut CudaBuffer, pred: &CudaBuffer, target: &CudaBuffer,
    rows: usize, cols: usize,
) -> Result<()> {
    let code = loss.kernel_code() as i32;
    be.loss_gradient("loss_backward", "dpred", code, loss, dpred, pred, target, rows, cols)
}

pub(super) fn fused_output_backward(
    be: &CudaBackend, loss: Loss, dlogits: &mut CudaBuffer, pred: &CudaBuffer, target: &CudaBuffer,
    rows: usize, cols: usize,
) -> Result<()> {
    be.loss_gradient(
        "fused_output_backward",
        "dlogits",
        FUSED_OUTPUT,
        loss,
        dlogits,
        pred,
        target,
        rows,
        cols,
    )
}
