//! A dense network between native Rust and the browser package's `Network`: the native side
//! of the page's training tests (tests/browser/train.test.mjs), usable by hand as well.
//!
//!     cargo run --release -p rusting_brain --example browser_network -- fixtures OUT_DIR
//!     cargo run --release -p rusting_brain --example browser_network -- predict NET.json ROWS.json
//!
//! `fixtures` writes `OUT_DIR/train-native.json`: iris' stratified 80/20 split, standardized;
//! the network file after three full-batch Adam steps from seed 7 (what the page must
//! reach from the same seed); a network trained for 200 epochs, its file and its outputs on
//! the test rows (what the page must predict after loading it); and native training speed
//! for the page's iris settings, in samples a second, and of the Text tab's tiny language
//! model, in tokens a second (single-threaded and on all threads).
//! `predict` loads a network file (one a page wrote: `JSON.stringify(network)`) and prints
//! its outputs for the rows of a JSON array of arrays.

use std::time::Instant;

use rusting_brain::core::Rng;
use rusting_brain::{Activation, Dataset, Loss, Network, Optimizer, TrainConfig, TransformerLm};
use serde_json::{json, Value};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The page's iris network (the Train page's defaults).
fn iris_network() -> Network {
    Network::builder()
        .input_size(4)
        .dense(16, Activation::Relu)
        .dense(3, Activation::Softmax)
        .loss(Loss::CategoricalCrossEntropy)
        .optimizer(Optimizer::adam(0.01))
        .seed(7)
        .build()
}

fn file_of(network: &Network, dir: &std::path::Path, name: &str) -> Result<Value> {
    let path = dir.join(name);
    network.save_json(&path)?;
    Ok(serde_json::from_slice(&std::fs::read(&path)?)?)
}

fn samples_per_second(train: &Dataset, threads: Option<usize>) -> Result<f64> {
    // The pool's closure must be Send; the error travels as text.
    let run = || -> std::result::Result<f64, String> {
        let mut net = iris_network();
        let epochs = 200;
        let config = TrainConfig { epochs, batch_size: 16, shuffle: true, seed: Some(1) };
        let t0 = Instant::now();
        net.fit(train, config).map_err(|e| e.to_string())?;
        Ok((epochs * train.len()) as f64 / t0.elapsed().as_secs_f64())
    };
    Ok(match threads {
        Some(n) => rayon::ThreadPoolBuilder::new().num_threads(n).build()?.install(run)?,
        None => run()?,
    })
}

/// Training speed of the Text tab's "tiny" model (its defaults: batch 8 of 64 tokens,
/// vocabulary 512), in tokens a second over 30 steps after 3 of warm-up.
fn lm_tokens_per_second(threads: Option<usize>) -> Result<f64> {
    let run = || -> std::result::Result<f64, String> {
        let mut lm = TransformerLm::builder()
            .vocab_size(512)
            .d_model(64)
            .n_layers(2)
            .heads(4, 2, 16)
            .d_ff(192)
            .max_seq_len(64)
            .optimizer(Optimizer::adam(3e-3))
            .seed(7)
            .build()
            .map_err(|e| e.to_string())?;
        let mut rng = Rng::new(1);
        let mut step = |lm: &mut TransformerLm| -> std::result::Result<(), String> {
            let rows: Vec<Vec<u32>> =
                (0..8).map(|_| (0..65).map(|_| rng.below(512) as u32).collect()).collect();
            lm.zero_grad().map_err(|e| e.to_string())?;
            let batch = rusting_brain::TokenBatch::new(&rows).map_err(|e| e.to_string())?;
            lm.accumulate_step(&batch).map_err(|e| e.to_string())?;
            lm.step_clipped(1.0, 1.0).map_err(|e| e.to_string())?;
            Ok(())
        };
        for _ in 0..3 {
            step(&mut lm)?;
        }
        let t0 = Instant::now();
        for _ in 0..30 {
            step(&mut lm)?;
        }
        Ok((30 * 8 * 64) as f64 / t0.elapsed().as_secs_f64())
    };
    Ok(match threads {
        Some(n) => rayon::ThreadPoolBuilder::new().num_threads(n).build()?.install(run)?,
        None => run()?,
    })
}

fn fixtures(out: &str) -> Result<()> {
    let dir = std::path::Path::new(out);
    std::fs::create_dir_all(dir)?;
    let csv = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/iris.csv");
    let (data, classes) = Dataset::from_csv_labeled(csv)?;
    let (mut train, mut test) = data.split_stratified(0.8);
    let stats = train.standardize();
    stats.apply(&mut test)?;

    let mut three = iris_network();
    let full = TrainConfig { epochs: 3, batch_size: train.len(), shuffle: false, seed: Some(0) };
    let three_losses = three.fit(&train, full)?;

    let mut trained = iris_network();
    let config = TrainConfig { epochs: 200, batch_size: 16, shuffle: true, seed: Some(7) };
    trained.fit(&train, config)?;
    let predictions = trained.predict_batch(test.inputs())?;
    let accuracy = trained.accuracy(&test)?;

    // Best of three, as the page's figure is.
    let mut one = 0.0f64;
    let mut all = 0.0f64;
    for _ in 0..3 {
        one = one.max(samples_per_second(&train, Some(1))?);
        all = all.max(samples_per_second(&train, None)?);
    }
    let fixture = json!({
        "classes": classes,
        "train": { "x": train.inputs(), "y": train.targets() },
        "test": { "x": test.inputs(), "y": test.targets() },
        "three_steps": { "losses": three_losses, "file": file_of(&three, dir, "iris-three-steps.json")? },
        "trained": {
            "file": file_of(&trained, dir, "iris-trained.json")?,
            "predictions": predictions,
            "accuracy": accuracy,
        },
        "native_samples_per_second": { "one_thread": one, "all_threads": all, "threads": rayon::current_num_threads() },
        "native_lm_tokens_per_second": {
            "one_thread": lm_tokens_per_second(Some(1))?,
            "all_threads": lm_tokens_per_second(None)?,
            "threads": rayon::current_num_threads(),
        },
    });
    let path = dir.join("train-native.json");
    std::fs::write(&path, serde_json::to_string(&fixture)?)?;
    println!(
        "wrote {}: held-out accuracy {:.1}%, native training {one:.0} samples/s on one thread, {all:.0} on {}",
        path.display(),
        100.0 * accuracy,
        rayon::current_num_threads()
    );
    Ok(())
}

fn predict(network: &str, rows: &str) -> Result<()> {
    let mut net = Network::load_json(network)?;
    let rows: Vec<Vec<f32>> = serde_json::from_slice(&std::fs::read(rows)?)
        .map_err(|e| format!("{rows}: expected a JSON array of rows of numbers: {e}"))?;
    println!("{}", serde_json::to_string(&net.predict_batch(&rows)?)?);
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["fixtures", out] => fixtures(out),
        ["predict", network, rows] => predict(network, rows),
        _ => Err("usage: browser_network fixtures OUT_DIR | predict NET.json ROWS.json".into()),
    }
}
