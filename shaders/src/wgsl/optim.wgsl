// One optimizer step per element. op 0: Adam/AdamW (constants formed on the host, as
// core's AdamConstants); op 1: SGD, with momentum when `momentum` > 0 (PyTorch semantics,
// no dampening), Nesterov when `nesterov` is 1. Twin of rusting_brain_core::ops::optim.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.len) { return; }
    if (p.op == 0u) {
        var g = grad[i] * p.grad_scale;
        if (p.decoupled == 1u) {
            param[i] *= 1.0 - p.lr * p.weight_decay;
        } else {
            g += p.weight_decay * param[i];
        }
        m[i] = p.beta1 * m[i] + p.one_minus_beta1 * g;
        v[i] = p.beta2 * v[i] + p.one_minus_beta2 * g * g;
        let denom = sqrt(v[i]) / p.bc2_sqrt + p.eps;
        param[i] -= p.step_size * m[i] / denom;
    } else {
        let g = grad[i] * p.grad_scale + p.weight_decay * param[i];
        if (p.momentum > 0.0) {
            m[i] = p.momentum * m[i] + g;
            var d = m[i];
            if (p.nesterov == 1u) { d = g + p.momentum * m[i]; }
            param[i] -= p.lr * d;
        } else {
            param[i] -= p.lr * g;
        }
    }
}
