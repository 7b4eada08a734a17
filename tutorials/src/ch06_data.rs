//! Chapter 6: loading data. The program writes a CSV, two `.npy` files and an IDX pair
//! itself, byte by byte where the format is binary, reads them back with the library's
//! loaders, then splits, standardizes and augments what it read.

// ANCHOR: uses
use std::path::Path;

use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;
// ANCHOR_END: uses

// ANCHOR: csv
fn load_csv(dir: &Path) -> Result<()> {
    // A header row (a first row with a non-numeric cell is a header), then numbers. The
    // last column is the target: `from_csv(path, 1)`.
    let grades = dir.join("grades.csv");
    std::fs::write(
        &grades,
        "hours_studied,hours_slept,score\n2.0,7.5,61\n4.5,6.0,78\n8.0,8.0,95\n1.0,5.5,40\n",
    )?;
    let data = Dataset::from_csv(&grades, 1)?;
    println!("grades.csv: {} rows, {} inputs, {} target", data.len(), data.input_size(), data.target_size());
    assert_eq!((data.len(), data.input_size(), data.target_size()), (4, 2, 1));
    assert_eq!(data.inputs()[1], [4.5, 6.0]);
    assert_eq!(data.targets()[1], [78.0]);

    // The last column holds a class name: the inputs are the other columns, the targets
    // one-hot, and the names come back sorted, so column i of a target is names[i].
    let flowers = dir.join("flowers.csv");
    std::fs::write(
        &flowers,
        "length,width,species\n5.1,3.5,setosa\n6.3,2.9,virginica\n5.8,2.7,versicolor\n4.9,3.0,setosa\n",
    )?;
    let (data, names) = Dataset::from_csv_labeled(&flowers)?;
    println!("flowers.csv: classes {names:?}, row 1's target {:?}", data.targets()[1]);
    assert_eq!(names, ["setosa", "versicolor", "virginica"]);
    assert_eq!(data.targets()[1], [0.0, 0.0, 1.0]);
    Ok(())
}
// ANCHOR_END: csv

// ANCHOR: csv_error
fn show_a_loader_error(dir: &Path) -> Result<()> {
    // Line 3, column 2 holds a word where a number should be.
    let broken = dir.join("broken.csv");
    std::fs::write(&broken, "hours_studied,hours_slept,score\n2.0,7.5,61\n4.5,six,78\n")?;
    let error = Dataset::from_csv(&broken, 1).err().ok_or("a bad cell was accepted")?;
    println!("error: {error}");
    let message = error.to_string();
    assert!(message.contains("broken.csv") && message.contains("line 3, column 2"));
    Ok(())
}
// ANCHOR_END: csv_error

// ANCHOR: npy
/// Writes an array as NumPy's `numpy.save` does (format 1.0): a magic string, a version,
/// the length of a Python-dict header, the header padded with spaces so the data starts
/// on a 64-byte boundary, then the values' bytes in C (row-major) order.
fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) -> std::io::Result<()> {
    // A 1-D shape is written `(4,)`: Python's one-element tuple.
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // 10 bytes come before the header (magic, version, length); it ends with a newline.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes)
}
// ANCHOR_END: npy

// ANCHOR: npy_load
fn load_npy(dir: &Path) -> Result<()> {
    // Four rows of three little-endian float32 features (`<f4`), and one unsigned-byte
    // label per row (`|u1`): a 1-D array, read as one target column of class indices.
    let features: [f32; 12] = [0.5, 1.0, -2.0, 0.0, 0.25, 3.5, 1.5, -1.0, 0.0, 2.0, 2.0, 2.0];
    let bytes: Vec<u8> = features.iter().flat_map(|v| v.to_le_bytes()).collect();
    write_npy(&dir.join("x.npy"), "<f4", &[4, 3], &bytes)?;
    write_npy(&dir.join("y.npy"), "|u1", &[4], &[0, 2, 1, 2])?;

    let mut data = Dataset::from_npy(dir.join("x.npy"), dir.join("y.npy"))?;
    assert_eq!((data.len(), data.input_size(), data.target_size()), (4, 3, 1));
    assert_eq!(data.inputs()[1], [0.0, 0.25, 3.5]);
    data.one_hot_targets(3)?;
    println!(
        "x.npy, y.npy: {} rows of {}, row 1's target {:?}",
        data.len(),
        data.input_size(),
        data.targets()[1]
    );
    assert_eq!(data.targets()[1], [0.0, 0.0, 1.0]);
    Ok(())
}
// ANCHOR_END: npy_load

// ANCHOR: idx
/// Writes an IDX file (the MNIST format): two zero bytes, the element type (0x08: unsigned
/// byte), the number of dimensions, each dimension as a big-endian u32, then the bytes.
fn write_idx(path: &Path, dims: &[u32], data: &[u8]) -> std::io::Result<()> {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes)
}

