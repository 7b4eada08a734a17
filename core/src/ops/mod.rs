//! The reference math: forward and backward of every primitive, on plain row-major slices,
//! single-threaded, written to be read. Backends are tested against these functions.
//!
//! Conventions shared by every function here:
//! - Shapes are in the doc comment as `(rows, cols)` etc., row-major, contiguous.
//! - Every length is checked against the shape arguments; a mismatch is
//!   [`CoreError::ShapeMismatch`](crate::CoreError::ShapeMismatch), never a panic.
//! - Outputs are overwritten, never read, unless a function says it accumulates (parameter
//!   gradients accumulate with `+=`, so micro-batches sum without extra copies).
//! - Zero rows (an empty batch) is a no-op. A zero *width* where the math divides by it
//!   (a norm over zero features, attention with zero head size) is
//!   [`CoreError::InvalidDimension`](crate::CoreError::InvalidDimension).
//! - NaN and Inf propagate through element-wise math the IEEE way; the losses return
//!   [`CoreError::NonFinite`](crate::CoreError::NonFinite) so a training loop can name the step.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod cross_entropy;
pub mod elementwise;
pub mod embedding;
pub mod l2norm;
pub mod lora;
pub mod loss;
pub mod matmul;
pub mod modulation;
pub mod moe;
pub mod norm;
pub mod optim;
pub mod q4;
pub mod q8;
pub mod rmsnorm;
pub mod rope;
pub mod sdpa;
pub mod softmax;
pub mod spatial;
pub mod swiglu;
pub mod unary;
