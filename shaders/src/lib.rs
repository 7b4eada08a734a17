//! `rusting_brain_shaders`: the WGSL compute shaders of rusting_brain and their runner.
//!
//! Each shader is a `.wgsl` file under `src/wgsl/`, named after the op it implements
//! (`rmsnorm.wgsl` beside `rusting_brain_core::ops::rmsnorm`), embedded with
//! `include_str!` so the crate publishes on its own; what several kernels share (the
//! workgroup reductions, attention's shape and bindings) is one file under `src/wgsl/prelude/`
//! joined in front of them at build (`concat!`). One runner, over wgpu, serves the
//! native build (Metal, Vulkan, DX12) and the browser (WebGPU): kernels compile once when
//! the [`Gpu`] opens, int8 weights travel packed four to a `u32` with their scales in a
//! buffer of their own, reads back never block the thread. Every shader has its reference
//! twin in `rusting_brain_core::ops` and a test comparing them (`tests/kernels.rs`, in CI
//! on Mesa's lavapipe).
//!
//! Portability: only WebGPU's core features (f32, `dot4I8Packed`, workgroup-memory
//! reductions), at most 8 storage buffers per stage and 64 invocations per workgroup, so
//! the same WGSL runs on SwiftShader in a browser and on lavapipe.
//!
//! Opening the default adapter, where the machine has one:
//!
//! ```
//! use rusting_brain_shaders::{Gpu, GpuOptions};
//!
//! match Gpu::new_blocking(&GpuOptions::default()) {
//!     Ok(gpu) => {
//!         println!("{}", gpu.adapter_info().name);
//!         let x = gpu.upload("x", &[1.0, 2.0, 3.0])?;
//!         assert_eq!(gpu.read_blocking(&x)?, vec![1.0, 2.0, 3.0]);
//!     }
//!     // No adapter (a server without a GPU or Mesa's lavapipe): an error saying so.
//!     Err(e) => println!("no GPU here: {e}"),
//! }
//! # Ok::<(), rusting_brain_shaders::ShaderError>(())
//! ```

#![warn(missing_docs)]

mod backend;
mod gpu;
mod ops;
pub mod sampler;

pub use backend::WgpuBackend;
#[cfg(not(target_arch = "wasm32"))]
pub use gpu::block_on;
pub use gpu::{Gpu, GpuBuffer, GpuCounters, GpuOptions};
pub use ops::{
    activation_words, check_ids, context_ids, rope_table, AttentionScratch, Batch, DenseOp, DispatchCache,
    KeyedCache, NAN_ROW, NO_ID, SUM_OF_SQUARES_CHUNK, TILED_ROWS,
};
pub use sampler::DeviceSampler;
pub use wgpu;

/// What can go wrong on the GPU; every message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ShaderError {
    /// No adapter (or none of the kind asked for) on this machine or in this browser.
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),
    /// The adapter would not give a device with the features and limits asked for.
    #[error("the adapter refused a device: {0}")]
    Device(String),
    /// A buffer larger than the adapter binds at once.
    #[error("{what} needs {bytes} bytes in one binding, over this adapter's limit of {limit} (max_storage_buffer_binding_size / max_buffer_size): use a smaller model or the CPU backend")]
    TooLarge {
        /// The buffer's role.
        what: String,
        /// Its size.
        bytes: u64,
        /// The adapter's limit.
        limit: u64,
    },
    /// wgpu's validation or the device reported an error.
    #[error("GPU validation or device error: {0}")]
    Validation(String),
    /// Mapping a buffer for reading failed.
    #[error("reading a GPU buffer back failed: {0}")]
    Readback(String),
    /// A bad argument; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// An error from core's checks.
    #[error(transparent)]
    Core(#[from] rusting_brain_core::CoreError),
}

/// Every kernel's name, WGSL source, and whether it needs the adapter's subgroups.
pub fn sources() -> impl Iterator<Item = (&'static str, String, bool)> {
    ops::kernels().map(|k| (k.name, k.source(), k.needs_subgroups))
}
