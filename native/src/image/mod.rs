//! Text to image: `ImagePipeline` and the parts it loads from a diffusers folder (the
//! denoisers, the autoencoder, the prompt encoders and tokenizers, the schedulers).

pub mod dit;
pub mod encoders;
pub(crate) mod folder;
pub mod pipeline;
pub mod scheduler;
pub(crate) mod tokenize;
pub mod unet;
pub mod vae;
