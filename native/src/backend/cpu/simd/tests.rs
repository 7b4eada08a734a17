//! The SIMD kernels against their plain twins, on every path this CPU has.

use super::*;

#[test]
fn quantize_i8_matches_the_reference_bit_for_bit() {
    use rusting_brain_core::ops::q8::quantize_activations;
    let mut rng = rusting_brain_core::Rng::new(7);
    // One buffer through every length, longer and shorter than the last.
    let mut kept = vec![99i8; 2000];
    for n in [0usize, 1, 3, 15, 16, 17, 33, 127, 1000, 256] {
        let mut x: Vec<f32> = (0..n).map(|_| rng.normal() as f32 * 3.0).collect();
        if n >= 16 {
            // Exact ties after scaling by 127 / absmax = 1: x.5 rounds away from zero,
            // and the largest float below one half rounds to zero.
            x[0] = 127.0;
            x[1] = 2.5;
            x[2] = -2.5;
            x[3] = 0.5;
            x[4] = -0.5;
            x[5] = 0.49999997;
            x[6] = -0.0;
            x[7] = f32::NAN;
            x[n - 1] = -1.5;
        }
        let want = quantize_activations(&x);
        assert_eq!(quantize_i8(&x), want, "n = {n}");
        let scale = quantize_i8_into(&x, &mut kept);
        assert_eq!((kept.clone(), scale), want, "n = {n}, kept buffer");
    }
    // Every value tiny enough that 1 / scale overflows to infinity.
    let tiny = [1e-40f32, -3e-41, 0.0, 2e-45].repeat(5);
    assert_eq!(quantize_i8(&tiny), quantize_activations(&tiny));
}

#[test]
fn fast_exp_is_within_two_ulp_of_libm_over_the_range() {
    let mut worst = 0.0f64;
    let mut x = -87.0f32;
    while x < 88.5 {
        let want = (x as f64).exp();
        let got = exp(x) as f64;
        worst = worst.max(((got - want) / want).abs());
        x += 0.001_37;
    }
    assert!(worst < 3e-7, "worst relative error {worst:e}");
    assert_eq!(exp(-100.0), 0.0);
    assert_eq!(exp(100.0), f32::INFINITY);
    assert!(exp(f32::NAN).is_nan());
    assert_eq!(exp(0.0), 1.0);
    // The same edge values through the vectorized loops (a NaN lane must not disturb
    // its neighbours, and the range bounds hold per lane).
    let edges =
        [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 100.0, -100.0, 88.72, 88.73, -87.33, -87.34, 0.5, -0.0];
    for n in [11, 16, 40, 64, 100] {
        let v: Vec<f32> = (0..n).map(|i| edges[i % edges.len()] + (i / edges.len()) as f32 * 0.25).collect();
        // Through each of the three exp loops.
        let (mut a, mut b, mut c) = (v.clone(), v.clone(), v.clone());
        exp_affine(&mut a, 1.0, 0.0);
        exp_affine_sum(&mut b, 1.0, 0.0);
        exp_sub_sum(&mut c, 0.0);
        for (name, got) in [("exp_affine", &a), ("exp_affine_sum", &b), ("exp_sub_sum", &c)] {
            for (i, (&g, &x)) in got.iter().zip(&v).enumerate() {
                let want = exp(x);
                assert!(
                    g == want || (g.is_nan() && want.is_nan()),
                    "{name}, n {n} at {i}: exp({x}) = {g}, want {want}"
                );
            }
        }
    }
}

#[test]
fn max_propagates_nan_and_handles_tails() {
    let mut v: Vec<f32> = (0..37).map(|i| i as f32).collect();
    assert_eq!(max(&v), 36.0);
    v[20] = f32::NAN;
    assert!(max(&v).is_nan());
    assert_eq!(max(&[]), f32::NEG_INFINITY);
}

