//! Train a small language model on the bundled corpus and generate text with it.
//!
//!     cargo run --release -p rusting_brain --example language_model               # train, then sample
//!     cargo run --release -p rusting_brain --example language_model -- train [--moe] [--steps N] [--corpus FILE]
//!     cargo run --release -p rusting_brain --example language_model -- generate "prompt" \
//!         [--tokens N] [--temperature T] [--top-k K] [--top-p P] [--repetition-penalty R] [--q8 | --q4] \
//!         [--seed S] [--from DIR] [--ids] [--prompts FILE] [--gpu]
//!     cargo run --release -p rusting_brain --example language_model -- chat
//!     cargo run --release -p rusting_brain --example language_model -- export-web [--out DIR]
//!
//! With a Hugging Face directory (Llama, Mistral, Qwen2/3, Mixtral, Qwen3-MoE: `config.json`,
//! safetensors, `tokenizer.json`, and for `chat` a chat template):
//!
//!     ... language_model -- generate "prompt" --from-pretrained DIR [--q8] [--context N] [sampling flags]
//!     ... language_model -- chat --from-pretrained DIR [--q8] [--context N] [--system TEXT]
//!     ... language_model -- generate "prompt" | chat --from-gguf FILE [the same flags]
//!     ... language_model -- export-gguf --from-pretrained DIR | --from-gguf FILE --out FILE [--q8 | --q4 | --q4k]
//!     ... language_model -- export-web --from-gguf FILE --out DIR [--context N]
//!     ... language_model -- train --from-pretrained DIR [--steps N] [--lr R] [--corpus FILE] \
//!         [--save-pretrained OUT] [--lora RANK]
//!
//! The corpus is the text of the Rust book and Rust by Example (examples/data/corpus, see
//! NOTICE.txt there); `--corpus` takes a .txt, .txt.gz or .jsonl (field "text") instead.
//! `train` learns a byte-level BPE vocabulary (Hugging Face `tokenizers`), writes the token
//! files, trains with warmup-cosine, clipping and held-out evaluation, and leaves
//! `model.rbw`, `tokenizer.json` and `loss.svg` in `target/language_model/`; `generate` and
//! `chat` are separate runs that read those back. `--moe` trains a mixture of experts with
//! the dense model's active size instead: layers 1-3 get 8 experts of width 256, top-2
//! (2 x 256 = the dense d_ff of 512), so each token does the same work with 3.1x the
//! feed-forward parameters. `export-web` writes what the browser demo loads (`www/models/`:
//! the model quantized to int8 as `model.rbw`, to 4 bits as `model.q4.rbw`, and
//! `tokenizer.json`), printing both downloads' sizes; `generate --q4` reads the 4-bit one
//! (`export-web --from-gguf FILE --out DIR` does the same for a GGUF model, its context cut
//! to `--context N`, 2,048 unless given). `generate --ids`
//! prints the generated ids as JSON instead of text (the browser tests compare them);
//! `--temperature 0` is greedy. `generate --gpu` (built with `--features gpu`) moves the
//! int8 or 4-bit model to wgpu first (a software adapter such as lavapipe where there is no GPU).
//!
//! `--from-pretrained` reads the model (int8 at load with `--q8`; its context cut to
//! `--context N` positions, 4,096 unless given, so KV caches stay small), its `tokenizer.json`,
//! and `generation_config.json`'s end ids and sampling settings (used unless a sampling
//! flag is given). `--from-gguf FILE` reads a llama.cpp GGUF file instead: the weights,
//! the tokenizer and chat template it carries, its end ids (greedy unless a sampling flag
//! is given). `chat` renders the conversation through the model's chat template
//! each turn and feeds the decoder only what is new. `train --from-pretrained` fine-tunes
//! every weight on the corpus (full fine-tuning) and writes a directory transformers loads
//! (`--save-pretrained`, default `target/language_model/finetuned`), tokenizer files
//! copied beside it. With `--lora RANK` it trains adapters of that rank (alpha twice the
//! rank) on every projection instead, the base frozen (learning rate 5e-4 unless given),
//! writes them as a PEFT directory in `OUT/adapter`, then merges them and writes the merged
//! model in `OUT`.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rusting_brain::gguf::GgufType;
use rusting_brain::{
    ChatMessage, ChatTemplate, GenerationConfig, LoraConfig, Optimizer, Precision, Sampler, Schedule,
    TokenFile, TransformerLm,
};
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, Tokenizer,
    TokenizerBuilder,
};

type Error = Box<dyn std::error::Error + Send + Sync>;

