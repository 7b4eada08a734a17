// The int8 product for many rows at once (prefill): out (m x n) = xq . W^T (+ beta * out),
// 32 x 32 outputs a workgroup, 4 x 4 in each invocation's registers. The packed int8 words
// of a 32-row strip of activations and of weights go through workgroup memory 8 words (32
// values) at a time, so each word read from memory feeds 32 dot4I8Packed instead of one.
// The i32 sums are exact whatever the order; with blocked weights (13-bit activations, two
// words a weight word) a step of 8 weight words is one block of 32 values, whose sums are
// scaled and added to the f32 totals in block order, so the result is bit-identical to
// q8_matmul.wgsl and to the CPU. Columns j0.. of rows of out_n, as q8_matmul.wgsl.
// Twin of rusting_brain_core::ops::q8::q8_matmul.

const TILE: u32 = 32u;
const TK: u32 = 8u;
var<workgroup> xt: array<u32, 512>; // TILE rows x TK words, twice that for 13-bit activations
var<workgroup> wt: array<u32, 256>;

@compute @workgroup_size(8, 8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let i0 = wid.y * TILE;
    let j0 = wid.x * TILE;
    var acc: array<array<i32, 4>, 4>;
    var total: array<array<f32, 4>, 4>;
    for (var a = 0u; a < 4u; a++) { for (var b = 0u; b < 4u; b++) { acc[a][b] = 0; total[a][b] = 0.0; } }
    for (var s0 = 0u; s0 < p.packed_cols; s0 += TK) {
        // 64 invocations load the two 256-word tiles, four words each; words past the
        // matrix (rows or packed columns) read as 0, which adds nothing.
        for (var e = t; e < TILE * TK; e += 64u) {
            let r = e / TK;
            let c = s0 + e % TK;
            var wv = 0u;
            if (j0 + r < p.n && c < p.packed_cols) { wv = w[(j0 + r) * p.packed_cols + c]; }
            wt[e] = wv;
        }
        // The activations: a word per weight word (int8), or two (13-bit, blocked weights).
        let xw = select(1u, 2u, p.blocks > 1u);
        for (var e = t; e < TILE * TK * xw; e += 64u) {
            let r = e / (TK * xw);
            let c = xw * s0 + e % (TK * xw);
            var xv = 0u;
            if (i0 + r < p.m && c < xw * p.packed_cols) { xv = xq[(i0 + r) * xw * p.packed_cols + c]; }
            xt[e] = xv;
        }
        workgroupBarrier();
        for (var c = 0u; c < TK; c++) {
            var wr: array<u32, 4>;
            for (var a = 0u; a < 4u; a++) { wr[a] = wt[(lid.x * 4u + a) * TK + c]; }
            if (p.blocks == 1u) {
                for (var a = 0u; a < 4u; a++) {
                    let xr = xt[(lid.y * 4u + a) * TK + c];
                    for (var b = 0u; b < 4u; b++) { acc[a][b] += dot4I8Packed(xr, wr[b]); }
                }
            } else {
                for (var a = 0u; a < 4u; a++) {
                    let at = (lid.y * 4u + a) * 2u * TK + 2u * c;
                    let x0 = xt[at];
                    let x1 = xt[at + 1u];
                    for (var b = 0u; b < 4u; b++) { acc[a][b] += dot_wide(wr[b], x0, x1); }
                }
            }
        }
        workgroupBarrier();
        // The end of a block (each step, blocks of 32 values) or of the row (one block).
        if (p.blocks > 1u || s0 + TK >= p.packed_cols) {
            let blk = min(s0 / TK, p.blocks - 1u);
            for (var a = 0u; a < 4u; a++) {
                let i = min(i0 + lid.y * 4u + a, p.m - 1u);
                for (var b = 0u; b < 4u; b++) {
                    let j = min(j0 + lid.x * 4u + b, p.n - 1u);
                    total[a][b] += f32(acc[a][b]) * xs[i * p.blocks + blk] * ws[j * p.blocks + blk];
                    acc[a][b] = 0;
                }
            }
        }
    }
    store_tile(total, i0, j0, lid);
}
