//! Chapter 15: the checkpoint file read by hand, exact resume from weights and optimizer
//! state, int8 quantization (file size, generation against f32, what it refuses), and the
//! int8 model decoded on a GPU where there is one.

// ANCHOR: setup
use std::io::Read;
use std::ops::Range;
use std::path::Path;

use rusting_brain::{NetworkError, Optimizer, Precision, Sampler, Schedule, TokenBatch, TransformerLm};

type Error = Box<dyn std::error::Error>;

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../native/examples/data/corpus/train.txt.gz");
const SEQ: usize = 32;
const BATCH: usize = 8;
const STEPS: u64 = 40;

/// The corpus's first `n` bytes as token ids: a 256-token vocabulary, one token a byte.
fn byte_ids(n: usize) -> Result<Vec<u32>, Error> {
    let file = std::fs::File::open(CORPUS).map_err(|e| format!("{CORPUS}: {e}"))?;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(file).take(n as u64).read_to_end(&mut bytes)?;
    Ok(bytes.into_iter().map(u32::from).collect())
}

fn new_model() -> Result<TransformerLm, Error> {
    Ok(TransformerLm::builder()
        .vocab_size(256)
        .d_model(64)
        .n_layers(2)
        .heads(4, 2, 16)
        .d_ff(128)
        .max_seq_len(64)
        .optimizer(Optimizer::adam(3e-3).betas(0.9, 0.95).weight_decay(0.1))
        .seed(15)
        .build()?)
}

/// Trains steps `steps` and returns their losses. The batch and the learning rate are
/// functions of the step's number alone, so a run cut in two sees what an uncut run sees.
fn train(model: &mut TransformerLm, ids: &[u32], steps: Range<u64>) -> Result<Vec<f32>, Error> {
    let schedule = Schedule::warmup_cosine(3e-3, 5, STEPS);
    let windows = ids.len() / (SEQ + 1);
    let mut losses = Vec::new();
    for step in steps {
        let rows: Vec<Vec<u32>> = (0..BATCH)
            .map(|r| {
                let w = (step as usize * BATCH + r) % windows;
                ids[w * (SEQ + 1)..(w + 1) * (SEQ + 1)].to_vec()
            })
            .collect();
        model.optimizer.set_learning_rate(schedule.rate(step));
        model.zero_grad()?;
        losses.push(model.accumulate_step(&TokenBatch::new(rows)?)?.lm_loss);
        model.step_clipped(1.0, 1.0)?;
    }
    Ok(losses)
}

/// Every weight's bits, by name: `==` on these is "bit for bit", where `==` on f32 would
/// also call 0.0 and -0.0 equal.
fn weight_bits(model: &TransformerLm) -> Result<Vec<(String, Vec<u32>)>, Error> {
    Ok(model
        .named_parameters()?
        .into_iter()
        .map(|(name, values)| (name, values.iter().map(|v| v.to_bits()).collect()))
        .collect())
}
// ANCHOR_END: setup

// ANCHOR: header
/// A safetensors file's header, read by hand: 8 bytes holding the JSON's length as a
/// little-endian u64, then that much JSON. Returns the JSON and the bytes after it (the
/// tensors' data).
fn read_header(path: &Path) -> Result<(serde_json::Value, usize), Error> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let length: [u8; 8] = bytes.get(..8).ok_or("shorter than 8 bytes")?.try_into()?;
    let n = usize::try_from(u64::from_le_bytes(length))?;
    let json = bytes[8..].get(..n).ok_or("the header is longer than the file")?;
    Ok((serde_json::from_slice(json)?, bytes.len() - 8 - n))
}

/// Prints the metadata and the first tensors, and checks that the shapes and dtypes
/// account for every byte of data.
fn describe(path: &Path) -> Result<(), Error> {
    let (header, data_bytes) = read_header(path)?;
    let entries = header.as_object().ok_or("the header is not a JSON object")?;
    let meta = &entries["__metadata__"];
    println!(
        "{}: format {}, precision {}",
        path.file_name().ok_or("no file name")?.to_string_lossy(),
        meta["format"],
        meta["precision"]
    );
    // The configuration is a JSON string inside the metadata (safetensors allows only strings).
    let config: serde_json::Value = serde_json::from_str(meta["config"].as_str().ok_or("no config")?)?;
    println!(
        "  config: vocab_size {}, d_model {}, n_layers {}",
        config["vocab_size"], config["d_model"], config["n_layers"]
    );
    let mut counted = 0;
    for (name, t) in entries.iter().filter(|(name, _)| *name != "__metadata__") {
        let dtype = t["dtype"].as_str().ok_or("a tensor without a dtype")?;
        let size = match dtype {
            "F32" => 4,
            "I8" => 1,
            other => return Err(format!("{name}: dtype {other} is not in this chapter").into()),
        };
        let shape: Vec<usize> = serde_json::from_value(t["shape"].clone())?;
        counted += size * shape.iter().product::<usize>();
        let shown =
            ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"];
        if shown.iter().any(|s| name.starts_with(s)) {
            println!("  {name:<44} {dtype:<4} {:<10} at {}", format!("{shape:?}"), t["data_offsets"]);
        }
    }
    println!("  {} tensors, {data_bytes} bytes of data", entries.len() - 1);
    assert_eq!(counted, data_bytes, "the shapes account for every byte");
    Ok(())
}
// ANCHOR_END: header

