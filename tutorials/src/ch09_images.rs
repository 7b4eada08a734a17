//! Chapter 9: images into a dense network. The program draws a folder of small PNGs (one
//! subfolder per class), loads it with `Dataset::from_image_folder`, trains a classifier
//! on the flattened pixels, and measures what mirrored copies add.

// ANCHOR: uses
use std::path::Path;

use rusting_brain::core::Rng;
use rusting_brain::vae::{save_png, Image};
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;
// ANCHOR_END: uses

// ANCHOR: layout
/// A 4x4 picture, red on its left half and green on its right, loaded back in colour and
/// in grayscale to show how a picture becomes a row.
fn layout(dir: &Path) -> Result<()> {
    let class = dir.join("palette").join("halves");
    std::fs::create_dir_all(&class)?;
    // `Image` holds channels first, values in [-1, 1]: -1 is 0, 1 is 255.
    let mut data = vec![-1.0; 3 * 16];
    for y in 0..4 {
        for x in 0..4 {
            let channel = if x < 2 { 0 } else { 1 };
            data[channel * 16 + y * 4 + x] = 1.0;
        }
    }
    save_png(&Image { width: 4, height: 4, channels: 3, data }, class.join("0.png"))?;

    let (colour, names) = Dataset::from_image_folder(dir.join("palette"), 4, 4, false)?;
    let row = &colour.inputs()[0];
    println!("classes {names:?}; colour row of {} values", row.len());
    println!("  red plane   {:?}", &row[0..4]);
    println!("  green plane {:?}", &row[16..20]);
    assert_eq!(row.len(), 3 * 16);
    assert_eq!(
        (&row[0..4], &row[16..20], &row[32..36]),
        (&[1.0, 1.0, 0.0, 0.0][..], &[0.0, 0.0, 1.0, 1.0][..], &[0.0; 4][..])
    );

    let (gray, _) = Dataset::from_image_folder(dir.join("palette"), 4, 4, true)?;
    println!("  grayscale   {:?}", &gray.inputs()[0][0..4]);
    assert_eq!(gray.input_size(), 16);
    // Luma weighs green far above red, as the eye does.
    assert!(gray.inputs()[0][0] < 0.3 && gray.inputs()[0][3] > 0.6);
    Ok(())
}
// ANCHOR_END: layout

// ANCHOR: draw
const CLASSES: [&str; 3] = ["horizontal", "square", "vertical"];

/// One 16x16 picture of class `class`: a bar or a hollow square at a random place, in a
/// random bright colour, on a dark background with noise.
fn draw(class: usize, rng: &mut Rng) -> Image {
    // Each shape's width and height; its top-left corner anywhere it fits.
    let (w, h) = [(10, 3), (8, 8), (3, 10)][class];
    let (x0, y0) = (rng.below(17 - w as u64) as usize, rng.below(17 - h as u64) as usize);
    let inside = |x: usize, y: usize| {
        let (dx, dy) = (x.wrapping_sub(x0), y.wrapping_sub(y0));
        let within = dx < w && dy < h;
        // The square is hollow: only its border is drawn.
        within && (class != 1 || dx == 0 || dy == 0 || dx == w - 1 || dy == h - 1)
    };
    let colour = [rng.uniform(0.3, 1.0), rng.uniform(0.3, 1.0), rng.uniform(0.3, 1.0)];
    let mut data = vec![0.0; 3 * 256];
    for (c, level) in colour.iter().enumerate() {
        for y in 0..16 {
            for x in 0..16 {
                let base = if inside(x, y) { *level } else { -0.8 };
                data[c * 256 + y * 16 + x] = (base + 0.15 * rng.normal()) as f32;
            }
        }
    }
    Image { width: 16, height: 16, channels: 3, data }
}

/// `dir/<class>/<n>.png`, `per_class` pictures of each class.
fn write_folder(dir: &Path, per_class: usize) -> Result<()> {
    // A folder left by an earlier run may hold other files: start from nothing.
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    let mut rng = Rng::new(9);
    for (class, name) in CLASSES.iter().enumerate() {
        std::fs::create_dir_all(dir.join(name))?;
        for n in 0..per_class {
            save_png(&draw(class, &mut rng), dir.join(name).join(format!("{n:03}.png")))?;
        }
    }
    Ok(())
}
// ANCHOR_END: draw

// ANCHOR: train
/// Test accuracy of a network trained on `train` for `epochs`, the same architecture and
/// seeds always.
fn train_and_score(train: &Dataset, test: &Dataset, epochs: usize) -> Result<(f32, Network)> {
    let mut network = Network::builder()
        .input_size(12 * 12)
        .dense(32, Activation::Relu)
        .dense(CLASSES.len(), Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(0.003))
        .seed(9)
        .try_build()?;
    network.fit(train, TrainConfig { epochs, batch_size: 16, shuffle: true, seed: Some(9) })?;
    Ok((network.accuracy(test)?, network))
}
// ANCHOR_END: train

// ANCHOR: main
pub fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join("rusting_brain_tutorial_09");
    layout(&dir)?;

    let shapes = dir.join("shapes");
    write_folder(&shapes, 100)?;
    // 16x16 colour files, read as 12x12 grayscale: 144 values a row, each in 0..=1.
    let (data, names) = Dataset::from_image_folder(&shapes, 12, 12, true)?;
    println!("{} pictures, {} values each, classes {names:?}", data.len(), data.input_size());
    assert_eq!((data.len(), data.input_size(), data.target_size()), (300, 144, 3));
    assert_eq!(names, CLASSES);
    assert!(data.inputs().iter().flatten().all(|v| (0.0..=1.0).contains(v)));

    // A deliberately small training set: a quarter of the pictures.
    let (train, test) = data.split_stratified(0.25);
    let mut flipped = train.clone();
    flipped.flip_horizontal(12)?;
    // Twice the rows make twice the steps an epoch: the plain run gets twice the epochs,
    // so both take the same number of steps.
    let (plain, _) = train_and_score(&train, &test, 80)?;
    let (augmented, mut network) = train_and_score(&flipped, &test, 40)?;
    println!("{} training pictures: test accuracy {:.1}%", train.len(), 100.0 * plain);
    println!("{} with mirrored copies: test accuracy {:.1}%", flipped.len(), 100.0 * augmented);
    for (name, row) in names.iter().zip(network.confusion_matrix(&test)?) {
        println!("  {name:<10} {row:?}");
    }
    assert_eq!(flipped.len(), 2 * train.len());
    assert!(
        plain >= 0.8 && augmented >= 0.97 && augmented > plain + 0.08,
        "plain {plain}, augmented {augmented}"
    );
    Ok(())
}
// ANCHOR_END: main
