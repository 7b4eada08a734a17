// Prelude joined before the int8 kernels: core's rounding (half away from zero; WGSL's
// round() goes to even) and the product of four int8 weights with four 13-bit activations.

// v * inv rounded half away from zero and clamped to [-lim, lim]; a NaN becomes 0 there
// as in core (the clamp keeps it, the conversion makes it 0 on the devices tested).
fn round_away(v: f32, inv: f32, lim: f32) -> i32 {
    let y = v * inv;
    var t = trunc(y);
    if (abs(y - t) >= 0.5) { t += sign(y); }
    return i32(clamp(t, -lim, lim));
}

// The four 13-bit activations packed two to a word in `x0` (values 0, 1, low half first)
// and `x1` (values 2, 3), sign-extended.
fn wide4(x0: u32, x1: u32) -> vec4<i32> {
    return vec4<i32>(bitcast<i32>(x0 << 16u) >> 16u, bitcast<i32>(x0) >> 16u,
                     bitcast<i32>(x1 << 16u) >> 16u, bitcast<i32>(x1) >> 16u);
}

// The four int8 weights packed in `w` against four 13-bit activations (`wide4`): exact in i32.
fn dot_wide(w: u32, x0: u32, x1: u32) -> i32 {
    return dot(unpack4xI8(w), wide4(x0, x1));
}

