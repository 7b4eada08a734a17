//! Chapter 5: classifying iris flowers from a labeled CSV; a stratified split, softmax and
//! categorical cross-entropy, and the confusion matrix with precision and recall read from it.

// ANCHOR: load
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../native/examples/data/iris.csv");
    let (data, classes) = Dataset::from_csv_labeled(path)?;
    println!("{} rows of {} measurements, classes {classes:?}", data.len(), data.input_size());
    let (x, y) = data.inputs().first().zip(data.targets().first()).ok_or("no rows")?;
    println!("first row {x:?}, target {y:?}");
    // ANCHOR_END: load

    // ANCHOR: split
    let (mut train, mut test) = data.split_stratified(0.8);
    // Rows per class on each side: a one-hot target's 1 sits in its class's column.
    let per_class = |d: &Dataset| -> Vec<usize> {
        (0..classes.len()).map(|c| d.targets().iter().filter(|t| t[c] == 1.0).count()).collect()
    };
    println!("training rows per class {:?}, held-out {:?}", per_class(&train), per_class(&test));
    let stats = train.standardize();
    stats.apply(&mut test)?;
    // ANCHOR_END: split

    // ANCHOR: train
    let mut model = Network::builder()
        .input_size(4)
        .dense(16, Activation::Relu)
        .dense(classes.len(), Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(0.01))
        .seed(7)
        .try_build()?;
    let config = TrainConfig { epochs: 200, batch_size: 16, shuffle: true, seed: Some(7) };
    model.fit_with(&train, config, |epoch, loss| {
        if epoch % 50 == 0 {
            println!("epoch {epoch:>3}  training loss {loss:.4}");
        }
        true
    })?;
    let accuracy = model.accuracy(&test)?;
    println!("held-out accuracy {:.1}%, held-out loss {:.4}", 100.0 * accuracy, model.evaluate(&test)?);
    // ANCHOR_END: train

    // ANCHOR: matrix
    // Row: the true class. Column: the class the network chose (the largest probability).
    let matrix = model.confusion_matrix(&test)?;
    print!("{:>12}", "");
    for name in &classes {
        print!("{name:>12}");
    }
    println!();
    for (name, row) in classes.iter().zip(&matrix) {
        print!("{name:>12}");
        for count in row {
            print!("{count:>12}");
        }
        println!();
    }
    // ANCHOR_END: matrix

    // ANCHOR: precision
    let total: usize = matrix.iter().flatten().sum();
    let correct: usize = (0..matrix.len()).map(|c| matrix[c][c]).sum();
    for (c, name) in classes.iter().enumerate() {
        let predicted_as_c: usize = matrix.iter().map(|row| row[c]).sum();
        let actually_c: usize = matrix[c].iter().sum();
        // A class the network never predicted has no precision: 0 / 0.
        let precision = matrix[c][c] as f32 / predicted_as_c.max(1) as f32;
        let recall = matrix[c][c] as f32 / actually_c.max(1) as f32;
        println!("{name:<11} precision {precision:.3}  recall {recall:.3}");
        assert!(recall >= 0.8, "{name}: recall {recall}");
    }
    assert_eq!(total, test.len());
    // The diagonal is what `accuracy` counts; the two must agree exactly.
    assert_eq!(correct as f32 / total as f32, accuracy);
    assert!(accuracy >= 0.9, "held-out accuracy {accuracy}");
    // ANCHOR_END: precision

    // ANCHOR: predict
    // A new flower, in centimetres: it goes through the training statistics first.
    let mut flower = [6.0, 2.9, 4.6, 1.3];
    stats.apply_row(&mut flower)?;
    let probabilities = model.predict(&flower)?;
    let best = (0..probabilities.len())
        .max_by(|&a, &b| probabilities[a].total_cmp(&probabilities[b]))
        .ok_or("no outputs")?;
    println!("{probabilities:.3?} -> {}", classes[best]);
    assert_eq!(classes[best], "versicolor");
    Ok(())
}
// ANCHOR_END: predict
