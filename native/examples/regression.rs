//! Regression on a smooth function of two variables, y = sin(2 x0) + 0.5 x1^2 on [-1, 1]^2,
//! 1000 samples, 80/20 split. The held-out MSE ends below 0.002 (the targets' variance is
//! about 0.5); `native/tests/network.rs` checks that claim.
//!
//!     cargo run --release -p rusting_brain --example regression

use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng::new(3);
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _ in 0..1_000 {
        let (a, b) = (rng.uniform(-1.0, 1.0) as f32, rng.uniform(-1.0, 1.0) as f32);
        xs.push(vec![a, b]);
        ys.push(vec![(2.0 * a).sin() + 0.5 * b * b]);
    }
    let (train, test) = Dataset::new(xs, ys)?.split(0.8);
    let mut model = Network::builder()
        .input_size(2)
        .dense(32, Activation::Tanh)
        .dense(32, Activation::Tanh)
        .dense(1, Activation::Identity)
        .loss(Loss::MeanSquaredError)
        .optimizer(Optimizer::adam(0.01))
        .seed(1)
        .build();
    let config = TrainConfig { epochs: 300, batch_size: 32, shuffle: true, seed: Some(5) };
    model.fit_with(&train, config, |epoch, loss| {
        if epoch % 50 == 0 {
            println!("epoch {epoch:>4}  train MSE {loss:.6}");
        }
        true
    })?;
    println!("held-out MSE {:.6} on {} samples", model.evaluate(&test)?, test.len());
    for x in [[0.5f32, -0.5], [-0.9, 0.1]] {
        let want = (2.0 * x[0]).sin() + 0.5 * x[1] * x[1];
        println!("f({:?}) = {want:.4}, predicted {:.4}", x, model.predict(&x)?[0]);
    }
    Ok(())
}
