// out (m x n) = xq (m x k, rows rounded for the weight: int8 with one scale for one block
// a row, 13-bit in blocks otherwise) . W^T (n x k, int8 rows with scales ws, p.blocks a row
// of p.block values) + beta * out. One invocation per output element,
// no barriers: it walks its weight row a packed word (four int8) at a time, dot4I8Packed
// sums each block exactly in i32, and the blocks are added in order as
// total + (f32(acc) * xs) * ws, as the CPU does, so the result is bit-identical to it.
// (A workgroup per output with a tree reduction ran at 8 tokens/s on lavapipe, where
// every barrier is a coroutine switch per invocation; this layout runs at several times
// that, and on GPUs neighbouring invocations still share the activation row in cache.)
// Twin of rusting_brain_core::ops::q8::q8_matmul.
// out_n / j0: the output's row length and this call's first column, so a weight split
// into row slabs (one binding each, under maxStorageBufferBindingSize) fills its columns.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let i = gid.y;
    if (j >= p.n || i >= p.m) { return; }
    let xb = i * p.packed_cols;
    let wb = j * p.packed_cols;
    var v = 0.0;
    if (p.blocks == 1u) {
        // One block a row: int8 activations, four to a word.
        var acc = 0;
        for (var s = 0u; s < p.packed_cols; s++) {
            acc += dot4I8Packed(xq[xb + s], w[wb + s]);
        }
        v = f32(acc) * xs[i] * ws[j];
    } else {
        // Blocks: 13-bit activations, two to a word (rows of 2 * packed_cols words).
        for (var b = 0u; b < p.blocks; b++) {
            var end = p.packed_cols;
            if (b + 1u < p.blocks) { end = (b + 1u) * p.block / 4u; }
            var acc = 0;
            for (var s = b * p.block / 4u; s < end; s++) {
                acc += dot_wide(w[wb + s], xq[2u * (xb + s)], xq[2u * (xb + s) + 1u]);
            }
            v += f32(acc) * xs[i * p.blocks + b] * ws[j * p.blocks + b];
        }
    }
    let o = i * p.out_n + p.j0 + j;
    if (p.beta == 0.0) { out[o] = v; } else { out[o] = v + p.beta * out[o]; }
}
