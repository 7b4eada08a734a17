// Softmax cross-entropy over rows of logits, one workgroup per row: the row's loss
// lse - logit[target] into `loss`, and with `grad` the row overwritten by
// scale * (softmax - onehot); a row whose target is NOT_COUNTED gets loss 0 and, with
// `grad`, a zero gradient. The host sums the losses in f64.
// Twin of rusting_brain_core::ops::cross_entropy::cross_entropy.
// Joined after prelude/reduce.wgsl (WG, part, reduce_max, reduce_sum).

const NOT_COUNTED: u32 = 0xffffffffu;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let r = wid.x + wid.y * nwg.x;
    if (r >= p.rows) { return; }
    let base = r * p.vocab;
    var m = -3.40282346e38; // -f32::MAX (3.4028235e38 rounds past it and Tint refuses it)
    for (var i = t; i < p.vocab; i += WG) { m = max(m, logits[base + i]); }
    let mx = reduce_max(t, m);
    var s = 0.0;
    for (var i = t; i < p.vocab; i += WG) { s += exp(logits[base + i] - mx); }
    let lse = mx + log(reduce_sum(t, s));
    let tgt = targets[r];
    let counted = tgt != NOT_COUNTED;
    var row_loss = 0.0;
    if (counted) { row_loss = lse - logits[base + tgt]; }
    // Every thread has read the target's logit before any thread overwrites the row.
    storageBarrier();
    workgroupBarrier();
    if (t == 0u) { loss[r] = row_loss; }
    if (p.grad == 1u) {
        for (var i = t; i < p.vocab; i += WG) {
            var g = 0.0;
            if (counted) {
                var y = 0.0;
                if (i == tgt) { y = 1.0; }
                g = p.scale * (exp(logits[base + i] - lse) - y);
            }
            logits[base + i] = g;
        }
    }
}
