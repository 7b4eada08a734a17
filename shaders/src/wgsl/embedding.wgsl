// f32 embedding lookup (also the mixture-of-experts gather): out[r, c] = table[ids[r], c],
// one invocation per output value. Ids are checked on the host before they are staged.
// Twin of rusting_brain_core::ops::embedding::embedding_forward.
struct Params { rows: u32, dim: u32, pad0: u32, pad1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.rows * p.dim) { return; }
    let r = i / p.dim;
    out[i] = table[ids[r] * p.dim + i % p.dim];
}
