// Prelude of the register-tiled quantized products: an invocation's 4 x 4 outputs, rows
// i0 + 4 lid.y.. and columns j0 + 4 lid.x.., written into columns p.j0.. of rows of
// p.out_n (+ p.beta times what is there), those past the matrix skipped.
fn store_tile(total: array<array<f32, 4>, 4>, i0: u32, j0: u32, lid: vec3<u32>) {
    for (var a = 0u; a < 4u; a++) {
        let i = i0 + lid.y * 4u + a;
        if (i >= p.m) { continue; }
        for (var b = 0u; b < 4u; b++) {
            let j = j0 + lid.x * 4u + b;
            if (j >= p.n) { continue; }
            let v = total[a][b];
            let o = i * p.out_n + p.j0 + j;
            if (p.beta == 0.0) { out[o] = v; } else { out[o] = v + p.beta * out[o]; }
        }
    }
}
