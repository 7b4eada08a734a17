// Causal GQA attention forward over a KV cache, one workgroup per (query row, head):
// scores into a scratch row, max, exp and sum, then the weighted sum of values with the
// head's dimensions spread over the threads; writes the log-sum-exp like the CPU.
// Layouts as rusting_brain_core::ops::attention (its twin): q/out (batch, q_len, q_heads, d),
// k/v (batch, kv_capacity, kv_heads, d), lse (batch, q_len, q_heads).
// Params and the bindings come from kernel! in ops/attention.rs; joined after prelude/reduce.wgsl (WG,
// part, reduce_max, reduce_sum).

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
    let sb = item * p.kv_capacity;
    var m = -3.40282346e38; // -f32::MAX (3.4028235e38 rounds past it and Tint refuses it)
    for (var j = t; j < n; j += WG) {
        let kb = ((b * p.kv_capacity + j) * p.kv_heads + kvh) * d;
        var acc = 0.0;
        for (var e = 0u; e < d; e++) { acc += q[qb + e] * k[kb + e]; }
        let s = acc * p.scale;
        scores[sb + j] = s;
        m = max(m, s);
    }
    let mx = reduce_max(t, m);
    var sum = 0.0;
    for (var j = t; j < n; j += WG) {
        let e = exp(scores[sb + j] - mx);
        scores[sb + j] = e;
        sum += e;
    }
    let total = reduce_sum(t, sum);
    // Every thread's scores must be visible before any thread reads them all.
    storageBarrier();
    workgroupBarrier();
    let inv = 1.0 / total;
    for (var e = t; e < d; e += WG) {
        var acc = 0.0;
        for (var j = 0u; j < n; j++) {
            acc += scores[sb + j] * v[((b * p.kv_capacity + j) * p.kv_heads + kvh) * d + e];
        }
        out[qb + e] = acc * inv;
    }
    if (t == 0u) { lse[item] = mx + log(total); }
}
