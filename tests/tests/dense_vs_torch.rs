//! A 3-layer dense network against PyTorch (`tests/fixtures/gen_dense_gradients.py`): the
//! loss, every parameter's gradient, and the parameters after one optimizer step, for each
//! activation/loss pairing in the fixture, on the CPU backend.
//!
//! Tolerance 1e-5 relative (+1e-7 absolute for gradients that are ~0, e.g. behind a dead
//! ReLU): PyTorch's side is float64, ours f32 with 5-7 term sums, so the true distance is
//! f32 rounding (~1e-7 relative; measured worst printed by the test).

use rusting_brain::cpu::CpuBackend;
use rusting_brain_core::backend::Memory;
use rusting_brain_core::models::dense::{DenseConfig, DenseLayer, DenseModel};
use rusting_brain_core::{Activation, Loss, Optimizer};
use rusting_brain_tests::*;

const TOL: Tolerance = Tolerance::new(1e-5, 1e-7);

/// One fixture configuration, as the generator's CONFIGS list spells it:
/// (hidden activations, output units, output activation, loss, (optimizer, lr, extra)).
type Config = (Vec<String>, usize, String, String, (String, f32, f32));

fn activation(name: &str) -> Activation {
    match name {
        "identity" => Activation::Identity,
        "relu" => Activation::Relu,
        "leaky_relu" => Activation::LeakyRelu(0.01),
        "sigmoid" => Activation::Sigmoid,
        "tanh" => Activation::Tanh,
        "softmax" => Activation::Softmax,
        other => panic!("unknown activation {other}"),
    }
}

#[test]
fn dense_gradients_and_one_step_match_pytorch_for_every_pairing() {
    let f = Fixture::named("dense_gradients.safetensors").unwrap();
    let configs: Vec<Config> = serde_json::from_str(&f.metadata("configs").unwrap()).unwrap();
    assert_eq!(configs.len(), 6);
    let mut worst: f64 = 0.0;
    for (c, (hidden, n_out, out_act, loss, (opt, lr, extra))) in configs.iter().enumerate() {
        let mut layers: Vec<DenseLayer> = hidden
            .iter()
            .zip([7, 6])
            .map(|(a, u)| DenseLayer { units: u, activation: activation(a) })
            .collect();
        layers.push(DenseLayer { units: *n_out, activation: activation(out_act) });
        let loss = match loss.as_str() {
            "mse" => Loss::MeanSquaredError,
            "bce" => Loss::BinaryCrossEntropy,
            "cce" => Loss::CategoricalCrossEntropy,
            other => panic!("unknown loss {other}"),
        };
        let config = DenseConfig { input_size: 5, layers, loss };
        let cpu = CpuBackend::new();
        let get = |k: &str| f.get(&format!("c{c}.{k}")).unwrap();
        let weights = (0..3).map(|l| cpu.upload(&get(&format!("w{l}")).to_f32()).unwrap()).collect();
        let biases = (0..3).map(|l| cpu.upload(&get(&format!("b{l}")).to_f32()).unwrap()).collect();
        let mut model = DenseModel::from_parameters(cpu, config, weights, biases).unwrap();
        let (x, y) = (get("x").to_f32(), get("y").to_f32());
        let value = model.forward_backward(&x, &y, 8).unwrap();
        let tag = format!("config {c} ({hidden:?} -> {out_act} + {loss:?}, {opt})");
        let r = assert_close(&format!("{tag} loss"), &[value], &get("loss"), TOL);
        worst = worst.max(r.worst_ratio);
        for (l, (dw, db)) in model.gradients().unwrap().iter().enumerate() {
            worst = worst
                .max(assert_close(&format!("{tag} dw{l}"), dw, &get(&format!("dw{l}")), TOL).worst_ratio);
            worst = worst
                .max(assert_close(&format!("{tag} db{l}"), db, &get(&format!("db{l}")), TOL).worst_ratio);
        }
        let optimizer = match opt.as_str() {
            "adam" => Optimizer::adam(*lr),
            "adamw" => Optimizer::adam(*lr).weight_decay(*extra),
            "sgd_momentum" => Optimizer::sgd_momentum(*lr, *extra),
            other => panic!("unknown optimizer {other}"),
        };
        model.step(&optimizer, 1.0).unwrap();
        for (l, (w, b)) in model.parameters().unwrap().iter().enumerate() {
            worst = worst.max(
                assert_close(&format!("{tag} w{l} after"), w, &get(&format!("w{l}_after")), TOL).worst_ratio,
            );
            worst = worst.max(
                assert_close(&format!("{tag} b{l} after"), b, &get(&format!("b{l}_after")), TOL).worst_ratio,
            );
        }
    }
    println!("worst element over all configurations: {worst:.3} of the tolerance");
}
