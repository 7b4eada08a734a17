// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). Twin of rusting_brain_core::ops::swiglu.
struct Params { len: u32, pad0: u32, pad1: u32, pad2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if (i >= p.len) { return; }
    let g = gate[i];
    out[i] = g / (1.0 + exp(-g)) * up[i];
}
