//! What the README states about initialization, defaults and file contents, checked on
//! built models: the transformer's normal(0, 0.02) matrices with the residual projections
//! scaled by 1/sqrt(2 n_layers) and norm weights of one; the dense network's He-uniform and
//! Glorot-uniform weights; the mixture-of-experts defaults; Q8 files holding `I8` matrices
//! beside `F32` scales; `save_bin` with adapters attached writing the base alone.
//!
//! Tolerances for the statistics: a sample standard deviation over n values drawn from
//! normal(0, s) is within 4 s / sqrt(2 n) of s at four standard errors, n >= 8,192 here
//! (at most 3.1% of s); a uniform(-a, a) sample of n values reaches past 0.99 a with
//! probability 1 - 0.995^n, certain for the n here.

use rusting_brain::{Activation, LoraConfig, Loss, Network, Precision, TransformerLm};
use rusting_brain_test_support::TempDir;

fn std_dev(v: &[f32]) -> f64 {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt()
}

#[test]
fn transformer_matrices_are_normal_with_scaled_residual_projections_and_unit_norms() {
    let n_layers = 4;
    let model =
        TransformerLm::builder().shape(512, 128, n_layers, (4, 2, 32), 256, 32).seed(11).build().unwrap();
    let residual = 0.02 / (2.0 * n_layers as f64).sqrt();
    let mut seen = 0;
    for (name, values) in model.named_parameters().unwrap() {
        let s = std_dev(&values);
        if name.ends_with("norm.weight") {
            assert!(values.iter().all(|&x| x == 1.0), "{name} is not all ones");
            continue;
        }
        let want = if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
            residual
        } else {
            0.02
        };
        let bound = 4.0 * want / (2.0 * values.len() as f64).sqrt();
        println!("{name}: std {s:.5}, expected {want:.5} +- {bound:.5}");
        assert!(values.len() >= 8_192, "{name}: too few values for the bound");
        assert!((s - want).abs() <= bound, "{name}: std {s}, expected {want}");
        seen += 1;
    }
    // The embedding (tied with the head) and 7 matrices a layer.
    assert_eq!(seen, 1 + 7 * n_layers);
}

#[test]
fn dense_weights_are_he_uniform_before_relu_and_glorot_uniform_otherwise() {
    let net = Network::builder()
        .input_size(300)
        .dense(200, Activation::Relu)
        .dense(100, Activation::Tanh)
        .dense(10, Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .seed(5)
        .try_build()
        .unwrap();
    let dir = TempDir::new("defaults_dense");
    let path = dir.join("net.json");
    net.save_json(&path).unwrap();
    let file: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let layers = file["layers"].as_array().unwrap();
    // (fan_in, fan_out, He?) per layer.
    for (l, (fan_in, fan_out, he)) in
        [(300.0f64, 200.0f64, true), (200.0, 100.0, false), (100.0, 10.0, false)].into_iter().enumerate()
    {
        let limit: f64 = if he { (6.0 / fan_in).sqrt() } else { (6.0 / (fan_in + fan_out)).sqrt() };
        let w: Vec<f64> = layers[l]["weights"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
            .collect();
        let max = w.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        println!("layer {l}: max |w| {max:.5}, limit {limit:.5}");
        // The draws are f64 rounded to f32, which may round past the limit by half an ulp.
        assert!(max <= limit * (1.0 + 1e-7) && max > 0.99 * limit, "layer {l}: max |w| {max}, limit {limit}");
        let bias = layers[l]["bias"].as_array().unwrap();
        assert!(bias.iter().all(|b| b.as_f64() == Some(0.0)), "layer {l}: biases start at zero");
    }
}

/// A small model's builder: vocabulary 64, width 32, 4 query heads over 2 of size 8.
fn small(n_layers: usize) -> rusting_brain::TransformerLmBuilder {
    TransformerLm::builder().shape(64, 32, n_layers, (4, 2, 8), 64, 16)
}

#[test]
fn mixture_of_experts_defaults_are_the_documented_ones() {
    for (top_k, renormalize) in [(1, false), (2, true), (3, true)] {
        let model = small(2).experts(4, top_k).build().unwrap();
        let moe = model.config().moe.clone().unwrap();
        assert_eq!(moe.load_balance_coef, 0.01);
        assert_eq!(moe.router_z_coef, 0.001);
        assert_eq!(moe.renormalize, renormalize, "top_k {top_k}");
    }
}

#[test]
fn q8_files_hold_i8_matrices_beside_f32_scales() {
    let mut model = small(1).build().unwrap();
    model.quantize().unwrap();
    let dir = TempDir::new("defaults_q8");
    let path = dir.join("m.q8.rbw");
    model.save_bin(&path, Precision::Q8).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut matrices = 0;
    for (name, view) in st.tensors() {
        if name.ends_with("norm.weight") || name.ends_with(".scale") {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            continue;
        }
        assert_eq!(view.dtype(), safetensors::Dtype::I8, "{name}");
        let scale = st.tensor(&format!("{name}.scale")).unwrap();
        assert_eq!(scale.dtype(), safetensors::Dtype::F32);
        // One scale per 32 values of a row (checkpoint version 2).
        let (rows, cols) = (view.shape()[0], view.shape()[1]);
        let want = if cols.div_ceil(32) == 1 { vec![rows] } else { vec![rows, cols.div_ceil(32)] };
        assert_eq!(scale.shape(), &want[..], "{name}: one scale per block of 32");
        matrices += 1;
    }
    assert_eq!(matrices, 1 + 7);
}

#[test]
fn save_bin_with_adapters_attached_writes_the_base_alone() {
    let mut model = small(1).seed(3).build().unwrap();
    let base = model.named_parameters().unwrap();
    model.add_lora(LoraConfig::new(4)).unwrap();
    // Train the adapters a step, so a merged save would differ from the base.
    model.train_step(&[vec![1, 2, 3, 4, 5]]).unwrap();
    let dir = TempDir::new("defaults_lora_base");
    let path = dir.join("base.rbw");
    model.save_bin(&path, Precision::F32).unwrap();
    let loaded = TransformerLm::load_bin(&path).unwrap();
    let saved = loaded.named_parameters().unwrap();
    assert_eq!(saved.len(), base.len());
    for ((name, want), (got_name, got)) in base.iter().zip(&saved) {
        assert_eq!(name, got_name);
        assert!(
            want.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: the saved base is not the base"
        );
    }
    let st_bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&st_bytes).unwrap();
    assert!(st.names().iter().all(|n| !n.contains("lora")), "an adapter tensor was saved");
}
