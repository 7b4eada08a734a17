//! Fine-tune the `language_model` example's checkpoint with LoRA on a text of another style:
//! the code listings of the bundled corpus alone (the base learned prose and code mixed).
//!
//!     cargo run --release -p rusting_brain --example language_model -- train   # the base, once
//!     cargo run --release -p rusting_brain --example lora_finetune [-- --steps N --rank R]
//!
//! It reports the held-out loss on the corpus's prose and on its code before and after,
//! trains rank-8 adapters on every projection (the base frozen), saves them
//! (`target/language_model/code_adapter.rbl`, a few hundred kilobytes beside the base's
//! megabytes), checks that the saved adapter reloads onto a fresh base bit for bit, merges
//! it and checks the merged model predicts the same, and generates from a code prompt.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rusting_brain::core::Rng;
use rusting_brain::{LoraConfig, Optimizer, Sampler, TokenBatch, TransformerLm};
use tokenizers::Tokenizer;

type Error = Box<dyn std::error::Error + Send + Sync>;

const SEQ: usize = 128;
const BATCH: usize = 8;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/language_model"))
}

fn gz_text(path: &Path) -> Result<String, Error> {
    let mut s = String::new();
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    flate2::read::GzDecoder::new(file).read_to_string(&mut s)?;
    Ok(s)
}

/// Whether a line of the corpus belongs to a code listing: indented, a comment or an
/// attribute, an item or statement keyword, or ending the way Rust lines end. Prose lines
/// are sentences and headings.
fn is_code(line: &str) -> bool {
    let t = line.trim_end();
    if t.is_empty() {
        return false;
    }
    let starts = [
        "fn ", "let ", "use ", "impl", "struct ", "enum ", "match ", "pub ", "mod ", "trait ", "//", "#[",
        "}", "{", "println!", "assert", "const ", "static ", "type ", "where", "for ", "while ", "loop ",
        "if ",
    ];
    line.starts_with("    ")
        || starts.iter().any(|s| t.trim_start().starts_with(s))
        || t.ends_with(';')
        || t.ends_with('{')
        || t.ends_with("},")
}

/// The text split into (code listings, prose), each keeping its line breaks.
fn split(text: &str) -> (String, String) {
    let (mut code, mut prose) = (String::new(), String::new());
    for line in text.lines() {
        let to = if is_code(line) { &mut code } else { &mut prose };
        to.push_str(line);
        to.push('\n');
    }
    (code, prose)
}

fn encode(tok: &Tokenizer, text: &str) -> Result<Vec<u32>, Error> {
    Ok(tok.encode(text, false)?.get_ids().to_vec())
}

/// Consecutive windows of `SEQ + 1` tokens, up to `max` of them.
fn windows(ids: &[u32], max: usize) -> Vec<Vec<u32>> {
    ids.chunks_exact(SEQ + 1).take(max).map(<[u32]>::to_vec).collect()
}

fn held_out(model: &mut TransformerLm, rows: &[Vec<u32>]) -> Result<f32, Error> {
    let (mut sum, mut n) = (0f64, 0usize);
    for b in rows.chunks(BATCH) {
        let l = model.evaluate(&TokenBatch::new(b)?)?;
        sum += l.lm_loss as f64 * l.tokens as f64;
        n += l.tokens;
    }
    Ok((sum / n.max(1) as f64) as f32)
}

fn arg(name: &str, default: usize) -> Result<usize, Error> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args.get(i + 1).ok_or(format!("{name} needs a value"))?.parse()?),
        None => Ok(default),
    }
}

