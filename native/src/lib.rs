//! `rusting_brain`: deep learning in Rust, natively. This is the crate users add.
//!
//! It wraps the model definitions and reference math of [`rusting_brain_core`] with
//! backends chosen at run time: the multi-threaded SIMD [`cpu::CpuBackend`], wgpu (feature
//! `gpu`: Vulkan, Metal, DX12) and CUDA (feature `cuda`, or `cuda-13`). The user-facing
//! types ([`Network`], [`TransformerLm`], [`Dataset`], [`TokenBatch`], [`ImagePipeline`],
//! ...) live here, along with files, threads, loaders and the Hugging Face, PEFT and ONNX
//! formats (feature `onnx` reads ONNX; writing needs none). Feature `images` adds image
//! folders to [`Dataset`] and the text-to-image example.
//!
//! Everything that can fail returns [`NetworkError`]; nothing panics on user input. The
//! tutorials (`tutorials/` in the repository) teach the crate chapter by chapter.
//!
//! A dense network learning XOR:
//!
//! ```
//! use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};
//!
//! let data = Dataset::new(
//!     vec![vec![0.0, 0.0], vec![0.0, 1.0], vec![1.0, 0.0], vec![1.0, 1.0]],
//!     vec![vec![0.0], vec![1.0], vec![1.0], vec![0.0]],
//! )?;
//! let mut model = Network::builder()
//!     .input_size(2)
//!     .dense(8, Activation::Tanh)
//!     .dense(1, Activation::Sigmoid)
//!     .loss(Loss::BinaryCrossEntropy)
//!     .optimizer(Optimizer::adam(0.05))
//!     .seed(42)
//!     .try_build()?;
//! let config = TrainConfig { epochs: 1_000, batch_size: 4, shuffle: true, seed: Some(42) };
//! model.fit(&data, config)?;
//! assert_eq!(model.accuracy(&data)?, 1.0);
//! // An input of the wrong width is an error:
//! assert!(model.predict(&[1.0]).is_err());
//! # Ok::<(), rusting_brain::NetworkError>(())
//! ```
//!
//! A primitive on the CPU backend:
//!
//! ```
//! use rusting_brain::core::backend::*; // the Backend trait, its op families and their specs
//! use rusting_brain::cpu::CpuBackend;
//!
//! let cpu = CpuBackend::new();
//! let a = cpu.upload(&[1.0, 2.0, 3.0, 4.0])?; // (2, 2)
//! let w = cpu.upload(&[1.0, 0.0, 0.0, 1.0])?; // (2, 2), stored (out, in)
//! let mut y = cpu.zeros(4)?;
//! cpu.matmul(&mut y, &a, &w, &MatmulSpec::new(2, 2, 2).trans_b(true))?;
//! assert_eq!(cpu.download(&y)?, vec![1.0, 2.0, 3.0, 4.0]);
//!
//! // Bad input is an error, not a panic:
//! let err = cpu.matmul(&mut y, &a, &cpu.zeros(3)?, &MatmulSpec::new(2, 2, 2)).unwrap_err();
//! assert_eq!(err.to_string(), "matmul: `b` has 3 elements but the shape needs 4");
//! # Ok::<(), rusting_brain::CoreError>(())
//! ```

// Kernels index several slices with one loop variable, as the formulas do.
#![allow(clippy::needless_range_loop)]
#![warn(missing_docs)]
// docs.rs (nightly) labels each feature-gated item with its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]

// By domain: the backends, file I/O, language models, dense networks, images.
mod backend;
mod dense;
mod error;
mod image;
mod io;
mod lm;

pub use backend::cpu;
/// llama.cpp's GGUF files: what they carry beside the weights, which
/// [`TransformerLm::from_gguf`] reads.
pub mod gguf {
    pub use crate::io::gguf::{held_precision, tokenizer_json, GgufType};
}
#[cfg(feature = "cuda-backend")]
pub use backend::cuda;
#[cfg(feature = "gpu")]
pub use backend::gpu;
pub use backend::profile;
#[cfg(feature = "onnx")]
pub use dense::onnx::{OnnxDim, OnnxIo, OnnxModel, OnnxOutput};
pub use image::pipeline as image_pipeline;
pub use image::{dit, encoders, scheduler, unet, vae};

pub use dense::dataset::{Dataset, Statistics, SPLIT_SEED};
pub use dense::network::{Network, NetworkBuilder, TrainConfig};
pub use dit::Dit;
pub use encoders::{ClipTextEncoder, T5Encoder, TextEncoder};
pub use error::NetworkError;
pub use image::folder::{Component, PipelineFolder};
pub use image::tokenize::{klein_prompt, ClipTokenizer, PromptTokenizer};
pub use image_pipeline::{
    component_sizes, ComponentSize, Conditioning, ImagePipeline, Latent, Noise, PipelineConfig, Solver,
};
pub use io::precision::Precision;
pub use lm::chat::{ChatMessage, ChatTemplate, GenerationConfig};
pub use lm::token_file::TokenFile;
pub use lm::transformer::{
    Decoder, KvCaches, ParameterCounts, StepLoss, TransformerLm, TransformerLmBuilder,
};
pub use rusting_brain_core as core;
pub use rusting_brain_core::models::transformer::{LoraConfig, TokenBatch, TransformerConfig, LORA_TARGETS};
pub use rusting_brain_core::{Activation, Backend, CoreError, Loss, Optimizer, ReferenceBackend};
pub use rusting_brain_core::{RopeScaling, Sampler, Schedule};
/// Which GPU adapter `to_gpu_with` asks for (feature `gpu`).
#[cfg(feature = "gpu")]
pub use rusting_brain_shaders::{GpuCounters, GpuOptions};
pub use unet::Unet;

/// Result type of this crate.
pub type Result<T, E = NetworkError> = std::result::Result<T, E>;
