//! The int8 product is bit-identical to the reference's (core's definition), not merely
//! close: every backend gets the same integer sums and scales them the same way, which is
//! what lets the page's CPU path give the native ids. Awkward shapes cover the four-row
//! groups' tails (n = 1..9), the 16-wide steps' tails (k = 1, 15, 16, 17, ...), several
//! activation rows, accumulation and a window inside larger buffers.

use rusting_brain_core::backend::Q8Ops;
use rusting_brain_core::backend::{q8_matmul_each, q8_swiglu_unfused, MatmulSpec, Q8Product};
use rusting_brain_core::ops::q8;
use rusting_brain_core::{ReferenceBackend, Rng};
use rusting_brain_portable::PortableBackend;

/// A weight rounding: int8 per row or in blocks, or 4-bit.
type Quantizer = fn(&[f32], usize, usize) -> rusting_brain_core::Result<(Vec<f32>, Vec<f32>)>;

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Per-row int8, blocked int8 and 4-bit (`Precision::Q4`'s layout) weights, and the
/// lookups of each layout's rows.
#[test]
fn int8_and_four_bit_products_equal_the_reference_bit_for_bit() {
    let mut rng = Rng::new(21);
    let quantizers: [(&str, Quantizer); 3] = [
        ("per-row", q8::quantize_rows),
        ("blocked", q8::quantize_blocks),
        ("4-bit", rusting_brain_core::ops::q4::quantize_q4),
    ];
    for &(m, n, k) in &[
        (1, 1, 1),
        (1, 3, 15),
        (1, 4, 16),
        (1, 5, 17),
        (1, 3, 31),
        (3, 7, 33),
        (3, 7, 96),
        (4, 17, 100),
        (2, 8, 192),
        (1, 9, 576),
        (1, 9, 1000),
        (5, 33, 127),
        (1, 256, 64),
    ] {
        let w = rng.normal_vec(n * k, 0.05);
        let x = rng.normal_vec(m * k, 1.0);
        for (name, quantize) in quantizers {
            let (packed, scales) = quantize(&w, n, k).unwrap();
            for beta in [0.0, 0.5] {
                let spec = MatmulSpec::new(m, n, k).trans_b(true).beta(beta);
                let init = if beta == 0.0 { vec![f32::NAN; m * n] } else { rng.normal_vec(m * n, 1.0) };
                let (mut got, mut want) = (init.clone(), init);
                PortableBackend.q8_matmul(&mut got, &x, &packed, &scales, &spec).unwrap();
                ReferenceBackend.q8_matmul(&mut want, &x, &packed, &scales, &spec).unwrap();
                assert!(got.iter().all(|v| v.is_finite()), "{m}x{n}x{k}: an output was not written");
                assert_eq!(bits(&got), bits(&want), "{m}x{n}x{k} beta {beta} {name}");
            }
            let ids = [0u32, (n - 1) as u32];
            let (mut got, mut want) = (vec![f32::NAN; 2 * k], vec![f32::NAN; 2 * k]);
            PortableBackend.q8_embedding(&mut got, &packed, &scales, &ids, n, k).unwrap();
            ReferenceBackend.q8_embedding(&mut want, &packed, &scales, &ids, n, k).unwrap();
            assert_eq!(bits(&got), bits(&want), "{name} lookup {n}x{k}");
        }
    }
}

#[test]
fn a_windowed_int8_product_touches_only_its_rows() {
    let mut rng = Rng::new(22);
    let (m, n, k) = (2, 6, 20);
    let (packed, scales) = q8::quantize_rows(&rng.normal_vec(n * k, 0.1), n, k).unwrap();
    let x = rng.normal_vec(3 * k + 5, 1.0);
    let spec = MatmulSpec::new(m, n, k).trans_b(true).window(5, 0, 7);
    let init = rng.normal_vec(7 + m * n + 4, 1.0);
    let (mut got, mut want) = (init.clone(), init.clone());
    PortableBackend.q8_matmul(&mut got, &x, &packed, &scales, &spec).unwrap();
    ReferenceBackend.q8_matmul(&mut want, &x, &packed, &scales, &spec).unwrap();
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(bits(&got[..7]), bits(&init[..7]), "before the window");
    assert_eq!(bits(&got[7 + m * n..]), bits(&init[7 + m * n..]), "after the window");
}

#[test]
fn bad_int8_operands_are_errors() {
    let (packed, scales) = q8::quantize_rows(&[1.0; 12], 3, 4).unwrap();
    let product = MatmulSpec::new(1, 3, 4).trans_b(true);
    let call = |x: Vec<f32>, scales: &Vec<f32>, spec: MatmulSpec| {
        let mut out = vec![0.0; 3];
        PortableBackend.q8_matmul(&mut out, &x, &packed, scales, &spec)
    };
    assert!(call(vec![1.0; 4], &scales, product).is_ok());
    let err = call(vec![1.0; 3], &scales, product).unwrap_err();
    assert!(err.to_string().contains('x'), "x too short: {err}");
    assert!(call(vec![1.0; 4], &vec![1.0; 2], product).is_err(), "two scales for three rows");
    assert!(call(vec![1.0; 4], &scales, MatmulSpec::new(1, 3, 4)).is_err(), "not x W^T");
}

/// The fused calls (one rounding of the shared input) give the same bits as their
/// definitions (one `q8_matmul` per product, then `swiglu_forward`), on the decode shapes
/// they fuse and on the ones they hand back (several rows), and refuse what the
/// definitions refuse.
#[test]
fn fused_int8_calls_equal_their_definitions_bit_for_bit() {
    let be = PortableBackend;
    let mut rng = Rng::new(23);
    let shapes = [(1, 256, &[256, 64, 64][..]), (1, 33, &[7, 1, 300]), (1, 17, &[5]), (3, 20, &[9, 4])];
    // Per-row weights (int8 files before blocks) and blocks of 32.
    let quantizers: [Quantizer; 3] =
        [q8::quantize_rows, q8::quantize_blocks, rusting_brain_core::ops::q4::quantize_q4];
    for (&(m, k, ns), quantize) in shapes.iter().flat_map(|s| quantizers.iter().map(move |q| (s, q))) {
        let x = rng.normal_vec(m * k, 1.0);
        let weights: Vec<(Vec<f32>, Vec<f32>)> =
            ns.iter().map(|&n| quantize(&rng.normal_vec(n * k, 0.1), n, k).unwrap()).collect();
        for beta in [0.0, 0.5] {
            let init: Vec<Vec<f32>> = ns.iter().map(|&n| rng.normal_vec(m * n, 1.0)).collect();
            let run = |fused: bool| {
                let mut outs = init.clone();
                let mut products = rusting_brain_test_support::q8_products(&mut outs, &weights, (m, k, beta));
                if fused {
                    be.q8_matmul_many(&x, &mut products).unwrap();
                } else {
                    q8_matmul_each(&be, &x, &mut products).unwrap();
                }
                outs
            };
            let (got, want) = (run(true), run(false));
            for (i, n) in ns.iter().enumerate() {
                assert_eq!(bits(&got[i]), bits(&want[i]), "q8_matmul_many {m}x{n}x{k} beta {beta}");
            }
            // The SwiGLU at the first width: its gate weight and a fresh up weight.
            let n = ns[0];
            let (wg, wu) = (&weights[0], &quantize(&rng.normal_vec(n * k, 0.1), n, k).unwrap());
            let spec = MatmulSpec::new(m, n, k).trans_b(true).beta(beta);
            let swiglu = |fused: bool| {
                let (mut out, mut gate, mut up) = (vec![f32::NAN; m * n], init[0].clone(), init[0].clone());
                let (g, u) = ((&wg.0, &wg.1), (&wu.0, &wu.1));
                if fused {
                    be.q8_swiglu(&mut out, &mut gate, &mut up, &x, g, u, &spec).unwrap();
                } else {
                    q8_swiglu_unfused(&be, &mut out, &mut gate, &mut up, &x, g, u, &spec).unwrap();
                }
                [out, gate, up]
            };
            let (got, want) = (swiglu(true), swiglu(false));
            for (part, (g, w)) in ["out", "gate", "up"].iter().zip(got.iter().zip(&want)) {
                assert_eq!(bits(g), bits(w), "q8_swiglu {part} {m}x{n}x{k} beta {beta}");
            }
        }
    }
    // A weight of the wrong size is refused, as by the definition.
    let x = rng.normal_vec(8, 1.0);
    let (packed, scales) = q8::quantize_rows(&rng.normal_vec(3 * 8, 0.1), 3, 8).unwrap();
    let mut out = vec![0.0; 4];
    let mut products = [Q8Product {
        out: &mut out,
        packed: &packed,
        scales: &scales,
        spec: MatmulSpec::new(1, 4, 8).trans_b(true),
    }];
    assert!(be.q8_matmul_many(&x, &mut products).is_err());
    let (mut o, mut g, mut u) = (vec![0.0; 4], vec![0.0; 4], vec![0.0; 4]);
    let spec = MatmulSpec::new(1, 4, 8).trans_b(true);
    let w = (&packed, &scales);
    assert!(be.q8_swiglu(&mut o, &mut g, &mut u, &x, w, w, &spec).is_err());
}
