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
    check_ids, context_ids, rope_table, AttentionScratch, Batch, DenseOp, DispatchCache, KeyedCache, NAN_ROW,
    NO_ID, SUM_OF_SQUARES_CHUNK, TILED_ROWS,
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

/// The kernels, in the order their pipelines are built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    RmsNorm,
    QuantizeActivations,
    Q8Matmul,
    Swiglu,
    Rope,
    Attention,
    Q8Embedding,
    Argmax,
    Matmul,
    Dense,
    Optim,
    MoeRoute,
    Q8Expert,
    MoeCombine,
    Penalize,
    TopK,
    Q8MatmulTiled,
    RmsNormSg,
    QuantizeActivationsSg,
    RmsNormBackward,
    SwigluBackward,
    AttentionBackwardQ,
    AttentionBackwardKv,
    Embedding,
    EmbeddingBackward,
    CrossEntropy,
    MoeCombineBackward,
    SumOfSquares,
    MatmulTiled,
    Lora,
}

impl Kernel {
    pub(crate) const ALL: [Kernel; 30] = [
        Kernel::RmsNorm,
        Kernel::QuantizeActivations,
        Kernel::Q8Matmul,
        Kernel::Swiglu,
        Kernel::Rope,
        Kernel::Attention,
        Kernel::Q8Embedding,
        Kernel::Argmax,
        Kernel::Matmul,
        Kernel::Dense,
        Kernel::Optim,
        Kernel::MoeRoute,
        Kernel::Q8Expert,
        Kernel::MoeCombine,
        Kernel::Penalize,
        Kernel::TopK,
        Kernel::Q8MatmulTiled,
        Kernel::RmsNormSg,
        Kernel::QuantizeActivationsSg,
        Kernel::RmsNormBackward,
        Kernel::SwigluBackward,
        Kernel::AttentionBackwardQ,
        Kernel::AttentionBackwardKv,
        Kernel::Embedding,
        Kernel::EmbeddingBackward,
        Kernel::CrossEntropy,
        Kernel::MoeCombineBackward,
        Kernel::SumOfSquares,
        Kernel::MatmulTiled,
        Kernel::Lora,
    ];

