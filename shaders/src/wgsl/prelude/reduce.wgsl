// Prelude joined before a kernel that reduces over a workgroup of WG threads: the
// tree reductions by halving (max and sum), the same order every run. WGSL declarations
// may come in any order, so the kernel file names WG, part and these functions freely.
const WG: u32 = 64u;
var<workgroup> part: array<f32, WG>;

fn reduce_max(t: u32, value: f32) -> f32 {
    part[t] = value;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) { part[t] = max(part[t], part[t + s]); }
        workgroupBarrier();
    }
    let r = part[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(t: u32, value: f32) -> f32 {
    part[t] = value;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) { part[t] += part[t + s]; }
        workgroupBarrier();
    }
    let r = part[0];
    workgroupBarrier();
    return r;
}
