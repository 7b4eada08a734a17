//! The int8 product is bit-identical to the reference's (core's definition), not merely
//! close: every backend gets the same integer sums and scales them the same way, which is
//! what lets the page's CPU path give the native ids. Awkward shapes cover the four-row
//! groups' tails (n = 1..9), the 16-wide steps' tails (k = 1, 15, 16, 17, ...), several
//! activation rows, accumulation and a window inside larger buffers.

use rusting_brain_core::backend::MatmulSpec;
use rusting_brain_core::ops::q8;
use rusting_brain_core::{Backend, ReferenceBackend, Rng};
use rusting_brain_portable::PortableBackend;

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn int8_products_equal_the_reference_bit_for_bit() {
    let mut rng = Rng::new(21);
    for &(m, n, k) in &[
        (1, 1, 1),
        (1, 3, 15),
        (1, 4, 16),
        (1, 5, 17),
        (3, 7, 33),
        (2, 8, 192),
        (1, 9, 1000),
        (5, 33, 127),
        (1, 256, 64),
    ] {
        let w = rng.normal_vec(n * k, 0.05);
        let (packed, scales) = q8::quantize_rows(&w, n, k).unwrap();
        let x = rng.normal_vec(m * k, 1.0);
        for beta in [0.0, 0.5] {
            let spec = MatmulSpec::new(m, n, k).trans_b(true).beta(beta);
            let init = if beta == 0.0 {
                vec![f32::NAN; m * n]
            } else {
                rng.normal_vec(m * n, 1.0)
            };
            let (mut got, mut want) = (init.clone(), init);
            PortableBackend
                .q8_matmul(&mut got, &x, &packed, &scales, &spec)
                .unwrap();
            ReferenceBackend
                .q8_matmul(&mut want, &x, &packed, &scales, &spec)
                .unwrap();
            assert!(
                got.iter().all(|v| v.is_finite()),
                "{m}x{n}x{k}: an output was not written"
            );
            assert_eq!(bits(&got), bits(&want), "{m}x{n}x{k} beta {beta}");
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
    PortableBackend
        .q8_matmul(&mut got, &x, &packed, &scales, &spec)
        .unwrap();
    ReferenceBackend
        .q8_matmul(&mut want, &x, &packed, &scales, &spec)
        .unwrap();
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(bits(&got[..7]), bits(&init[..7]), "before the window");
    assert_eq!(
        bits(&got[7 + m * n..]),
        bits(&init[7 + m * n..]),
        "after the window"
    );
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
    assert!(
        call(vec![1.0; 4], &vec![1.0; 2], product).is_err(),
        "two scales for three rows"
    );
    assert!(
        call(vec![1.0; 4], &scales, MatmulSpec::new(1, 3, 4)).is_err(),
        "not x W^T"
    );
}
