// Rounds each activation row for an int8 or 4-bit weight, one workgroup a block of p.block
// values. p.wide 0 (one block a row, p.block == p.cols): int8 with the row's scale
// (absmax / 127), four to a u32 (memory order, as the CPU packs them). p.wide 1 (blocks of
// 32, for blocked int8 or 4-bit weights, one block too where a row is that short):
// integers in [-4095, 4095] with a scale a block (absmax / 4095), two to a u32 (low half
// first: the CPU's i16 pairs in memory order), rows of 2 * packed_cols words. Padding is 0
// (the row's last block writes it). Rounding is half away from zero (WGSL's round() goes
// to even), so the integers equal the CPU's.
// Twin of rusting_brain_core::ops::q8::quantize_activations and quantize_activations_wide.

const WG: u32 = 64u;
var<workgroup> part: array<f32, WG>;

fn at(base: u32, c: u32, inv: f32) -> i32 {
    if (c >= p.cols) { return 0; }
    return round_away(x[base + c], inv, 127.0);
}

fn wide_at(base: u32, c: u32, inv: f32) -> u32 {
    if (c >= p.cols) { return 0u; }
    return bitcast<u32>(round_away(x[base + c], inv, 4095.0)) & 0xffffu;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let blocks = (p.cols + p.block - 1u) / p.block;
    let g = wid.x + wid.y * nwg.x;
    if (g >= p.rows * blocks) { return; }
    let r = g / blocks;
    let c0 = (g % blocks) * p.block;
    let c1 = min(p.cols, c0 + p.block);
    let base = r * p.cols;
    var m = 0.0;
    for (var i = c0 + t; i < c1; i += WG) { m = max(m, abs(x[base + i])); }
    part[t] = m;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) { part[t] = max(part[t], part[t + s]); }
        workgroupBarrier();
    }
    if (p.wide == 0u) {
        let scale = part[0] / 127.0;
        var inv = 0.0;
        if (scale > 0.0) { inv = 1.0 / scale; }
        for (var s = t; s < p.packed_cols; s += WG) {
            let c = 4u * s;
            let v = vec4<i32>(at(base, c, inv), at(base, c + 1u, inv), at(base, c + 2u, inv), at(base, c + 3u, inv));
            xq[r * p.packed_cols + s] = pack4xI8(v);
        }
        if (t == 0u) { xs[g] = scale; }
        return;
    }
    let scale = part[0] / 4095.0;
    var inv = 0.0;
    if (scale > 0.0) { inv = 1.0 / scale; }
    var end = (c1 + 1u) / 2u;
    if (g % blocks + 1u == blocks) { end = 2u * p.packed_cols; }
    for (var s = c0 / 2u + t; s < end; s += WG) {
        xq[r * 2u * p.packed_cols + s] = wide_at(base, 2u * s, inv) | (wide_at(base, 2u * s + 1u, inv) << 16u);
    }
    if (t == 0u) { xs[g] = scale; }
}
