//! Pixels into a dense network: an image folder (one subfolder per class) loaded, resized to
//! 16x16 grayscale, split, mirrored for more training data, trained and scored.
//!
//!     cargo run --release -p rusting_brain --example image_classification --features images [-- DIR]
//!
//! Without DIR it generates a small folder of its own (no real image set ships with the
//! repository): 60 noisy 24x24 PNGs per class of three shapes (horizontal bars, vertical
//! bars, a centered square), and says so.

use std::path::{Path, PathBuf};

use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

/// A class name and the pixels where its shape is bright.
type Shape = (&'static str, fn(u32, u32) -> bool);

fn generate(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng::new(11);
    let shapes: [Shape; 3] = [
        ("horizontal", |_, y| (y / 4) % 2 == 0),
        ("vertical", |x, _| (x / 4) % 2 == 0),
        ("square", |x, y| (6..18).contains(&x) && (6..18).contains(&y)),
    ];
    for (name, inside) in shapes {
        std::fs::create_dir_all(dir.join(name))?;
        for i in 0..60 {
            let img = image::GrayImage::from_fn(24, 24, |x, y| {
                let base = if inside(x, y) { 200.0 } else { 40.0 };
                image::Luma([(base + rng.normal() * 30.0).clamp(0.0, 255.0) as u8])
            });
            img.save(dir.join(name).join(format!("{i:03}.png")))?;
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = match std::env::args().nth(1) {
        Some(d) => PathBuf::from(d),
        None => {
            let d = std::env::temp_dir().join("rusting_brain_shapes");
            if !d.exists() {
                generate(&d)?;
            }
            println!(
                "no image folder given: using a generated one at {} (three shapes, 60 images each)",
                d.display()
            );
            d
        }
    };
    let (data, classes) = Dataset::from_image_folder(&dir, 16, 16, true)?;
    let (mut train, test) = data.split_stratified(0.8);
    train.flip_horizontal(16)?;
    println!(
        "{} training rows (with mirrored copies), {} test rows, classes {classes:?}",
        train.len(),
        test.len()
    );
    let mut model = Network::builder()
        .input_size(256)
        .dense(64, Activation::Relu)
        .dense(classes.len(), Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(1e-3))
        .seed(1)
        .build();
    let config = TrainConfig { epochs: 30, batch_size: 32, shuffle: true, seed: Some(1) };
    model.fit_with(&train, config, |epoch, loss| {
        if epoch % 5 == 0 {
            println!("epoch {epoch:>3}  loss {loss:.4}");
        }
        true
    })?;
    println!("test accuracy {:.1}%", 100.0 * model.accuracy(&test)?);
    for (name, row) in classes.iter().zip(model.confusion_matrix(&test)?) {
        println!("  {name:<11} {row:?}");
    }
    Ok(())
}
