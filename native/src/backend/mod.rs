//! The backends a model runs on, each implementing core's op families: the CPU's (rayon
//! and hand-vectorized loops), CUDA's (cuBLASLt and NVRTC kernels), wgpu's (WGSL), and the
//! timing wrapper that runs any of them.

pub mod cpu;
#[cfg(feature = "cuda-backend")]
pub mod cuda;
#[cfg(feature = "gpu")]
pub mod gpu;
pub mod profile;
