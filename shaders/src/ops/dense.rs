//! Dense layers: the f32 GEMM (`matmul.wgsl`), the element-wise and per-row ops of
//! `dense.wgsl`, and the optimizers (`optim.wgsl`); twins of `rusting_brain_core::ops::{matmul,
//! activation, loss, softmax, elementwise, optim}`.

use super::*;

const DENSE: Kernel = kernel!(
    "dense",
    { op: u32, rows: u32, cols: u32, code: u32, alpha: f32, inv: f32, pad0: u32, pad1: u32 },
    [read x0: f32, read x1: f32, read x2: f32, read_write y: f32]
);
const OPTIM: Kernel = kernel!(
    "optim",
    { op: u32, len: u32, decoupled: u32, nesterov: u32, lr: f32, beta1: f32, beta2: f32, one_minus_beta1: f32, one_minus_beta2: f32, eps: f32, weight_decay: f32, grad_scale: f32, step_size: f32, bc2_sqrt: f32, momentum: f32, pad: u32 },
    [read_write param: f32, read grad: f32, read_write m: f32, read_write v: f32]
);
const MATMUL: Kernel = kernel!(
    "matmul",
    { m: u32, n: u32, k: u32, batch: u32, trans_a: u32, trans_b: u32, alpha: f32, beta: f32, a0: u32, b0: u32, c0: u32, bf16: u32 },
    [read a: f32, read b: f32, read_write c: f32]
);
const MATMUL_TILED: Kernel = kernel!(
    "matmul_tiled",
    { m: u32, n: u32, k: u32, batch: u32, trans_a: u32, trans_b: u32, alpha: f32, beta: f32, a0: u32, b0: u32, c0: u32, bf16: u32 },
    [read a: f32, read b: f32, read_write c: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[DENSE, OPTIM, MATMUL, MATMUL_TILED];

/// Output columns from which the f32 product takes the register-tiled kernel.
pub const TILED_MATMUL: usize = 16;

impl Batch<'_> {
    /// One of the dense layers' element-wise or per-row ops on `y` (see `dense.wgsl` for
    /// the roles of `x`); lengths are checked by the caller.
    pub fn dense(
        &mut self, op: DenseOp, x: [Option<&GpuBuffer>; 3], y: &GpuBuffer, rows: usize, cols: usize,
    ) -> Result<(), ShaderError> {
        let (code, alpha, inv) = op.codes();
        let invocations = match op {
            DenseOp::BiasBackward => cols,
            DenseOp::ActivationForward(5, _) | DenseOp::ActivationBackward(5, _) => rows,
            _ => rows * cols,
        };
        if invocations == 0 {
            return Ok(());
        }
        let spare = &self.gpu.spare[0];
        let [x0, x1, x2] = x.map(|b| b.unwrap_or(spare));
        let p = [op.index(), u(rows, "rows")?, u(cols, "cols")?, code, alpha.to_bits(), inv.to_bits()];
        self.dispatch(&DENSE, &p, &[x0, x1, x2, y], grid(invocations.div_ceil(WG)))?;
        Ok(())
    }

    /// An optimizer step over `len` values: `words` are `optim.wgsl`'s parameters; `m`
    /// and `v` are the moments (Adam) or `m` the velocity (SGD with momentum).
    pub fn optim(
        &mut self, words: &[u32; 16], param: &GpuBuffer, grad: &GpuBuffer, m: Option<&GpuBuffer>,
        v: Option<&GpuBuffer>,
    ) -> Result<(), ShaderError> {
        let len = words[1] as usize;
        need("optim", "param", param, len)?;
        need("optim", "grad", grad, len)?;
        if len == 0 {
            return Ok(());
        }
        let m = m.unwrap_or(&self.gpu.spare[0]);
        let v = v.unwrap_or(&self.gpu.spare[1]);
        self.dispatch(&OPTIM, words, &[param, grad, m, v], grid(len.div_ceil(WG)))?;
        Ok(())
    }

    /// `c = alpha * op(a) op(b) + beta * c` in f32 over `batch` problems, the operands
    /// starting at word offsets `at = (a, b, c)` (a MatmulSpec's window); with `bf16` the
    /// operands are rounded to bfloat16 as they are read (mixed precision). Shapes are
    /// checked by the caller (the backend runs `MatmulSpec::check`).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &mut self, c: &GpuBuffer, a: &GpuBuffer, b: &GpuBuffer,
        (m, n, k, batch): (usize, usize, usize, usize), (trans_a, trans_b): (bool, bool),
        (alpha, beta): (f32, f32), at: (usize, usize, usize), bf16: bool,
    ) -> Result<(), ShaderError> {
        const OP: &str = "matmul";
        need(OP, "a", a, at.0 + batch * m * k)?;
        need(OP, "b", b, at.1 + batch * k * n)?;
        need(OP, "c", c, at.2 + batch * m * n)?;
        let (gx, gy) = (n.div_ceil(8), m.div_ceil(8));
        if gx > MAX_GROUPS || gy > MAX_GROUPS || batch > MAX_GROUPS {
            return Err(ShaderError::Invalid(format!(
                "{OP}: ({m} x {n}) x {batch} is over the grid's limits"
            )));
        }
        if m * n * batch == 0 {
            return Ok(());
        }
        let p = [
            u(m, "m")?,
            u(n, "n")?,
            u(k, "k")?,
            u(batch, "batch")?,
            trans_a as u32,
            trans_b as u32,
            alpha.to_bits(),
            beta.to_bits(),
            u(at.0, "a offset")?,
            u(at.1, "b offset")?,
            u(at.2, "c offset")?,
            bf16 as u32,
        ];
        // By n alone: the row count of an expert's product follows the routing, and a kernel
        // picked by it would change (and need new bind groups) from one step to the next.
        if n >= TILED_MATMUL {
            // 4 x 4 outputs an invocation, 32 x 32 a workgroup.
            self.dispatch3(
                &MATMUL_TILED,
                &p,
                &[a, b, c],
                (n.div_ceil(32) as u32, m.div_ceil(32) as u32, batch as u32),
            )?;
        } else {
            self.dispatch3(&MATMUL, &p, &[a, b, c], (gx as u32, gy as u32, batch as u32))?;
        }
        Ok(())
    }
}

