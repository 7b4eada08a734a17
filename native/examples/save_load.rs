//! Train, save to JSON, load in a fresh network, and check both predict the same.
//!
//!     cargo run --release -p rusting_brain --example save_load

use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data = Dataset::new(
        vec![vec![0.0, 0.0], vec![0.0, 1.0], vec![1.0, 0.0], vec![1.0, 1.0]],
        vec![vec![0.0], vec![1.0], vec![1.0], vec![1.0]], // OR
    )?;
    let mut model = Network::builder()
        .input_size(2)
        .dense(4, Activation::Relu)
        .dense(1, Activation::Sigmoid)
        .loss(Loss::BinaryCrossEntropy)
        .optimizer(Optimizer::adam(0.05))
        .seed(3)
        .build();
    model.fit(&data, TrainConfig { epochs: 500, batch_size: 4, shuffle: true, seed: Some(3) })?;
    let path = std::env::temp_dir().join("rusting_brain_or.json");
    model.save_json(&path)?;
    println!(
        "saved {} ({} bytes, {} parameters)",
        path.display(),
        std::fs::metadata(&path)?.len(),
        model.parameter_count()?
    );
    let mut loaded = Network::load_json(&path)?;
    for x in data.inputs() {
        let (a, b) = (model.predict(x)?[0], loaded.predict(x)?[0]);
        println!(
            "{x:?}: trained {a:.6}  loaded {b:.6}  {}",
            if a.to_bits() == b.to_bits() { "identical" } else { "DIFFERENT" }
        );
    }
    println!("accuracy after loading {:.0}%", 100.0 * loaded.accuracy(&data)?);
    Ok(())
}
