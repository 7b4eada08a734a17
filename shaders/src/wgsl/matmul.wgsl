// C = alpha * op(A) op(B) + beta * C, f32, batched, with transposes and element offsets
// (MatmulSpec's window). One invocation per output element, no barriers: dense networks'
// products are small, and on lavapipe barriers cost more than the reuse a tile would buy.
// Twin of rusting_brain_core::ops::matmul::matmul (f32 and bf16
// precision).

// f32 rounded to bfloat16 and back, to nearest even, NaN kept NaN: core's round_bf16, the
// operands of a mixed-precision product (Precision::Bf16; accumulation stays f32).
fn bf16(x: f32) -> f32 {
    let u = bitcast<u32>(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) { return bitcast<f32>((u | 0x00400000u) & 0xffff0000u); }
    return bitcast<f32>((u + 0x7fffu + ((u >> 16u) & 1u)) & 0xffff0000u);
}

@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    let i = gid.y;
    let z = gid.z;
    if (i >= p.m || j >= p.n || z >= p.batch) { return; }
    let ab = p.a0 + z * p.m * p.k;
    let bb = p.b0 + z * p.k * p.n;
    var acc = 0.0;
    for (var t = 0u; t < p.k; t++) {
        // op(A)[i, t]: A stored (m, k), or (k, m) when transposed.
        var x: f32;
        if (p.trans_a == 0u) { x = a[ab + i * p.k + t]; } else { x = a[ab + t * p.m + i]; }
        // op(B)[t, j]: B stored (k, n), or (n, k) when transposed.
        var y: f32;
        if (p.trans_b == 0u) { y = b[bb + t * p.n + j]; } else { y = b[bb + j * p.k + t]; }
        if (p.bf16 != 0u) { x = bf16(x); y = bf16(y); }
        acc += x * y;
    }
    let o = p.c0 + z * p.m * p.n + i * p.n + j;
    if (p.beta == 0.0) { c[o] = p.alpha * acc; } else { c[o] = p.alpha * acc + p.beta * c[o]; }
}