const VOCAB: usize = 2048;
const SEQ: usize = 128;
const BATCH: usize = 16;
const END: &str = "<|end|>";
/// About 2.5 minutes on the 2-core development VM (15K tokens/s), ~4.8 passes over the corpus.
const DEFAULT_STEPS: u64 = 1000;

fn out_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/language_model"))
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/data/corpus"))
}

/// Reads a .txt, .txt.gz or .jsonl (one document per line, field "text") into text.
fn read_text(path: &Path) -> Result<String, Error> {
    let name = path.to_string_lossy();
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if name.ends_with(".gz") {
        let mut s = String::new();
        flate2::read::GzDecoder::new(file)
            .read_to_string(&mut s)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(s)
    } else if name.ends_with(".jsonl") {
        let mut s = String::new();
        for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(&line)
                .map_err(|e| format!("{}: line {}: {e}", path.display(), i + 1))?;
            let text = v["text"]
                .as_str()
                .ok_or_else(|| format!("{}: line {}: no string field \"text\"", path.display(), i + 1))?;
            s.push_str(text);
            s.push('\n');
        }
        Ok(s)
    } else {
        Ok(std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?)
    }
}

/// The training and held-out text: the bundled corpus's two files, or a user corpus whose
/// last tenth (at a line break) is held out.
fn corpus_texts(corpus: Option<&Path>) -> Result<(String, String), Error> {
    Ok(match corpus {
        Some(p) => {
            let text = read_text(p)?;
            let cut = held_out_cut(&text);
            (text[..cut].to_string(), text[cut..].to_string())
        }
        None => {
            (read_text(&corpus_dir().join("train.txt.gz"))?, read_text(&corpus_dir().join("heldout.txt.gz"))?)
        }
    })
}

/// Where a user corpus's held-out last tenth begins: at a line break, else at a character
/// boundary near 90%.
fn held_out_cut(text: &str) -> usize {
    let mut at = text.len() * 9 / 10;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    text[..at].rfind('\n').unwrap_or(at)
}

fn model(max_seq: usize, moe: bool) -> Result<TransformerLm, Error> {
    let builder = TransformerLm::builder()
        .vocab_size(VOCAB)
        .d_model(192)
        .n_layers(4)
        .heads(6, 2, 32)
        .d_ff(512)
        .max_seq_len(max_seq)
        .optimizer(Optimizer::adam(2e-3).betas(0.9, 0.95).weight_decay(0.1))
        .seed(7);
    let builder = if moe { builder.experts(8, 2).moe_layers(1..4).expert_d_ff(256) } else { builder };
    Ok(builder.build()?)
}

/// Each sparse layer's share of routed tokens per expert, in percent.
fn usage_line(model: &TransformerLm) -> String {
    model
        .expert_usage()
        .iter()
        .map(|layer| {
            let cells: Vec<String> = layer.iter().map(|u| format!("{:.0}", 100.0 * u)).collect();
            format!("[{}]", cells.join(" "))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn train_tokenizer(train_txt: &Path, out: &Path) -> Result<Tokenizer, Error> {
    let mut trainer = BpeTrainer::builder()
        .vocab_size(VOCAB)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(vec![AddedToken::from(END, true)])
        .build();
    let mut tokenizer = TokenizerBuilder::<
        BPE,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::default()
    .with_model(BPE::default())
    .with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(ByteLevel::default().add_prefix_space(false))))
    .with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())))
    .build()?;
    tokenizer.train_from_files(&mut trainer, vec![train_txt.to_string_lossy().into_owned()])?;
    tokenizer.save(out, false)?;
    Tokenizer::from_file(out)
}

/// Unigram entropy of a token sequence, in nats: the loss of a model that knows only
/// token frequencies, the bar a language model must get under.
fn unigram_entropy(ids: &[u32]) -> f64 {
    let mut counts = vec![0usize; VOCAB];
    ids.iter().for_each(|&i| counts[i as usize] += 1);
    let n = ids.len() as f64;
    counts.iter().filter(|&&c| c > 0).map(|&c| c as f64 / n).map(|p| -p * p.ln()).sum()
}

fn held_out_loss(model: &mut TransformerLm, file: &mut TokenFile, max_chunks: usize) -> Result<f32, Error> {
    held_out_loss_at(model, file, max_chunks, SEQ)
}

fn held_out_loss_at(
    model: &mut TransformerLm, file: &mut TokenFile, max_chunks: usize, seq: usize,
) -> Result<f32, Error> {
    let (mut sum, mut n) = (0.0f64, 0usize);
    let mut i = 0;
    while let Some(b) = file.chunk(i, BATCH, seq)? {
        let l = model.evaluate(&b)?;
        sum += l.lm_loss as f64 * l.tokens as f64;
        n += l.tokens;
        i += 1;
        if i == max_chunks {
            break;
        }
    }
    Ok((sum / n.max(1) as f64) as f32)
}

