//! The matmul family on this backend.

use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::ElementwiseOps;
use rusting_brain_core::backend::MatmulOps;
use rusting_brain_core::backend::MatmulSpec;
use rusting_brain_core::backend::Memory;
use rusting_brain_core::backend::OperandPrecision;
use rusting_brain_core::Result;

impl MatmulOps for WgpuBackend {
    fn matmul(&self, c: &mut GpuBuffer, a: &GpuBuffer, b: &GpuBuffer, spec: &MatmulSpec) -> Result<()> {
        spec.check("matmul", a.len(), b.len(), c.len())?;
        let at = spec.window.map_or((0, 0, 0), |w| (w.a, w.b, w.c));
        if spec.k == 0 {
            // No products: C = beta * C, as the reference.
            let n = spec.batch * spec.m * spec.n;
            if at.2 == 0 && n == c.len() {
                return if spec.beta == 0.0 { self.fill(c, 0.0) } else { self.scale(c, spec.beta) };
            }
        }
        self.record(|g, _| {
            g.matmul(
                c,
                a,
                b,
                (spec.m, spec.n, spec.k, spec.batch),
                (spec.trans_a, spec.trans_b),
                (spec.alpha, spec.beta),
                at,
                spec.precision == OperandPrecision::Bf16,
            )
        })
    }
}
