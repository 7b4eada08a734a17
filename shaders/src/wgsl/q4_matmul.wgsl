// out (m x n) = xq (m x k, 13-bit in blocks of 32, two to a word) . W^T + beta * out, W
// the (n x k) 4-bit weight: rows of p.wpc words (each 64 values 8 words, byte l holding
// value l in its low nibble and value 32 + l in its high one) with scales ws, rows of
// 2 + 2 p.blocks ([row_d, row_m, d_0, m_0, ...]). One invocation per output element, as
// q8_matmul.wgsl: per block the exact i32 sums s1 = sum(x q) and s2 = sum(x), then
// total + (f32(s1) * xs) * d, total - (f32(s2) * xs) * m in block order, as the CPU adds
// them, so the result is bit-identical to it. Columns j0.. of rows of out_n, as
// q8_matmul.wgsl. Twin of rusting_brain_core::ops::q4::q4_matmul.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let i = gid.y;
    if (j >= p.n || i >= p.m) { return; }
    let xb = 2u * i * p.packed_cols;
    let wb = j * p.wpc;
    let sb = j * (2u + 2u * p.blocks);
    var v = 0.0;
    for (var b = 0u; b < p.blocks; b++) {
        // Block b: the activations' quads 8b.., the low (b even) or high nibbles of its
        // group's eight words.
        let q0 = 8u * b;
        let q1 = min(q0 + 8u, p.packed_cols);
        let w0 = wb + 8u * (b / 2u) - q0;
        let shift = 4u * (b % 2u);
        var s1 = 0;
        var s2 = 0;
        for (var s = q0; s < q1; s++) {
            let a = wide4(xq[xb + 2u * s], xq[xb + 2u * s + 1u]);
            s1 += dot(vec4<i32>(unpack4xU8((w[w0 + s] >> shift) & 0x0f0f0f0fu)), a);
            s2 += a.x + a.y + a.z + a.w;
        }
        let x_scale = xs[i * p.blocks + b];
        v = v + (f32(s1) * x_scale) * ws[sb + 2u + 2u * b];
        v = v - (f32(s2) * x_scale) * ws[sb + 3u + 2u * b];
    }
    let o = i * p.out_n + p.j0 + j;
    if (p.beta == 0.0) { out[o] = v; } else { out[o] = v + p.beta * out[o]; }
}
