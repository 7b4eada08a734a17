//! Model definitions: configuration, parameter layout, and forward/backward/update written
//! once over the [`Backend`](crate::Backend) trait, so every backend runs the same model.

pub mod dense;
#[cfg(feature = "checkpoint")]
pub mod dense_file;
pub mod image;
pub mod transformer;

pub use image::{clip, dit, t5, unet, vae};
