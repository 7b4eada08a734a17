// Partial sums of squares: workgroup g sums x[g * CHUNK ..][..CHUNK]^2 into
// partials[offset + g]; the host adds the partials in f64 (one read-back for every
// tensor of a global gradient norm). Twin of rusting_brain_core::ops::l2norm.

const WG: u32 = 64u;
const CHUNK: u32 = 4096u;
var<workgroup> part: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let g = wid.x + wid.y * nwg.x;
    let groups = (p.len + CHUNK - 1u) / CHUNK;
    if (g >= groups) { return; }
    let end = min(p.len, (g + 1u) * CHUNK);
    var acc = 0.0;
    for (var i = g * CHUNK + t; i < end; i += WG) {
        let v = x[i];
        acc += v * v;
    }
    part[t] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) { part[t] += part[t + s]; }
        workgroupBarrier();
    }
    if (t == 0u) { partials[p.offset + g] = part[0]; }
}
