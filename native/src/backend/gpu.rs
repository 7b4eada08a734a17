//! The `gpu` feature: wgpu (Metal, Vulkan, DX12). `WgpuBackend` runs core's models (an f32
//! `TransformerLm` trains on it after `to_gpu`, an int8 one decodes there, a `Network`
//! trains after its `to_gpu`); the draw on the device is `rusting_brain_shaders::sampler`
//! (shared with the browser build, where its reads are awaited by the page); natively
//! `TransformerLm` awaits them on its own thread.

pub use rusting_brain_shaders::{Gpu, GpuCounters, GpuOptions, WgpuBackend};

use rusting_brain_shaders::ShaderError;

use crate::NetworkError;

impl From<ShaderError> for NetworkError {
    fn from(e: ShaderError) -> Self {
        match e {
            ShaderError::Core(c) => NetworkError::Core(c),
            ShaderError::Invalid(m) => NetworkError::InvalidInput(m),
            other => NetworkError::Gpu(other.to_string()),
        }
    }
}

/// A backend on the adapter `options` pick: what `to_gpu_with` moves a model onto.
pub(crate) fn open(options: &GpuOptions) -> Result<WgpuBackend, NetworkError> {
    Ok(WgpuBackend::new(std::sync::Arc::new(Gpu::new_blocking(options)?)))
}
