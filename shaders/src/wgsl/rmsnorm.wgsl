// RMSNorm forward, one workgroup per row: out = x * rstd * weight,
// rstd = 1 / sqrt(mean(x^2) + eps). Twin of rusting_brain_core::ops::rmsnorm.

const WG: u32 = 64u;
var<workgroup> part: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    // Rows beyond 65535 workgroups wrap into the grid's second dimension.
    let r = wid.x + wid.y * nwg.x;
    if (r >= p.rows) { return; }
    let base = r * p.dim;
    var ss = 0.0;
    for (var i = t; i < p.dim; i += WG) {
        let v = inp[base + i];
        ss += v * v;
    }
    part[t] = ss;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) { part[t] += part[t + s]; }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(part[0] / f32(p.dim) + p.eps);
    for (var i = t; i < p.dim; i += WG) {
        out[base + i] = inp[base + i] * inv * weight[i];
    }
    if (t == 0u) { rstd[r] = inv; }
}
