// SwiGLU backward: dgate = dout * up * silu'(gate), dup = dout * silu(gate), with
// silu'(g) = s (1 + g (1 - s)) and s the two-branch sigmoid. Twin of
// rusting_brain_core::ops::swiglu::swiglu_backward.

fn sigmoid(v: f32) -> f32 {
    if (v >= 0.0) { return 1.0 / (1.0 + exp(-v)); }
    let e = exp(v);
    return e / (1.0 + e);
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.len) { return; }
    let g = gate[i];
    let s = sigmoid(g);
    dgate[i] = dout[i] * up[i] * (s * (1.0 + g * (1.0 - s)));
    dup[i] = dout[i] * (g * s);
}
