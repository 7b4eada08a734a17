//! `rusting_brain_shaders`: the WGSL compute shaders of rusting_brain and their runner.
//!
//! Each shader is a `.wgsl` file in this crate's `src/`, named after the op it implements
//! (`rmsnorm.wgsl` beside `rusting_brain_core::ops::rmsnorm`), embedded with `include_str!`
//! so the crate publishes on its own. One runner, over wgpu, serves the native build
//! (Metal, Vulkan, DX12) and the browser (WebGPU): pipelines and bind groups are created
//! once, int8 weights travel packed in `u32` with their scales in a buffer of their own.
//! Every shader has its reference twin in `rusting_brain_core::ops` and a test comparing
//! them (in CI on Mesa's lavapipe).
//!
//! The shaders and the runner arrive with the wgpu backend; this crate fixes their home.
#![no_std]