/// The max at every tail length around the vector and step widths, wherever the largest
/// value sits, and a NaN anywhere.
#[test]
fn max_is_the_largest_at_every_length() {
    let mut rng = rusting_brain_core::Rng::new(12);
    for n in (1..=140).chain([257, 1000]) {
        let v: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
        let want = v.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
        assert_eq!(max(&v), want, "n = {n}");
        for at in [0, n / 2, n - 1] {
            let mut w = v.clone();
            w[at] = f32::NAN;
            assert!(max(&w).is_nan(), "n = {n}, NaN at {at}");
        }
    }
}

/// The attention's row helpers give the same bits as their definitions on every path:
/// the scores as `scale * dot` with `dot_rows_body`'s one chain per key, the weighted sum
/// as one `axpy` per row in order, the exps' sum as 64-wide chunks then the tail in
/// order; head widths on and off the 16-lane multiple, key counts around the passes.
#[test]
fn attention_row_helpers_match_their_definitions_bit_for_bit() {
    let mut rng = rusting_brain_core::Rng::new(13);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for d in [16usize, 24, 32, 48, 64, 80, 128] {
        for keys in [1usize, 3, 4, 7, 80, 131] {
            let stride = 2 * d + 5;
            let q: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
            let rows: Vec<f32> = (0..keys * stride).map(|_| rng.normal() as f32).collect();
            let mut got = vec![0.0f32; keys];
            dot_rows(&mut got, &q, &rows, stride, 0.17);
            let mut want = vec![0.0f32; keys];
            dot_rows_body::<true>(&mut want, &q, &rows, stride, 0.17);
            if isa() == Isa::Baseline {
                dot_rows_body::<BASE_FMA>(&mut want, &q, &rows, stride, 0.17);
            }
            assert_eq!(bits(&got), bits(&want), "scores, d {d}, {keys} keys");
            for (j, w) in want.iter().enumerate() {
                let plain: f64 = q.iter().zip(&rows[j * stride..]).map(|(&a, &b)| a as f64 * b as f64).sum();
                assert!((*w as f64 - 0.17 * plain).abs() < 1e-5 * (1.0 + plain.abs()), "score {j}");
            }

            let p: Vec<f32> = (0..keys).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
            let mut got: Vec<f32> = (0..d).map(|_| rng.normal() as f32).collect();
            let start = got.clone();
            let mut want = got.clone();
            axpy_rows(&mut got, &p, 0.3, &rows, stride);
            for (j, &pj) in p.iter().enumerate() {
                axpy(&mut want, pj * 0.3, &rows[j * stride..j * stride + d]);
            }
            assert_eq!(bits(&got), bits(&want), "weighted sum, d {d}, {keys} keys");
            for (i, w) in want.iter().enumerate() {
                let plain: f64 = start[i] as f64
                    + p.iter()
                        .enumerate()
                        .map(|(j, &pj)| (pj * 0.3) as f64 * rows[j * stride + i] as f64)
                        .sum::<f64>();
                assert!(
                    (*w as f64 - plain).abs() < 1e-5 * (1.0 + plain.abs()),
                    "weighted sum {i}, d {d}, {keys} keys: {w} against {plain}"
                );
            }
        }
    }
    // Sums in STEP-wide lanes, folded, then the tail in order.
    let sum_of = |w: &[f32]| {
        let full = w.len() / STEP * STEP;
        let mut acc = [0.0f32; STEP];
        for c in w[..full].chunks_exact(STEP) {
            for l in 0..STEP {
                acc[l] += c[l];
            }
        }
        fold(&acc) + w[full..].iter().fold(0.0f32, |t, &v| t + v)
    };
    for n in (1..=140).chain([1000]) {
        let x: Vec<f32> = (0..n).map(|_| rng.normal() as f32 * 4.0).collect();
        let mut got = x.clone();
        let sum = exp_sub_sum(&mut got, 1.5);
        let want: Vec<f32> = x.iter().map(|&v| exp(v - 1.5)).collect();
        assert_eq!(bits(&got), bits(&want), "exps, n {n}");
        assert_eq!(sum.to_bits(), sum_of(&want).to_bits(), "sum, n {n}");
        // The scaled form: each value scaled, then shifted, then exp'd; summed alike.
        let mut scaled = x.clone();
        let scaled_sum = exp_affine_sum(&mut scaled, 0.7, 1.5);
        let want: Vec<f32> = x.iter().map(|&v| exp(0.7 * v - 1.5)).collect();
        assert_eq!(bits(&scaled), bits(&want), "scaled exps, n {n}");
        assert_eq!(scaled_sum.to_bits(), sum_of(&want).to_bits(), "scaled sum, n {n}");
    }
}

