// Causal GQA attention backward, query side: one workgroup per query row (b, t, h).
// delta = dout . out; for the visible keys, 64 at a time, each thread recomputes one key's
// probability p = exp(scale q.k - lse) and ds = p (dout.v - delta) scale into workgroup
// memory, then the threads (over the head's dimensions) add ds k to dq, keys in order.
// Nothing T x T is stored: the key-side pass recomputes p and ds from q, k, v, lse and the
// delta written here. Twin of rusting_brain_core::ops::attention::attention_backward.
// Params, p, q, k, v and the rest of the bindings: ATTENTION_PARAMS and kernel! in ops/attention.rs.

const WG: u32 = 64u;
// Head sizes up to 4 * WG: each thread keeps up to four of the row's dimensions.
const PER: u32 = 4u;
var<workgroup> part: array<f32, WG>;
var<workgroup> ds_tile: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let item = wid.x + wid.y * nwg.x; // (b, row, h)
    if (item >= p.batch * p.q_len * p.q_heads) { return; }
    let h = item % p.q_heads;
    let bt = item / p.q_heads;
    let row = bt % p.q_len;
    let b = bt / p.q_len;
    let d = p.head_dim;
    let kvh = h / (p.q_heads / p.kv_heads);
    let n = p.kv_len - p.q_len + row + 1u;
    let qb = item * d;

    var acc = 0.0;
    for (var e = t; e < d; e += WG) { acc += dout[qb + e] * out[qb + e]; }
    part[t] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if (t < s) { part[t] += part[t + s]; }
        workgroupBarrier();
    }
    let dl = part[0];
    if (t == 0u) { delta[item] = dl; }
    let l = lse[item];

    var dqa = array<f32, PER>(0.0, 0.0, 0.0, 0.0);
    for (var j0 = 0u; j0 < n; j0 += WG) {
        let j = j0 + t;
        var ds = 0.0;
        if (j < n) {
            let kb = ((b * p.kv_capacity + j) * p.kv_heads + kvh) * d;
            var s = 0.0;
            var dp = 0.0;
            for (var e = 0u; e < d; e++) {
                s += q[qb + e] * k[kb + e];
                dp += dout[qb + e] * v[kb + e];
            }
            let pr = exp(p.scale * s - l);
            ds = pr * (dp - dl) * p.scale;
        }
        ds_tile[t] = ds;
        workgroupBarrier();
        let count = min(WG, n - j0);
        for (var c = 0u; c < PER; c++) {
            let e = t + c * WG;
            if (e < d) {
                var a = dqa[c];
                for (var jj = 0u; jj < count; jj++) {
                    a += ds_tile[jj] * k[((b * p.kv_capacity + j0 + jj) * p.kv_heads + kvh) * d + e];
                }
                dqa[c] = a;
            }
        }
        workgroupBarrier();
    }
    for (var c = 0u; c < PER; c++) {
        let e = t + c * WG;
        if (e < d) { dq[qb + e] = dqa[c]; }
    }
}
