// The int8 product of the routed slots that chose one expert with that expert's weights:
// slot s (token s / top_k) reads activation row s / top_k (`x_per_token`, the gate and up
// projections) or row s (the down projection); slots that chose another expert are left
// as they are (one dispatch per expert fills every slot). Otherwise as q8_matmul.wgsl
// (int8 activations for one block a row; 13-bit ones, exact i32 sums per block, added up
// in block order as total + (f32(acc) * xs) * ws, for blocked weights).
// Twin of rusting_brain_core::ops::moe::q8_matmul_routed.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let s = gid.y;
    if (j >= p.n || s >= p.slots) { return; }
    if (expert[s] != p.only) { return; }
    var xr = s;
    if (p.x_per_token == 1u) { xr = s / p.top_k; }
    let xb = xr * p.packed_cols;
    let wb = j * p.packed_cols;
    var v = 0.0;
    if (p.blocks == 1u) {
        var acc = 0;
        for (var c = 0u; c < p.packed_cols; c++) {
            acc += dot4I8Packed(xq[xb + c], w[wb + c]);
        }
        v = f32(acc) * xs[xr] * ws[j];
    } else {
        for (var b = 0u; b < p.blocks; b++) {
            var end = p.packed_cols;
            if (b + 1u < p.blocks) { end = (b + 1u) * p.block / 4u; }
            var acc = 0;
            for (var c = b * p.block / 4u; c < end; c++) {
                acc += dot_wide(w[wb + c], xq[2u * (xb + c)], xq[2u * (xb + c) + 1u]);
            }
            v += f32(acc) * xs[xr * p.blocks + b] * ws[j * p.blocks + b];
        }
    }
    out[s * p.n + j] = v;
}