/// The grouped forms against the one-head calls, bit for bit: one to nine heads (runs
/// of four, three, two and one), head widths on and off the 16-lane multiple and past
/// the grouped weighted sum's 64 lanes, key counts around every pass width (16 / H
/// keys) and the 16-key blocks.
#[test]
fn grouped_attention_rows_equal_the_one_head_calls_bit_for_bit() {
    let mut rng = rusting_brain_core::Rng::new(29);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for d in [16usize, 24, 32, 64, 80, 128] {
        for h in 1..=9usize {
            for keys in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 80, 131] {
                let stride = 2 * d + 3;
                let q: Vec<f32> = (0..h * d).map(|_| rng.normal() as f32).collect();
                let rows: Vec<f32> = (0..(keys - 1) * stride + d).map(|_| rng.normal() as f32).collect();
                let mut got = vec![f32::NAN; h * keys];
                dot_rows_heads(&mut got, keys, &q, h, &rows, stride, 0.21);
                let mut want = vec![0.0f32; h * keys];
                for i in 0..h {
                    dot_rows(
                        &mut want[i * keys..(i + 1) * keys],
                        &q[i * d..(i + 1) * d],
                        &rows,
                        stride,
                        0.21,
                    );
                }
                assert_eq!(bits(&got), bits(&want), "scores, {h} heads of {d}, {keys} keys");

                let p: Vec<f32> = (0..h * keys).map(|_| rng.uniform(0.0, 1.0) as f32).collect();
                let inv: Vec<f32> = (0..h).map(|_| rng.uniform(0.1, 1.0) as f32).collect();
                let mut got: Vec<f32> = (0..h * d).map(|_| rng.normal() as f32).collect();
                let mut want = got.clone();
                axpy_rows_heads(&mut got, &p, keys, &inv, &rows, stride);
                for i in 0..h {
                    axpy_rows(
                        &mut want[i * d..(i + 1) * d],
                        &p[i * keys..(i + 1) * keys],
                        inv[i],
                        &rows,
                        stride,
                    );
                }
                assert_eq!(bits(&got), bits(&want), "weighted sums, {h} heads of {d}, {keys} keys");
            }
        }
    }
}

#[test]
fn int8_dot_products_agree_on_every_path_and_length() {
    for n in [0usize, 1, 3, 63, 64, 65, 127, 200, 1000, 4096] {
        let x: Vec<i8> = (0..n).map(|i| ((i * 37 % 255) as i32 - 127) as i8).collect();
        let w: Vec<i8> = (0..n).map(|i| ((i * 91 % 255) as i32 - 127) as i8).collect();
        let want: i32 = x.iter().zip(&w).map(|(&a, &b)| a as i32 * b as i32).sum();
        assert_eq!(dot_i8(&x, &w), want, "n = {n} (vnni: {})", has_vnni());
        assert_eq!(dot_i8_generic(&x, &w), want, "n = {n}, generic");
    }
    // The extremes: -127 x -127 and -127 x 127 over a long row stay exact.
    let x = vec![-127i8; 4096];
    assert_eq!(dot_i8(&x, &x), 4096 * 127 * 127);
    assert_eq!(dot_i8(&x, &vec![127i8; 4096]), -4096 * 127 * 127);
}

