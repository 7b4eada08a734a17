//! Chapter 2: gradient descent on one weight by hand, then the library learning XOR, which no
//! single neuron can represent.

// ANCHOR: by_hand
/// Four points that lie close to the line y = 3x.
const XS: [f32; 4] = [1.0, 2.0, 3.0, 4.0];
const YS: [f32; 4] = [3.1, 5.9, 9.2, 11.8];

/// How wrong the one-weight model y = w * x is: the mean of the squared errors.
fn loss(w: f32) -> f32 {
    let squares: f32 = XS.iter().zip(&YS).map(|(x, y)| (w * x - y).powi(2)).sum();
    squares / XS.len() as f32
}

/// dL/dw. Each term (w x - y)^2 grows by 2 (w x - y) x per unit of w (the chain rule),
/// and the derivative of a mean is the mean of the derivatives.
fn gradient(w: f32) -> f32 {
    let terms: f32 = XS.iter().zip(&YS).map(|(x, y)| 2.0 * (w * x - y) * x).sum();
    terms / XS.len() as f32
}

/// Gradient descent: start somewhere, and step against the slope, again and again.
fn descend(learning_rate: f32, steps: usize) -> f32 {
    let mut w = 0.0;
    for _ in 0..steps {
        w -= learning_rate * gradient(w);
    }
    w
}
// ANCHOR_END: by_hand

// ANCHOR: by_hand_run
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig};

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The slope the formula gives should match the slope measured by nudging w both ways.
    let (w, h) = (1.0, 0.1);
    let measured = (loss(w + h) - loss(w - h)) / (2.0 * h);
    println!("gradient at w = 1: formula {:.4}, measured {measured:.4}", gradient(w));
    // The loss is a parabola in w, so the centered difference is exact but for f32 rounding:
    // losses near 30 are off by a few units of 4e-6, divided by 2h = 0.2 that is about 1e-4
    // at worst. The two agree to 3e-5 here.
    assert!((gradient(w) - measured).abs() < 1e-3);

    // For y = w x the best w has a closed form, sum(x y) / sum(x^2); descent must find it.
    let best = XS.iter().zip(&YS).map(|(x, y)| x * y).sum::<f32>() / XS.iter().map(|x| x * x).sum::<f32>();
    for learning_rate in [0.002, 0.05, 0.14] {
        let w = descend(learning_rate, 30);
        println!("learning rate {learning_rate:<6} w = {w:>10.4}, loss {:>12.4}", loss(w));
    }
    println!("closed form          w = {best:>10.4}, loss {:>12.4}", loss(best));
    assert!((descend(0.05, 30) - best).abs() < 1e-4);
    assert!(loss(descend(0.14, 30)) > loss(0.0), "too large a rate should diverge");
    // ANCHOR_END: by_hand_run

    // ANCHOR: data
    let data = Dataset::new(
        vec![vec![0.0, 0.0], vec![0.0, 1.0], vec![1.0, 0.0], vec![1.0, 1.0]],
        vec![vec![0.0], vec![1.0], vec![1.0], vec![0.0]],
    )?;
    // ANCHOR_END: data

    // ANCHOR: line
    // One sigmoid neuron: its decision boundary, w . x + b = 0, is a straight line.
    let mut line = Network::builder()
        .input_size(2)
        .dense(1, Activation::Sigmoid)
        .loss(Loss::BinaryCrossEntropy)
        .optimizer(Optimizer::sgd(0.5))
        .seed(1)
        .try_build()?;
    let config = TrainConfig { epochs: 2_000, batch_size: 4, shuffle: false, seed: Some(1) };
    line.fit(&data, config)?;
    let (line_loss, line_accuracy) = (line.evaluate(&data)?, line.accuracy(&data)?);
    println!("one neuron: loss {line_loss:.4}, accuracy {line_accuracy:.2}");
    // No line separates XOR; the best a line can do is answer 0.5 everywhere, a loss of ln 2.
    assert!(line_accuracy < 1.0 && line_loss > 0.69);
    // ANCHOR_END: line

    // ANCHOR: model
    let mut model = Network::builder()
        .input_size(2)
        .dense(4, Activation::Tanh)
        .dense(1, Activation::Sigmoid)
        .loss(Loss::BinaryCrossEntropy)
        .optimizer(Optimizer::sgd(0.5))
        .seed(1)
        .try_build()?;
    // ANCHOR_END: model

    // ANCHOR: fit
    let config = TrainConfig { epochs: 10_000, batch_size: 4, shuffle: false, seed: Some(1) };
    let history = model.fit_with(&data, config, |epoch, loss| {
        if epoch == 1 || epoch % 100 == 0 {
            println!("epoch {epoch:>5}  loss {loss:.4}");
        }
        // Returning false stops training: here, once the loss is small enough.
        loss > 0.01
    })?;
    println!("stopped after {} epochs", history.len());
    // ANCHOR_END: fit

    // ANCHOR: check
    for (x, y) in data.inputs().iter().zip(data.targets()) {
        println!("{x:?} -> {:.3}  (want {})", model.predict(x)?[0], y[0]);
    }
    let accuracy = model.accuracy(&data)?;
    println!("accuracy {:.0}%", 100.0 * accuracy);
    assert_eq!(accuracy, 1.0);
    assert!(history.len() < config.epochs, "the callback should have stopped training early");
    let first = history.first().ok_or("no epochs ran")?;
    assert!(history.iter().all(|l| l <= first), "full-batch descent with a small rate should not climb");
    Ok(())
}
// ANCHOR_END: check
