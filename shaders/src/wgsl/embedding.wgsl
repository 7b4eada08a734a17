// f32 embedding lookup (also the mixture-of-experts gather): out[r, c] = table[ids[r], c],
// one invocation per output value. Ids are checked on the host before they are staged.
// Twin of rusting_brain_core::ops::embedding::embedding_forward.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.rows * p.dim) { return; }
    let r = i / p.dim;
    out[i] = table[ids[r] * p.dim + i % p.dim];
}
