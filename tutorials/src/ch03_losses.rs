//! Chapter 3: the activations and losses of a dense network, computed by hand and checked
//! against the library; why softmax goes with cross-entropy; what a mismatched pair does.

// ANCHOR: activations
fn relu(z: f32) -> f32 {
    z.max(0.0)
}

fn leaky_relu(z: f32, slope: f32) -> f32 {
    if z > 0.0 {
        z
    } else {
        slope * z
    }
}

fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

/// Scores to probabilities: all positive, summing to 1, the largest score the most likely.
/// Subtracting the largest score first cancels out in the ratio, but keeps `exp` from
/// overflowing to infinity on large scores.
fn softmax(z: &[f32]) -> Vec<f32> {
    let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = z.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}
// ANCHOR_END: activations

// ANCHOR: losses
/// The natural log, floored at -100 as PyTorch's losses floor it, so that a prediction of
/// exactly 0 costs 100 instead of infinity.
fn ln(p: f64) -> f64 {
    p.ln().max(-100.0)
}

/// Every (prediction, target) pair of two tables of rows, in f64 so that long sums keep
/// their precision.
fn pairs<'a>(pred: &'a [Vec<f32>], target: &'a [Vec<f32>]) -> impl Iterator<Item = (f64, f64)> + 'a {
    pred.iter().flatten().zip(target.iter().flatten()).map(|(&p, &y)| (p as f64, y as f64))
}

/// Mean squared error: the mean over every element of (p - y)^2.
fn mse(pred: &[Vec<f32>], target: &[Vec<f32>]) -> f64 {
    let (sum, n) = pairs(pred, target).fold((0.0, 0), |(s, n), (p, y)| (s + (p - y).powi(2), n + 1));
    sum / n as f64
}

/// Binary cross-entropy: each element is a probability p that its target is 1; the cost is
/// -ln p when the target is 1 and -ln(1 - p) when it is 0. Mean over every element.
fn bce(pred: &[Vec<f32>], target: &[Vec<f32>]) -> f64 {
    let (sum, n) = pairs(pred, target)
        .fold((0.0, 0), |(s, n), (p, y)| (s - (y * ln(p) + (1.0 - y) * ln(1.0 - p)), n + 1));
    sum / n as f64
}

/// Categorical cross-entropy: each row is a distribution over classes, and the cost is
/// -ln of the probability given to the true class. Summed over a row's classes (only the
/// one-hot class counts), averaged over rows.
fn cce(pred: &[Vec<f32>], target: &[Vec<f32>]) -> f64 {
    let sum: f64 = pairs(pred, target).map(|(p, y)| -y * ln(p)).sum();
    sum / pred.len() as f64
}
// ANCHOR_END: losses

// ANCHOR: compare
use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

type ByHand = fn(&[Vec<f32>], &[Vec<f32>]) -> f64;

/// Builds an untrained network ending in `activation`, and returns its loss on `data`
/// computed by hand from its predictions, and as the library's `evaluate` computes it.
fn both_losses(
    data: &Dataset, activation: Activation, loss: Loss, by_hand: ByHand,
) -> Result<(f64, f32), Box<dyn std::error::Error>> {
    let mut network = Network::builder()
        .input_size(data.input_size())
        .dense(8, Activation::Tanh)
        .dense(data.target_size(), activation)
        .loss(loss)
        .seed(5)
        .try_build()?;
    let predictions = network.predict_batch(data.inputs())?;
    Ok((by_hand(&predictions, data.targets()), network.evaluate(data)?))
}
// ANCHOR_END: compare

