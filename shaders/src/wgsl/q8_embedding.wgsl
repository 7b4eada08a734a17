// out[r] = int8 row ids[r] of the table times its scales (p.blocks a row of p.block
// values; one a row for per-row tables). Ids are checked on the host.
// Twin of rusting_brain_core::ops::q8::q8_embedding.
// A table split into row slabs is gathered one slab per call: ids in [id0, id0 + slab_rows)
// are this call's, the rest are left to the others (vocab is the whole table's).

// NaN's bits, read at run time: Tint (the browser's compiler) refuses a constant
// expression that evaluates to NaN or infinity.
var<private> NAN_BITS: u32 = 0x7fc00000u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    if (idx >= p.rows * p.dim) { return; }
    let r = idx / p.dim;
    let c = idx % p.dim;
    let id = ids[r];
    if (id >= p.vocab) {
        out[idx] = bitcast<f32>(NAN_BITS); // NaN: never a silent wrong row
        return;
    }
    if (id < p.id0 || id >= p.id0 + p.slab_rows) { return; }
    let local = id - p.id0;
    let word = unpack4xI8(table[local * p.packed_cols + c / 4u]);
    out[idx] = f32(word[c % 4u]) * scales[local * p.blocks + c / p.block];
}
