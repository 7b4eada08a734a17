//! Chapter 16: a small base model taught to answer questions with LoRA adapters (supervised
//! fine-tuning), the adapters saved in PEFT's format and merged, the result quantized and
//! written where the `rusting-brain` npm package loads it.

// ANCHOR: setup
use std::io::Read;

use rusting_brain::{LoraConfig, NetworkError, Optimizer, Precision, Sampler, TokenBatch, TransformerLm};
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

type Error = Box<dyn std::error::Error>;

/// `tokenizers`' errors are `Box<dyn Error + Send + Sync>`; a coercion turns them into
/// `Box<dyn Error>` (chapter 14).
fn tk<T>(result: tokenizers::Result<T>) -> Result<T, Error> {
    result.map_err(|e| e as Error)
}

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../native/examples/data/corpus/train.txt.gz");
/// The browser package stops a reply when the model draws this token.
const END: &str = "<|end|>";

/// The corpus's first `n` bytes, ending at a line break.
fn corpus(n: usize) -> Result<String, Error> {
    let file = std::fs::File::open(CORPUS).map_err(|e| format!("{CORPUS}: {e}"))?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(file).read_to_string(&mut text)?;
    let end = text.as_bytes()[..n.min(text.len())]
        .iter()
        .rposition(|&b| b == b'\n')
        .ok_or("no line break in the corpus")?;
    text.truncate(end + 1);
    Ok(text)
}

/// Chapter 14's byte-level BPE vocabulary.
fn train_bpe(text: &str, vocab_size: usize) -> Result<Tokenizer, Error> {
    let mut trainer: TrainerWrapper = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from(END, true)])
        .build()
        .into();
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
        .with_decoder(Some(ByteLevel::default()));
    tk(tokenizer.train(&mut trainer, text.split_inclusive('\n')))?;
    Ok(tokenizer)
}
// ANCHOR_END: setup

// ANCHOR: pretrain
/// The base model: next-token prediction on `text`, which knows nothing of questions,
/// answers or <|end|>.
fn pretrain(text: &str, tokenizer: &Tokenizer) -> Result<TransformerLm, Error> {
    const SEQ: usize = 48;
    let ids = tk(tokenizer.encode(text, false))?.get_ids().to_vec();
    let rows: Vec<Vec<u32>> = ids.chunks_exact(SEQ + 1).map(<[u32]>::to_vec).collect();
    let mut model = TransformerLm::builder()
        .vocab_size(tokenizer.get_vocab_size(true))
        .d_model(64)
        .n_layers(2)
        .heads(4, 2, 16)
        .d_ff(128)
        .max_seq_len(128)
        .optimizer(Optimizer::adam(3e-3))
        .seed(16)
        .build()?;
    // Eight rows a step, round and round the text.
    for step in 0..150 {
        let batch: Vec<Vec<u32>> = (0..8).map(|r| rows[(step * 8 + r) % rows.len()].clone()).collect();
        model.train_step(&batch)?;
    }
    Ok(model)
}
// ANCHOR_END: pretrain

// ANCHOR: task
/// A question and its answer as token ids, the form `TokenBatch::supervised` takes.
type Pair = (Vec<u32>, Vec<u32>);

/// The new task: the corpus's table of keywords ("fn: Define a function ...") as questions
/// and answers. An answer starts with a space, as the definition does after "fn:", and ends
/// with <|end|>.
fn glossary(text: &str, tokenizer: &Tokenizer) -> Result<Vec<Pair>, Error> {
    let end = tokenizer.token_to_id(END).ok_or("the vocabulary has no <|end|>")?;
    let table = text
        .split("Keywords Currently in Use")
        .nth(1)
        .and_then(|rest| rest.split("Keywords Reserved").next())
        .ok_or("the keyword table is not in the corpus")?;
    let mut pairs = Vec::new();
    for line in table.lines() {
        let Some((keyword, meaning)) = line.split_once(": ") else {
            continue;
        };
        if keyword.contains(' ') {
            continue; // a sentence with a colon, not a row of the table
        }
        let prompt = format!("Q: What does {keyword} do?\nA:");
        let prompt = tk(tokenizer.encode(prompt.as_str(), false))?.get_ids().to_vec();
        let mut answer = tk(tokenizer.encode(format!(" {meaning}").as_str(), false))?.get_ids().to_vec();
        answer.push(end);
        pairs.push((prompt, answer));
    }
    Ok(pairs)
}

