//! The `Backend` trait: the primitives every model is written against.
//!
//! A backend owns its buffers (`Backend::Buffer`: a `Vec<f32>` on the CPU, a device
//! allocation on a GPU) and runs the primitives of [`crate::ops`] on them. Semantics are
//! exactly those of the reference functions of the same name (shapes, which outputs are
//! overwritten and which accumulate, errors); [`crate::ReferenceBackend`] is the definition
//! and every backend is tested against it.
//!
//! Dispatch: model code is generic over `B: Backend` internally, so each backend's kernels
//! are called statically; the user-facing model types hold an enum of per-backend states
//! and pick the arm at run time, which is how a built model moves to a device without a
//! type parameter. The trait is also object-safe for a fixed buffer type
//! (`&dyn Backend<Buffer = Vec<f32>>`), which the tests use to run one sweep over several
//! host backends.
//!
//! Token ids, targets and masks are host slices: they are small, and a device backend
//! uploads them itself.

use alloc::vec::Vec;

pub use crate::ops::activation::ActivationOps;
pub use crate::ops::attention::AttentionOps;
pub use crate::ops::attention::AttentionSpec;
pub use crate::ops::attention::{attention_rows_each, AttentionRows};
pub use crate::ops::conv::Conv2dSpec;
pub use crate::ops::conv::ConvOps;
pub use crate::ops::cross_entropy::CrossEntropyOps;
pub use crate::ops::cross_entropy::CrossEntropySum;
pub use crate::ops::elementwise::ElementwiseOps;
pub use crate::ops::embedding::EmbeddingOps;
pub use crate::ops::l2norm::L2normOps;
pub use crate::ops::lora::lora_forward_by_gemm;
pub use crate::ops::lora::LoraOps;
pub use crate::ops::lora::LoraSpec;
pub use crate::ops::loss::LossOps;
pub use crate::ops::matmul::MatmulOps;
pub use crate::ops::matmul::{MatmulSpec, OperandPrecision};
pub use crate::ops::modulation::ModulationOps;
pub use crate::ops::modulation::{ColumnCopy, ModulationSpec, RopePairsSpec};
pub use crate::ops::moe::MoeOps;
pub use crate::ops::moe::RoutedSpec;
pub use crate::ops::norm::GroupNormSpec;
pub use crate::ops::norm::NormOps;
pub use crate::ops::optim::OptimOps;
pub use crate::ops::optim::{AdamParams, SgdParams};
pub use crate::ops::q8::Q8Ops;
pub use crate::ops::q8::{
    q8_attention_unfused, q8_matmul_each, q8_mlp_unfused, q8_swiglu_unfused, Q8Attention, Q8Product,
};
pub use crate::ops::rmsnorm::RmsnormOps;
pub use crate::ops::rope::RopeOps;
pub use crate::ops::rope::RopeSpec;
pub use crate::ops::sdpa::SdpaOps;
pub use crate::ops::sdpa::SdpaSpec;
pub use crate::ops::softmax::SoftmaxOps;
pub use crate::ops::spatial::PatchSpec;
pub use crate::ops::spatial::SpatialOps;
pub use crate::ops::swiglu::SwigluOps;
pub use crate::ops::unary::Unary;
pub use crate::ops::unary::UnaryOps;
use crate::Result;

/// Where a backend's buffers live: allocation, transfers to and from the host, copies. Every other family builds on it.
pub trait Memory {
    /// A contiguous f32 buffer living wherever this backend computes.
    type Buffer;
    /// A short name for messages ("reference", "cpu", "cuda", "wgpu").
    fn name(&self) -> &'static str;
    /// Waits until every queued operation has finished, reporting a failure of any of them.
    /// Host backends finish each call before returning; a device backend that queues work
    /// overrides this (timing wrappers fence each primitive with it).
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    /// A new buffer of `len` zeros.
    fn zeros(&self, len: usize) -> Result<Self::Buffer>;
    /// A new buffer holding `data`.
    fn upload(&self, data: &[f32]) -> Result<Self::Buffer>;
    /// The buffer's contents on the host.
    fn download(&self, buf: &Self::Buffer) -> Result<Vec<f32>>;
    /// Overwrites `dst` with `data` (same length).
    fn write(&self, dst: &mut Self::Buffer, data: &[f32]) -> Result<()>;
    /// Number of f32 elements.
    fn len(&self, buf: &Self::Buffer) -> usize;
    /// Sets every element to `value`.
    fn fill(&self, buf: &mut Self::Buffer, value: f32) -> Result<()>;
    /// dst = src (same length).
    fn copy(&self, dst: &mut Self::Buffer, src: &Self::Buffer) -> Result<()>;
    /// `dst[dst_offset..][..len] = src[src_offset..][..len]` (KV-cache appends, row picks).
    fn copy_range(
        &self, dst: &mut Self::Buffer, dst_offset: usize, src: &Self::Buffer, src_offset: usize, len: usize,
    ) -> Result<()>;
    /// The most values a buffer a kernel reads or writes whole may hold (a GPU's storage
    /// binding); a model keeps its scratch within it, e.g. by prefilling a long prompt in
    /// pieces. The host backends have no such bound.
    fn max_binding_len(&self) -> usize {
        usize::MAX
    }
}

