//! XOR, the smallest problem a straight line cannot solve: 2 inputs, 8 tanh units, 1 sigmoid.
//!
//!     cargo run --release -p rusting_brain --example xor

use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = Dataset::new(
        vec![vec![0.0, 0.0], vec![0.0, 1.0], vec![1.0, 0.0], vec![1.0, 1.0]],
        vec![vec![0.0], vec![1.0], vec![1.0], vec![0.0]],
    )?;
    let mut model = Network::builder()
        .input_size(2)
        .dense(8, Activation::Tanh)
        .dense(1, Activation::Sigmoid)
        .loss(Loss::BinaryCrossEntropy)
        .optimizer(Optimizer::adam(0.05))
        .seed(42)
        .build();
    let config = TrainConfig { epochs: 2_000, batch_size: 4, shuffle: true, seed: Some(42) };
    let history = model.fit_with(&data, config, |epoch, loss| {
        if epoch % 200 == 0 {
            println!("epoch {epoch:>5}  loss {loss:.6}");
        }
        loss > 1e-4
    })?;
    println!("stopped after {} epochs", history.len());
    for x in data.inputs() {
        println!("{x:?} -> {:.4}", model.predict(x)?[0]);
    }
    println!("accuracy {:.1}%", 100.0 * model.accuracy(&data)?);
    println!("confusion matrix [actual][predicted]: {:?}", model.confusion_matrix(&data)?);
    Ok(())
}
