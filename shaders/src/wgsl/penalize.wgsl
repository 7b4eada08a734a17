// The CTRL / Hugging Face repetition penalty on one row of logits, in place: each id of
// the context (the host passes each once, and only ids inside the vocabulary) has its
// logit divided by the penalty when positive, multiplied when not.
// Twin of rusting_brain_core::Sampler::penalized.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= p.n_ids) { return; }
    let id = ids[i];
    let x = logits[id];
    if (x > 0.0) { logits[id] = x / p.penalty; } else { logits[id] = x * p.penalty; }
}