fn plot(path: &Path, train: &[(u64, f32)], held: &[(u64, f32)], steps: u64) -> Result<(), Error> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let top = train.iter().chain(held).map(|p| p.1).fold(0.0f32, f32::max) * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption("language_model: loss per token (nats)", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0u64..steps, 0f32..top)?;
    chart.configure_mesh().x_desc("step").y_desc("loss").draw()?;
    chart
        .draw_series(LineSeries::new(train.iter().copied(), &BLUE))?
        .label("train")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(LineSeries::new(held.iter().copied(), &RED))?
        .label("held-out")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn train(steps: u64, corpus: Option<PathBuf>, moe: bool) -> Result<(), Error> {
    let dir = out_dir();
    std::fs::create_dir_all(&dir)?;
    let t0 = Instant::now();
    let (train_text, held_text) = corpus_texts(corpus.as_deref())?;
    let train_txt = dir.join("train.txt");
    std::fs::write(&train_txt, &train_text)?;
    let tokenizer = train_tokenizer(&train_txt, &dir.join("tokenizer.json"))?;
    let encode = |t: &str| -> Result<Vec<u32>, Error> { Ok(tokenizer.encode(t, false)?.get_ids().to_vec()) };
    let (train_ids, held_ids) = (encode(&train_text)?, encode(&held_text)?);
    TokenFile::write(dir.join("train.bin"), &train_ids)?;
    TokenFile::write(dir.join("heldout.bin"), &held_ids)?;
    let entropy = unigram_entropy(&train_ids);
    println!(
        "corpus: {} train and {} held-out tokens, vocabulary {VOCAB} (BPE trained in {:.1} s); unigram entropy {entropy:.3} nats",
        train_ids.len(),
        held_ids.len(),
        t0.elapsed().as_secs_f64()
    );

    let mut model = model(SEQ, moe)?;
    println!("model: {}", model.parameter_counts());
    let mut data = TokenFile::open(dir.join("train.bin"), 42)?;
    let mut held = TokenFile::open(dir.join("heldout.bin"), 0)?;
    let first = held_out_loss(&mut model, &mut held, 8)?;
    println!("held-out loss at start {first:.3} (perplexity {:.0})", first.exp());
    let schedule = Schedule::warmup_cosine(2e-3, steps / 10 + 1, steps);
    let bar = indicatif::ProgressBar::new(steps);
    bar.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} ETA {eta}")?);
    let (mut train_curve, mut held_curve) = (Vec::new(), vec![(0u64, first)]);
    let t = Instant::now();
    for step in 0..steps {
        model.optimizer.set_learning_rate(schedule.rate(step));
        let batch = data.batch(step, BATCH, SEQ)?;
        model.zero_grad()?;
        let loss = model.accumulate_step(&batch)?;
        model.step_clipped(1.0, 1.0)?;
        train_curve.push((step + 1, loss.lm_loss));
        let tps = (step + 1) as f64 * (BATCH * SEQ) as f64 / t.elapsed().as_secs_f64();
        let balance = if moe { format!("  balance {:.3}", loss.load_balance_loss) } else { String::new() };
        bar.set_message(format!("loss {:.3}{balance}  {tps:.0} tokens/s", loss.lm_loss));
        bar.inc(1);
        if (step + 1) % 100 == 0 || step + 1 == steps {
            held_curve.push((step + 1, held_out_loss(&mut model, &mut held, 8)?));
        }
    }
    bar.finish_and_clear();
    let secs = t.elapsed().as_secs_f64();
    let last = held_out_loss(&mut model, &mut held, usize::MAX)?;
    println!(
        "trained {steps} steps in {secs:.0} s ({:.0} tokens/s); held-out loss {first:.3} -> {last:.3} (perplexity {:.1}), unigram entropy {entropy:.3}",
        steps as f64 * (BATCH * SEQ) as f64 / secs,
        last.exp()
    );
    if moe {
        println!("expert shares in the last held-out batch, % per sparse layer: {}", usage_line(&model));
    }
    model.save_bin(dir.join("model.rbw"), Precision::F32)?;
    plot(&dir.join("loss.svg"), &train_curve, &held_curve, steps)?;
    println!("wrote {}/{{model.rbw, tokenizer.json, loss.svg}}", dir.display());
    Ok(())
}

struct Gen {
    tokens: usize,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    repetition_penalty: f32,
    seed: Option<u64>,
    q8: bool,
    ids: bool,
    /// A sampling flag was given (else a Hugging Face directory's settings are used).
    explicit: bool,
    /// `--context N`: the positions a Hugging Face model is given (default 4,096 at most).
    context: Option<usize>,
}

