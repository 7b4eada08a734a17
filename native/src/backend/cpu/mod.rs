//! The CPU backend: every primitive of `rusting_brain_core::Backend`, parallel over rayon's
//! pool and vectorized for the instruction set detected at run time (AVX-512, AVX2+FMA,
//! or the baseline / NEON). GEMMs go to the `gemm` crate, GEMVs to our own kernels.
//!
//! Each op lives in the file named after it, beside its reference twin in
//! `rusting_brain_core::ops`; `tests/backend_vs_reference.rs` compares every one of them on
//! awkward shapes with the outputs poisoned first.
//!
//! Reductions are split at fixed sizes (never by thread count) and their partial results
//! added in a fixed order, so a run gives the same bits on 2 cores and on 64.

mod activation;
mod amx;
mod attention;
pub mod bf16;
mod conv;
mod cross_entropy;
mod elementwise;
mod embedding;
pub mod int8_gemm;
mod l2norm;
mod loss;
mod matmul;
mod modulation;
mod moe;
mod norm;
mod optim;
pub(crate) mod q4;
pub(crate) mod q8;
mod rmsnorm;
mod rope;
pub mod sdpa;
mod shared_buf;
pub mod simd;
mod softmax;
mod spatial;
mod swiglu;
pub(crate) mod team;
mod unary;

use rusting_brain_core::backend::*;
use rusting_brain_core::error::check_len;
use rusting_brain_core::Result;

/// Elements per parallel task for element-wise work: large enough that rayon's overhead
/// (~1 us a task) is noise, small enough to spread over many cores.
pub(crate) const ELEMENTS_PER_TASK: usize = 1 << 14;

/// Rows per parallel task for row-wise work with `cols` columns: about
/// `ELEMENTS_PER_TASK` elements, at least one row. Depends on the shape only.
pub(crate) fn rows_per_task(cols: usize) -> usize {
    (ELEMENTS_PER_TASK / cols.max(1)).max(1)
}

/// The multi-threaded, SIMD CPU backend. Buffers are `Vec<f32>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// The CPU backend (stateless: the thread team and the kernels' choice are global).
    pub fn new() -> Self {
        CpuBackend
    }
    /// Threads in rayon's pool (set `RAYON_NUM_THREADS` to change it).
    pub fn threads(&self) -> usize {
        rayon::current_num_threads()
    }
    /// The SIMD instruction set the kernels run with on this CPU (`RB_CPU_ISA` and
    /// `RB_CPU_VNNI=0` lower it), with `+vnni` when the int8 products use VNNI and `+amx`
    /// when the int8 GEMM uses AMX tiles (`RB_CPU_AMX=0` turns them off).
    pub fn isa(&self) -> &'static str {
        match (simd::isa().name(), simd::has_vnni(), simd::has_amx_int8()) {
            ("avx512f", true, true) => "avx512f+vnni+amx",
            ("avx512f", true, false) => "avx512f+vnni",
            (name, _, _) => name,
        }
    }
}

/// Whether a SwiGLU's gating products (`spec`, `x` into `s`, keeping `gate` and `up`; `op`
/// and `name` name the call and `s` in errors) take
/// the fused one-row path: one activation row over all of `x`, beta 0. When they do, the
/// checks the unfused calls would make of the spec and lengths are made here; `false`
/// leaves the checking to those calls.
pub(crate) fn fused_swiglu_row(
    (op, name): (&'static str, &'static str), spec: &MatmulSpec, x: &[f32], s: &mut [f32], gate: &[f32],
    up: &[f32],
) -> Result<bool> {
    if !(spec.one_row_of(x.len()) && spec.beta == 0.0) {
        return Ok(false);
    }
    rusting_brain_core::ops::q8::q8_operands(spec, x, s)?;
    rusting_brain_core::ops::swiglu::check_swiglu_forward(s.len(), gate.len(), up.len())?;
    check_len(op, name, s.len(), spec.n)?;
    Ok(true)
}

rusting_brain_core::host_memory!(CpuBackend, "cpu");

// Families this backend runs through their default methods (on the host, or through
// the backend's other primitives).
impl LoraOps for CpuBackend {}
