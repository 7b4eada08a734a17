//! `q8_matmul` (the byte-lane form every backend and the browser's CPU path run) against
//! its definition written out element by element: int8 activations, the exact integer
//! sum over `q8_at`, one scale product. Equal bit for bit on awkward shapes, for rows of
//! every sign and with beta.

use rusting_brain_core::ops::q8::{packed_cols, q8_at, q8_matmul, quantize_activations, quantize_rows};
use rusting_brain_core::Rng;

#[allow(clippy::too_many_arguments)]
fn definition(
    x: &[f32], packed: &[f32], scales: &[f32], m: usize, n: usize, k: usize, beta: f32, out: &mut [f32],
) {
    let pc = packed_cols(k);
    for i in 0..m {
        let (xq, sx) = quantize_activations(&x[i * k..(i + 1) * k]);
        for j in 0..n {
            let row = &packed[j * pc..(j + 1) * pc];
            let acc: i32 = (0..k).map(|c| q8_at(row, c) as i32 * xq[c] as i32).sum();
            let v = acc as f32 * sx * scales[j];
            out[i * n + j] = if beta == 0.0 { v } else { v + beta * out[i * n + j] };
        }
    }
}

#[test]
fn byte_lanes_equal_the_definition_bit_for_bit() {
    let mut rng = Rng::new(11);
    for &(m, n, k) in
        &[(1, 1, 1), (1, 3, 3), (3, 7, 7), (2, 33, 33), (1, 127, 127), (4, 5, 1000), (1, 2, 4096)]
    {
        let w: Vec<f32> = (0..n * k).map(|_| rng.normal() as f32 * 0.5).collect();
        let mut x: Vec<f32> = (0..m * k).map(|_| rng.normal() as f32 * 3.0).collect();
        // Saturating rows: the largest activation at both ends of int8.
        x[0] = 1e3;
        if m > 1 {
            x[k] = -1e3;
        }
        let (packed, scales) = quantize_rows(&w, n, k).unwrap();
        for beta in [0.0f32, 0.5] {
            let init: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.25 - 1.0).collect();
            let (mut got, mut want) = (init.clone(), init);
            q8_matmul(&mut got, &x, &packed, &scales, m, n, k, beta).unwrap();
            definition(&x, &packed, &scales, m, n, k, beta, &mut want);
            let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "m {m} n {n} k {k} beta {beta}: {got:?} vs {want:?}");
        }
    }
}
