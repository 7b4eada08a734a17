//! ONNX in and out (feature `onnx`): models exported by PyTorch and by Keras through tf2onnx
//! (tests/fixtures/gen_onnx.py) run through `OnnxModel` against ONNX Runtime's outputs;
//! `Network::save_onnx` of the XOR, iris and regression networks read back by tract and
//! compared with `predict` at batch sizes 1 and 37; and the bad files.
//!
//! Tolerances: against ONNX Runtime 1e-5 absolute plus 1e-5 relative (both f32, different
//! kernels and summation orders; measured worst values are printed). Our own exports
//! against `predict`, 1e-6 absolute: the same f32 products in another order, and tract's
//! own exp, tanh and sigmoid (about 3e-6 relative near zero, so not a relative bound).

use std::path::{Path, PathBuf};

use rusting_brain::{Activation, Loss, Network, OnnxDim, OnnxModel, Optimizer, TrainConfig};
use rusting_brain_core::Rng;
use rusting_brain_test_support::dense::{iris, iris_network, regression_data, xor, xor_network};
use safetensors::SafeTensors;

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/onnx"))
}

fn tensor(st: &SafeTensors<'_>, name: &str) -> (Vec<usize>, Vec<f32>) {
    let t = st.tensor(name).unwrap();
    let v = t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    (t.shape().to_vec(), v)
}

fn scratch(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("rb-onnx-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn pytorch_and_keras_exports_match_onnx_runtime() {
    let bytes = std::fs::read(fixtures().join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    for (name, batch_dim) in [("torch_mlp", "batch"), ("torch_cnn", "batch"), ("keras_mlp", "unk__")] {
        let mut model = OnnxModel::load(fixtures().join(format!("{name}.onnx"))).unwrap();
        let inputs = model.input_shapes().to_vec();
        assert_eq!(inputs.len(), 1, "{name}");
        let dims = inputs[0].shape.clone().expect("the exports give the rank");
        match &dims[0] {
            OnnxDim::Symbolic(s) => assert!(s.starts_with(batch_dim), "{name}: batch dimension {s}"),
            d => panic!("{name}: the batch dimension should be symbolic, is {d}"),
        }
        assert!(model.fixed_input_shapes().is_none(), "{name}: dynamic batch");
        let (shape, x) = tensor(&st, &format!("{name}.input"));
        let (want_shape, want) = tensor(&st, &format!("{name}.output"));
        let out = model.run(&[(&shape, &x)]).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].shape, want_shape, "{name}");
        let mut worst = 0f32;
        for (g, w) in out[0].values.iter().zip(&want) {
            let d = (g - w).abs();
            assert!(d <= 1e-5 + 1e-5 * w.abs(), "{name}: {g} vs ONNX Runtime's {w}");
            worst = worst.max(d);
        }
        eprintln!("{name} ({}): worst |ours - ONNX Runtime| {worst:.2e}", inputs[0]);
        // Another batch size reuses the model with that shape fixed.
        let (b1, x1) = ([&[1usize][..], &shape[1..]].concat(), x[..x.len() / shape[0]].to_vec());
        let one = model.run(&[(&b1, &x1)]).unwrap();
        let row = want.len() / want_shape[0];
        for (g, w) in one[0].values.iter().zip(&want[..row]) {
            assert!((g - w).abs() <= 1e-5 + 1e-5 * w.abs(), "{name} batch 1: {g} vs {w}");
        }
    }
}

/// The three example networks, trained briefly (what they compute is what matters here);
/// the regression one takes a leaky ReLU so every activation the export maps is covered.
fn networks() -> Vec<(&'static str, Network, usize)> {
    let run = |epochs| TrainConfig { epochs, batch_size: 8, shuffle: true, seed: Some(1) };
    let mut x = xor_network();
    x.fit(&xor(), run(200)).unwrap();
    let mut iris_net = iris_network();
    iris_net.fit(&iris().0, run(20)).unwrap();
    let mut reg = Network::builder()
        .input_size(2)
        .dense(32, Activation::Tanh)
        .dense(32, Activation::LeakyRelu(0.1))
        .dense(1, Activation::Identity)
        .loss(Loss::MeanSquaredError)
        .optimizer(Optimizer::adam(0.01))
        .seed(1)
        .build();
    reg.fit(&regression_data(200, 3), run(20)).unwrap();
    vec![("xor", x, 2), ("iris", iris_net, 4), ("regression", reg, 2)]
}

