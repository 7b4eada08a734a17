// Embedding backward (also the mixture-of-experts scatter-add), deterministic and without
// atomics: the host groups the positions by id, and one invocation per (distinct id,
// column) adds that id's rows of dout in position order, the reference's order.
// `groups` holds [ids (n_ids)] [offsets (n_ids + 1)] [positions (rows)].
// Twin of rusting_brain_core::ops::embedding::embedding_backward.

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.n_ids * p.dim) { return; }
    let u = i / p.dim;
    let c = i % p.dim;
    let id = groups[u];
    let first = groups[p.n_ids + u];
    let last = groups[p.n_ids + u + 1u];
    let positions = 2u * p.n_ids + 1u;
    var acc = dtable[id * p.dim + c];
    for (var s = first; s < last; s++) {
        acc += dout[groups[positions + s] * p.dim + c];
    }
    dtable[id * p.dim + c] = acc;
}
