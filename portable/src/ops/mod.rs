//! The portable backend's op families, one file each: what it runs for every primitive of
//! `rusting_brain_core::Backend`.

mod activation;
mod attention;
mod cross_entropy;
mod elementwise;
mod embedding;
mod l2norm;
mod lora;
mod loss;
mod matmul;
mod moe;
mod optim;
mod q8;
mod rmsnorm;
mod rope;
mod softmax;
mod swiglu;
