//! The modulation family on this backend.

use crate::backend::cpu::CpuBackend;
use rayon::prelude::*;
use rusting_brain_core::backend::ColumnCopy;
use rusting_brain_core::backend::ModulationOps;
use rusting_brain_core::backend::ModulationSpec;
use rusting_brain_core::backend::RopePairsSpec;
use rusting_brain_core::ops::modulation;
use rusting_brain_core::Result;

/// Values a column copy moves before it splits over the threads.
const PARALLEL_VALUES: usize = 1 << 16;

impl ModulationOps for CpuBackend {
    // Memory-bound glue of the diffusion transformers: the reference loops run on the
    // buffers in place (no copies), which is all a CPU can do with them, except the column
    // copies, whose rows split over the threads.
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
        spec.check(dst.len(), src.len())?;
        if spec.rows * spec.width < PARALLEL_VALUES || spec.dst_cols == 0 || spec.src_cols == 0 {
            return modulation::copy_cols(dst, src, spec);
        }
        // The rows over the threads: a UNet's GEGLU halves are two copies of 10 M values
        // each at 512 x 512, which one thread copied at half the memory's rate.
        let (w, rows) = (spec.width, (PARALLEL_VALUES / spec.width).max(1));
        dst.par_chunks_mut(spec.dst_cols).zip(src.par_chunks(spec.src_cols)).with_min_len(rows).for_each(
            |(d, s)| d[spec.dst_at..spec.dst_at + w].copy_from_slice(&s[spec.src_at..spec.src_at + w]),
        );
        Ok(())
    }
    fn rope_pairs(
        &self, x: &mut Vec<f32>, cos: &Vec<f32>, sin: &Vec<f32>, spec: &RopePairsSpec,
    ) -> Result<()> {
        modulation::rope_pairs(x, cos, sin, spec)
    }
}
