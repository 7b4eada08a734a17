//! The examples' datasets and networks, shared by the test files that train or export them
//! (native's network and ONNX tests, the GPU dense tests).

use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer};
use rusting_brain_core::Rng;

/// The four XOR rows.
pub fn xor() -> Dataset {
    Dataset::new(
        vec![vec![0.0, 0.0], vec![0.0, 1.0], vec![1.0, 0.0], vec![1.0, 1.0]],
        vec![vec![0.0], vec![1.0], vec![1.0], vec![0.0]],
    )
    .unwrap()
}

/// The xor example's network: 2 -> 8 tanh -> 1 sigmoid.
pub fn xor_network() -> Network {
    Network::builder()
        .input_size(2)
        .dense(8, Activation::Tanh)
        .dense(1, Activation::Sigmoid)
        .loss(Loss::BinaryCrossEntropy)
        .optimizer(Optimizer::adam(0.05))
        .seed(42)
        .build()
}

/// The bundled iris table (150 rows, 4 features, 3 one-hot classes) and its class names.
pub fn iris() -> (Dataset, Vec<String>) {
    Dataset::from_csv_labeled(concat!(env!("CARGO_MANIFEST_DIR"), "/../native/examples/data/iris.csv"))
        .unwrap()
}

/// Iris split 80/20 by class and standardized by the training part's statistics, as the
/// classification example does: (train, test).
pub fn iris_split() -> (Dataset, Dataset) {
    let (mut train, mut test) = iris().0.split_stratified(0.8);
    let stats = train.standardize();
    stats.apply(&mut test).unwrap();
    (train, test)
}

/// The classification example's network: 4 -> 16 relu -> 3 softmax.
pub fn iris_network() -> Network {
    Network::builder()
        .input_size(4)
        .dense(16, Activation::Relu)
        .dense(3, Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(0.01))
        .seed(7)
        .build()
}

/// The regression example's task: y = sin(2 x0) + 0.5 x1^2 on [-1, 1]^2.
pub fn regression_data(n: usize, seed: u64) -> Dataset {
    let mut rng = Rng::new(seed);
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (a, b) = (rng.uniform(-1.0, 1.0) as f32, rng.uniform(-1.0, 1.0) as f32);
        xs.push(vec![a, b]);
        ys.push(vec![(2.0 * a).sin() + 0.5 * b * b]);
    }
    Dataset::new(xs, ys).unwrap()
}
