// The k largest values of one row, most likely first, ties to the lower index (the core
// sampler's ranking), by k rounds of a workgroup argmax over a scratch copy in which each
// winner is then struck out (set to -inf). -inf values are never chosen: a round that finds nothing
// writes id 0xffffffff. A NaN anywhere makes every id 0xfffffffe (the host reports it).
// The host draws from these k with the sampler's f64 arithmetic (Sampler::sample_ranked).

const WG: u32 = 64u;
const NONE: u32 = 0xffffffffu;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> saw_nan: atomic<u32>;
// -inf's bits, read at run time: Tint (the browser's compiler) refuses a constant
// expression that evaluates to NaN or infinity.
var<private> NEG_INF_BITS: u32 = 0xff800000u;

// By the bits: WGSL lets a compiler assume floats are never NaN or infinite, so `v != v`
// and comparisons with -inf may be folded away (lavapipe's LLVM does fold the first).
fn is_nan(v: f32) -> bool {
    let b = bitcast<u32>(v);
    return (b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0u;
}

fn is_neg_inf(v: f32) -> bool { return bitcast<u32>(v) == 0xff800000u; }

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) t: u32) {
    if (t == 0u) { atomicStore(&saw_nan, 0u); }
    for (var c = t; c < p.cols; c += WG) {
        let v = logits[c];
        if (is_nan(v)) { atomicStore(&saw_nan, 1u); }
        scratch[c] = v;
    }
    storageBarrier();
    workgroupBarrier();
    for (var s = 0u; s < p.k; s++) {
        var bv = 0.0;
        var bi = NONE;
        for (var c = t; c < p.cols; c += WG) {
            let v = scratch[c];
            // Strictly greater, and never -inf: the first maximum in the stride wins.
            if (!is_neg_inf(v) && !is_nan(v) && (bi == NONE || v > bv)) { bv = v; bi = c; }
        }
        best_v[t] = bv;
        best_i[t] = bi;
        workgroupBarrier();
        for (var h = WG / 2u; h > 0u; h = h / 2u) {
            if (t < h) {
                let ov = best_v[t + h];
                let oi = best_i[t + h];
                if (oi != NONE && (best_i[t] == NONE || ov > best_v[t] || (ov == best_v[t] && oi < best_i[t]))) {
                    best_v[t] = ov;
                    best_i[t] = oi;
                }
            }
            workgroupBarrier();
        }
        if (t == 0u) {
            top_ids[s] = best_i[0];
            top_vals[s] = best_v[0];
            if (best_i[0] != NONE) { scratch[best_i[0]] = bitcast<f32>(NEG_INF_BITS); }
        }
        storageBarrier();
        workgroupBarrier();
    }
    if (t == 0u && atomicLoad(&saw_nan) == 1u) {
        for (var s = 0u; s < p.k; s++) { top_ids[s] = 0xfffffffeu; }
    }
}