// ANCHOR: table
pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("     z  identity   relu  leaky(0.1)  sigmoid    tanh");
    for z in [-3.0f32, -0.5, 0.0, 0.5, 3.0] {
        println!(
            "{z:>6.1}  {z:>8.2} {:>6.2} {:>11.2} {:>8.3} {:>7.3}",
            relu(z),
            leaky_relu(z, 0.1),
            sigmoid(z),
            z.tanh()
        );
    }
    let scores = [2.0, 1.0, 0.25];
    let p = softmax(&scores);
    println!("softmax({scores:?}) = {p:.3?}, sum {:.6}", p.iter().sum::<f32>());
    // Adding the same number to every score changes nothing; without the max subtracted,
    // exp(102) would overflow f32 to infinity and every probability would be NaN.
    let shifted = softmax(&scores.map(|s| s + 100.0));
    for (a, b) in p.iter().zip(&shifted) {
        assert!((a - b).abs() < 1e-6);
    }
    assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    // ANCHOR_END: table

    // ANCHOR: check
    // 200 rows of 3 random inputs, and three kinds of target: any number (regression), 0 or
    // 1 per column (independent yes/no questions), and one class out of three (one-hot).
    let mut rng = Rng::new(11);
    let inputs: Vec<Vec<f32>> = (0..200).map(|_| (0..3).map(|_| rng.normal() as f32).collect()).collect();
    let numbers: Vec<Vec<f32>> = (0..200).map(|_| vec![rng.normal() as f32, rng.normal() as f32]).collect();
    let yes_no: Vec<Vec<f32>> = (0..200).map(|_| vec![rng.below(2) as f32, rng.below(2) as f32]).collect();
    let one_hot: Vec<Vec<f32>> = (0..200)
        .map(|_| {
            let mut row = vec![0.0; 3];
            row[rng.below(3) as usize] = 1.0;
            row
        })
        .collect();
    let cases = [
        ("identity + MSE", numbers, Activation::Identity, Loss::MeanSquaredError, mse as ByHand),
        ("sigmoid + BCE", yes_no, Activation::Sigmoid, Loss::BinaryCrossEntropy, bce),
        ("softmax + CCE", one_hot, Activation::Softmax, Loss::CategoricalCrossEntropy, cce),
    ];
    for (name, targets, activation, loss, by_hand) in cases {
        let data = Dataset::new(inputs.clone(), targets)?;
        let (mine, library) = both_losses(&data, activation, loss, by_hand)?;
        println!("{name:<15} by hand {mine:.7}  evaluate {library:.7}");
        // Both sum the same f32 predictions in f64, so the only real difference is that the
        // library returns its mean as an f32, rounded by up to 6e-8 of the value. They
        // differ by at most 5e-8 of the value here; 1e-6 leaves room for a change in the
        // order of the sums, and none for a change in the formula.
        assert!((mine - library as f64).abs() < 1e-6 * mine);
    }
    // ANCHOR_END: check

    // ANCHOR: slopes
    // A sigmoid output that is confidently wrong: the target is 1, the output almost 0.
    let (z, y) = (-6.0f32, 1.0f32);
    let p = sigmoid(z);
    // A step that is a power of two, so that z + h and z - h are exact in f32.
    let h = 1.0 / 1024.0;
    let slope = |f: ByHand| {
        let at = |z: f32| f(&[vec![sigmoid(z)]], &[vec![y]]);
        (at(z + h) - at(z - h)) / (2.0 * h as f64)
    };
    let (mse_slope, bce_slope) = (slope(mse), slope(bce));
    println!("output {p:.5}, target {y}: dMSE/dz = {mse_slope:.5}, dBCE/dz = {bce_slope:.5}");
    // The chain rule's answers: MSE's slope carries the sigmoid's own slope p (1 - p),
    // almost 0 here; with cross-entropy that factor cancels and p - y is left.
    // The measured slopes rest on f32 sigmoids, rounded by about 1e-7 of their value;
    // divided by 2h that is an error near 5e-5 (2e-5 here for BCE, 1e-7 for MSE, whose
    // slope is tiny). The tolerances are well above that and far below the slopes' gap.
    let (p, y) = (p as f64, y as f64);
    assert!((mse_slope - 2.0 * (p - y) * p * (1.0 - p)).abs() < 1e-5);
    assert!((bce_slope - (p - y)).abs() < 1e-3);

    // The same cancellation for softmax and categorical cross-entropy, score by score.
    let (scores, target) = ([2.0f32, -1.0, 0.5], [0.0f32, 1.0, 0.0]);
    let p = softmax(&scores);
    for i in 0..scores.len() {
        let at = |d: f32| {
            let mut z = scores;
            z[i] += d;
            cce(&[softmax(&z)], &[target.to_vec()])
        };
        let measured = (at(h) - at(-h)) / (2.0 * h as f64);
        println!("dCCE/dz{i} = {measured:>8.5}, p - y = {:>8.5}", p[i] - target[i]);
        // f32 rounding again, as above: up to 7e-5 here.
        assert!((measured - (p[i] - target[i]) as f64).abs() < 1e-3);
    }
    // ANCHOR_END: slopes

    // ANCHOR: mismatch
    let xor = Dataset::new(
        vec![vec![0.0, 0.0], vec![0.0, 1.0], vec![1.0, 0.0], vec![1.0, 1.0]],
        vec![vec![0.0], vec![1.0], vec![1.0], vec![0.0]],
    )?;
    let xor_network = |activation, loss| {
        Network::builder()
            .input_size(2)
            .dense(4, Activation::Tanh)
            .dense(1, activation)
            .loss(loss)
            .optimizer(Optimizer::sgd(0.5))
            .seed(1)
            .try_build()
    };

    // An identity output can leave (0, 1), where a logarithm of p or of 1 - p is not a
    // number; a softmax over one unit divides a number by itself and always outputs 1.
    // Both are refused when the network is built, not epochs later.
    for (activation, loss) in [
        (Activation::Identity, Loss::BinaryCrossEntropy),
        (Activation::Softmax, Loss::BinaryCrossEntropy),
        (Activation::Tanh, Loss::CategoricalCrossEntropy),
    ] {
        match xor_network(activation, loss) {
            Ok(_) => return Err(format!("{activation:?} + {loss:?} was accepted").into()),
            Err(e) => println!("{activation:?} + {loss:?}: {e}"),
        }
    }

    // The pair this chapter recommends, on the same network: it learns XOR.
    let config = TrainConfig { epochs: 300, batch_size: 4, shuffle: false, seed: Some(1) };
    let mut sigmoid_bce = xor_network(Activation::Sigmoid, Loss::BinaryCrossEntropy)?;
    let history = sigmoid_bce.fit(&xor, config)?;
    let last = history.last().ok_or("no epochs ran")?;
    println!("Sigmoid + BinaryCrossEntropy: loss {last:.4} after 300 epochs");
    assert_eq!(sigmoid_bce.accuracy(&xor)?, 1.0);
    Ok(())
}
// ANCHOR_END: mismatch