/// The decode rows against the plain formula, bit for bit: row counts around the
/// sixteen-row pass, widths around the 64-byte step (a masked last step), a stride
/// past the width (packed rows are padded), both betas, the extremes included.
#[test]
fn decode_rows_match_the_plain_formula_bit_for_bit() {
    for k in [1usize, 5, 63, 64, 65, 130, 256, 704] {
        let stride = k.div_ceil(4) * 4 + 4;
        for n in [0usize, 1, 4, 15, 16, 17, 33, 48, 70] {
            let w: Vec<i8> =
                (0..n * stride).map(|i| ((i * 91 + 13) % 255) as i32 - 127).map(|v| v as i8).collect();
            let mut x: Vec<i8> = (0..k).map(|i| (((i * 37 + 5) % 255) as i32 - 127) as i8).collect();
            if k > 2 {
                x[k - 1] = -127;
            }
            let xsum: i32 = x.iter().map(|&v| v as i32).sum();
            let scales: Vec<f32> = (0..n).map(|j| 1e-3 * (j as f32 + 0.37)).collect();
            let sx = 0.013f32;
            for beta in [0.0f32, 1.0] {
                let init: Vec<f32> =
                    (0..n).map(|j| if beta == 0.0 { f32::NAN } else { j as f32 * 0.1 - 2.0 }).collect();
                let mut got = init.clone();
                let (sums, scales_x) = ([xsum], [sx]);
                let row = Int8Row {
                    q: &x,
                    wide: &[],
                    block: k,
                    sums: &sums,
                    scales: &scales_x,
                    lo: &[],
                    hi: &[],
                    hi_sums: &[],
                    wide_sums: &[],
                };
                q8_rows(&mut got, &row, &w, stride, &scales, beta);
                for j in 0..n {
                    let row = &w[j * stride..j * stride + k];
                    let acc: i32 = x.iter().zip(row).map(|(&a, &b)| a as i32 * b as i32).sum();
                    let v = acc as f32 * sx * scales[j];
                    let want = if beta == 0.0 { v } else { v + beta * init[j] };
                    assert_eq!(
                        got[j].to_bits(),
                        want.to_bits(),
                        "k {k}, n {n}, row {j}, beta {beta} (vnni: {})",
                        has_vnni()
                    );
                }
            }
        }
    }
}

/// A tile's operands of length `n`: four activation rows, four weight rows (row
/// `extreme` all -127) and the activation rows' sums.
fn tile_operands(n: usize, extreme: usize) -> (Vec<Vec<i8>>, Vec<Vec<i8>>, [i32; 4]) {
    let row = |seed: usize| -> Vec<i8> {
        (0..n).map(|i| ((i * seed + seed * 7) % 255) as i32 - 127).map(|v| v as i8).collect()
    };
    let xs: Vec<Vec<i8>> = (0..4).map(|i| row(37 + 2 * i)).collect();
    let mut ws: Vec<Vec<i8>> = (0..4).map(|j| row(91 + 4 * j)).collect();
    ws[extreme].fill(-127);
    let xsums = [0, 1, 2, 3].map(|i| xs[i].iter().map(|&v| v as i32).sum::<i32>());
    (xs, ws, xsums)
}

/// The GEMM tile against the plain sums, on lengths around the 64-byte chunk, the
/// extremes included.
#[test]
fn int8_tile_agrees_with_the_plain_sums() {
    for n in [1usize, 63, 64, 65, 130, 512, 1408] {
        let (xs, ws, xsums) = tile_operands(n, 3);
        let got = dot4x4_i8([&xs[0], &xs[1], &xs[2], &xs[3]], xsums, [&ws[0], &ws[1], &ws[2], &ws[3]]);
        for i in 0..4 {
            for j in 0..4 {
                let want: i32 = xs[i].iter().zip(&ws[j]).map(|(&a, &b)| a as i32 * b as i32).sum();
                assert_eq!(got[i][j], want, "n = {n}, ({i}, {j}) (vnni: {})", has_vnni());
            }
        }
    }
}

