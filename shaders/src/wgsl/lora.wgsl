// y[row] += scale * t[row] B^T with t[row] = x[row] A^T kept: the adapter's forward in one
// pass, one workgroup per row. Twin of rusting_brain_core::ops::lora::lora_forward, for
// ranks up to RMAX (larger ones take the backend's two GEMMs). x, y and t are read and
// written from their row offsets, so an expert's run of grouped rows is a window.

const WG: u32 = 64u;
const RMAX: u32 = 32u;
// Each invocation's partial sums of the rank dot products, then their totals.
var<workgroup> partial: array<f32, 2048>;
var<workgroup> ts: array<f32, 32>;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) { return; }
    let xo = p.x_off + row * p.d_in;
    var acc: array<f32, 32>;
    for (var j = 0u; j < p.rank; j++) { acc[j] = 0.0; }
    for (var k = li; k < p.d_in; k += WG) {
        let xv = x[xo + k];
        for (var j = 0u; j < p.rank; j++) {
            acc[j] += xv * a[j * p.d_in + k];
        }
    }
    for (var j = 0u; j < p.rank; j++) { partial[li * RMAX + j] = acc[j]; }
    workgroupBarrier();
    if (li < p.rank) {
        var s = 0.0;
        for (var i = 0u; i < WG; i++) { s += partial[i * RMAX + li]; }
        ts[li] = s;
        t[p.t_off + row * p.rank + li] = s;
    }
    workgroupBarrier();
    let scale = bitcast<f32>(p.scale_bits);
    let yo = p.y_off + row * p.d_out;
    for (var o = li; o < p.d_out; o += WG) {
        var s = 0.0;
        for (var j = 0u; j < p.rank; j++) { s += ts[j] * b[o * p.rank + j]; }
        y[yo + o] += scale * s;
    }
}
