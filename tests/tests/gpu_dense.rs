//! Dense networks trained on the GPU (`Network::to_gpu`, the WGSL forward, backward and
//! optimizer kernels through core's `DenseModel`) against the same training on the CPU:
//! XOR and iris reach the CPU's accuracy, and three steps leave the same weights.
//! Software adapter (lavapipe) as in tests/gpu_lm.rs; `RB_REQUIRE_GPU=1` makes a missing
//! adapter a failure.
//!
//! Tolerance of the 3-step comparison: 1e-5 of each tensor's scale. The GPU's products
//! sum in the reference's order but may fuse multiply-adds, and its exp/tanh/sqrt are a
//! few ULP off libm; three Adam steps of lr 0.05 carry those differences (measured worst
//! printed by the test).

use rusting_brain::{Activation, Loss, Network, Optimizer, TrainConfig};
use rusting_brain_test_support::dense::{iris_network, iris_split, xor};

fn on_gpu(n: &mut Network) -> Option<()> {
    rusting_brain_tests::network_to_wgpu(n).then(|| eprintln!("device: {}", n.device()))
}

fn xor_net(optimizer: Optimizer) -> Network {
    Network::builder()
        .input_size(2)
        .dense(8, Activation::Tanh)
        .dense(8, Activation::LeakyRelu(0.1))
        .dense(1, Activation::Sigmoid)
        .loss(Loss::BinaryCrossEntropy)
        .optimizer(optimizer)
        .seed(42)
        .build()
}

#[test]
fn three_steps_on_the_gpu_leave_the_cpus_weights() {
    for optimizer in [Optimizer::adam(0.05), Optimizer::sgd_momentum(0.5, 0.9)] {
        let mut cpu = xor_net(optimizer);
        let mut gpu = xor_net(optimizer);
        if on_gpu(&mut gpu).is_none() {
            return;
        }
        let config = TrainConfig { epochs: 3, batch_size: 4, shuffle: false, seed: Some(1) };
        let (hc, hg) = (cpu.fit(&xor(), config).unwrap(), gpu.fit(&xor(), config).unwrap());
        for (a, b) in hc.iter().zip(&hg) {
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "loss history {hc:?} vs {hg:?}");
        }
        // The weights after three steps, read back by moving the network to the CPU.
        gpu.to_cpu().unwrap();
        let (dir, name) = (std::env::temp_dir(), format!("rb_gpu_dense_{}.json", std::process::id()));
        let (pc, pg) = (dir.join(format!("cpu_{name}")), dir.join(format!("gpu_{name}")));
        cpu.save_json(&pc).unwrap();
        gpu.save_json(&pg).unwrap();
        let load = |p: &std::path::Path| {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            let mut all = Vec::new();
            collect(&v["layers"], &mut all);
            all
        };
        let (wc, wg) = (load(&pc), load(&pg));
        let _ = (std::fs::remove_file(&pc), std::fs::remove_file(&pg));
        assert_eq!(wc.len(), wg.len());
        assert!(wc.len() > 100, "the weights were read ({})", wc.len());
        // Through the kit's helper: a NaN weight or a length mismatch fails, never folds away.
        let (wc, wg): (Vec<f32>, Vec<f32>) =
            (wc.iter().map(|&v| v as f32).collect(), wg.iter().map(|&v| v as f32).collect());
        let worst = rusting_brain_test_support::rel_to_scale("weights after 3 steps", &wg, &wc);
        eprintln!("{optimizer:?}: worst weight difference after 3 steps {worst:e} of the scale");
        assert!(worst < 1e-5, "{worst}");
    }
}

/// Every number under a JSON value, in document order.
fn collect(v: &serde_json::Value, out: &mut Vec<f64>) {
    match v {
        serde_json::Value::Number(n) => out.push(n.as_f64().unwrap_or(f64::NAN)),
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
        serde_json::Value::Object(o) => o.values().for_each(|x| collect(x, out)),
        _ => {}
    }
}

#[test]
fn xor_and_iris_reach_the_cpus_accuracy_on_the_gpu() {
    let mut n = xor_net(Optimizer::adam(0.05));
    if on_gpu(&mut n).is_none() {
        return;
    }
    let config = TrainConfig { epochs: 300, batch_size: 4, shuffle: true, seed: Some(42) };
    n.fit(&xor(), config).unwrap();
    assert_eq!(n.accuracy(&xor()).unwrap(), 1.0);

    // Iris as tests in native/tests/network.rs trains it on the CPU (93% or better there).
    let (train, test) = iris_split();
    let mut model = iris_network();
    on_gpu(&mut model).unwrap();
    let config = TrainConfig { epochs: 200, batch_size: 16, shuffle: true, seed: Some(7) };
    model.fit(&train, config).unwrap();
    let acc = model.accuracy(&test).unwrap();
    eprintln!("iris test accuracy on the GPU: {acc}");
    assert!(acc >= 0.93, "test accuracy {acc}");
    // Bad input stays an error on the GPU too.
    assert!(model.predict(&[1.0, 2.0]).is_err());
}
