//! Model definitions: configuration, parameter layout, and forward/backward/update written
//! once over the [`Backend`](crate::Backend) trait, so every backend runs the same model.

pub mod clip;
pub mod dense;
#[cfg(feature = "checkpoint")]
pub mod dense_file;
pub mod dit;
pub mod layers;
pub mod t5;
pub mod transformer;
pub mod unet;
pub mod vae;
