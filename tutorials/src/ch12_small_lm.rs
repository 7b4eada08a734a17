//! Chapter 12: a small byte-level language model trained on the CPU, end to end: the
//! corpus, token files, batches, warmup and cosine decay, gradient accumulation and
//! clipping, held-out loss and perplexity, then greedy and seeded sampling.

// ANCHOR: imports
use std::error::Error;
use std::io::Read;
use std::path::Path;

use rusting_brain::{Optimizer, Sampler, Schedule, TokenBatch, TokenFile, TransformerLm};
// ANCHOR_END: imports

// ANCHOR: corpus
/// A gzipped text file of the repository's corpus (the Rust book and Rust by Example).
fn read_corpus(name: &str) -> Result<String, Box<dyn Error>> {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../native/examples/data/corpus")).join(name);
    let file = std::fs::File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(file).read_to_string(&mut text)?;
    Ok(text)
}

/// The simplest tokenizer there is: one token per byte, ids 0 to 255. Every text
/// encodes, UTF-8 included (a character outside ASCII becomes two to four tokens).
fn encode(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

fn decode(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids.iter().map(|&id| id as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The loss of a model that knows how often each byte occurs and nothing else, in nats:
/// a language model that reads context must get under it.
fn unigram_entropy(ids: &[u32]) -> f32 {
    let mut counts = [0usize; 256];
    ids.iter().for_each(|&id| counts[id as usize] += 1);
    let n = ids.len() as f32;
    counts.iter().filter(|&&c| c > 0).map(|&c| c as f32 / n).map(|p| -p * p.ln()).sum()
}
// ANCHOR_END: corpus

// ANCHOR: config
const VOCAB: usize = 256;
const SEQ: usize = 64; // positions a training row predicts
const MICRO: usize = 4; // rows per micro-batch
const ACCUMULATE: usize = 2; // micro-batches per optimizer step
const STEPS: u64 = 300;
/// Chunks of 8 rows x 64 predictions: 8,192 held-out tokens.
const HELD_OUT_CHUNKS: usize = 16;
// ANCHOR_END: config

// ANCHOR: held_out
/// Mean loss per held-out token over the first chunks of the held-out file, read in order
/// so every evaluation sees the same tokens.
fn held_out_loss(model: &mut TransformerLm, held: &mut TokenFile) -> Result<f32, Box<dyn Error>> {
    let (mut sum, mut tokens) = (0.0f64, 0usize);
    for i in 0..HELD_OUT_CHUNKS {
        let Some(batch) = held.chunk(i, 8, SEQ)? else {
            break;
        };
        let loss = model.evaluate(&batch)?;
        sum += f64::from(loss.lm_loss) * loss.tokens as f64;
        tokens += loss.tokens;
    }
    if tokens == 0 {
        return Err("the held-out file has no tokens".into());
    }
    Ok((sum / tokens as f64) as f32)
}
// ANCHOR_END: held_out

// ANCHOR: train
fn train(
    model: &mut TransformerLm, data: &mut TokenFile, held: &mut TokenFile,
) -> Result<(), Box<dyn Error>> {
    let schedule = Schedule::warmup_cosine(3e-3, STEPS / 10, STEPS);
    for step in 0..STEPS {
        model.optimizer.set_learning_rate(schedule.rate(step));
        model.zero_grad()?;
        let mut loss = 0.0;
        for micro in 0..ACCUMULATE {
            // Windows drawn from (seed, index) alone: a resumed run reads the same ones.
            let batch = data.batch(step * ACCUMULATE as u64 + micro as u64, MICRO, SEQ)?;
            loss += model.accumulate_step(&batch)?.lm_loss / ACCUMULATE as f32;
        }
        // The gradients were summed over the micro-batches; 1 / ACCUMULATE makes them the
        // mean, then the global norm is clipped to 1.
        let norm = model.step_clipped(1.0 / ACCUMULATE as f32, 1.0)?;
        if (step + 1) % 100 == 0 {
            let held_loss = held_out_loss(model, held)?;
            println!(
                "step {:>3}  lr {:.1e}  train loss {loss:.3}  gradient norm {norm:.2}  held-out {held_loss:.3}",
                step + 1,
                schedule.rate(step)
            );
        }
    }
    Ok(())
}
// ANCHOR_END: train

// ANCHOR: generate
fn generate(model: &mut TransformerLm) -> Result<(), Box<dyn Error>> {
    let prompt = encode("fn main() {\n    let ");
    let greedy = model.generate(&prompt, 60, &mut Sampler::greedy())?;
    println!("greedy:      {:?}", decode(&[&prompt[..], &greedy].concat()));

    let sampler = || Sampler::temperature(0.8, Some(42)).top_k(20);
    let first = model.generate(&prompt, 60, &mut sampler())?;
    let second = model.generate(&prompt, 60, &mut sampler())?;
    println!("temperature: {:?}", decode(&[&prompt[..], &first].concat()));
    assert_eq!(first, second, "the same seed drew different tokens");
    assert_eq!(first.len(), 60);
    Ok(())
}
// ANCHOR_END: generate

// ANCHOR: main
pub fn main() -> Result<(), Box<dyn Error>> {
    let (train_ids, held_ids) =
        (encode(&read_corpus("train.txt.gz")?), encode(&read_corpus("heldout.txt.gz")?));
    let entropy = unigram_entropy(&train_ids);
    println!(
        "{} training and {} held-out tokens; unigram entropy {entropy:.3} nats",
        train_ids.len(),
        held_ids.len()
    );

    // A row of n ids is n - 1 predictions: each input position's target is the next id.
    let example = TokenBatch::new([encode("fn main")])?;
    println!("inputs  {:?}\ntargets {:?}", decode(&example.inputs), decode(&example.targets));

    let dir = std::env::temp_dir().join("rusting_brain_tutorial_12");
    std::fs::create_dir_all(&dir)?;
    TokenFile::write(dir.join("train.bin"), &train_ids)?;
    TokenFile::write(dir.join("heldout.bin"), &held_ids)?;
    let mut data = TokenFile::open(dir.join("train.bin"), 42)?;
    let mut held = TokenFile::open(dir.join("heldout.bin"), 0)?;

    let mut model = TransformerLm::builder()
        .vocab_size(VOCAB)
        .d_model(64)
        .n_layers(2)
        .heads(4, 2, 16)
        .d_ff(176)
        .max_seq_len(128)
        .optimizer(Optimizer::adam(3e-3).betas(0.9, 0.95).weight_decay(0.1))
        .seed(7)
        .build()?;
    println!("model: {}", model.parameter_counts());

    let start = held_out_loss(&mut model, &mut held)?;
    println!(
        "held-out loss at start {start:.3} (ln 256 = {:.3}), perplexity {:.1}",
        (VOCAB as f32).ln(),
        start.exp()
    );
    train(&mut model, &mut data, &mut held)?;
    let end = held_out_loss(&mut model, &mut held)?;
    println!("held-out loss {start:.3} -> {end:.3}, perplexity {:.1} -> {:.1}", start.exp(), end.exp());
    // A fresh model predicts every byte about equally: ln 256. Frequencies alone would reach
    // the unigram entropy; the model must do better than that, so it reads its context.
    assert!((start - (VOCAB as f32).ln()).abs() < 0.1);
    assert!(end < entropy - 0.3, "held-out loss {end:.3} is not clearly under {entropy:.3}");

    generate(&mut model)
}
// ANCHOR_END: main
