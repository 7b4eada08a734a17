//! Iris species from four measurements (examples/data/iris.csv, from scikit-learn's copy;
//! see IRIS_LICENSE.txt): a labeled CSV, a stratified 80/20 split, standardized inputs.
//!
//!     cargo run --release -p rusting_brain --example classification

use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/iris.csv");
    let (data, classes) = Dataset::from_csv_labeled(path)?;
    let (mut train, mut test) = data.split_stratified(0.8);
    let stats = train.standardize();
    stats.apply(&mut test)?;
    println!("{} training rows, {} test rows, classes {classes:?}", train.len(), test.len());
    let mut model = Network::builder()
        .input_size(4)
        .dense(16, Activation::Relu)
        .dense(3, Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(0.01))
        .seed(7)
        .build();
    let config = TrainConfig { epochs: 200, batch_size: 16, shuffle: true, seed: Some(7) };
    model.fit_with(&train, config, |epoch, loss| {
        if epoch % 40 == 0 {
            println!("epoch {epoch:>4}  loss {loss:.4}");
        }
        true
    })?;
    println!(
        "test accuracy {:.1}%  (test loss {:.4})",
        100.0 * model.accuracy(&test)?,
        model.evaluate(&test)?
    );
    println!("confusion matrix, rows = actual, columns = predicted:");
    for (name, row) in classes.iter().zip(model.confusion_matrix(&test)?) {
        println!("  {name:<11} {row:?}");
    }
    Ok(())
}
