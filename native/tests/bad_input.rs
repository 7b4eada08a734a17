//! The CPU backend on bad input: a wrong-length buffer, a zero width, an out-of-range id or
//! a bad hyper-parameter is an error naming the op and the argument, never a panic.

use rusting_brain::cpu::CpuBackend;
use rusting_brain_core::backend::*;
use rusting_brain_core::{Activation, CoreError, Loss};

fn v(n: usize) -> Vec<f32> {
    vec![0.5; n]
}

#[track_caller]
fn shape_err<T: std::fmt::Debug>(r: rusting_brain_core::Result<T>, op: &str, what: &str) {
    match r {
        Err(CoreError::ShapeMismatch { op: o, what: w, .. }) => assert_eq!((o, w), (op, what)),
        other => panic!("expected a shape error for {op}/{what}, got {other:?}"),
    }
}

#[test]
fn every_primitive_rejects_a_wrong_length_buffer() {
    let b = CpuBackend;
    let (rows, cols) = (3, 4);
    let spec = MatmulSpec::new(2, 3, 4);
    shape_err(b.matmul(&mut v(6), &v(7), &v(12), &spec), "matmul", "a");
    shape_err(b.matmul(&mut v(5), &v(8), &v(12), &spec), "matmul", "c");
    shape_err(b.add_bias(&mut v(12), &v(3), rows, cols), "add_bias", "bias");
    shape_err(b.bias_backward(&mut v(4), &v(11), rows, cols), "bias_backward", "dout");
    shape_err(
        b.rmsnorm_forward(&mut v(12), &mut v(2), &v(12), &v(4), rows, cols, 1e-5),
        "rmsnorm_forward",
        "rstd",
    );
    shape_err(
        b.rmsnorm_backward(&mut v(12), &mut v(4), &v(12), &v(12), &v(5), &v(3), rows, cols),
        "rmsnorm_backward",
        "weight",
    );
    let rope = RopeSpec::unscaled(1, 2, 1, 4, 0, 10_000.0);
    shape_err(b.rope_forward(&mut v(7), &rope), "rope_forward", "x");
    shape_err(b.softmax_forward(&mut v(12), &v(13), rows, cols), "softmax_forward", "inp");
    shape_err(b.softmax_backward(&mut v(12), &v(12), &v(1), rows, cols), "softmax_backward", "out");
    shape_err(b.swiglu_forward(&mut v(4), &v(4), &v(3)), "swiglu_forward", "up");
    shape_err(b.swiglu_backward(&mut v(4), &mut v(5), &v(4), &v(4), &v(4)), "swiglu_backward", "dup");
    let att = AttentionSpec::causal(1, 2, 2, 1, 4);
    shape_err(
        b.attention_forward(&mut v(16), &mut v(4), &v(16), &v(8), &v(7), &att),
        "attention_forward",
        "v",
    );
    shape_err(
        b.attention_backward(
            &mut v(16),
            &mut v(8),
            &mut v(8),
            &v(16),
            &v(16),
            &v(8),
            &v(8),
            &v(16),
            &v(3),
            &att,
        ),
        "attention_backward",
        "lse",
    );
    shape_err(b.embedding_forward(&mut v(7), &v(20), &[1, 2], 5, 4), "embedding_forward", "out");
    shape_err(b.embedding_backward(&mut v(19), &v(8), &[1, 2], 5, 4), "embedding_backward", "dtable");
    shape_err(b.cross_entropy(&mut v(12), &[0, 1], None, rows, cols, None), "cross_entropy", "targets");
    shape_err(
        b.cross_entropy(&mut v(12), &[0, 1, 2], Some(&[true]), rows, cols, None),
        "cross_entropy",
        "mask",
    );
    shape_err(
        b.activation_forward(Activation::Relu, &mut v(12), &v(11), rows, cols),
        "activation_forward",
        "inp",
    );
    shape_err(
        b.activation_backward(Activation::Tanh, &mut v(12), &v(12), &v(12), &v(12 + 1), rows, cols),
        "activation_backward",
        "out",
    );
    shape_err(b.loss_forward(Loss::MeanSquaredError, &v(12), &v(10), rows, cols), "loss_forward", "target");
    shape_err(
        b.loss_backward(Loss::BinaryCrossEntropy, &mut v(1), &v(12), &v(12), rows, cols),
        "loss_backward",
        "dpred",
    );
    shape_err(
        b.fused_output_backward(Loss::CategoricalCrossEntropy, &mut v(12), &v(11), &v(12), rows, cols),
        "fused_output_backward",
        "pred",
    );
    let hp = AdamParams::default();
    shape_err(b.adam_update(&mut v(4), &v(4), &mut v(4), &mut v(3), &hp, 1), "adam_update", "v");
    let sgd = SgdParams { momentum: 0.9, ..SgdParams::new(0.1) };
    shape_err(b.sgd_update(&mut v(4), &v(4), Some(&mut v(2)), &sgd), "sgd_update", "velocity");
    shape_err(b.axpy(&mut v(4), 1.0, &v(5)), "axpy", "x");
    shape_err(b.write(&mut v(4), &[1.0; 3]), "write", "data");
    shape_err(b.copy(&mut v(4), &v(2)), "copy", "src");
}

