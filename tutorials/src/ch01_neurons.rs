//! Chapter 1: a neuron, a layer, and a network's forward pass computed by hand, then checked
//! against the library's `predict`.

// ANCHOR: neuron
/// One neuron: a weighted sum of its inputs plus a bias, passed through an activation.
fn neuron(inputs: &[f32], weights: &[f32], bias: f32, activation: fn(f32) -> f32) -> f32 {
    let sum: f32 = inputs.iter().zip(weights).map(|(x, w)| x * w).sum();
    activation(sum + bias)
}

fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}
// ANCHOR_END: neuron

// ANCHOR: layer
/// A layer is many neurons reading the same inputs. `weights` has one row per neuron, each
/// row as long as the input: PyTorch's `nn.Linear` layout, and the library's.
fn layer(inputs: &[f32], weights: &[Vec<f32>], bias: &[f32], activation: fn(f32) -> f32) -> Vec<f32> {
    weights.iter().zip(bias).map(|(row, b)| neuron(inputs, row, *b, activation)).collect()
}
// ANCHOR_END: layer

// ANCHOR: main
use rusting_brain::{Activation, Loss, Network, Optimizer};

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A neuron that fires when both inputs are on: an AND gate, weights picked by hand.
    let and = |a: f32, b: f32| neuron(&[a, b], &[10.0, 10.0], -15.0, sigmoid);
    for (a, b) in [(0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0)] {
        println!("AND({a}, {b}) = {:.3}", and(a, b));
    }
    assert!(and(1.0, 1.0) > 0.99 && and(0.0, 1.0) < 0.01);

    // The library's network: 3 inputs, 4 tanh units, 2 sigmoid outputs. Its weights are
    // random (seeded), not trained: this chapter is only about the forward pass.
    let network = Network::builder()
        .input_size(3)
        .dense(4, Activation::Tanh)
        .dense(2, Activation::Sigmoid)
        .loss(Loss::MeanSquaredError)
        .optimizer(Optimizer::sgd(0.1))
        .seed(7)
        .try_build()?;
    println!("{} parameters", network.parameter_count()?);

    // Its JSON file holds every weight; read them back and redo the forward pass by hand.
    let dir = std::env::temp_dir().join("rusting_brain_tutorial_01");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("network.json");
    network.save_json(&path)?;
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;

    let input = [0.5, -1.0, 2.0];
    let mut x = input.to_vec();
    for l in file["layers"].as_array().ok_or("no layers in the file")? {
        let weights: Vec<Vec<f32>> = serde_json::from_value(l["weights"].clone())?;
        let bias: Vec<f32> = serde_json::from_value(l["bias"].clone())?;
        let activation = match l["activation"].as_str() {
            Some("tanh") => f32::tanh,
            Some("sigmoid") => sigmoid,
            other => return Err(format!("this chapter does not handle {other:?}").into()),
        };
        x = layer(&x, &weights, &bias, activation);
    }

    let mut network = Network::load_json(&path)?;
    let predicted = network.predict(&input)?;
    println!("by hand   {x:?}");
    println!("predict   {predicted:?}");
    assert_eq!(x.len(), predicted.len(), "one value per output");
    for (a, b) in x.iter().zip(&predicted) {
        // The library sums in another order (SIMD lanes), so the last bit may differ.
        assert!((a - b).abs() < 1e-6, "by hand {a}, predict {b}");
    }
    Ok(())
}
// ANCHOR_END: main