/// `save_onnx` read back by tract: the same predictions at batch sizes 1 and 37, the
/// symbolic `batch` dimension kept. With RB_ONNX_OUT set, also writes each model and its
/// predictions there for tests/fixtures/check_onnx_export.py (ONNX Runtime, onnx.checker).
#[test]
fn saved_networks_run_under_tract_as_predict_does() {
    let dir = std::env::var("RB_ONNX_OUT").map(PathBuf::from).unwrap_or_else(|_| scratch("export"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng::new(11);
    for (name, mut net, inputs) in networks() {
        let path = dir.join(format!("{name}.onnx"));
        net.save_onnx(&path).unwrap();
        let mut model = OnnxModel::load(&path).unwrap();
        let shape = model.input_shapes()[0].shape.clone().unwrap();
        assert_eq!(shape, vec![OnnxDim::Symbolic("batch".into()), OnnxDim::Fixed(inputs)], "{name}");
        for batch in [1usize, 37] {
            let rows: Vec<Vec<f32>> = (0..batch).map(|_| rng.normal_vec(inputs, 1.0)).collect();
            let want: Vec<f32> = net.predict_batch(&rows).unwrap().concat();
            let flat = rows.concat();
            let got = model.run(&[(&[batch, inputs], &flat)]).unwrap();
            let worst = got[0]
                .values
                .iter()
                .zip(&want)
                .map(|(g, w)| (g - w).abs())
                // NaN-propagating: `f32::max` would skip a NaN and let it pass.
                .fold(0f32, |m, d| if d > m || d.is_nan() { d } else { m });
            assert_eq!(got[0].values.len(), want.len(), "{name}");
            assert!(worst <= 1e-6, "{name} batch {batch}: worst |tract - predict| {worst}");
            eprintln!("{name} batch {batch}: worst |tract - predict| {worst:.2e}");
            if std::env::var("RB_ONNX_OUT").is_ok() {
                let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
                std::fs::write(dir.join(format!("{name}.b{batch}.input.f32")), bytes(&flat)).unwrap();
                std::fs::write(dir.join(format!("{name}.b{batch}.output.f32")), bytes(&want)).unwrap();
            }
        }
    }
}

fn refused(path: &Path, parts: &[&str]) {
    let err = match OnnxModel::load(path) {
        Ok(m) => panic!("{} loaded: inputs {:?}", path.display(), m.input_shapes()),
        Err(e) => e.to_string(),
    };
    for p in parts {
        assert!(err.contains(p), "`{err}` does not mention {p}");
    }
}

#[test]
fn bad_files_and_bad_inputs_are_clear_errors() {
    let dir = scratch("bad");
    let good = std::fs::read(fixtures().join("torch_mlp.onnx")).unwrap();
    let cut = dir.join("cut.onnx");
    std::fs::write(&cut, &good[..good.len() / 2]).unwrap();
    refused(&cut, &["cut.onnx"]);
    let text = dir.join("text.onnx");
    std::fs::write(&text, b"this is not a protobuf").unwrap();
    refused(&text, &["text.onnx", "not an ONNX model"]);
    refused(&dir.join("missing.onnx"), &["missing.onnx", "no such ONNX file"]);
    // A valid graph with an operator tract lacks (tests/fixtures/gen_onnx.py).
    refused(&fixtures().join("unknown_op.onnx"), &["unknown_op.onnx", "FancyGelu"]);
    // Found by the fuzz target: a node reading a value nothing defines made tract panic
    // (a name lookup without a check).
    refused(
        &fixtures().join("../fuzz/onnx-undefined-input.onnx"),
        &["onnx-undefined-input.onnx", "which no input, initializer or node of the graph defines"],
    );
    // Also found by fuzzing: a reduction over an axis past the rank made tract's shape
    // inference panic; the panic is caught and the file refused.
    refused(
        &fixtures().join("../fuzz/onnx-reduce-axis.onnx"),
        &["onnx-reduce-axis.onnx", "a malformed ONNX graph", "axis"],
    );
    // Inputs that do not fit.
    // Each names the file, then what does not fit.
    let mut model = OnnxModel::load(fixtures().join("torch_mlp.onnx")).unwrap();
    let e = model.run(&[]).unwrap_err().to_string();
    assert!(e.contains("torch_mlp.onnx") && e.contains("takes 1 inputs"), "{e}");
    let e = model.run(&[(&[2, 7], &[0.0; 14])]).unwrap_err().to_string();
    assert!(e.contains("torch_mlp.onnx") && e.contains("[2, 7]"), "{e}");
    let e = model.run(&[(&[2, 8], &[0.0; 15])]).unwrap_err().to_string();
    assert!(e.contains("torch_mlp.onnx") && e.contains("holds 16 values; 15 given"), "{e}");
    let e = model.run(&[(&[16], &[0.0; 16])]).unwrap_err().to_string();
    assert!(e.contains("torch_mlp.onnx") && e.contains("rank 2"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}
