//! `rusting_brain_core`: everything a browser, a CPU and a GPU must agree on, written once.
//!
//! This crate is `#![no_std]` + `alloc` so that the same definitions run natively and in
//! WebAssembly. It holds:
//!
//! - [`ops`]: the reference math, forward and backward, on plain slices, single-threaded and
//!   written for clarity. Every function is generic over [`Real`] so tests can run it in `f64`
//!   against central finite differences; backends run it in `f32`.
//! - [`Backend`]: the trait naming the primitives a model is built from, over an associated
//!   buffer type, and [`ReferenceBackend`], which implements it with [`ops`]. Every other
//!   backend (the rayon CPU one, CUDA, wgpu) is tested against it.
//! - [`CoreError`]: the one error type of this crate.
//!
//! - [`models`]: the model definitions (dense networks, the transformer language model and
//!   its mixture-of-experts layers, the image models' denoisers, autoencoder and text
//!   encoders), written once over [`Backend`], so the native CPU, CUDA and wgpu backends and
//!   the browser's run the same code; [`sampler`], [`schedule`], [`optimizer`] and the
//!   checkpoint layout (feature `checkpoint`) beside them.
//!
//! A product on the reference backend, and the token a greedy sampler picks from it:
//!
//! ```
//! use rusting_brain_core::backend::*; // the Backend trait, its op families and their specs
//! use rusting_brain_core::{ReferenceBackend, Sampler};
//!
//! let be = ReferenceBackend;
//! let x = be.upload(&[1.0, 2.0])?; // one row of 2 features
//! let w = be.upload(&[0.5, -1.0, 2.0, 0.0, 1.0, 1.0])?; // (3, 2), stored (out, in)
//! let mut logits = be.zeros(3)?;
//! be.matmul(&mut logits, &x, &w, &MatmulSpec::new(1, 3, 2).trans_b(true))?;
//! let logits = be.download(&logits)?;
//! assert_eq!(logits, vec![-1.5, 2.0, 3.0]);
//! assert_eq!(Sampler::greedy().sample(&logits, &[])?, 2);
//!
//! // A shape that does not fit is an error that says so, never a panic:
//! assert!(be.matmul(&mut be.zeros(2)?, &x, &w, &MatmulSpec::new(1, 3, 2)).is_err());
//! # Ok::<(), rusting_brain_core::CoreError>(())
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
// docs.rs (nightly) labels each feature-gated item with its feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
// The reference math indexes several arrays with one loop variable, as the formulas do;
// rewriting those loops as zipped iterators would make them harder to check by eye.
#![allow(clippy::needless_range_loop)]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod backend;
#[cfg(feature = "checkpoint")]
pub mod checkpoint;
pub mod diffusion;
/// The errors every primitive and backend reports, and the shape checks they share.
pub mod error;
pub mod models;
pub mod ops;
pub mod optimizer;
pub mod real;
pub mod reference;
pub mod rng;
pub mod sampler;
pub mod schedule;

pub use backend::{
    global_l2_norm, AdamParams, AttentionSpec, Backend, CrossEntropySum, MatmulSpec, OperandPrecision,
    RopeSpec, RoutedSpec, SgdParams,
};
pub use error::CoreError;
pub use ops::activation::Activation;
pub use ops::loss::Loss;
pub use ops::rope::RopeScaling;
pub use optimizer::{Optimizer, OptimizerKind};
pub use real::Real;
pub use reference::ReferenceBackend;
pub use rng::Rng;
pub use sampler::Sampler;
pub use schedule::Schedule;

/// Result type of this crate.
pub type Result<T, E = CoreError> = core::result::Result<T, E>;
