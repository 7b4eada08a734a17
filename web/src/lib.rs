//! `rusting_brain_web`: rusting_brain in the browser.
//!
//! This crate becomes the `rusting-brain` npm package: a `cdylib` for
//! `wasm32-unknown-unknown` with a wasm-bindgen API for loading an int8 language model and
//! generating text, through WebGPU compute shaders (from `rusting_brain_shaders`) where the
//! browser has WebGPU and through `rusting_brain_core`'s CPU path where it does not.
//!
//! It runs core's model definitions, never a copy of them: everything numeric a browser
//! and a native build must agree on lives in `rusting_brain_core`, which builds for
//! wasm32 without `std`. Today the crate re-exports that core; the bindings, the npm
//! package and the demo page under `www/` arrive with the browser work.

pub use rusting_brain_core as core;
