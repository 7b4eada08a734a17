// x[t] += sum over t's slots, in rank order, of weight[slot] * y[row_of_slot[slot]]: one
// invocation per output element, so no two write one place, and the adds run in the
// reference's order. Twin of rusting_brain_core::ops::moe::moe_combine.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.rows * p.dim) { return; }
    let t = i / p.dim;
    let c = i % p.dim;
    var v = x[i];
    for (var s = 0u; s < p.top_k; s++) {
        let slot = t * p.top_k + s;
        v = v + weight[slot] * y[row_of_slot[slot] * p.dim + c];
    }
    x[i] = v;
}
