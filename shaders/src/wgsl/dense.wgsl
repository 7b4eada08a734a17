// The element-wise and per-row parts of dense layers, picked by `op`:
//   0 add_bias:        out[r, c] += bias[c]                       (one invocation per element)
//   1 bias_backward:   dbias[c] += sum_r dout[r, c]               (one per column, rows in order)
//   2 act forward:     out = f(inp)                               (per element; softmax per row)
//   3 act backward:    dinp = f'(inp) * dout                      (per element; softmax per row)
//   4 loss_backward:   dpred = d loss / d pred / divisor
//   5 fused_output:    dlogits = (pred - target) / divisor
//   6 fill: x = alpha;  7 scale: x *= alpha;  8 axpy: y += alpha * x
// Activation codes: 0 identity, 1 relu, 2 leaky relu (slope alpha), 3 sigmoid, 4 tanh,
// 5 softmax. Loss codes: 0 MSE, 1 binary cross-entropy, 2 categorical cross-entropy.
// Twins: rusting_brain_core::ops::{activation, loss, softmax, elementwise}.

// Roles by op: (x0, x1, x2, y) =
//   add_bias (bias, -, -, out); bias_backward (dout, -, -, dbias);
//   act fwd (inp, -, -, out); act bwd (dout, inp, out, dinp);
//   loss/fused (pred, target, -, dpred); fill/scale (-, -, -, x); axpy (x, -, -, y).

fn sigmoid(v: f32) -> f32 {
    // Both branches stay in range, as the reference's sigmoid.
    if (v >= 0.0) { return 1.0 / (1.0 + exp(-v)); }
    let e = exp(v);
    return e / (1.0 + e);
}

fn act(v: f32) -> f32 {
    switch p.code {
        case 1u: { return max(v, 0.0); }
        case 2u: { if (v > 0.0) { return v; } return p.alpha * v; }
        case 3u: { return sigmoid(v); }
        case 4u: { return tanh(v); }
        default: { return v; }
    }
}

fn dact(dout: f32, inp: f32, out: f32) -> f32 {
    switch p.code {
        case 1u: { if (inp > 0.0) { return dout; } return 0.0; }
        case 2u: { if (inp > 0.0) { return dout; } return p.alpha * dout; }
        case 3u: { return dout * out * (1.0 - out); }
        case 4u: { return dout * (1.0 - out * out); }
        default: { return dout; }
    }
}

fn ln_floor(v: f32) -> f32 { return max(log(v), -100.0); }

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    let n = p.rows * p.cols;
    let per_row = (p.op == 2u || p.op == 3u) && p.code == 5u;
    if (p.op == 1u) {
        if (i >= p.cols) { return; }
        var s = 0.0;
        for (var r = 0u; r < p.rows; r++) { s += x0[r * p.cols + i]; }
        y[i] += s;
        return;
    }
    if (per_row) {
        if (i >= p.rows) { return; }
        let base = i * p.cols;
        if (p.op == 2u) {
            var m = -3.40282346e38; // -f32::MAX (3.4028235e38 rounds past it and Tint refuses it)
            for (var c = 0u; c < p.cols; c++) { m = max(m, x0[base + c]); }
            var s = 0.0;
            for (var c = 0u; c < p.cols; c++) { let e = exp(x0[base + c] - m); y[base + c] = e; s += e; }
            let inv = 1.0 / s;
            for (var c = 0u; c < p.cols; c++) { y[base + c] *= inv; }
        } else {
            var dot = 0.0;
            for (var c = 0u; c < p.cols; c++) { dot += x0[base + c] * x2[base + c]; }
            for (var c = 0u; c < p.cols; c++) { y[base + c] = x2[base + c] * (x0[base + c] - dot); }
        }
        return;
    }
    if (i >= n) { return; }
    switch p.op {
        case 0u: { y[i] += x0[i % p.cols]; }
        case 2u: { y[i] = act(x0[i]); }
        case 3u: { y[i] = dact(x0[i], x1[i], x2[i]); }
        case 4u: {
            let pr = x0[i];
            let t = x1[i];
            var g: f32;
            switch p.code {
                case 0u: { g = 2.0 * (pr - t); }
                case 1u: { g = (pr - t) / max(pr * (1.0 - pr), 1e-12); }
                default: { g = -t / max(pr, 1e-12); }
            }
            y[i] = p.inv * g;
        }
        case 5u: { y[i] = (x0[i] - x1[i]) * p.inv; }
        case 6u: { y[i] = p.alpha; }
        case 7u: { y[i] *= p.alpha; }
        case 8u: { y[i] += p.alpha * x0[i]; }
        default: {}
    }
}
