//! The image models, inference only: the denoisers (the diffusion transformers of FLUX.1,
//! FLUX.2 and SD3 in [`dit`], the Stable Diffusion UNets in [`unet`]), the autoencoder
//! ([`vae`]) and the prompt encoders ([`clip`], [`t5`]; the LLaMA-family encoder is the
//! language model's). Each holds its weights in typed layers built once at load from
//! [`blocks`], which also holds what they share (linear, convolution, norms, the ResNet
//! block, attention over pixels, the timestep MLP).

pub mod blocks;
pub mod clip;
pub mod dit;
pub mod t5;
pub mod unet;
pub mod vae;