#[test]
fn zero_widths_are_errors_and_zero_rows_are_no_ops() {
    let b = CpuBackend;
    let dim_err = |r: rusting_brain_core::Result<()>| matches!(r, Err(CoreError::InvalidDimension { .. }));
    assert!(dim_err(b.rmsnorm_forward(&mut v(0), &mut v(3), &v(0), &v(0), 3, 0, 1e-5)));
    assert!(dim_err(b.softmax_forward(&mut v(0), &v(0), 3, 0)));
    assert!(dim_err(b.embedding_forward(&mut v(0), &v(0), &[0], 1, 0)));
    assert!(dim_err(b.attention_forward(
        &mut v(0),
        &mut v(0),
        &v(0),
        &v(0),
        &v(0),
        &AttentionSpec::causal(1, 1, 1, 1, 0)
    )));
    // No rows: nothing to do, nothing written, no error.
    b.rmsnorm_forward(&mut v(0), &mut v(0), &v(0), &v(4), 0, 4, 1e-5).unwrap();
    b.softmax_forward(&mut v(0), &v(0), 0, 4).unwrap();
    b.matmul(&mut v(0), &v(0), &v(12), &MatmulSpec::new(0, 3, 4)).unwrap();
    b.attention_forward(&mut v(0), &mut v(0), &v(0), &v(0), &v(0), &AttentionSpec::causal(0, 4, 2, 1, 8))
        .unwrap();
    let s = b.cross_entropy(&mut v(0), &[], None, 0, 5, Some(1.0)).unwrap();
    assert_eq!(s.count, 0);
    assert_eq!(b.loss_forward(Loss::MeanSquaredError, &v(0), &v(0), 0, 3).unwrap(), 0.0);
}

#[test]
fn ids_hyperparameters_and_non_finite_losses_are_reported() {
    let b = CpuBackend;
    let err = b.embedding_forward(&mut v(8), &v(20), &[4, 5], 5, 4).unwrap_err();
    assert_eq!(err.to_string(), "embedding_forward: id 5 at position 1 is outside the vocabulary (5)");
    let err = b.cross_entropy(&mut v(6), &[0, 3], None, 2, 3, None).unwrap_err();
    assert!(matches!(err, CoreError::IdOutOfRange { id: 3, index: 1, .. }), "{err}");
    let mut logits = vec![0.0, f32::INFINITY, 0.0];
    let err = b.cross_entropy(&mut logits, &[0], None, 1, 3, None).unwrap_err();
    assert!(matches!(err, CoreError::NonFinite { .. }), "{err}");
    let err = b.loss_forward(Loss::MeanSquaredError, &vec![f32::NAN], &vec![0.0], 1, 1).unwrap_err();
    assert!(matches!(err, CoreError::NonFinite { .. }), "{err}");
    let bad = AdamParams { beta2: 1.5, ..AdamParams::default() };
    assert!(matches!(
        b.adam_update(&mut v(1), &v(1), &mut v(1), &mut v(1), &bad, 1),
        Err(CoreError::InvalidArgument { .. })
    ));
    let rope = RopeSpec::unscaled(1, 1, 1, 3, 0, 10_000.0);
    assert!(matches!(b.rope_forward(&mut v(3), &rope), Err(CoreError::InvalidDimension { .. })));
    // An overflowing shape is an error, not a wrapped multiplication.
    let huge = MatmulSpec::new(usize::MAX / 2, 4, 4);
    assert!(matches!(b.matmul(&mut v(1), &v(1), &v(16), &huge), Err(CoreError::InvalidDimension { .. })));
}

#[test]
fn nan_inputs_propagate_instead_of_vanishing() {
    let b = CpuBackend;
    let mut out = v(4);
    b.softmax_forward(&mut out, &vec![1.0, f32::NAN, 0.0, 2.0], 1, 4).unwrap();
    assert!(out.iter().all(|x| x.is_nan()), "{out:?}");
    let mut c = v(1);
    b.matmul(&mut c, &vec![f32::NAN, 1.0], &vec![1.0, 1.0], &MatmulSpec::new(1, 1, 2)).unwrap();
    assert!(c[0].is_nan());
    let norm = global_l2_norm(&b, &[&vec![1.0, f32::INFINITY]]).unwrap();
    assert!(norm.is_infinite());
}
