//! GEMMs on CUDA through cuBLASLt (see `gemm`), with the BF16 operand rounding of mixed
//! precision (`to_bf16` in `kernels/cu/elementwise.cu`); twin of `rusting_brain_core::ops::matmul`.

use super::*;
use crate::backend::cuda::CudaBackend;
use crate::backend::cuda::CudaBuffer;
use rusting_brain_core::backend::MatmulOps;
use rusting_brain_core::backend::MatmulSpec;
use rusting_brain_core::Result;

impl CudaBackend {
    /// Rounds `len` f32 of `src` from `offset` to bf16 into `dst`.
    pub(super) fn to_bf16(
        &self, dst: &mut CudaSlice<u16>, src: &CudaBuffer, offset: usize, len: usize,
    ) -> Result<()> {
        let view = src.data.slice(offset..offset + len);
        launch!(self, "to_bf16", grid(len); dst, &view, &(len as i64))
    }

    pub(super) fn gemm(
        &self, c: &mut CudaBuffer, a: &CudaBuffer, b: &CudaBuffer, spec: &MatmulSpec,
    ) -> Result<()> {
        let (la, lb, lc) = spec.check("matmul", a.len, b.len, c.len)?;
        let (wa, wb, wc) = spec.window.map_or((0, 0, 0), |w| (w.a, w.b, w.c));
        let (m, n, k, batch) = (spec.m, spec.n, spec.k, spec.batch);
        if m == 0 || n == 0 || batch == 0 {
            return Ok(());
        }
        if k == 0 {
            // C = beta C: no product to run.
            let mut view = c.data.slice_mut(wc..wc + lc * batch);
            let total = lc * batch;
            return if spec.beta == 0.0 {
                launch!(self, "fill", grid(total); &mut view, &0.0f32, &(total as i64))
            } else {
                launch!(self, "scale", grid(total); &mut view, &spec.beta, &(total as i64))
            };
        }
        let bf16 = spec.precision == OperandPrecision::Bf16;
        // cuBLASLt runs in whatever context is current on this thread; cudarc's own calls
        // bind it, raw ones do not.
        self.dev.ctx.bind_to_thread().map_err(drv("binding the CUDA context"))?;
        let stream = &self.dev.stream;
        let (c_ptr, _gc) = c.data.device_ptr_mut(stream);
        let c_ptr = c_ptr + (wc * 4) as u64;
        let mut a_guard = self.dev.bf16_a.lock().map_err(|_| dev_err("scratch lock poisoned"))?;
        let mut b_guard = self.dev.bf16_b.lock().map_err(|_| dev_err("scratch lock poisoned"))?;
        let (a_ptr, b_ptr) = if bf16 {
            let sa = self.scratch(&mut a_guard, la * batch, "BF16 operand scratch")?;
            self.to_bf16(sa, a, wa, la * batch)?;
            let pa = sa.device_ptr(stream).0;
            let sb = self.scratch(&mut b_guard, lb * batch, "BF16 operand scratch")?;
            self.to_bf16(sb, b, wb, lb * batch)?;
            (pa, sb.device_ptr(stream).0)
        } else {
            let (pa, _) = a.data.device_ptr(stream);
            let (pb, _) = b.data.device_ptr(stream);
            (pa + (wa * 4) as u64, pb + (wb * 4) as u64)
        };
        let key = GemmKey {
            m,
            n,
            k,
            trans_a: spec.trans_a,
            trans_b: spec.trans_b,
            batch,
            bf16,
            tf32: self.tf32(),
            align: [alignment(a_ptr), alignment(b_ptr), alignment(c_ptr)],
        };
        let mut lt = self.dev.lt.lock().map_err(|_| dev_err("cuBLASLt lock poisoned"))?;
        let ws = lt.workspace.device_ptr(stream).0;
        // SAFETY: the pointers address the operands `spec.check` validated (offset by the
        // window), in bf16 scratch of la*batch / lb*batch elements when bf16; all on this
        // backend's device and stream.
        unsafe { lt.run(key, a_ptr, b_ptr, c_ptr, spec.alpha, spec.beta, ws, stream.cu_stream()) }
            .map_err(dev_err)
    }
}

pub(super) fn matmul(
    be: &CudaBackend, c: &mut CudaBuffer, a: &CudaBuffer, b: &CudaBuffer, spec: &MatmulSpec,
) -> Result<()> {
    be.gemm(c, a, b, spec)
}

impl MatmulOps for CudaBackend {
    fn matmul(&self, c: &mut CudaBuffer, a: &CudaBuffer, b: &CudaBuffer, spec: &MatmulSpec) -> Result<()> {
        matmul(self, c, a, b, spec)
    }
}