/// The ops of `dense.wgsl`. Activation codes: 0 identity, 1 ReLU, 2 leaky ReLU, 3 sigmoid,
/// 4 tanh, 5 softmax (per row); loss codes: 0 MSE, 1 binary, 2 categorical cross-entropy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DenseOp {
    /// `y[r, c] += x0[c]`.
    AddBias,
    /// `y[c] += sum_r x0[r, c]`.
    BiasBackward,
    /// `y = f(x0)`; (activation code, leaky slope).
    ActivationForward(u32, f32),
    /// `y = f'(x1) * x0` with the forward output in x2; (code, slope).
    ActivationBackward(u32, f32),
    /// `y = dloss/dpred(x0, x1) / divisor`; (loss code, 1 / divisor).
    LossBackward(u32, f32),
    /// `y = (x0 - x1) / divisor`; (1 / divisor).
    FusedOutputBackward(f32),
    /// `y = value`.
    Fill(f32),
    /// `y *= alpha`.
    Scale(f32),
    /// `y += alpha * x0`.
    Axpy(f32),
}

impl DenseOp {
    fn index(self) -> u32 {
        match self {
            DenseOp::AddBias => 0,
            DenseOp::BiasBackward => 1,
            DenseOp::ActivationForward(..) => 2,
            DenseOp::ActivationBackward(..) => 3,
            DenseOp::LossBackward(..) => 4,
            DenseOp::FusedOutputBackward(_) => 5,
            DenseOp::Fill(_) => 6,
            DenseOp::Scale(_) => 7,
            DenseOp::Axpy(_) => 8,
        }
    }
    /// (code, alpha, inv).
    fn codes(self) -> (u32, f32, f32) {
        match self {
            DenseOp::ActivationForward(c, a) | DenseOp::ActivationBackward(c, a) => (c, a, 0.0),
            DenseOp::LossBackward(c, inv) => (c, 0.0, inv),
            DenseOp::FusedOutputBackward(inv) => (0, 0.0, inv),
            DenseOp::Fill(a) | DenseOp::Scale(a) | DenseOp::Axpy(a) => (0, a, 0.0),
            DenseOp::AddBias | DenseOp::BiasBackward => (0, 0.0, 0.0),
        }
    }
}
