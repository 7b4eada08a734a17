// Backward of moe_combine, one workgroup per slot: dy[row] = weight * dout[token]
// (overwritten) and the slot's weight gradient dout[token] . y[row].
// Twin of rusting_brain_core::ops::moe::moe_combine_backward.

const WG: u32 = 64u;
var<workgroup> part: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let slot = wid.x + wid.y * nwg.x;
    if (slot >= p.slots) { return; }
    let tok = slot / p.top_k;
    let row = row_of_slot[slot];
    let w = weight[slot];
    var acc = 0.0;
    for (var c = t; c < p.dim; c += WG) {
        let g = dout[tok * p.dim + c];
        dy[row * p.dim + c] = w * g;
        acc += g * y[row * p.dim + c];
    }
    part[t] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) { part[t] += part[t + s]; }
        workgroupBarrier();
    }
    if (t == 0u) { dweight[slot] = part[0]; }
}
