// RMSNorm forward with subgroup reductions (used when the adapter has subgroups; the
// workgroup-tree version in rmsnorm.wgsl runs everywhere else): each subgroup sums its
// partials with subgroupAdd, its first invocation leaves the sum in its own slot of a
// 64-slot array (the others leave 0), and one barrier later every invocation adds the 64
// slots in order. One barrier instead of seven.
// Twin of rusting_brain_core::ops::rmsnorm.

const WG: u32 = 64u;
var<workgroup> part: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32, @builtin(subgroup_invocation_id) sid: u32) {
    // Rows beyond 65535 workgroups wrap into the grid's second dimension.
    let r = wid.x + wid.y * nwg.x;
    if (r >= p.rows) { return; }
    let base = r * p.dim;
    var ss = 0.0;
    for (var i = t; i < p.dim; i += WG) {
        let v = inp[base + i];
        ss += v * v;
    }
    let sub = subgroupAdd(ss);
    part[t] = select(0.0, sub, sid == 0u);
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < WG; i++) { total += part[i]; }
    let inv = 1.0 / sqrt(total / f32(p.dim) + p.eps);
    for (var i = t; i < p.dim; i += WG) {
        out[base + i] = inp[base + i] * inv * weight[i];
    }
    if (t == 0u) { rstd[r] = inv; }
}