fn load(q8: bool) -> Result<(TransformerLm, Tokenizer), Error> {
    load_from(out_dir(), q8, false)
}

/// `model.rbw` and `tokenizer.json` from `dir` (an int8 file loads quantized already);
/// with `q4`, `model.q4.rbw` where `export-web` wrote one, else `model.rbw` rounded to 4 bits.
fn load_from(dir: PathBuf, q8: bool, q4: bool) -> Result<(TransformerLm, Tokenizer), Error> {
    let q4_file = dir.join("model.q4.rbw");
    let file = if q4 && q4_file.is_file() { q4_file } else { dir.join("model.rbw") };
    let mut model = TransformerLm::load_bin(&file).map_err(|e| format!("{e} (run `train` first)"))?;
    if q4 {
        model.quantize_to(Precision::Q4)?;
        if model.precision() != Precision::Q4 {
            return Err(format!(
                "{} is int8 and has no 4-bit form: run `export-web` (it writes model.q4.rbw) or point at the f32 model",
                file.display()
            )
            .into());
        }
    } else if q8 {
        model.quantize()?;
    }
    Ok((model, Tokenizer::from_file(dir.join("tokenizer.json"))?))
}

fn sampler(g: &Gen) -> Sampler {
    if g.temperature == 0.0 {
        return Sampler::greedy().repetition_penalty(g.repetition_penalty);
    }
    Sampler::temperature(g.temperature, g.seed)
        .top_k(g.top_k)
        .top_p(g.top_p)
        .repetition_penalty(g.repetition_penalty)
}

/// The int8 model and its tokenizer where the browser demo looks for them.
fn export_web(out: Option<PathBuf>) -> Result<(), Error> {
    let out = out.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../www/models"));
    std::fs::create_dir_all(&out)?;
    let (f32_model, _) = load(false)?;
    let (mut model, _) = load(true)?;
    model.quantize()?;
    let path = out.join("model.rbw");
    model.save_bin(&path, Precision::Q8)?;
    // The same weights at 4 bits (rounded from f32, not from int8), for the page's CPU path.
    let path4 = out.join("model.q4.rbw");
    f32_model.save_bin(&path4, Precision::Q4)?;
    std::fs::copy(out_dir().join("tokenizer.json"), out.join("tokenizer.json"))?;
    let (size, size4) = (std::fs::metadata(&path)?.len(), std::fs::metadata(&path4)?.len());
    println!(
        "wrote {} ({:.2} MB, int8), {} ({:.2} MB, 4-bit: {:.2}x the int8 download) and tokenizer.json",
        path.display(),
        size as f64 / 1e6,
        path4.display(),
        size4 as f64 / 1e6,
        size4 as f64 / size as f64
    );
    Ok(())
}

/// A llama.cpp GGUF model as the browser demo loads it: `model.rbw` (int8), `model.q4.rbw`
/// (4 bits, rounded from the f32 weights) and the tokenizer the file carries as
/// `tokenizer.json`, the context cut to `context` positions (the page holds a KV cache of
/// that many).
fn export_web_gguf(file: &Path, out: &Path, context: usize) -> Result<(), Error> {
    std::fs::create_dir_all(out)?;
    let path = out.join("model.rbw");
    let mut int8 = TransformerLm::from_gguf_at(file, Precision::Q8)?;
    int8.set_max_seq_len(context)?;
    int8.save_bin(&path, Precision::Q8)?;
    drop(int8);
    let path4 = out.join("model.q4.rbw");
    let mut f32_model = TransformerLm::from_gguf(file)?;
    f32_model.set_max_seq_len(context)?;
    f32_model.save_bin(&path4, Precision::Q4)?;
    std::fs::write(out.join("tokenizer.json"), rusting_brain::gguf::tokenizer_json(file)?)?;
    let (size, size4) = (std::fs::metadata(&path)?.len(), std::fs::metadata(&path4)?.len());
    println!(
        "wrote {} ({:.1} MB, int8), {} ({:.1} MB, 4-bit) and tokenizer.json, context {context}",
        path.display(),
        size as f64 / 1e6,
        path4.display(),
        size4 as f64 / 1e6
    );
    Ok(())
}

/// Streams the continuation of `prompt`, printing text as ids arrive.
/// Moves `model` to wgpu, a software adapter allowed (the browser tests' CI has no GPU).
#[cfg(feature = "gpu")]
fn to_gpu(model: &mut TransformerLm) -> Result<(), Error> {
    let options = rusting_brain::GpuOptions { software: true, ..Default::default() };
    model.to_gpu_with(&options)?;
    Ok(())
}

