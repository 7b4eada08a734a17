// The index of the largest logit of each row (ties go to the lower index, as the core
// sampler's greedy draw), so a decode step reads back 4 bytes. A row with a NaN gets
// 0xfffffffe, which the host reports as the error the core sampler gives.

const WG: u32 = 64u;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> saw_nan: atomic<u32>;

// By the bits: WGSL lets a compiler assume floats are never NaN or infinite, so `v != v`
// and comparisons with -inf may be folded away (lavapipe's LLVM does fold the first).
fn is_nan(v: f32) -> bool {
    let b = bitcast<u32>(v);
    return (b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0u;
}

fn is_neg_inf(v: f32) -> bool { return bitcast<u32>(v) == 0xff800000u; }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let r = wid.x;
    if (r >= p.rows) { return; }
    if (t == 0u) { atomicStore(&saw_nan, 0u); }
    workgroupBarrier();
    var bv = -3.40282346e38; // -f32::MAX (3.4028235e38 rounds past it and Tint refuses it)
    var bi = 0xffffffffu;
    for (var c = t; c < p.cols; c += WG) {
        let v = logits[r * p.cols + c];
        if (is_nan(v)) { atomicStore(&saw_nan, 1u); }
        // Strictly greater: a thread's first maximum wins within its stride.
        if (bi == 0xffffffffu || v > bv) { bv = v; bi = c; }
    }
    best_v[t] = bv;
    best_i[t] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) {
            let ov = best_v[t + s];
            let oi = best_i[t + s];
            if (oi != 0xffffffffu && (best_i[t] == 0xffffffffu || ov > best_v[t] || (ov == best_v[t] && oi < best_i[t]))) {
                best_v[t] = ov;
                best_i[t] = oi;
            }
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        if (atomicLoad(&saw_nan) == 1u) { ids[r] = 0xfffffffeu; } else { ids[r] = best_i[0]; }
    }
}
