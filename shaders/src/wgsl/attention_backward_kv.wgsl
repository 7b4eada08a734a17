// Causal GQA attention backward, key side: one workgroup per key/value row (b, j, kvh).
// The (query row, query head) pairs that see key j, in the reference's order (rows, then
// heads of the group), 64 at a time: each thread recomputes one pair's p and ds as the
// query-side pass did (same sums, same order), then the threads (over the dimensions) add
// p dout to dv and ds q to dk. Rows past kv_len get zeros. Twin of
// rusting_brain_core::ops::attention::attention_backward.
// Params, p, q, k, v and the rest of the bindings: ATTENTION_PARAMS and kernel! in ops/attention.rs.

const WG: u32 = 64u;
const PER: u32 = 4u;
var<workgroup> p_tile: array<f32, WG>;
var<workgroup> ds_tile: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let item = wid.x + wid.y * nwg.x; // (b, j, kvh)
    if (item >= p.batch * p.kv_capacity * p.kv_heads) { return; }
    let kvh = item % p.kv_heads;
    let bj = item / p.kv_heads;
    let j = bj % p.kv_capacity;
    let b = bj / p.kv_capacity;
    let d = p.head_dim;
    let group = p.q_heads / p.kv_heads;
    let kb = item * d;
    // Query row t sits at position off + t and sees key j when off + t >= j.
    let off = p.kv_len - p.q_len;
    var t0 = 0u;
    if (j > off) { t0 = j - off; }
    var pairs = 0u;
    if (j < p.kv_len) { pairs = (p.q_len - t0) * group; }

    var dka = array<f32, PER>(0.0, 0.0, 0.0, 0.0);
    var dva = array<f32, PER>(0.0, 0.0, 0.0, 0.0);
    for (var c0 = 0u; c0 < pairs; c0 += WG) {
        let pi = c0 + t;
        var pr = 0.0;
        var ds = 0.0;
        if (pi < pairs) {
            let row = t0 + pi / group;
            let h = kvh * group + pi % group;
            let li = (b * p.q_len + row) * p.q_heads + h;
            let qb = li * d;
            var s = 0.0;
            var dp = 0.0;
            for (var e = 0u; e < d; e++) {
                s += q[qb + e] * k[kb + e];
                dp += dout[qb + e] * v[kb + e];
            }
            pr = exp(p.scale * s - lse[li]);
            ds = pr * (dp - delta[li]) * p.scale;
        }
        p_tile[t] = pr;
        ds_tile[t] = ds;
        workgroupBarrier();
        let count = min(WG, pairs - c0);
        for (var c = 0u; c < PER; c++) {
            let e = t + c * WG;
            if (e < d) {
                var ak = dka[c];
                var av = dva[c];
                for (var pp = 0u; pp < count; pp++) {
                    let pj = c0 + pp;
                    let row = t0 + pj / group;
                    let h = kvh * group + pj % group;
                    let qb = ((b * p.q_len + row) * p.q_heads + h) * d;
                    ak += ds_tile[pp] * q[qb + e];
                    av += p_tile[pp] * dout[qb + e];
                }
                dka[c] = ak;
                dva[c] = av;
            }
        }
        workgroupBarrier();
    }
    for (var c = 0u; c < PER; c++) {
        let e = t + c * WG;
        if (e < d) {
            dk[kb + e] = dka[c];
            dv[kb + e] = dva[c];
        }
    }
}
