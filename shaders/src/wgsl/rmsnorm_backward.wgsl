// RMSNorm backward. Twin of the reference backward in core/src/ops/rmsnorm.rs.
//   mode 0, one workgroup per row:   dinp = rstd * (w * dout - xhat * mean(w * dout * xhat))
//   mode 1, one invocation a column: dweight[i] += sum_r dout[r, i] * xhat[r, i], rows in
//           order, so the sum runs as the reference's does and needs no atomics.

const WG: u32 = 64u;
var<workgroup> part: array<f32, WG>;

fn row_pass(r: u32, t: u32) {
    let base = r * p.dim;
    let s = rstd[r];
    var acc = 0.0;
    for (var i = t; i < p.dim; i += WG) {
        acc += weight[i] * dout[base + i] * inp[base + i] * s;
    }
    part[t] = acc;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h = h / 2u) {
        if (t < h) { part[t] += part[t + h]; }
        workgroupBarrier();
    }
    let mean = part[0] / f32(p.dim);
    for (var i = t; i < p.dim; i += WG) {
        let xhat = inp[base + i] * s;
        dinp[base + i] = s * (weight[i] * dout[base + i] - xhat * mean);
    }
}

fn column_pass(i: u32) {
    if (i < p.dim) {
        var acc = dweight[i];
        for (var r = 0u; r < p.rows; r++) {
            acc += dout[r * p.dim + i] * (inp[r * p.dim + i] * rstd[r]);
        }
        dweight[i] = acc;
    }
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let g = wid.x + wid.y * nwg.x;
    if (p.mode == 0u) {
        if (g < p.rows) { row_pass(g, t); }
    } else {
        column_pass(g * WG + t);
    }
}
