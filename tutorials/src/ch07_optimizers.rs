//! Chapter 7: optimizers. Plain SGD, momentum, Nesterov and Adam train the same network from
//! the same starting weights on the same data; a learning-rate schedule; weight decay; and
//! what makes two runs give the same weights, bit for bit.

// ANCHOR: uses
use std::path::Path;

use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, Schedule, TrainConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;
// ANCHOR_END: uses

// ANCHOR: problem
/// 256 points of a wiggly curve, y = sin(3x) on [-1, 1], with a little noise.
fn curve() -> Result<Dataset> {
    let mut rng = Rng::new(7);
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for _ in 0..256 {
        let x = rng.uniform(-1.0, 1.0);
        inputs.push(vec![x as f32]);
        targets.push(vec![((3.0 * x).sin() + 0.05 * rng.normal()) as f32]);
    }
    Ok(Dataset::new(inputs, targets)?)
}

/// One network, built the same way every time: only the optimizer changes.
fn network(optimizer: Optimizer, seed: u64) -> Result<Network> {
    Ok(Network::builder()
        .input_size(1)
        .dense(32, Activation::Tanh)
        .dense(1, Activation::Identity)
        .loss(Loss::MeanSquaredError)
        .optimizer(optimizer)
        .seed(seed)
        .try_build()?)
}

const EPOCHS: usize = 60;

fn config(seed: u64) -> TrainConfig {
    TrainConfig { epochs: EPOCHS, batch_size: 16, shuffle: true, seed: Some(seed) }
}
// ANCHOR_END: problem

// ANCHOR: compare
fn compare(data: &Dataset) -> Result<Vec<(&'static str, Vec<f32>)>> {
    let optimizers = [
        ("sgd", Optimizer::sgd(0.05)),
        ("momentum", Optimizer::sgd_momentum(0.05, 0.9)),
        ("nesterov", Optimizer::sgd_momentum(0.05, 0.9).nesterov(true)),
        ("adam", Optimizer::adam(0.01)),
        ("adam b2=.99", Optimizer::adam(0.01).betas(0.9, 0.99).epsilon(1e-7)),
    ];
    let mut curves = Vec::new();
    for (name, optimizer) in optimizers {
        let history = network(optimizer, 1)?.fit(data, config(1))?;
        curves.push((name, history));
    }
    print!("epoch");
    curves.iter().for_each(|(name, _)| print!(" {name:>11}"));
    println!();
    for epoch in [1, 5, 10, 20, 40, 60] {
        print!("{epoch:>5}");
        curves.iter().for_each(|(_, h)| print!(" {:>11.5}", h[epoch - 1]));
        println!();
    }
    Ok(curves)
}
// ANCHOR_END: compare

// ANCHOR: schedule
/// Adam at a high constant rate against Adam on a schedule that starts at the same rate,
/// warms up to it over 5 epochs and decays to a hundredth of it: one `fit` call per
/// epoch, the rate set before each. Returns both networks' final loss over the data.
fn schedule(data: &Dataset) -> Result<(f32, f32)> {
    let mut constant = network(Optimizer::adam(0.1), 1)?;
    let mut scheduled = network(Optimizer::adam(0.1), 1)?;
    let rates = Schedule::warmup_cosine(0.1, 5, EPOCHS as u64).floor(0.01);
    for epoch in 0..EPOCHS {
        // A seed per epoch: each call starts its own shuffle, and the same seed every call
        // would repeat one order.
        let one = TrainConfig { epochs: 1, seed: Some(100 + epoch as u64), ..config(1) };
        constant.fit(data, one)?;
        scheduled.optimizer.set_learning_rate(rates.rate(epoch as u64));
        scheduled.fit(data, one)?;
    }
    let (a, b) = (constant.evaluate(data)?, scheduled.evaluate(data)?);
    println!("loss after {EPOCHS} epochs: adam at 0.1 throughout {a:.5}, warmup + cosine decay {b:.5}");
    Ok((a, b))
}
// ANCHOR_END: schedule

// ANCHOR: decay
/// The root of the sum of every squared weight and bias, read from the saved file.
fn weight_norm(network: &Network, path: &Path) -> Result<f64> {
    network.save_json(path)?;
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut sum = 0.0;
    for layer in file["layers"].as_array().ok_or("no layers in the file")? {
        let rows = layer["weights"].as_array().ok_or("no weights")?;
        let values = rows
            .iter()
            .filter_map(|r| r.as_array())
            .flatten()
            .chain(layer["bias"].as_array().into_iter().flatten());
        sum += values.filter_map(|v| v.as_f64()).map(|v| v * v).sum::<f64>();
    }
    Ok(sum.sqrt())
}

fn decay(data: &Dataset, dir: &Path) -> Result<(f64, f64)> {
    let mut plain = network(Optimizer::adam(0.01), 1)?;
    let mut decayed = network(Optimizer::adam(0.01).weight_decay(0.2), 1)?;
    let (plain_loss, decayed_loss) = (plain.fit(data, config(1))?, decayed.fit(data, config(1))?);
    let (a, b) =
        (weight_norm(&plain, &dir.join("plain.json"))?, weight_norm(&decayed, &dir.join("decayed.json"))?);
    println!(
        "weight norm: adam {a:.3} (loss {:.5}), adam + weight_decay(0.2) {b:.3} (loss {:.5})",
        plain_loss[EPOCHS - 1],
        decayed_loss[EPOCHS - 1]
    );
    Ok((a, b))
}
// ANCHOR_END: decay

// ANCHOR: reproduce
/// Builds with `init_seed`, trains with `shuffle_seed`, and returns the saved file's bytes.
fn run(data: &Dataset, init_seed: u64, shuffle_seed: u64, path: &Path) -> Result<Vec<u8>> {
    let mut net = network(Optimizer::adam(0.01), init_seed)?;
    net.fit(data, config(shuffle_seed))?;
    net.save_json(path)?;
    Ok(std::fs::read(path)?)
}

fn reproduce(data: &Dataset, dir: &Path) -> Result<()> {
    let first = run(data, 1, 1, &dir.join("first.json"))?;
    let again = run(data, 1, 1, &dir.join("again.json"))?;
    let other_init = run(data, 2, 1, &dir.join("other_init.json"))?;
    let other_order = run(data, 1, 2, &dir.join("other_order.json"))?;
    println!(
        "same seeds: {} bytes, identical {}; other init seed identical {}; other shuffle seed identical {}",
        first.len(),
        first == again,
        first == other_init,
        first == other_order
    );
    assert!(first == again, "the same seeds gave different weights");
    assert!(first != other_init && first != other_order);
    Ok(())
}
// ANCHOR_END: reproduce

// ANCHOR: main
pub fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join("rusting_brain_tutorial_07");
    std::fs::create_dir_all(&dir)?;
    let data = curve()?;

    let curves = compare(&data)?;
    let last = |name: &str| -> Result<f32> {
        let (_, history) = curves.iter().find(|(n, _)| *n == name).ok_or("no such run")?;
        Ok(history[EPOCHS - 1])
    };
    let sgd = last("sgd")?;
    for faster in ["momentum", "nesterov", "adam"] {
        assert!(last(faster)? < 0.5 * sgd, "{faster} against sgd: {curves:?}");
    }

    let (constant, scheduled) = schedule(&data)?;
    assert!(scheduled < 0.5 * constant, "constant {constant}, scheduled {scheduled}");

    let (plain, decayed) = decay(&data, &dir)?;
    assert!(decayed < 0.85 * plain, "weight norms {plain} and {decayed}");

    reproduce(&data, &dir)?;
    Ok(())
}
// ANCHOR_END: main
