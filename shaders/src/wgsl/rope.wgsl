// Rotary position embedding in place over x (batch, seq, heads, head_dim), pairs (i, i + half).
// cos/sin come from a table built on the host per position (cos[half] then sin[half]), the
// same f32 values the CPU uses: a GPU's cos of a large angle is only specified to ~2^-11.
// Twin of rusting_brain_core::ops::rope.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = p.head_dim / 2u;
    let idx = gid.x + gid.y * nwg.x * 64u;
    // idx runs over (row, head, i < half).
    if (idx >= p.rows * p.heads * half) { return; }
    let i = idx % half;
    let rh = idx / half;
    let row = rh / p.heads;
    let pos = p.pos_offset + row % p.seq;
    let c = table[pos * p.head_dim + i];
    let s = table[pos * p.head_dim + half + i] * p.sign;
    let at = rh * p.head_dim + i;
    let a = x[at];
    let b = x[at + half];
    x[at] = a * c - b * s;
    x[at + half] = b * c + a * s;
}
