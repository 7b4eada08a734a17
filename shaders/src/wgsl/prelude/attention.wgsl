// Prelude joined before the attention kernels (forward, backward query side, backward
// key side): the shape they share (rusting_brain_core::ops::attention::AttentionSpec) and
// the bindings of q, k and v.
struct Params {
    batch: u32, q_len: u32, kv_len: u32, kv_capacity: u32,
    q_heads: u32, kv_heads: u32, head_dim: u32, scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
