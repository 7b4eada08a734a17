//! `rusting_brain_portable`: a single-threaded CPU backend that needs nothing but `alloc`,
//! for WebAssembly (the browser's CPU path when there is no WebGPU) and any target
//! without threads.
//!
//! It runs `rusting_brain_core`'s own definitions of the primitives, in f32 directly on
//! the buffers: the reference backend runs the same functions on f64 copies, which makes
//! it exact but costs a copy and an allocation per call and halves what SIMD holds. The
//! products and attention run this crate's kernels instead (`kernels.rs`), built on two
//! inner loops (`dot.rs`): an f32 dot product on eight lanes that the compiler turns into
//! SIMD128 on wasm32, and an exact int8 dot product written with SIMD128 intrinsics there.
//! Every addition's order is fixed in the source, so a native build computes the same bits
//! as the browser does and the native tests speak for the page; the int8 products are
//! bit-identical to core's on every backend.
//!
//! ```
//! use rusting_brain_core::backend::*; // the Backend trait, its op families and their specs
//! use rusting_brain_portable::PortableBackend;
//!
//! let be = PortableBackend;
//! let a = be.upload(&[1.0, 2.0, 3.0, 4.0])?; // (2, 2)
//! let b = be.upload(&[1.0, 0.0, 0.0, 1.0])?; // identity
//! let mut c = be.zeros(4)?;
//! be.matmul(&mut c, &a, &b, &MatmulSpec::new(2, 2, 2))?;
//! assert_eq!(be.download(&c)?, vec![1.0, 2.0, 3.0, 4.0]);
//! # Ok::<(), rusting_brain_core::CoreError>(())
//! ```

#![cfg_attr(not(test), no_std)]
#![warn(missing_docs)]

extern crate alloc;

mod dot;
mod exp;
mod kernels;
mod ops;
mod rope;

use rusting_brain_core::backend::*;

/// Core's math in f32 on one thread, with SIMD128 kernels for the products and attention
/// on wasm32; buffers are `Vec<f32>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PortableBackend;

rusting_brain_core::host_memory!(PortableBackend, "portable");

// Families this backend runs through their default methods (on the host, or through
// the backend's other primitives).
impl ConvOps for PortableBackend {}
impl NormOps for PortableBackend {}
impl UnaryOps for PortableBackend {}
impl SdpaOps for PortableBackend {}
impl SpatialOps for PortableBackend {}
impl ModulationOps for PortableBackend {}
