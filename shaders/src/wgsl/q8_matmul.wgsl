// out (m x n) = xq (m x k, int8 rows with scales xs) . W^T (n x k, int8 rows with scales
// ws) + beta * out. One workgroup per output element: its threads stride over the packed
// row, dot4I8Packed sums exactly in i32, a tree adds the partials (integer, so the order
// does not matter), then f32(acc) * xs * ws as the CPU does.
// Twin of rusting_brain_core::ops::q8::q8_matmul.
struct Params { m: u32, n: u32, packed_cols: u32, beta: f32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xq: array<u32>;
@group(0) @binding(2) var<storage, read> xs: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read> ws: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;
var<workgroup> part: array<i32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let i = wid.y;
    // Output columns past the grid's width come round again (n can exceed 65535).
    for (var j = wid.x; j < p.n; j += nwg.x) {
        var acc = 0;
        let xb = i * p.packed_cols;
        let wb = j * p.packed_cols;
        for (var s = t; s < p.packed_cols; s += WG) {
            acc += dot4I8Packed(xq[xb + s], w[wb + s]);
        }
        part[t] = acc;
        workgroupBarrier();
        for (var h = WG / 2u; h > 0u; h = h / 2u) {
            if (t < h) { part[t] += part[t + h]; }
            workgroupBarrier();
        }
        if (t == 0u) {
            let v = f32(part[0]) * xs[i] * ws[j];
            let o = i * p.n + j;
            if (p.beta == 0.0) { out[o] = v; } else { out[o] = v + p.beta * out[o]; }
        }
        workgroupBarrier();
    }
}