/// Greedy replies to each prompt: how many are the answer word for word (<|end|>
/// included), and how many end with <|end|> at all.
fn replies(model: &mut TransformerLm, pairs: &[Pair], end: u32) -> Result<(usize, usize), Error> {
    let (mut exact, mut ended) = (0, 0);
    for (prompt, answer) in pairs {
        let reply = model.generate_with(prompt, answer.len() + 8, &mut Sampler::greedy(), |id| id != end)?;
        exact += usize::from(reply == *answer);
        ended += usize::from(reply.last() == Some(&end));
    }
    Ok((exact, ended))
}
// ANCHOR_END: task

// ANCHOR: base
pub fn main() -> Result<(), Error> {
    let dir = std::env::temp_dir().join("rusting_brain_tutorial_16");
    std::fs::create_dir_all(&dir)?;

    let text = corpus(256 << 10)?;
    let tokenizer = train_bpe(&text, 512)?;
    let end = tokenizer.token_to_id(END).ok_or("the vocabulary has no <|end|>")?;
    // The base reads the corpus's first 4 KiB, the keyword appendix, thirty times over.
    let base_path = dir.join("base.rbw");
    pretrain(&corpus(4 << 10)?, &tokenizer)?.save_bin(&base_path, Precision::F32)?;

    let pairs = glossary(&text, &tokenizer)?;
    assert_eq!(pairs.len(), 39, "the table lists 39 keywords");
    // Every fourth question is held out of training.
    let (train, held): (Vec<_>, Vec<_>) = pairs.iter().enumerate().partition(|(i, _)| i % 4 != 3);
    let train: Vec<_> = train.into_iter().map(|(_, p)| p.clone()).collect();
    let held: Vec<_> = held.into_iter().map(|(_, p)| p.clone()).collect();

    let mut model = TransformerLm::load_bin(&base_path)?;
    let answers = TokenBatch::supervised(&train)?;
    let base_loss = model.evaluate(&answers)?.lm_loss;
    let (base_exact, _) = replies(&mut model, &train, end)?;
    let (_, base_ended) = replies(&mut model, &held, end)?;
    println!(
        "base: answer loss {base_loss:.3}; {base_exact} of {} answers word for word; \
         {base_ended} of {} held-out replies end",
        train.len(),
        held.len()
    );
    // ANCHOR_END: base

    // ANCHOR: lora
    let rank = 8;
    model.add_lora(LoraConfig::new(rank).alpha(2.0 * rank as f32))?;
    let c = model.config().clone();
    let (q, kv) = (c.q_heads * c.head_dim, c.kv_heads * c.head_dim);
    // A is (rank, d_in) and B is (d_out, rank), for q, k, v, o, gate, up and down.
    let per_layer: usize = [
        (c.d_model, q),
        (c.d_model, kv),
        (c.d_model, kv),
        (q, c.d_model),
        (c.d_model, c.d_ff),
        (c.d_model, c.d_ff),
        (c.d_ff, c.d_model),
    ]
    .iter()
    .map(|(d_in, d_out)| rank * (d_in + d_out))
    .sum();
    let total = model.parameter_counts().total;
    println!(
        "LoRA rank {rank}: {} of {total} weights train ({:.1}%)",
        model.trainable_parameters(),
        100.0 * model.trainable_parameters() as f64 / total as f64
    );
    assert_eq!(model.trainable_parameters(), c.n_layers * per_layer);
    // ANCHOR_END: lora

    // ANCHOR: finetune
    let frozen = model.named_parameters()?;
    // The adapters are few and start at zero: a higher rate than pretraining's, no decay.
    model.optimizer = Optimizer::adam(1e-2).betas(0.9, 0.99);
    for step in 0..100 {
        // Ten questions a step, the three thirds of the training set in turn.
        let third = &train[(step % 3) * 10..(step % 3 + 1) * 10];
        model.zero_grad()?;
        model.accumulate_step(&TokenBatch::supervised(third)?)?;
        model.step_clipped(1.0, 1.0)?;
    }
    let tuned_loss = model.evaluate(&answers)?.lm_loss;
    let (tuned_exact, _) = replies(&mut model, &train, end)?;
    let (held_exact, held_ended) = replies(&mut model, &held, end)?;
    println!(
        "tuned: answer loss {tuned_loss:.3}; {tuned_exact} of {} answers word for word; \
         held out: {held_ended} of {} end, {held_exact} right",
        train.len(),
        held.len()
    );
    assert!(model.named_parameters()? == frozen, "the base weights did not move");
    assert!(tuned_loss < base_loss / 4.0 && tuned_exact >= 25, "the adapters learned the answers");
    assert!(held_ended > base_ended, "and the form of an answer");

    for (prompt, _) in [&train[7], &held[4]] {
        let reply = model.generate_with(prompt, 40, &mut Sampler::greedy(), |id| id != end)?;
        let (q, a) = (tk(tokenizer.decode(prompt, false))?, tk(tokenizer.decode(&reply, false))?);
        println!("{q}{a}");
    }
    // ANCHOR_END: finetune

    // ANCHOR: gpu
    // Where there is a GPU the adapters train there too: the saved adapters onto two fresh
    // copies of the base, two steps on each device, the losses compared.
    let adapter = dir.join("adapter.rbl");
    model.save_lora(&adapter)?;
    let mut on_gpu = TransformerLm::load_bin(&base_path)?;
    on_gpu.load_lora(&adapter)?;
    match on_gpu.to_gpu() {
        Ok(()) => {
            let mut on_cpu = TransformerLm::load_bin(&base_path)?;
            on_cpu.load_lora(&adapter)?;
            let batch = TokenBatch::supervised(&train[..10])?;
            for _ in 0..2 {
                let (g, c) = (on_gpu.train_step_batch(&batch)?, on_cpu.train_step_batch(&batch)?);
                let device = on_gpu.device().unwrap_or_default();
                println!("loss on {device}: {:.6}, on the CPU: {:.6}", g.lm_loss, c.lm_loss);
                // The same math summed in another order: equal to float rounding.
                assert!((g.lm_loss - c.lm_loss).abs() <= 1e-4 * c.lm_loss);
            }
        }
        Err(NetworkError::Gpu(why)) => println!("no GPU, the adapters trained on the CPU only ({why})"),
        Err(other) => return Err(other.into()),
    }
    // ANCHOR_END: gpu

    // ANCHOR: peft
    let peft = dir.join("adapter");
    model.save_lora_peft(&peft)?;
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(peft.join("adapter_config.json"))?)?;
    println!(
        "PEFT adapter: r {}, lora_alpha {}, target_modules {}",
        config["r"], config["lora_alpha"], config["target_modules"]
    );
    println!(
        "  adapter_model.safetensors {} bytes; the base {} bytes",
        std::fs::metadata(peft.join("adapter_model.safetensors"))?.len(),
        std::fs::metadata(&base_path)?.len()
    );
    // Put onto a fresh copy of the base, the directory predicts the same, bit for bit.
    let probe = TokenBatch::supervised(&train[..4])?;
    let adapted = model.forward_batch(&probe)?;
    let mut reloaded = TransformerLm::load_bin(&base_path)?;
    reloaded.load_lora(&peft)?;
    assert!(reloaded.forward_batch(&probe)? == adapted);
    // ANCHOR_END: peft

    // ANCHOR: merge
    model.merge_lora()?;
    assert_eq!(model.trainable_parameters(), total, "an ordinary model again");
    let merged = model.forward_batch(&probe)?;
    let largest = adapted.iter().fold(0f32, |m, v| m.max(v.abs()));
    // A NaN difference fails the check below (NaN <= x is false); a length that differs
    // is a failure of its own.
    assert_eq!(merged.len(), adapted.len());
    let worst = merged.iter().zip(&adapted).map(|(a, b)| (a - b).abs()).fold(0f32, |w, d| {
        if d > w || d.is_nan() {
            d
        } else {
            w
        }
    });
    println!("merged: logits within {:.1e} of the largest", worst / largest);
    assert!(merged.iter().all(|v| v.is_finite()) && worst <= 1e-4 * largest);
    // ANCHOR_END: merge

    // ANCHOR: ship
    // The folder a page serves: the int8 weights and the tokenizer, under the names the
    // demo page (www/) looks for.
    let models = dir.join("site").join("models");
    std::fs::create_dir_all(&models)?;
    let weights = models.join("model.rbw");
    model.save_bin(&weights, Precision::Q8)?;
    tk(tokenizer.save(models.join("tokenizer.json"), false))?;

    // The same bytes the page's loadModel reads; the same int8 model.
    let mut shipped = TransformerLm::load_bin(&weights)?;
    let (shipped_exact, _) = replies(&mut shipped, &train, end)?;
    println!(
        "{}: {} bytes; int8 answers {shipped_exact} of {} word for word",
        weights.display(),
        std::fs::metadata(&weights)?.len(),
        train.len()
    );
    assert!(shipped.is_quantized() && shipped_exact + 3 >= tuned_exact);
    Ok(())
}
// ANCHOR_END: ship