fn load_idx(dir: &Path) -> Result<Dataset> {
    // Two 3x3 images, a bright left column and a bright right column, and their labels.
    #[rustfmt::skip]
    let pixels = [
        255, 0, 0,   255, 0, 0,   255, 0, 0,
        0, 0, 255,   0, 0, 255,   0, 0, 255,
    ];
    write_idx(&dir.join("images.idx"), &[2, 3, 3], &pixels)?;
    write_idx(&dir.join("labels.idx"), &[2], &[0, 1])?;

    let mut images = Dataset::from_idx(dir.join("images.idx"), dir.join("labels.idx"))?;
    images.one_hot_targets(2)?;
    println!(
        "images.idx: {} images of {} pixels, row 0 {:?}",
        images.len(),
        images.input_size(),
        images.inputs()[0]
    );
    assert_eq!((images.len(), images.input_size()), (2, 9));
    assert_eq!(images.inputs()[0][..3], [1.0, 0.0, 0.0]);
    Ok(images)
}
// ANCHOR_END: idx

// ANCHOR: flip
fn augment(images: &mut Dataset) -> Result<()> {
    // Each image is 3 pixels wide: every 3-value line of a row is reversed, and the
    // mirrored copies are appended after the originals, with the same targets.
    images.flip_horizontal(3)?;
    println!("after flip_horizontal(3): {} rows, row 2 {:?}", images.len(), images.inputs()[2]);
    assert_eq!(images.len(), 4);
    assert_eq!(images.inputs()[2][..3], [0.0, 0.0, 1.0]);
    assert_eq!(images.targets()[2], images.targets()[0]);
    Ok(())
}
// ANCHOR_END: flip

// ANCHOR: rings
/// 300 rows, two classes at 2:1: class 1 is a ring around class 0. The first feature is
/// below one in size, the second in the thousands.
fn rings() -> Result<Dataset> {
    let mut rng = Rng::new(6);
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for i in 0..300 {
        let class = usize::from(i % 3 == 0);
        let radius = if class == 1 { rng.uniform(1.2, 2.0) } else { rng.uniform(0.0, 0.8) };
        let angle = rng.uniform(0.0, std::f64::consts::TAU);
        inputs.push(vec![(radius * angle.cos()) as f32, (2_000.0 + 1_000.0 * radius * angle.sin()) as f32]);
        let mut target = vec![0.0; 2];
        target[class] = 1.0;
        targets.push(target);
    }
    Ok(Dataset::new(inputs, targets)?)
}

/// Rows of each class: the argmax of each one-hot target.
fn class_counts(data: &Dataset) -> Vec<usize> {
    let mut counts = vec![0; data.target_size()];
    for t in data.targets() {
        let class = (0..t.len()).fold(0, |best, i| if t[i] > t[best] { i } else { best });
        counts[class] += 1;
    }
    counts
}
// ANCHOR_END: rings

// ANCHOR: split
fn split(data: &Dataset) -> (Dataset, Dataset) {
    let (plain_train, plain_test) = data.split(0.8);
    let (train, test) = data.split_stratified(0.8);
    println!(
        "split:            train {:?}  test {:?}",
        class_counts(&plain_train),
        class_counts(&plain_test)
    );
    println!("split_stratified: train {:?}  test {:?}", class_counts(&train), class_counts(&test));
    assert_eq!((plain_train.len(), plain_test.len()), (240, 60));
    assert_eq!((class_counts(&train), class_counts(&test)), (vec![160, 80], vec![40, 20]));
    (train, test)
}
// ANCHOR_END: split

// ANCHOR: standardize
fn standardize(train: &mut Dataset, test: &mut Dataset) -> Result<()> {
    // The statistics come from the training rows alone; the same numbers then transform
    // the test rows and any row predicted later.
    let stats = train.standardize();
    stats.apply(test)?;
    println!("training means {:?}, standard deviations {:?}", stats.mean, stats.std);
    for column in 0..2 {
        let values: Vec<f32> = train.inputs().iter().map(|r| r[column]).collect();
        let mean = values.iter().sum::<f32>() / values.len() as f32;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / values.len() as f32;
        assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4, "column {column}: {mean} {var}");
    }

    let mut row = vec![0.1, 2_500.0];
    stats.apply_row(&mut row)?;
    assert_eq!(row[1], (2_500.0 - stats.mean[1]) / stats.std[1]);
    Ok(())
}
// ANCHOR_END: standardize

// ANCHOR: compare
/// Test accuracy of one network, the same architecture and seeds every call.
fn train_and_score(train: &Dataset, test: &Dataset) -> Result<f32> {
    let mut network = Network::builder()
        .input_size(2)
        .dense(16, Activation::Tanh)
        .dense(2, Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(0.01))
        .seed(6)
        .try_build()?;
    network.fit(train, TrainConfig { epochs: 40, batch_size: 16, shuffle: true, seed: Some(6) })?;
    Ok(network.accuracy(test)?)
}
// ANCHOR_END: compare

// ANCHOR: main
pub fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join("rusting_brain_tutorial_06");
    std::fs::create_dir_all(&dir)?;
    load_csv(&dir)?;
    show_a_loader_error(&dir)?;
    load_npy(&dir)?;
    let mut images = load_idx(&dir)?;
    augment(&mut images)?;

    let (mut train, mut test) = split(&rings()?);
    let raw = train_and_score(&train, &test)?;
    standardize(&mut train, &mut test)?;
    let standardized = train_and_score(&train, &test)?;
    println!("test accuracy: raw inputs {:.1}%, standardized {:.1}%", 100.0 * raw, 100.0 * standardized);
    assert!(standardized >= 0.95 && standardized > raw + 0.2, "raw {raw}, standardized {standardized}");
    Ok(())
}
// ANCHOR_END: main
