// Mixture-of-experts routing on the device, one invocation per token: softmax over the
// router logits, top-k by repeated selection (ties to the lower index), weights renormalized
// over the chosen k when asked. Writes each slot's expert and weight in rank order.
// Twin of rusting_brain_core::ops::moe::Routing::route (which works in f64; here f32, so
// weights agree to ~1e-7 and the choice only differs on near-ties).

const MAX_EXPERTS: u32 = 256u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    if (t >= p.rows) { return; }
    let e_n = p.n_experts;
    let base = t * e_n;
    var prob: array<f32, MAX_EXPERTS>;
    var m = logits[base];
    for (var i = 1u; i < e_n; i++) { m = max(m, logits[base + i]); }
    var sum = 0.0;
    for (var i = 0u; i < e_n; i++) {
        let e = exp(logits[base + i] - m);
        prob[i] = e;
        sum += e;
    }
    for (var i = 0u; i < e_n; i++) { prob[i] = prob[i] / sum; }
    // Chosen experts are marked by a negative probability (all real ones are >= 0).
    var norm = 0.0;
    for (var s = 0u; s < p.top_k; s++) {
        var best = 0u;
        var bv = -1.0;
        for (var i = 0u; i < e_n; i++) {
            if (prob[i] > bv) { bv = prob[i]; best = i; }
        }
        expert[t * p.top_k + s] = best;
        weight[t * p.top_k + s] = bv;
        norm += bv;
        prob[best] = -2.0;
    }
    if (p.renormalize == 1u) {
        for (var s = 0u; s < p.top_k; s++) {
            weight[t * p.top_k + s] = weight[t * p.top_k + s] / norm;
        }
    }
}
