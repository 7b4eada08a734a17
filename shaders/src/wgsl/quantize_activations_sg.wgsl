// quantize_activations.wgsl with a subgroup reduction for the absmax (used when the adapter has
// subgroups): subgroupMax, the subgroup's first invocation keeps it in its own slot, one
// barrier, then every invocation takes the max of the 64 slots. Same integers.
// Rounds each activation row to int8 in blocks of p.block values (the whole row for
// per-row weights), each block with its own scale (absmax / 127), one workgroup a block;
// four values packed to a u32 (memory order, as the CPU packs them), padding bytes 0. A
// block of 32 starts on a word, so blocks never share one. Rounding is half away
// from zero (WGSL's round() goes to even), so the integers equal the CPU's.
// Twin of rusting_brain_core::ops::q8::quantize_activation_blocks.

const WG: u32 = 64u;
var<workgroup> part: array<f32, WG>;

fn q(v: f32, inv: f32) -> i32 {
    let y = v * inv;
    var t = trunc(y);
    if (abs(y - t) >= 0.5) { t += sign(y); }
    return i32(clamp(t, -127.0, 127.0));
}

fn at(base: u32, c: u32, inv: f32) -> i32 {
    if (c >= p.cols) { return 0; }
    return q(x[base + c], inv);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32, @builtin(subgroup_invocation_id) sid: u32) {
    let blocks = (p.cols + p.block - 1u) / p.block;
    let g = wid.x + wid.y * nwg.x;
    if (g >= p.rows * blocks) { return; }
    let r = g / blocks;
    let c0 = (g % blocks) * p.block;
    let c1 = min(p.cols, c0 + p.block);
    let base = r * p.cols;
    var m = 0.0;
    for (var i = c0 + t; i < c1; i += WG) { m = max(m, abs(x[base + i])); }
    let sub = subgroupMax(m);
    part[t] = select(0.0, sub, sid == 0u);
    workgroupBarrier();
    var absmax = 0.0;
    for (var i = 0u; i < WG; i++) { absmax = max(absmax, part[i]); }
    let scale = absmax / 127.0;
    var inv = 0.0;
    if (scale > 0.0) { inv = 1.0 / scale; }
    for (var s = c0 / 4u + t; s < (c1 + 3u) / 4u; s += WG) {
        let c = 4u * s;
        let v = vec4<i32>(at(base, c, inv), at(base, c + 1u, inv), at(base, c + 2u, inv), at(base, c + 3u, inv));
        xq[r * p.packed_cols + s] = pack4xI8(v);
    }
    if (t == 0u) { xs[g] = scale; }
}
