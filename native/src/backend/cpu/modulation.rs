//! The modulation family on this backend.

use crate::backend::cpu::CpuBackend;
use rusting_brain_core::backend::ColumnCopy;
use rusting_brain_core::backend::ModulationOps;
use rusting_brain_core::backend::ModulationSpec;
use rusting_brain_core::backend::RopePairsSpec;
use rusting_brain_core::ops::modulation;
use rusting_brain_core::Result;

impl ModulationOps for CpuBackend {
    // Memory-bound glue of the diffusion transformers: the reference loops run on the
    // buffers in place (no copies), which is all a CPU can do with them.
    fn modulate(
        &self, out: &mut Vec<f32>, x: &Vec<f32>, mods: &Vec<f32>, shift_at: usize, scale_at: usize,
        spec: &ModulationSpec,
    ) -> Result<()> {
        modulation::modulate(out, x, mods, shift_at, scale_at, spec)
    }
    fn gate_add(
        &self, x: &mut Vec<f32>, y: &Vec<f32>, mods: &Vec<f32>, gate_at: usize, spec: &ModulationSpec,
    ) -> Result<()> {
        modulation::gate_add(x, y, mods, gate_at, spec)
    }
    fn copy_cols(&self, dst: &mut Vec<f32>, src: &Vec<f32>, spec: &ColumnCopy) -> Result<()> {
        modulation::copy_cols(dst, src, spec)
    }
    fn rope_pairs(
        &self, x: &mut Vec<f32>, cos: &Vec<f32>, sin: &Vec<f32>, spec: &RopePairsSpec,
    ) -> Result<()> {
        modulation::rope_pairs(x, cos, sin, spec)
    }
}
