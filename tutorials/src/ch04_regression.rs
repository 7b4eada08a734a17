//! Chapter 4: regression on a noisy function of one variable; a held-out split, standardized
//! inputs, and the held-out error compared with the noise it cannot go below.

// ANCHOR: data
use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

/// What the network should discover: a wave on a slope.
fn truth(x: f32) -> f32 {
    (x / 80.0).sin() + x / 400.0
}

/// The standard deviation of the noise added to every measurement.
const NOISE: f32 = 0.1;

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng::new(4);
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _ in 0..500 {
        let x = rng.uniform(0.0, 600.0) as f32;
        xs.push(vec![x]);
        ys.push(vec![truth(x) + NOISE * rng.normal() as f32]);
    }
    let data = Dataset::new(xs, ys)?;
    // Shuffled with a fixed seed, then cut: 400 rows to learn from, 100 to judge by.
    let (train, test) = data.split(0.8);
    println!("{} training rows, {} held-out rows", train.len(), test.len());
    // ANCHOR_END: data

    // ANCHOR: baseline
    // The score to beat: always answer the training targets' mean.
    let mean = train.targets().iter().map(|t| t[0]).sum::<f32>() / train.len() as f32;
    let baseline = test.targets().iter().map(|t| (t[0] - mean).powi(2)).sum::<f32>() / test.len() as f32;
    println!("always the mean:        held-out MSE {baseline:.4}");
    // ANCHOR_END: baseline

    // ANCHOR: train
    let config = TrainConfig { epochs: 300, batch_size: 32, shuffle: true, seed: Some(4) };
    let fit = |train: &Dataset, test: &Dataset| -> Result<(Network, f32, f32), Box<dyn std::error::Error>> {
        let mut network = Network::builder()
            .input_size(1)
            .dense(32, Activation::Tanh)
            .dense(32, Activation::Tanh)
            .dense(1, Activation::Identity)
            .loss(Loss::MeanSquaredError)
            .optimizer(Optimizer::adam(0.01))
            .seed(4)
            .try_build()?;
        network.fit(train, config)?;
        let (train_mse, test_mse) = (network.evaluate(train)?, network.evaluate(test)?);
        Ok((network, train_mse, test_mse))
    };

    let (_, _, raw_mse) = fit(&train, &test)?;
    println!("raw inputs (0 to 600):  held-out MSE {raw_mse:.4}");
    // ANCHOR_END: train

    // ANCHOR: standardize
    // The statistics come from the training rows alone, and the same transform is applied
    // to the held-out rows: they must not influence anything the network learns.
    let (mut train_std, mut test_std) = (train.clone(), test.clone());
    let stats = train_std.standardize();
    stats.apply(&mut test_std)?;
    println!("input mean {:.2}, standard deviation {:.2}", stats.mean[0], stats.std[0]);
    let (mut network, train_mse, test_mse) = fit(&train_std, &test_std)?;
    println!("standardized inputs:    held-out MSE {test_mse:.4} (training {train_mse:.4})");
    println!("the noise's variance:   {:.4}", NOISE * NOISE);
    // ANCHOR_END: standardize

    // ANCHOR: check
    for x in [50.0f32, 200.0, 350.0, 500.0] {
        // A new input goes through the training statistics before the network sees it.
        let mut row = [x];
        stats.apply_row(&mut row)?;
        let predicted = network.predict(&row)?[0];
        println!("x = {x:>4}: truth {:>7.4}, predicted {predicted:>7.4}", truth(x));
    }
    // Noise of variance 0.01 is in every held-out target, so no model can score much below
    // it (100 rows leave it uncertain by about 0.0015); a good one comes close.
    assert!(test_mse < 1.5 * NOISE * NOISE, "held-out MSE {test_mse}");
    assert!(test_mse > 0.5 * NOISE * NOISE, "held-out MSE {test_mse} beats the noise");
    assert!(test_mse < raw_mse && test_mse < baseline / 20.0);
    Ok(())
}
// ANCHOR_END: check
