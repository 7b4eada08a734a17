// C = alpha * op(A) op(B) + beta * C, f32, batched, with transposes and element offsets,
// register-tiled: each invocation computes a 4 x 4 block of C (a workgroup of 8 x 8 covers
// 32 x 32), so every value loaded serves four multiply-adds instead of one. No workgroup
// memory and no barriers (cheap on lavapipe as on GPUs). Each output still sums over t in
// order, exactly as matmul.wgsl and the reference do. Taken for products of at least
// 16 output columns; twin of rusting_brain_core::ops::matmul::matmul (f32 and bf16
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
    let j0 = gid.x * 4u;
    let i0 = gid.y * 4u;
    let z = gid.z;
    if (i0 >= p.m || j0 >= p.n || z >= p.batch) { return; }
    let ab = p.a0 + z * p.m * p.k;
    let bb = p.b0 + z * p.k * p.n;
    // op(A)[i, t] = a[ab + i * ai + t * at]; op(B)[t, j] = b[bb + t * bt + j * bj].
    var ai = p.k;
    var at = 1u;
    if (p.trans_a != 0u) { ai = 1u; at = p.m; }
    var bt = p.n;
    var bj = 1u;
    if (p.trans_b != 0u) { bt = 1u; bj = p.k; }
    // Rows and columns past the edge read the last valid one and are not written.
    var ra: array<u32, 4>;
    var cb: array<u32, 4>;
    for (var r = 0u; r < 4u; r++) {
        ra[r] = ab + min(i0 + r, p.m - 1u) * ai;
        cb[r] = bb + min(j0 + r, p.n - 1u) * bj;
    }
    var acc: array<vec4<f32>, 4>;
    for (var t = 0u; t < p.k; t++) {
        var y = vec4<f32>(b[cb[0] + t * bt], b[cb[1] + t * bt], b[cb[2] + t * bt], b[cb[3] + t * bt]);
        if (p.bf16 != 0u) { y = vec4<f32>(bf16(y.x), bf16(y.y), bf16(y.z), bf16(y.w)); }
        for (var r = 0u; r < 4u; r++) {
            var x = a[ra[r] + t * at];
            if (p.bf16 != 0u) { x = bf16(x); }
            acc[r] += x * y;
        }
    }
    for (var r = 0u; r < 4u; r++) {
        let i = i0 + r;
        if (i < p.m) {
            for (var s = 0u; s < 4u; s++) {
                let j = j0 + s;
                if (j < p.n) {
                    let o = p.c0 + z * p.m * p.n + i * p.n + j;
                    let v = acc[r][s];
                    if (p.beta == 0.0) { c[o] = p.alpha * v; } else { c[o] = p.alpha * v + p.beta * c[o]; }
                }
            }
        }
    }
}