    /// Whether the kernel uses subgroup operations (built only on adapters that have them;
    /// each has a workgroup-reduction twin used everywhere else).
    pub(crate) fn needs_subgroups(self) -> bool {
        matches!(self, Kernel::RmsNormSg | Kernel::QuantizeActivationsSg)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kernel::RmsNorm => "rmsnorm",
            Kernel::QuantizeActivations => "quantize_activations",
            Kernel::Q8Matmul => "q8_matmul",
            Kernel::Swiglu => "swiglu",
            Kernel::Rope => "rope",
            Kernel::Attention => "attention",
            Kernel::Q8Embedding => "q8_embedding",
            Kernel::Argmax => "argmax",
            Kernel::Matmul => "matmul",
            Kernel::Dense => "dense",
            Kernel::Optim => "optim",
            Kernel::MoeRoute => "moe_route",
            Kernel::Q8Expert => "q8_expert",
            Kernel::MoeCombine => "moe_combine",
            Kernel::Penalize => "penalize",
            Kernel::TopK => "topk",
            Kernel::Q8MatmulTiled => "q8_matmul_tiled",
            Kernel::RmsNormSg => "rmsnorm_sg",
            Kernel::QuantizeActivationsSg => "quantize_activations_sg",
            Kernel::RmsNormBackward => "rmsnorm_backward",
            Kernel::SwigluBackward => "swiglu_backward",
            Kernel::AttentionBackwardQ => "attention_backward_q",
            Kernel::AttentionBackwardKv => "attention_backward_kv",
            Kernel::Embedding => "embedding",
            Kernel::EmbeddingBackward => "embedding_backward",
            Kernel::CrossEntropy => "cross_entropy",
            Kernel::MoeCombineBackward => "moe_combine_backward",
            Kernel::SumOfSquares => "sum_of_squares",
            Kernel::MatmulTiled => "matmul_tiled",
            Kernel::Lora => "lora",
        }
    }

    pub(crate) fn source(self) -> &'static str {
        match self {
            Kernel::RmsNorm => include_str!("wgsl/rmsnorm.wgsl"),
            Kernel::QuantizeActivations => include_str!("wgsl/quantize_activations.wgsl"),
            Kernel::Q8Matmul => include_str!("wgsl/q8_matmul.wgsl"),
            Kernel::Swiglu => include_str!("wgsl/swiglu.wgsl"),
            Kernel::Rope => include_str!("wgsl/rope.wgsl"),
            Kernel::Attention => concat!(
                include_str!("wgsl/prelude/attention.wgsl"),
                include_str!("wgsl/prelude/reduce.wgsl"),
                include_str!("wgsl/attention.wgsl")
            ),
            Kernel::Q8Embedding => include_str!("wgsl/q8_embedding.wgsl"),
            Kernel::Argmax => include_str!("wgsl/argmax.wgsl"),
            Kernel::Matmul => include_str!("wgsl/matmul.wgsl"),
            Kernel::Dense => include_str!("wgsl/dense.wgsl"),
            Kernel::Optim => include_str!("wgsl/optim.wgsl"),
            Kernel::MoeRoute => include_str!("wgsl/moe_route.wgsl"),
            Kernel::Q8Expert => include_str!("wgsl/q8_expert.wgsl"),
            Kernel::MoeCombine => include_str!("wgsl/moe_combine.wgsl"),
            Kernel::Penalize => include_str!("wgsl/penalize.wgsl"),
            Kernel::TopK => include_str!("wgsl/topk.wgsl"),
            Kernel::Q8MatmulTiled => include_str!("wgsl/q8_matmul_tiled.wgsl"),
            Kernel::RmsNormSg => include_str!("wgsl/rmsnorm_sg.wgsl"),
            Kernel::QuantizeActivationsSg => include_str!("wgsl/quantize_activations_sg.wgsl"),
            Kernel::RmsNormBackward => include_str!("wgsl/rmsnorm_backward.wgsl"),
            Kernel::SwigluBackward => include_str!("wgsl/swiglu_backward.wgsl"),
            Kernel::AttentionBackwardQ => concat!(
                include_str!("wgsl/prelude/attention.wgsl"),
                include_str!("wgsl/attention_backward_q.wgsl")
            ),
            Kernel::AttentionBackwardKv => concat!(
                include_str!("wgsl/prelude/attention.wgsl"),
                include_str!("wgsl/attention_backward_kv.wgsl")
            ),
            Kernel::Embedding => include_str!("wgsl/embedding.wgsl"),
            Kernel::EmbeddingBackward => include_str!("wgsl/embedding_backward.wgsl"),
            Kernel::CrossEntropy => {
                concat!(include_str!("wgsl/prelude/reduce.wgsl"), include_str!("wgsl/cross_entropy.wgsl"))
            }
            Kernel::MoeCombineBackward => include_str!("wgsl/moe_combine_backward.wgsl"),
            Kernel::SumOfSquares => include_str!("wgsl/sum_of_squares.wgsl"),
            Kernel::MatmulTiled => include_str!("wgsl/matmul_tiled.wgsl"),
            Kernel::Lora => include_str!("wgsl/lora.wgsl"),
        }
    }

    /// Every kernel's name, WGSL source and whether it needs subgroups (for validation
    /// with naga, or inspection).
    pub fn sources() -> impl Iterator<Item = (&'static str, &'static str, bool)> {
        Kernel::ALL.iter().map(|k| (k.name(), k.source(), k.needs_subgroups()))
    }
}

/// Every kernel's name, WGSL source, and whether it needs the adapter's subgroups.
pub fn sources() -> impl Iterator<Item = (&'static str, &'static str, bool)> {
    Kernel::sources()
}
