// One optimizer step per element. op 0: Adam/AdamW (constants formed on the host, as
// core's AdamConstants); op 1: SGD, with momentum when `momentum` > 0 (PyTorch semantics,
// no dampening), Nesterov when `nesterov` is 1. Twin of rusting_brain_core::ops::optim.
struct Params {
    op: u32, len: u32, decoupled: u32, nesterov: u32,
    lr: f32, beta1: f32, beta2: f32, one_minus_beta1: f32,
    one_minus_beta2: f32, eps: f32, weight_decay: f32, grad_scale: f32,
    step_size: f32, bc2_sqrt: f32, momentum: f32, pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> m: array<f32>;
@group(0) @binding(4) var<storage, read_write> v: array<f32>;

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