fn main() -> Result<(), Error> {
    let (steps, rank) = (arg("--steps", 300)?, arg("--rank", 8)?);
    let d = dir();
    let (base, tok_path) = (d.join("model.rbw"), d.join("tokenizer.json"));
    if !base.exists() || !tok_path.exists() {
        return Err(format!(
            "{} or its tokenizer is missing: run `cargo run --release -p rusting_brain --example language_model -- train` first",
            base.display()
        )
        .into());
    }
    let tok = Tokenizer::from_file(&tok_path)?;
    let corpus = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/corpus"));
    let (code_train, _) = split(&gz_text(&corpus.join("train.txt.gz"))?);
    let (code_held, prose_held) = split(&gz_text(&corpus.join("heldout.txt.gz"))?);
    let train_ids = encode(&tok, &code_train)?;
    let held = [
        ("prose", windows(&encode(&tok, &prose_held)?, 48)),
        ("code", windows(&encode(&tok, &code_held)?, 48)),
    ];
    println!(
        "code listings: {} training tokens; held out: {} prose and {} code windows of {SEQ}",
        train_ids.len(),
        held[0].1.len(),
        held[1].1.len()
    );

    let mut model = TransformerLm::load_bin(&base)?;
    let before: Vec<f32> = held.iter().map(|(_, r)| held_out(&mut model, r)).collect::<Result<_, _>>()?;
    model.add_lora(LoraConfig::new(rank).alpha(2.0 * rank as f32))?;
    println!(
        "LoRA rank {rank} on every projection: {} of {} weights train",
        model.trainable_parameters(),
        model.parameter_counts().total
    );
    model.optimizer = Optimizer::adam(2e-3).betas(0.9, 0.99).weight_decay(0.0);
    let mut rng = Rng::new(8);
    let t = Instant::now();
    for step in 0..steps {
        let rows: Vec<Vec<u32>> = (0..BATCH)
            .map(|_| {
                let at = rng.below((train_ids.len() - SEQ - 1) as u64) as usize;
                train_ids[at..at + SEQ + 1].to_vec()
            })
            .collect();
        model.zero_grad()?;
        let loss = model.accumulate_step(&TokenBatch::new(&rows)?)?;
        model.step_clipped(1.0, 1.0)?;
        if (step + 1) % 50 == 0 {
            println!("  step {:>4}: training loss {:.3}", step + 1, loss.lm_loss);
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let after: Vec<f32> = held.iter().map(|(_, r)| held_out(&mut model, r)).collect::<Result<_, _>>()?;
    println!("trained {steps} steps in {secs:.0} s ({:.0} tokens/s)", (steps * BATCH * SEQ) as f64 / secs);
    println!("{:<16} {:>10} {:>10}", "held-out loss", "base", "+ adapter");
    for (i, (name, _)) in held.iter().enumerate() {
        println!("{name:<16} {:>10.3} {:>10.3}", before[i], after[i]);
    }

    let adapter = d.join("code_adapter.rbl");
    model.save_lora(&adapter)?;
    println!(
        "saved {} ({} KiB; the base is {} KiB)",
        adapter.display(),
        std::fs::metadata(&adapter)?.len() / 1024,
        std::fs::metadata(&base)?.len() / 1024
    );
    let probe = TokenBatch::new(&held[1].1[..BATCH.min(held[1].1.len())])?;
    let adapted = model.forward_batch(&probe)?;
    let mut fresh = TransformerLm::load_bin(&base)?;
    fresh.load_lora(&adapter)?;
    let same = fresh.forward_batch(&probe)? == adapted;
    println!("reloaded onto a fresh base: logits {}", if same { "bit for bit the same" } else { "DIFFER" });
    model.merge_lora()?;
    let merged = model.forward_batch(&probe)?;
    let scale = adapted.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = merged.iter().zip(&adapted).map(|(a, b)| (a - b).abs()).fold(0f32, |m, d| {
        if d > m || d.is_nan() {
            d
        } else {
            m
        }
    });
    println!("merged: worst logit difference {:.1e} of the largest", worst / scale);

    let prompt = "fn main() {\n    let";
    let ids = encode(&tok, prompt)?;
    let mut sampler = Sampler::temperature(0.8, Some(5)).top_p(0.9);
    let out = model.generate(&ids, 60, &mut sampler)?;
    println!("--- merged model, from {prompt:?}:\n{prompt}{}", tok.decode(&out, false)?);
    let merged_ok = worst <= 1e-4 * scale; // false for NaN too
    if !same || !merged_ok {
        return Err("the adapter did not reload or merge to the same predictions".into());
    }
    Ok(())
}