#[cfg(not(feature = "gpu"))]
fn to_gpu(_: &mut TransformerLm) -> Result<(), Error> {
    Err("--gpu: this build has no GPU support; build with --features gpu".into())
}

fn generate(model: &mut TransformerLm, tok: &Tokenizer, prompt: &str, g: &Gen) -> Result<(), Error> {
    let ends: Vec<u32> = tok.token_to_id(END).into_iter().collect();
    let ids = tok.encode(prompt, false)?.get_ids().to_vec();
    generate_until(model, tok, prompt, &ids, g, &ends, sampler(g))
}

/// Streams the continuation of `prompt` until `ends` or `g.tokens`.
fn generate_until(
    model: &mut TransformerLm, tok: &Tokenizer, prompt: &str, ids: &[u32], g: &Gen, ends: &[u32],
    mut sampler: Sampler,
) -> Result<(), Error> {
    let ids = ids.to_vec();
    let mut out: Vec<u32> = Vec::new();
    if g.ids {
        let t0 = Instant::now();
        let mut first = None;
        model.generate_with(&ids, g.tokens, &mut sampler, |id| {
            first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
            if ends.contains(&id) {
                return false;
            }
            out.push(id);
            true
        })?;
        // Decode rate after the first token (prefill + first draw), as the browser reports it.
        let (total, first) = (t0.elapsed().as_secs_f64(), first.unwrap_or(0.0));
        let rate = out.len().saturating_sub(1) as f64 / (total - first).max(1e-9);
        println!(
            "{{\"prompt\":{ids:?},\"ids\":{out:?},\"tokens_per_second\":{rate:.1},\"first_token_ms\":{:.1}}}",
            first * 1e3
        );
        return Ok(());
    }
    let mut printed = 0;
    print!("{prompt}");
    model.generate_with(&ids, g.tokens, &mut sampler, |id| {
        if ends.contains(&id) {
            return false;
        }
        out.push(id);
        // Byte-level BPE: decode everything so far and print the new, complete characters.
        if let Ok(text) = tok.decode(&out, true) {
            let text = text.trim_end_matches('\u{fffd}');
            if text.len() > printed {
                print!("{}", &text[printed..]);
                printed = text.len();
                let _ = std::io::stdout().flush();
            }
        }
        true
    })?;
    println!();
    Ok(())
}

/// Draws up to `tokens` ids until `ends(id)`; the ending id is kept with `keep_end`.
/// `None` (after saying so) when the context fills first.
fn reply(
    decoder: &mut rusting_brain::Decoder<'_>, sampler: &mut Sampler, tokens: usize,
    ends: impl Fn(u32) -> Result<bool, Error>, keep_end: bool,
) -> Result<Option<Vec<u32>>, Error> {
    let mut out = Vec::new();
    for _ in 0..tokens {
        if !decoder.has_next() {
            println!("(the context is full: {} positions)", decoder.capacity());
            return Ok(None);
        }
        let id = decoder.next(sampler)?;
        let end = ends(id)?;
        if !end || keep_end {
            out.push(id);
        }
        if end {
            break;
        }
    }
    Ok(Some(out))
}

fn chat(g: &Gen) -> Result<(), Error> {
    let (mut model, tok) = load(g.q8)?;
    let mut decoder = model.decoder();
    let mut sampler = sampler(g);
    println!("chat: each line you type is fed to one decoder that keeps its cache; empty line quits");
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            break;
        }
        decoder.feed(tok.encode(format!("{line}\n").as_str(), false)?.get_ids())?;
        // A turn ends at the first line break (the id that draws it is kept).
        let Some(reply) = reply(
            &mut decoder,
            &mut sampler,
            g.tokens,
            |id| Ok(tok.decode(&[id], false)?.contains('\n')),
            true,
        )?
        else {
            return Ok(());
        };
        println!("> {}", tok.decode(&reply, false)?.trim_end());
    }
    Ok(())
}

/// A published model: a Hugging Face directory (`--from-pretrained`) or a GGUF file
/// (`--from-gguf`), which carries its tokenizer and chat template.
enum Pretrained {
    Dir(PathBuf),
    Gguf(PathBuf),
}

impl Pretrained {
    fn path(&self) -> &Path {
        match self {
            Pretrained::Dir(p) | Pretrained::Gguf(p) => p,
        }
    }
    fn template(&self) -> Result<ChatTemplate, Error> {
        Ok(match self {
            Pretrained::Dir(dir) => ChatTemplate::from_pretrained(dir)?,
            Pretrained::Gguf(file) => ChatTemplate::from_gguf(file)?,
        })
    }
}

