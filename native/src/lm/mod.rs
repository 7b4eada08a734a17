//! Language models: `TransformerLm` (training, decoding, int8, MoE, LoRA) over core's model,
//! its checkpoints, chat templates, LoRA adapters, token files, and the model on a device.

pub(crate) mod chat;
pub(crate) mod checkpoint;
#[cfg(feature = "cuda-backend")]
pub(crate) mod cuda;
#[cfg(any(feature = "gpu", feature = "cuda-backend"))]
pub(crate) mod device;
pub(crate) mod lora;
pub(crate) mod token_file;
pub(crate) mod transformer;
