//! Chapter 14: a byte-level BPE vocabulary trained on the bundled corpus, saved and loaded as
//! `tokenizer.json`, its compression at several sizes, and its ids fed to a `TransformerLm`.

// ANCHOR: header
use std::io::Read;

use rusting_brain::{Optimizer, Sampler, TokenBatch, TransformerLm};
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

type Error = Box<dyn std::error::Error>;

/// `tokenizers` returns `Box<dyn Error + Send + Sync>`, which `?` does not turn into
/// `Box<dyn Error>` by itself (no `From` impl covers it); a coercion does.
fn tk<T>(result: tokenizers::Result<T>) -> Result<T, Error> {
    result.map_err(|e| e as Error)
}
// ANCHOR_END: header

// ANCHOR: corpus
const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../native/examples/data/corpus/train.txt.gz");

/// The corpus's first `train_bytes` to learn the vocabulary from, and the `test_bytes` after
/// them to measure it on; each piece ends at a line break, so no character is cut in two.
fn corpus(train_bytes: usize, test_bytes: usize) -> Result<(String, String), Error> {
    let file = std::fs::File::open(CORPUS).map_err(|e| format!("{CORPUS}: {e}"))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(file).read_to_string(&mut text)?;
    let line_end = |from: usize, len: usize| -> Result<usize, Error> {
        let to = (from + len).min(text.len());
        let last = text.as_bytes()[from..to]
            .iter()
            .rposition(|&b| b == b'\n')
            .ok_or("the corpus has no line break there")?;
        Ok(from + last + 1)
    };
    let split = line_end(0, train_bytes)?;
    let end = line_end(split, test_bytes)?;
    Ok((text[..split].to_string(), text[split..end].to_string()))
}
// ANCHOR_END: corpus

// ANCHOR: train
/// Ends a document; the browser package stops generating when it is drawn.
const END: &str = "<|end|>";

/// A byte-level BPE vocabulary of `vocab_size` tokens, with the `language_model` example's
/// settings.
fn train_bpe(text: &str, vocab_size: usize) -> Result<Tokenizer, Error> {
    let mut trainer: TrainerWrapper = BpeTrainer::builder()
        .vocab_size(vocab_size)
        // A pair seen once is not a pattern; merging it would only spend a slot.
        .min_frequency(2)
        .show_progress(false)
        // All 256 byte values are tokens from the start, so every text encodes and there
        // is no "unknown" token.
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from(END, true)])
        .build()
        .into();
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer
        // Split at GPT-2's word boundaries first, so merges never cross them; no space is
        // added in front, so decode(encode(text)) is text.
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
        .with_decoder(Some(ByteLevel::default()));
    // Lines with their line breaks, so "\n" and indentation take part in merges.
    tk(tokenizer.train(&mut trainer, text.split_inclusive('\n')))?;
    Ok(tokenizer)
}
// ANCHOR_END: train