/// `Backend` and its blanket impl from one list of the families, so the two cannot drift.
macro_rules! backend_of {
    ($(#[$doc:meta])* $($family:ident),+ $(,)?) => {
        $(#[$doc])*
        pub trait Backend: $($family +)+ {}

        impl<T: ?Sized $(+ $family)+> Backend for T {}
    };
}

backend_of! {
    /// Every primitive a model is written against: the sum of the op families, one trait each
    /// beside its reference math in [`crate::ops`]. Implemented for every type that implements
    /// all of them.
    Memory, ElementwiseOps, L2normOps, MatmulOps, ActivationOps, LossOps, RmsnormOps, RopeOps,
    SoftmaxOps, SwigluOps, AttentionOps, EmbeddingOps, CrossEntropyOps, MoeOps, Q8Ops, LoraOps,
    ConvOps, NormOps, UnaryOps, SdpaOps, SpatialOps, ModulationOps, OptimOps,
}

/// The global L2 norm over several buffers (gradient clipping): `sqrt(sum of sum(x^2))`.
/// NaN/Inf anywhere gives a NaN/Inf norm, which the caller reports.
pub fn global_l2_norm<B: Backend + ?Sized>(backend: &B, buffers: &[&B::Buffer]) -> Result<f64> {
    Ok(libm::sqrt(backend.sum_of_squares_many(buffers)?))
}

/// The buffer of the host backends (the reference, the CPU's, the portable one).
pub type HostBuffer = Vec<f32>;

/// The memory family of a backend whose buffers are host `Vec<f32>`s, written once for the
/// reference, the CPU and the portable backend: `host_memory!(MyBackend, "name")`.
#[macro_export]
macro_rules! host_memory {
    ($backend:ty, $name:expr) => {
        impl $crate::backend::Memory for $backend {
            type Buffer = $crate::backend::HostBuffer;

            fn name(&self) -> &'static str {
                $name
            }
            fn zeros(&self, len: usize) -> $crate::Result<Self::Buffer> {
                $crate::backend::host::zeros(len)
            }
            fn upload(&self, data: &[f32]) -> $crate::Result<Self::Buffer> {
                Ok(data.to_vec())
            }
            fn download(&self, buf: &Self::Buffer) -> $crate::Result<$crate::backend::HostBuffer> {
                Ok(buf.clone())
            }
            fn write(&self, dst: &mut Self::Buffer, data: &[f32]) -> $crate::Result<()> {
                $crate::backend::host::copy_checked("write", "data", dst, data)
            }
            fn len(&self, buf: &Self::Buffer) -> usize {
                buf.len()
            }
            fn fill(&self, buf: &mut Self::Buffer, value: f32) -> $crate::Result<()> {
                buf.fill(value);
                Ok(())
            }
            fn copy(&self, dst: &mut Self::Buffer, src: &Self::Buffer) -> $crate::Result<()> {
                $crate::backend::host::copy_checked("copy", "src", dst, src)
            }
            fn copy_range(
                &self, dst: &mut Self::Buffer, dst_offset: usize, src: &Self::Buffer, src_offset: usize,
                len: usize,
            ) -> $crate::Result<()> {
                $crate::backend::host::copy_range(dst, dst_offset, src, src_offset, len)
            }
        }
    };
}

/// What [`host_memory!`] expands to call: the host backends' memory operations.
#[doc(hidden)]
pub mod host {
    use alloc::vec::Vec;

    use crate::error::{check_len, check_range};
    use crate::{CoreError, Result};

    /// `len` zeros, or an error where the allocator cannot give that many: a failed
    /// allocation aborts the process, so a large buffer (a KV cache sized by a context a
    /// file declares) is reserved once first, then allocated zeroed (its pages untouched
    /// until written).
    pub fn zeros(len: usize) -> Result<Vec<f32>> {
        if len > 1 << 24 {
            let mut probe: Vec<f32> = Vec::new();
            probe.try_reserve_exact(len).map_err(|_| CoreError::Device {
                backend: "host",
                message: alloc::format!("cannot allocate {len} values ({} MiB)", len >> 18),
            })?;
        }
        Ok(alloc::vec![0.0; len])
    }
    /// `dst = src`, lengths checked (`op` and `name` for the message).
    pub fn copy_checked(op: &'static str, name: &'static str, dst: &mut [f32], src: &[f32]) -> Result<()> {
        check_len(op, name, src.len(), dst.len())?;
        dst.copy_from_slice(src);
        Ok(())
    }
    /// `dst[dst_offset..][..len] = src[src_offset..][..len]`, both ranges checked.
    pub fn copy_range(
        dst: &mut [f32], dst_offset: usize, src: &[f32], src_offset: usize, len: usize,
    ) -> Result<()> {
        check_range("copy_range", "dst", dst.len(), dst_offset, len)?;
        check_range("copy_range", "src", src.len(), src_offset, len)?;
        dst[dst_offset..dst_offset + len].copy_from_slice(&src[src_offset..src_offset + len]);
        Ok(())
    }
}