/// A published model (int8 at load with `q8`), its tokenizer and generation settings.
fn load_pretrained(
    src: &Pretrained, q8: bool, context: Option<usize>,
) -> Result<(TransformerLm, Tokenizer, GenerationConfig), Error> {
    let t0 = Instant::now();
    let precision = if q8 { Precision::Q8 } else { Precision::F32 };
    let (mut model, tok, gen) = match src {
        Pretrained::Dir(dir) => {
            let tok_path = dir.join("tokenizer.json");
            let tok = Tokenizer::from_file(&tok_path).map_err(|e| format!("{}: {e}", tok_path.display()))?;
            (TransformerLm::from_pretrained_at(dir, precision)?, tok, GenerationConfig::from_pretrained(dir)?)
        }
        Pretrained::Gguf(file) => {
            let tok: Tokenizer = rusting_brain::gguf::tokenizer_json(file)?
                .parse()
                .map_err(|e| format!("{}: its tokenizer: {e}", file.display()))?;
            (TransformerLm::from_gguf_at(file, precision)?, tok, GenerationConfig::from_gguf(file)?)
        }
    };
    let dir = src.path();
    // A published context (131,072 positions for Llama 3.1) would make KV caches of many
    // gigabytes; 4,096 unless asked.
    let full = model.config().max_seq_len;
    let n = context.unwrap_or(full.min(4096)).min(full);
    if n != full {
        model.set_max_seq_len(n)?;
        eprintln!("context {n} positions of the model's {full} (--context N to change)");
    }
    let c = model.config();
    eprintln!(
        "loaded {} in {:.2} s: {} layers, d_model {}, vocabulary {}, context {}{}; ends at {:?}",
        dir.display(),
        t0.elapsed().as_secs_f64(),
        c.n_layers,
        c.d_model,
        c.vocab_size,
        c.max_seq_len,
        if q8 { ", int8" } else { "" },
        gen.eos_token_ids
    );
    Ok((model, tok, gen))
}

fn generate_pretrained(src: &Pretrained, prompt: &str, g: &Gen) -> Result<(), Error> {
    let (mut model, tok, gen) = load_pretrained(src, g.q8, g.context)?;
    let sampler = if g.explicit { sampler(g) } else { gen.sampler(g.seed) };
    // With the tokenizer's special tokens (a Llama prompt starts with <|begin_of_text|>),
    // as transformers' tokenizer(prompt) encodes by default.
    let ids = tok.encode(prompt, true)?.get_ids().to_vec();
    generate_until(&mut model, &tok, prompt, &ids, g, &gen.eos_token_ids, sampler)
}

/// A conversation through the directory's chat template: each turn renders the whole
/// conversation, and the decoder is fed only what follows what it has already read (or
/// starts again when the template rewrote earlier turns).
fn chat_pretrained(src: &Pretrained, system: Option<String>, g: &Gen) -> Result<(), Error> {
    let (mut model, tok, gen) = load_pretrained(src, g.q8, g.context)?;
    let template = src.template()?;
    let mut sampler = if g.explicit { sampler(g) } else { gen.sampler(g.seed) };
    let mut messages: Vec<ChatMessage> = system.into_iter().map(ChatMessage::system).collect();
    let mut decoder = model.decoder();
    println!("chat with {}: empty line quits", src.path().display());
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            break;
        }
        messages.push(ChatMessage::user(line));
        let prompt = template.render(&messages, true)?;
        let ids = tok.encode(prompt.as_str(), false)?.get_ids().to_vec();
        if ids.len() >= decoder.capacity() {
            println!(
                "(the conversation is {} tokens; the context holds {}: start a new chat)",
                ids.len(),
                decoder.capacity()
            );
            return Ok(());
        }
        let ctx = decoder.context();
        if ids.len() >= ctx.len() && ids[..ctx.len()] == *ctx {
            let new = ids[ctx.len()..].to_vec();
            decoder.feed(&new)?;
        } else {
            drop(decoder);
            decoder = model.decoder();
            decoder.feed(&ids)?;
        }
        let Some(reply) = reply(&mut decoder, &mut sampler, g.tokens, |id| Ok(gen.is_end(id)), false)? else {
            return Ok(());
        };
        let text = tok.decode(&reply, true)?;
        println!("> {}", text.trim());
        messages.push(ChatMessage::assistant(text.trim().to_string()));
    }
    Ok(())
}

