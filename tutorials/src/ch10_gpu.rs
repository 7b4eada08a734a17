//! Chapter 10: GPU basics. The same network trains on the CPU and, where the machine has a
//! wgpu adapter (Vulkan, Metal, DX12, or Mesa's software lavapipe), on the GPU; the program
//! measures how far apart the two end up. Without an adapter it says why and stays on the
//! CPU. With the `cuda` feature it also tries an NVIDIA GPU through CUDA.

// ANCHOR: uses
use std::path::Path;
use std::time::Instant;

use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, GpuOptions, Loss, Network, Optimizer, TrainConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;
// ANCHOR_END: uses

// ANCHOR: setup
/// Two interleaved half-moons, 512 points.
fn moons() -> Result<Dataset> {
    let mut rng = Rng::new(10);
    let (mut inputs, mut targets) = (Vec::new(), Vec::new());
    for i in 0..512 {
        let class = i % 2;
        let t = rng.uniform(0.0, std::f64::consts::PI);
        let (x, y) = if class == 0 { (t.cos(), t.sin()) } else { (1.0 - t.cos(), 0.5 - t.sin()) };
        inputs.push(vec![(x + 0.1 * rng.normal()) as f32, (y + 0.1 * rng.normal()) as f32]);
        targets.push(if class == 0 { vec![1.0, 0.0] } else { vec![0.0, 1.0] });
    }
    Ok(Dataset::new(inputs, targets)?)
}

fn network() -> Result<Network> {
    Ok(Network::builder()
        .input_size(2)
        .dense(64, Activation::Tanh)
        .dense(64, Activation::Tanh)
        .dense(2, Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(0.03))
        .seed(10)
        .try_build()?)
}

fn epochs(epochs: usize, seed: u64) -> TrainConfig {
    TrainConfig { epochs, batch_size: 64, shuffle: true, seed: Some(seed) }
}

/// Every weight and bias, layer by layer, read from a saved file.
fn parameters(network: &Network, path: &Path) -> Result<Vec<f32>> {
    network.save_json(path)?;
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut out = Vec::new();
    for layer in file["layers"].as_array().ok_or("no layers in the file")? {
        out.extend(serde_json::from_value::<Vec<Vec<f32>>>(layer["weights"].clone())?.concat());
        out.extend(serde_json::from_value::<Vec<f32>>(layer["bias"].clone())?);
    }
    Ok(out)
}

/// The largest |a - b|: infinite when the lengths differ, NaN when a value is NaN (`max`
/// would skip it), so a check that it is small fails on either.
fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |worst, d| if d > worst || d.is_nan() { d } else { worst })
}
// ANCHOR_END: setup

// ANCHOR: move
/// Moves the network to a GPU: the best adapter first, then the software one. Returns
/// the adapter's name, or `None` (with the reason printed) if neither opens.
fn to_some_gpu(network: &mut Network) -> Option<String> {
    match network.to_gpu() {
        Ok(()) => return Some(network.device()),
        Err(error) => println!("to_gpu: {error}"),
    }
    match network.to_gpu_with(&GpuOptions { software: true, ..Default::default() }) {
        Ok(()) => Some(network.device()),
        Err(error) => {
            println!("to_gpu_with(software): {error}");
            None
        }
    }
}
// ANCHOR_END: move

// ANCHOR: cuda
#[cfg(feature = "cuda")]
fn try_cuda(data: &Dataset) -> Result<()> {
    let (mut cpu, mut cuda) = (network()?, network()?);
    // Device 0, at most 256 MiB there: weights, gradients and Adam's moments are counted
    // against the budget before anything is allocated.
    if let Err(error) = cuda.to_cuda(0, 256) {
        println!("to_cuda: {error}");
        return Ok(());
    }
    cpu.fit(data, epochs(5, 1))?;
    cuda.fit(data, epochs(5, 1))?;
    let (a, b) = (cpu.predict_batch(data.inputs())?, cuda.predict_batch(data.inputs())?);
    let difference = max_difference(&a.concat(), &b.concat());
    println!("on {}: 5 epochs, outputs within {difference:.1e} of the CPU's", cuda.device());
    assert!(difference < 1e-4, "CUDA outputs {difference} from the CPU's");
    cuda.to_cpu()?;
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn try_cuda(_: &Dataset) -> Result<()> {
    println!("CUDA: not built in; `--features cuda` adds it (cargo run --release -p rusting_brain_tutorials --features cuda -- 10)");
    Ok(())
}
// ANCHOR_END: cuda

// ANCHOR: main
pub fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join("rusting_brain_tutorial_10");
    std::fs::create_dir_all(&dir)?;
    let data = moons()?;

    // Two copies of one network, trained alike for 3 epochs so that Adam has state to move.
    let (mut cpu, mut gpu) = (network()?, network()?);
    cpu.fit(&data, epochs(3, 1))?;
    gpu.fit(&data, epochs(3, 1))?;

    println!("before: {}", gpu.device());
    let Some(adapter) = to_some_gpu(&mut gpu) else {
        println!("no GPU adapter: training goes on on the CPU alone");
        cpu.fit(&data, epochs(10, 2))?;
        let accuracy = cpu.accuracy(&data)?;
        println!("CPU accuracy {:.1}%", 100.0 * accuracy);
        assert!(accuracy > 0.95, "CPU accuracy {accuracy}");
        return try_cuda(&data);
    };
    println!("after to_gpu: {adapter}");

    // The same 10 epochs, same shuffling, on each device.
    let start = Instant::now();
    let cpu_losses = cpu.fit(&data, epochs(10, 2))?;
    let cpu_time = start.elapsed();
    let start = Instant::now();
    let gpu_losses = gpu.fit(&data, epochs(10, 2))?;
    let gpu_time = start.elapsed();
    println!("10 epochs: CPU {cpu_time:.2?}, GPU {gpu_time:.2?}");
    println!("last loss: CPU {:.6}, GPU {:.6}", cpu_losses[9], gpu_losses[9]);

    let (cpu_out, gpu_out) = (cpu.predict_batch(data.inputs())?, gpu.predict_batch(data.inputs())?);
    let outputs = max_difference(&cpu_out.concat(), &gpu_out.concat());
    let accuracy = gpu.accuracy(&data)?;

    // Back to the CPU: weights, gradients and Adam's moments all come home.
    gpu.to_cpu()?;
    println!("after to_cpu: {}", gpu.device());
    let weights =
        max_difference(&parameters(&cpu, &dir.join("cpu.json"))?, &parameters(&gpu, &dir.join("gpu.json"))?);
    println!(
        "largest difference: outputs {outputs:.1e}, weights {weights:.1e}; GPU accuracy {:.1}%",
        100.0 * accuracy
    );
    assert!(accuracy > 0.95, "GPU accuracy {accuracy}");
    assert!(outputs < 1e-5 && weights < 1e-4, "outputs {outputs}, weights {weights}");

    // Had the moments stayed behind, the next epoch would jump away from the CPU's.
    cpu.fit(&data, epochs(1, 3))?;
    gpu.fit(&data, epochs(1, 3))?;
    let after =
        max_difference(&parameters(&cpu, &dir.join("cpu.json"))?, &parameters(&gpu, &dir.join("gpu.json"))?);
    println!("one more epoch, both on the CPU: weights differ by {after:.1e}");
    assert!(after < 2.0 * weights + 1e-5, "{after} after one epoch, {weights} before");

    try_cuda(&data)
}
// ANCHOR_END: main
