// The 4-bit product for many rows at once (prefill): q4_matmul.wgsl's result, 32 x 32
// outputs a workgroup, 4 x 4 in each invocation's registers, as q8_matmul_tiled.wgsl.
// A step is one block of 32 values: a 32-row strip of the weights' nibbles for it (the
// low or high nibbles of its group's eight words, which masked are int8 words of values
// 0..15) and of the 13-bit activations go through workgroup memory; each invocation
// keeps its four rows' s2 = sum(x) beside the sixteen s1 = sum(x q), and at the block's
// end adds (f32(s1) * xs) * d, then subtracts (f32(s2) * xs) * m, so the result is
// bit-identical to q4_matmul.wgsl and to the CPU. Twin of rusting_brain_core::ops::q4::q4_matmul.

const TILE: u32 = 32u;
const TK: u32 = 8u;
var<workgroup> xt: array<u32, 512>; // TILE rows x TK quads, two words each
var<workgroup> wt: array<u32, 256>;

@compute @workgroup_size(8, 8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let i0 = wid.y * TILE;
    let j0 = wid.x * TILE;
    let rs = 2u + 2u * p.blocks;
    var total: array<array<f32, 4>, 4>;
    for (var a = 0u; a < 4u; a++) { for (var b = 0u; b < 4u; b++) { total[a][b] = 0.0; } }
    for (var blk = 0u; blk < p.blocks; blk++) {
        let s0 = blk * TK;
        let shift = 4u * (blk % 2u);
        // 64 invocations load the tiles; rows past the matrix read as 0, which adds nothing
        // (the activations' padding past k is 0 too).
        for (var e = t; e < TILE * TK; e += 64u) {
            let r = e / TK;
            var wv = 0u;
            if (j0 + r < p.n) { wv = (w[(j0 + r) * p.wpc + 8u * (blk / 2u) + e % TK] >> shift) & 0x0f0f0f0fu; }
            wt[e] = wv;
        }
        for (var e = t; e < TILE * TK * 2u; e += 64u) {
            let r = e / (TK * 2u);
            let c = 2u * s0 + e % (TK * 2u);
            var xv = 0u;
            if (i0 + r < p.m && c < 2u * p.packed_cols) { xv = xq[(i0 + r) * 2u * p.packed_cols + c]; }
            xt[e] = xv;
        }
        workgroupBarrier();
        var acc: array<array<i32, 4>, 4>;
        var sum: array<i32, 4>;
        for (var a = 0u; a < 4u; a++) { sum[a] = 0; for (var b = 0u; b < 4u; b++) { acc[a][b] = 0; } }
        for (var c = 0u; c < TK; c++) {
            var wr: array<u32, 4>;
            for (var b = 0u; b < 4u; b++) { wr[b] = wt[(lid.x * 4u + b) * TK + c]; }
            for (var a = 0u; a < 4u; a++) {
                let at = (lid.y * 4u + a) * 2u * TK + 2u * c;
                let x = wide4(xt[at], xt[at + 1u]);
                sum[a] += x.x + x.y + x.z + x.w;
                for (var b = 0u; b < 4u; b++) { acc[a][b] += dot(unpack4xI8(wr[b]), x); }
            }
        }
        workgroupBarrier();
        for (var a = 0u; a < 4u; a++) {
            let i = min(i0 + lid.y * 4u + a, p.m - 1u);
            let x_scale = xs[i * p.blocks + blk];
            for (var b = 0u; b < 4u; b++) {
                let j = min(j0 + lid.x * 4u + b, p.n - 1u);
                total[a][b] = total[a][b] + (f32(acc[a][b]) * x_scale) * ws[j * rs + 2u + 2u * blk];
                total[a][b] = total[a][b] - (f32(sum[a]) * x_scale) * ws[j * rs + 3u + 2u * blk];
            }
        }
    }
    store_tile(total, i0, j0, lid);
}