/// Full fine-tuning of a Hugging Face model on a corpus, then `save_pretrained` with the
/// tokenizer files beside it.
fn finetune_pretrained(
    dir: &Path, steps: u64, lr: f32, corpus: Option<PathBuf>, out: Option<PathBuf>, context: Option<usize>,
    lora: Option<usize>,
) -> Result<(), Error> {
    let (mut model, tok, _) = load_pretrained(&Pretrained::Dir(dir.to_path_buf()), false, context)?;
    if let Some(r) = lora {
        model.add_lora(LoraConfig::new(r).alpha(2.0 * r as f32))?;
        println!(
            "LoRA rank {r} on every projection: {} of {} weights train",
            model.trainable_parameters(),
            model.parameter_counts().total
        );
    }
    let seq = SEQ.min(model.config().max_seq_len);
    let (train_text, held_text) = corpus_texts(corpus.as_deref())?;
    let work = out_dir().join("finetune-tokens");
    std::fs::create_dir_all(&work)?;
    let encode = |t: &str| -> Result<Vec<u32>, Error> { Ok(tok.encode(t, false)?.get_ids().to_vec()) };
    let (train_ids, held_ids) = (encode(&train_text)?, encode(&held_text)?);
    TokenFile::write(work.join("train.bin"), &train_ids)?;
    TokenFile::write(work.join("heldout.bin"), &held_ids)?;
    println!(
        "corpus: {} train and {} held-out tokens with {}'s tokenizer; model: {}",
        train_ids.len(),
        held_ids.len(),
        dir.display(),
        model.parameter_counts()
    );
    let mut data = TokenFile::open(work.join("train.bin"), 42)?;
    let mut held = TokenFile::open(work.join("heldout.bin"), 0)?;
    model.optimizer = Optimizer::adam(lr).betas(0.9, 0.95).weight_decay(0.0);
    let first = held_out_loss_at(&mut model, &mut held, 8, seq)?;
    let schedule = Schedule::warmup_cosine(lr, steps / 10 + 1, steps);
    let t = Instant::now();
    for step in 0..steps {
        model.optimizer.set_learning_rate(schedule.rate(step));
        let batch = data.batch(step, BATCH, seq)?;
        model.zero_grad()?;
        let loss = model.accumulate_step(&batch)?;
        model.step_clipped(1.0, 1.0)?;
        if (step + 1) % 10 == 0 || step + 1 == steps {
            let tps = (step + 1) as f64 * (BATCH * seq) as f64 / t.elapsed().as_secs_f64();
            println!("step {:>5}  loss {:.3}  {tps:.0} tokens/s", step + 1, loss.lm_loss);
        }
    }
    let last = held_out_loss_at(&mut model, &mut held, 8, seq)?;
    println!("held-out loss {first:.3} -> {last:.3} after {steps} steps");
    let out = out.unwrap_or_else(|| out_dir().join("finetuned"));
    if lora.is_some() {
        model.save_lora_peft(out.join("adapter"))?;
        println!(
            "wrote {} (PEFT: adapter_config.json, adapter_model.safetensors)",
            out.join("adapter").display()
        );
        model.merge_lora()?;
    }
    model.save_pretrained(&out)?;
    for f in [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "chat_template.json",
    ] {
        let (from, to) = (dir.join(f), out.join(f));
        // Saving over the source directory: its tokenizer files are already there.
        let same = matches!((from.canonicalize(), to.canonicalize()), (Ok(a), Ok(b)) if a == b);
        if from.is_file() && !same {
            std::fs::copy(&from, &to)?;
        }
    }
    println!("wrote {} (config.json, safetensors, generation_config.json, tokenizer files)", out.display());
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let num = |name: &str, default: f64| -> Result<f64, Error> {
        flag(name)
            .map_or(Ok(default), |v| v.parse::<f64>().map_err(|_| format!("{name} {v}: not a number").into()))
    };
    let g = Gen {
        tokens: num("--tokens", 120.0)? as usize,
        temperature: num("--temperature", 0.8)? as f32,
        top_k: num("--top-k", 40.0)? as usize,
        top_p: num("--top-p", 0.95)? as f32,
        repetition_penalty: num("--repetition-penalty", 1.1)? as f32,
        seed: flag("--seed")
            .map(|v| v.parse::<u64>().map_err(|_| format!("--seed {v}: not a whole number")))
            .transpose()?,
        q8: args.iter().any(|a| a == "--q8"),
        ids: args.iter().any(|a| a == "--ids"),
        explicit: ["--temperature", "--top-k", "--top-p", "--repetition-penalty"]
            .iter()
            .any(|f| args.iter().any(|a| a == f)),
        context: flag("--context")
            .map(|v| v.parse::<usize>().map_err(|_| format!("--context {v}: not a whole number")))
            .transpose()?,
    };
    let published = match (flag("--from-pretrained"), flag("--from-gguf")) {
        (Some(_), Some(_)) => return Err("--from-pretrained and --from-gguf: give one".into()),
        (Some(d), None) => Some(Pretrained::Dir(PathBuf::from(d))),
        (None, Some(f)) => Some(Pretrained::Gguf(PathBuf::from(f))),
        (None, None) => None,
    };
    let pretrained = match &published {
        Some(Pretrained::Dir(d)) => Some(d.clone()),
        _ => None,
    };
    match args.first().map(String::as_str) {
        None => {
            train(DEFAULT_STEPS, None, false)?;
            let (mut model, tok) = load(false)?;
            for prompt in ["The borrow checker", "fn main() {", "A trait"] {
                println!("---");
                generate(&mut model, &tok, prompt, &g)?;
            }
            Ok(())
        }
        Some("train") => match &pretrained {
            Some(dir) => {
                let lora = flag("--lora").map(|v| v.parse::<usize>()).transpose()?;
                let lr = if lora.is_some() { 5e-4 } else { 5e-5 };
                finetune_pretrained(
                    dir,
                    num("--steps", 100.0)? as u64,
                    num("--lr", lr)? as f32,
                    flag("--corpus").map(PathBuf::from),
                    flag("--save-pretrained").map(PathBuf::from),
                    g.context,
                    lora,
                )
            }
            None => train(
                num("--steps", DEFAULT_STEPS as f64)? as u64,
                flag("--corpus").map(PathBuf::from),
                args.iter().any(|a| a == "--moe"),
            ),
        },
        Some("generate") => {
            // `--prompts FILE`: a JSON list of prompts, each generated in turn (with `--ids`,
            // one JSON line each: what the browser tests compare across paths).
            let prompts: Vec<String> = match flag("--prompts") {
                Some(file) => serde_json::from_str(&std::fs::read_to_string(&file)?)
                    .map_err(|e| format!("--prompts {file}: a JSON list of strings: {e}"))?,
                None => vec![args
                    .get(1)
                    .filter(|p| !p.starts_with("--"))
                    .ok_or("generate needs a prompt: generate \"fn main\"")?
                    .clone()],
            };
            if let Some(src) = &published {
                return prompts.iter().try_for_each(|p| generate_pretrained(src, p, &g));
            }
            let q4 = args.iter().any(|a| a == "--q4");
            let (mut model, tok) = match flag("--from") {
                Some(dir) => load_from(PathBuf::from(dir), g.q8, q4)?,
                None => load_from(out_dir(), g.q8, q4)?,
            };
            if args.iter().any(|a| a == "--gpu") {
                to_gpu(&mut model)?;
            }
            prompts.iter().try_for_each(|p| generate(&mut model, &tok, p, &g))
        }
        Some("chat") => match &published {
            Some(src) => chat_pretrained(src, flag("--system"), &g),
            None => chat(&g),
        },
        Some("export-web") => match &published {
            Some(Pretrained::Gguf(file)) => {
                let out = flag("--out").map(PathBuf::from).ok_or("export-web --from-gguf needs --out DIR")?;
                export_web_gguf(file, &out, g.context.unwrap_or(2048))
            }
            Some(Pretrained::Dir(_)) => Err("export-web takes --from-gguf FILE (or no model flag)".into()),
            None => export_web(flag("--out").map(PathBuf::from)),
        },
        Some("export-gguf") => {
            // A published model written as GGUF for llama.cpp and ollama (f32 weights, so
            // load without --q8; the file's type from --q8 (Q8_0), --q4 (Q4_0) or --q4k (Q4_K,
            // Q5_0 for rows that are not whole super-blocks)).
            let src =
                published.as_ref().ok_or("export-gguf needs --from-pretrained DIR or --from-gguf FILE")?;
            let out = PathBuf::from(flag("--out").ok_or("export-gguf needs --out FILE.gguf")?);
            let file = if g.q8 {
                GgufType::Q8_0
            } else if args.iter().any(|a| a == "--q4k") {
                GgufType::Q4K
            } else if args.iter().any(|a| a == "--q4") {
                GgufType::Q4_0
            } else {
                GgufType::F32
            };
            // The whole context unless --context cuts it: the file says what the model holds.
            let (model, _, _) = load_pretrained(src, false, g.context.or(Some(usize::MAX)))?;
            model.save_gguf_as(&out, file)?;
            println!("wrote {} ({file:?}, {} bytes)", out.display(), std::fs::metadata(&out)?.len());
            Ok(())
        }
        Some(other) => Err(format!(
            "unknown subcommand `{other}` (train, generate, chat, export-web, export-gguf, or none)"
        )
        .into()),
    }
}
