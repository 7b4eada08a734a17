//! `rusting_brain`: deep learning in Rust, natively. This is the crate users add.
//!
//! It wraps the model definitions and reference math of [`rusting_brain_core`] with
//! backends chosen at run time: the multi-threaded SIMD [`cpu::CpuBackend`] today, CUDA and
//! wgpu behind features as they land. The user-facing types (`Network`, `TransformerLm`,
//! `Dataset`, `TokenBatch`, ...) live here, along with files, threads and loaders.
//!
//! Everything that can fail returns [`NetworkError`]; nothing panics on user input.

pub mod cpu;
mod error;

pub use error::NetworkError;
pub use rusting_brain_core as core;
pub use rusting_brain_core::{Activation, Backend, CoreError, Loss, ReferenceBackend};

/// Result type of this crate.
pub type Result<T, E = NetworkError> = std::result::Result<T, E>;
