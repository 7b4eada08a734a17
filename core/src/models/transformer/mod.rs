//! A decoder-only transformer language model, Llama layout: token embedding tied with the
//! output head; pre-norm blocks of RMSNorm -> causal grouped-query attention with RoPE ->
//! residual, RMSNorm -> SwiGLU feed-forward -> residual; a final RMSNorm.
//!
//! Forward and backward are written out layer by layer over the [`Backend`] primitives, the
//! llm.c way: every activation the backward pass needs is kept in an arena sized for one
//! (batch, seq) shape and reused while that shape repeats. Parameter names and layouts
//! follow Hugging Face's `LlamaForCausalLM` (`model.layers.{i}.self_attn.q_proj.weight` is
//! `(q_heads * head_dim, d_model)`), so checkpoints map without transposes.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::backend::{
    AttentionSpec, LoraSpec, MatmulSpec, OperandPrecision, Q8Attention, Q8Product, RopeSpec, RoutedSpec,
    SdpaSpec,
};
use crate::{Backend, CoreError, Optimizer, Result, Rng, RopeScaling};

// The model by layer, the llm.c way: each layer's forward beside its backward, the model's
// step reading forward -> backward -> update.
mod arena; // the activations a (batch, seq) shape keeps for the backward pass
mod batch; // TokenBatch
mod block; // one pre-norm block
mod config; // TransformerConfig, MoeConfig
mod decode; // KV caches and cached decoding
mod linear; // weights as products read them (f32, int8), adapters on them
mod lora; // LoRA state, PEFT names
mod mlp; // SwiGLU feed-forward
mod model; // TransformerModel: construction, training step, named parameters
mod moe; // mixture-of-experts feed-forward
mod params; // the parameter tree and its layout
mod train; // the training step: forward, backward, update
mod turns; // conversations for chat

use arena::*;
use block::*;
use linear::*;
use mlp::*;
use moe::*;

pub use crate::ops::q8::QuantFormat;
pub use batch::*;
pub use config::*;
pub use decode::*;
pub use lora::{
    adapted_shapes, adapter_buffers, adapter_buffers_mut, peft_names, Adapters, LoraConfig, LoraPair,
    LoraState, NamedLora, LORA_TARGETS,
};
pub use model::*;
pub use params::{Block, Experts, Swiglu, TensorKind, TensorSpec, Tree};
pub use turns::{Conversation, Finish, Reply, Turn};

use crate::backend::Memory;
use crate::ops::moe::Routing;

/// Parameters, gradients or optimizer moments on backend `B`, as one [`Tree`].
pub type Params<B> = Tree<<B as Memory>::Buffer>;

/// One block of [`Params`].
pub type LayerParams<B> = Block<<B as Memory>::Buffer>;

/// An int8 model's matrices: (packed int8, per-row scales) where the layout has a
/// [`TensorKind::Matrix`], `None` for norms and routers (they stay f32 in [`Params`]).
pub type QuantParams<B> = Tree<Option<(<B as Memory>::Buffer, <B as Memory>::Buffer)>>;

/// Zeroed buffers of `layout`'s shapes.
pub fn zeros_like<B: Backend>(b: &B, layout: &Tree<TensorSpec>) -> Result<Params<B>> {
    layout.as_ref().try_map(|_, t| b.zeros(t.len()))
}

/// Zero-length buffers in `layout`'s tree: what an int8 model keeps in place of the
/// gradients and optimizer moments it does not have.
pub fn hollow<B: Backend>(b: &B, layout: &Tree<TensorSpec>) -> Result<Params<B>> {
    layout.as_ref().try_map(|_, _| b.zeros(0))
}