// ANCHOR: resume
pub fn main() -> Result<(), Error> {
    let dir = std::env::temp_dir().join("rusting_brain_tutorial_15");
    std::fs::create_dir_all(&dir)?;
    let ids = byte_ids(64 << 10)?;

    let mut straight = new_model()?;
    let straight_losses = train(&mut straight, &ids, 0..STEPS)?;

    let (weights, state) = (dir.join("model.rbw"), dir.join("model.rbw.opt"));
    let mut first_half = new_model()?;
    let mut losses = train(&mut first_half, &ids, 0..STEPS / 2)?;
    first_half.save_bin(&weights, Precision::F32)?;
    first_half.save_optimizer_state(&state)?;
    drop(first_half); // as if the process had ended here

    let mut resumed = TransformerLm::load_bin(&weights)?;
    resumed.load_optimizer_state(&state)?;
    assert_eq!(resumed.steps(), STEPS / 2);
    losses.extend(train(&mut resumed, &ids, STEPS / 2..STEPS)?);
    println!(
        "loss at steps 1, 20, 21, 40: {:.4} {:.4} {:.4} {:.4}",
        losses[0], losses[19], losses[20], losses[39]
    );
    let bits = |l: &[f32]| l.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&losses), bits(&straight_losses), "the same losses, bit for bit");
    assert_eq!(weight_bits(&resumed)?, weight_bits(&straight)?, "the same weights");
    println!("resumed at step 20: every loss and weight equals the uninterrupted run's");
    // ANCHOR_END: resume

    // ANCHOR: weights_only
    // The weights alone: Adam's moments start from zero and its settings from the default.
    let mut weights_only = TransformerLm::load_bin(&weights)?;
    let other = train(&mut weights_only, &ids, STEPS / 2..STEPS)?;
    println!("without the optimizer state, step 40's loss is {:.4}", other[19]);
    assert_ne!(weight_bits(&weights_only)?, weight_bits(&straight)?);
    // ANCHOR_END: weights_only

    // ANCHOR: files
    straight.save_bin(&weights, Precision::F32)?;
    let q8 = dir.join("model.q8.rbw");
    straight.save_bin(&q8, Precision::Q8)?;
    describe(&weights)?;
    describe(&q8)?;
    let (f32_size, q8_size) = (std::fs::metadata(&weights)?.len(), std::fs::metadata(&q8)?.len());
    let ratio = q8_size as f64 / f32_size as f64;
    println!("F32 file {f32_size} bytes, Q8 file {q8_size} bytes: {ratio:.3} of it");
    // A byte a weight instead of four, plus an f32 scale per matrix row, the f32 norms and
    // a longer header.
    assert!((0.25..0.30).contains(&ratio), "Q8 is about a quarter of F32");
    // ANCHOR_END: files

    // ANCHOR: quantize
    let mut int8 = TransformerLm::load_bin(&q8)?;
    assert!(int8.is_quantized());
    let mut in_memory = TransformerLm::load_bin(&weights)?;
    in_memory.quantize()?;
    println!(
        "weight bytes: {} f32 with gradients and Adam's moments, {} int8",
        straight.weight_bytes(),
        int8.weight_bytes()
    );

    let (mut same, mut total) = (0, 0);
    for start in [1000, 5000, 20000, 40000] {
        let prompt = &ids[start..start + 16];
        let want = straight.generate(prompt, 32, &mut Sampler::greedy())?;
        let got = int8.generate(prompt, 32, &mut Sampler::greedy())?;
        assert_eq!(got, in_memory.generate(prompt, 32, &mut Sampler::greedy())?);
        // Position by position, as a reader would compare the two texts.
        same += want.iter().zip(&got).filter(|(a, b)| a == b).count();
        total += want.len();
    }
    println!("greedy ids, int8 against f32: {same} of {total} the same");
    assert!(same * 10 >= total * 8, "int8 decoding should mostly agree with f32");
    // ANCHOR_END: quantize

    // ANCHOR: refused
    let rows = vec![ids[..SEQ + 1].to_vec()];
    let refused = int8.train_step(&rows).err().ok_or("an int8 model trained")?;
    println!("train_step on int8: {refused}");
    let no_f32 = int8.save_bin(dir.join("again.rbw"), Precision::F32).err().ok_or("int8 saved as F32")?;
    println!("save_bin(F32) on int8: {no_f32}");
    assert!(refused.to_string().contains("quantized") && no_f32.to_string().contains("quantized"));
    // ANCHOR_END: refused

    // ANCHOR: gpu
    let prompt = &ids[1000..1016];
    let on_cpu = int8.generate(prompt, 32, &mut Sampler::greedy())?;
    match int8.to_gpu() {
        Ok(()) => {
            let on_gpu = int8.generate(prompt, 32, &mut Sampler::greedy())?;
            println!(
                "int8 on {}: greedy ids equal the CPU's: {}",
                int8.device().unwrap_or_default(),
                on_gpu == on_cpu
            );
            assert_eq!(on_gpu, on_cpu);
        }
        Err(NetworkError::Gpu(why)) => println!("no GPU, so the int8 model stays on the CPU ({why})"),
        Err(other) => return Err(other.into()),
    }
    Ok(())
}
// ANCHOR_END: gpu