// ANCHOR: save
pub fn main() -> Result<(), Error> {
    let dir = std::env::temp_dir().join("rusting_brain_tutorial_14");
    std::fs::create_dir_all(&dir)?;
    let (train_text, test_text) = corpus(256 << 10, 64 << 10)?;
    let started = std::time::Instant::now();
    let trained = train_bpe(&train_text, 1024)?;
    println!(
        "learned {} tokens from {} KiB of text in {:.1} s",
        trained.get_vocab_size(true),
        train_text.len() >> 10,
        started.elapsed().as_secs_f64()
    );
    let path = dir.join("tokenizer.json");
    tk(trained.save(&path, false))?;
    let tokenizer = tk(Tokenizer::from_file(&path))?;

    let sample = "fn main() {\n    println!(\"naïve café, 日本\");\n}";
    let encoding = tk(tokenizer.encode(sample, false))?;
    println!("{} bytes -> {} tokens", sample.len(), encoding.len());
    println!("tokens {:?}", encoding.get_tokens());
    println!("ids    {:?}", encoding.get_ids());
    assert_eq!(encoding.get_ids(), tk(trained.encode(sample, false))?.get_ids());
    let decoded = tk(tokenizer.decode(encoding.get_ids(), false))?;
    assert_eq!(decoded, sample, "byte-level BPE gives back every byte");
    // ANCHOR_END: save

    // ANCHOR: special
    let end = tokenizer.token_to_id(END).ok_or("the vocabulary has no <|end|>")?;
    let two = format!("the first document.{END}The second");
    let ids = tk(tokenizer.encode(two.as_str(), false))?.get_ids().to_vec();
    println!("{END} is id {end}: {ids:?}");
    assert_eq!(ids.iter().filter(|&&id| id == end).count(), 1);
    assert_eq!(tk(tokenizer.decode(&ids, false))?, two);
    assert_eq!(tk(tokenizer.decode(&ids, true))?, two.replace(END, ""));
    // ANCHOR_END: special

    // ANCHOR: sizes
    println!("{:>6} {:>12} {:>16} {:>20}", "vocab", "tokens/byte", "bytes/128 tokens", "embedding (d 192)");
    let mut previous = f64::INFINITY;
    for vocab_size in [257, 512, 1024, 2048] {
        let t = if vocab_size == 1024 { tokenizer.clone() } else { train_bpe(&train_text, vocab_size)? };
        let tokens = tk(t.encode(test_text.as_str(), false))?.len();
        let per_byte = tokens as f64 / test_text.len() as f64;
        let vocab = t.get_vocab_size(true);
        println!("{vocab:>6} {per_byte:>12.3} {:>16.0} {:>20}", 128.0 / per_byte, vocab * 192);
        if vocab_size == 257 {
            // 256 bytes and <|end|>: no merges, one token a byte.
            assert_eq!(tokens, test_text.len());
        }
        assert!(per_byte < previous, "a larger vocabulary must compress more");
        previous = per_byte;
    }
    // ANCHOR_END: sizes

    // ANCHOR: model
    let vocab = tokenizer.get_vocab_size(true);
    let mut model = TransformerLm::builder()
        .vocab_size(vocab)
        .d_model(64)
        .n_layers(2)
        .heads(4, 2, 16)
        .d_ff(128)
        .max_seq_len(64)
        .optimizer(Optimizer::adam(3e-3))
        .seed(14)
        .build()?;
    const SEQ: usize = 32;
    let rows = |text: &str| -> Result<Vec<Vec<u32>>, Error> {
        let ids = tk(tokenizer.encode(text, false))?.get_ids().to_vec();
        Ok(ids.chunks_exact(SEQ + 1).map(<[u32]>::to_vec).collect())
    };
    let (train_rows, test_rows) = (rows(&train_text)?, rows(&test_text)?);
    let held_out = TokenBatch::new(&test_rows[..16])?;
    let before = model.evaluate(&held_out)?.lm_loss;
    // Batches of 8 consecutive windows, walking through the training text.
    for step in 0..300 {
        let at = (step * 8) % (train_rows.len() - 8);
        model.train_step(&train_rows[at..at + 8])?;
    }
    let after = model.evaluate(&held_out)?.lm_loss;
    // ANCHOR_END: model

    // ANCHOR: unigram
    // The loss of a model that knows only how often each token occurs: the first thing
    // training picks up, and the bar that context-aware predictions have to get under.
    let mut counts = vec![0usize; vocab];
    train_rows.iter().flatten().for_each(|&id| counts[id as usize] += 1);
    let total = counts.iter().sum::<usize>() as f64;
    let unigram: f64 =
        counts.iter().filter(|&&c| c > 0).map(|&c| -(c as f64 / total) * (c as f64 / total).ln()).sum();
    println!(
        "held-out loss {before:.3} -> {after:.3}; ln {vocab} = {:.3}, unigram entropy {unigram:.3}",
        (vocab as f32).ln()
    );
    // Untrained, every token is about equally likely: the loss starts near ln(vocab).
    assert!((before - (vocab as f32).ln()).abs() < 0.3);
    assert!((after as f64) < unigram - 0.2, "300 steps should use the context");
    // ANCHOR_END: unigram

    // ANCHOR: generate
    let prompt = tk(tokenizer.encode("fn main() {", false))?.get_ids().to_vec();
    let new_ids = model.generate(&prompt, 16, &mut Sampler::greedy())?;
    println!("greedy continuation: {:?}", tk(tokenizer.decode(&new_ids, false))?);
    // ANCHOR_END: generate

    // ANCHOR: mismatch
    let mut bytes_only = TransformerLm::builder()
        .vocab_size(256)
        .d_model(64)
        .n_layers(2)
        .heads(4, 2, 16)
        .d_ff(128)
        .max_seq_len(64)
        .build()?;
    let refused = bytes_only
        .train_step(&train_rows[..2])
        .err()
        .ok_or("a 256-token model took ids of a 1024-token vocabulary")?;
    println!("a 256-token model: {refused}");
    assert!(refused.to_string().contains("outside the vocabulary (256)"));
    assert_eq!(bytes_only.steps(), 0, "the refused step changed nothing");
    Ok(())
}
// ANCHOR_END: mismatch
