//! What the shader tests share: the software adapter's backend.

use std::sync::Arc;

use rusting_brain_shaders::{Gpu, GpuOptions, ShaderError, WgpuBackend};

/// A backend on the software adapter (lavapipe in CI), or None (skip) where there is none
/// and RB_REQUIRE_GPU is not 1.
pub fn gpu() -> Option<WgpuBackend> {
    let g = Gpu::new_blocking(&GpuOptions { software: true, ..Default::default() });
    let g = rusting_brain_test_support::gpu_or_skip("the GPU did not open", g, |e| {
        matches!(e, ShaderError::NoAdapter(_))
    })?;
    Some(WgpuBackend::new(Arc::new(g)))
}
