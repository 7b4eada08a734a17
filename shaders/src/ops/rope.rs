//! Rotary position embeddings (`rope.wgsl`); twin of `rusting_brain_core::ops::rope`.

use super::*;
use crate::backend::WgpuBackend;
use crate::GpuBuffer;
use rusting_brain_core::backend::RopeOps;
use rusting_brain_core::backend::RopeSpec;
use rusting_brain_core::Result;
use rusting_brain_core::RopeScaling;

const ROPE: Kernel = kernel!(
    "rope",
    { rows: u32, seq: u32, heads: u32, head_dim: u32, pos_offset: u32, sign: f32, pad0: u32, pad1: u32 },
    [read table: f32, read_write x: f32]
);

/// The kernels this family dispatches (gathered in `ops::KERNELS`).
pub(super) const KERNELS: &[Kernel] = &[ROPE];

impl Batch<'_> {
    /// Rotates `x` (batch, seq, heads, head_dim) in place; `table` holds cos/sin per
    /// position (see [`rope_table`]) up to at least `pos_offset + seq`. `inverse` rotates
    /// back (the backward pass).
    pub fn rope(
        &mut self, x: &GpuBuffer, table: &GpuBuffer, spec: &RopeSpec, inverse: bool,
    ) -> Result<(), ShaderError> {
        const OP: &str = "rope";
        let rows = spec.batch * spec.seq;
        spec.check(OP, rows * spec.heads * spec.head_dim)?;
        need(OP, "x", x, rows * spec.heads * spec.head_dim)?;
        need(OP, "table", table, (spec.pos_offset + spec.seq) * spec.head_dim)?;
        let pairs = rows * spec.heads * (spec.head_dim / 2);
        if pairs == 0 {
            return Ok(());
        }
        let sign: f32 = if inverse { -1.0 } else { 1.0 };
        let p = [
            u(rows, "rows")?,
            u(spec.seq, "seq")?,
            u(spec.heads, "heads")?,
            u(spec.head_dim, "head_dim")?,
            u(spec.pos_offset, "pos_offset")?,
            sign.to_bits(),
        ];
        self.dispatch(&ROPE, &p, &[table, x], grid(pairs.div_ceil(WG)))?;
        Ok(())
    }
}

/// cos/sin per position for [`Batch::rope`]: `positions` rows of `(cos[half], sin[half])`,
/// the f32 angles formed exactly as the CPU forms them.
pub fn rope_table(positions: usize, head_dim: usize, theta: f32, scaling: RopeScaling) -> Vec<f32> {
    let half = head_dim / 2;
    let freqs: Vec<f32> = (0..half).map(|i| scaling.inv_freq(i, head_dim, theta)).collect();
    let mut t = vec![0.0f32; positions * head_dim];
    for (pos, row) in t.chunks_exact_mut(head_dim.max(1)).enumerate() {
        for i in 0..half {
            let angle = pos as f32 * freqs[i];
            row[i] = libm_cos(angle);
            row[half + i] = libm_sin(angle);
        }
    }
    t
}

fn libm_cos(x: f32) -> f32 {
    use rusting_brain_core::Real;
    Real::cos(x)
}

fn libm_sin(x: f32) -> f32 {
    use rusting_brain_core::Real;
    Real::sin(x)
}

impl RopeOps for WgpuBackend {
    fn rope_forward(&self, x: &mut GpuBuffer, spec: &RopeSpec) -> Result<()> {
        self.rope(x, spec, false)
    }
    fn rope_backward(&self, dx: &mut GpuBuffer, spec: &RopeSpec) -> Result<()> {
        self.rope(dx, spec, true)
    }
}
