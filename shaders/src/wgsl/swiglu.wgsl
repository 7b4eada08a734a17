// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). Twin of rusting_brain_core::ops::swiglu.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.len) { return; }
    let g = gate[i];
    out[i] = g / (1.0 + exp(-g)) * up[i];
}