/// The tile with its outputs against the plain formula, bit for bit: lengths on and off
/// the 64-byte chunk (the vector stores and the plain ones), both betas (beta 0 must
/// not read the NaN already there), a stride past four with the elements between the
/// tile's rows left as they were, scales that round differently per column.
#[test]
fn int8_tile_outputs_match_the_plain_formula_bit_for_bit() {
    for n in [1usize, 63, 64, 65, 128, 704, 1408] {
        let (xs, ws, xsums) = tile_operands(n, 2);
        let sx = [0.013f32, 0.7, 1e-4, 3.3];
        let scales = [1e-3f32 * 0.37, 0.011, 2.5e-3, 0.9];
        let stride = 7;
        for beta in [0.0f32, 1.0, -0.5] {
            let init: Vec<f32> = (0..3 * stride + 4)
                .map(|e| if beta == 0.0 && e % stride < 4 { f32::NAN } else { e as f32 * 0.1 - 2.0 })
                .collect();
            let mut got = init.clone();
            tile4x4_i8(
                &mut got,
                stride,
                [&xs[0], &xs[1], &xs[2], &xs[3]],
                xsums,
                sx,
                [&ws[0], &ws[1], &ws[2], &ws[3]],
                &scales,
                beta,
            );
            for (e, (g, old)) in got.iter().zip(&init).enumerate() {
                let (u, v) = (e / stride, e % stride);
                let want = if v < 4 {
                    let acc: i32 = xs[u].iter().zip(&ws[v]).map(|(&a, &b)| a as i32 * b as i32).sum();
                    let y = acc as f32 * sx[u] * scales[v];
                    if beta == 0.0 {
                        y
                    } else {
                        y + beta * old
                    }
                } else {
                    *old
                };
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "n {n}, beta {beta}, element ({u}, {v}) (vnni: {})",
                    has_vnni()
                );
            }
        }
    }
}

#[test]
fn dot_matches_a_double_precision_sum_on_odd_lengths() {
    for n in [0usize, 1, 3, 7, 15, 16, 17, 33, 127, 1000] {
        let a: Vec<f32> = (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
        let b: Vec<f32> = (0..n).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.3).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-4, "n = {n}");
    }
}

#[test]
fn wide_rounding_matches_the_plain_loops_bit_for_bit() {
    // The 13-bit activation rows blocked int8 and 4-bit weights meet: values, scales, the
    // byte split and the blocks' sums, on lengths around the 32-value blocks and 64-value
    // steps, with exact ties, NaN, infinities and a block of zeros.
    use rusting_brain_core::ops::q8::{quantize_activations_wide, Q8_BLOCK};
    let mut rng = rusting_brain_core::Rng::new(11);
    let (mut fast, mut plain) = (QuantRow::default(), QuantRow::default());
    for n in [0usize, 1, 5, 16, 17, 31, 32, 33, 63, 64, 65, 100, 576, 1536, 7] {
        let mut x: Vec<f32> = (0..n).map(|_| rng.normal() as f32 * 2.0).collect();
        if n >= 40 {
            // Block 0: absmax 4095, so the scale is 1 and these are exact ties.
            x[0] = 4095.0;
            x[1] = 2.5;
            x[2] = -2.5;
            x[3] = 0.5;
            x[4] = -0.5;
            x[5] = 0.49999997;
            x[6] = f32::NAN;
            // Block 1: an infinity (its scale infinite, its values 0).
            x[33] = f32::INFINITY;
        }
        if n >= 100 {
            x[64..96].fill(0.0);
            x[97] = f32::NEG_INFINITY;
        }
        fast.fill_wide(&x, Q8_BLOCK);
        plain.fill_wide_plain(&x, Q8_BLOCK);
        let (q, scales) = quantize_activations_wide(&x, Q8_BLOCK);
        assert_eq!(plain.wide, q, "n = {n}: the plain loops against core");
        assert_eq!(fast.wide, q, "n = {n}: values");
        let bits = |v: &[f32]| v.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fast.scales), bits(&scales), "n = {n}: scales");
        assert_eq!(fast.lo, plain.lo, "n = {n}: low bytes");
        assert_eq!(fast.hi, plain.hi, "n = {n}: high bytes");
        assert_eq!(fast.hi_sums, plain.hi_sums, "n = {n}: high sums");
        assert_eq!(fast.wide_sums, plain.wide_sums, "n = {n}: sums");
        assert_eq!(fast.block, plain.block, "n = {n}: block");
    }
}
