//! `rusting_brain_kernels`: the CUDA C kernels of rusting_brain.
//!
//! Each kernel is a `.cu` file in this crate's `src/`, named after the op it implements
//! (`rmsnorm.cu` beside `rusting_brain_core::ops::rmsnorm`), embedded with `include_str!`
//! so the crate publishes on its own, compiled by NVRTC at first use and launched through
//! cudarc (loaded dynamically, so nothing here needs a CUDA toolkit to build). Every kernel
//! has its reference twin in `rusting_brain_core::ops` and a test comparing the two on
//! awkward shapes; CI compiles every kernel with NVRTC even without a GPU.
//!
//! The kernels and their runner arrive with the CUDA backend; this crate fixes their home.
#![no_std]
