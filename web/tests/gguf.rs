//! A GGUF file read the way the page reads it (`rusting_brain_web::gguf`, the formats
//! crate over the file's bytes, rounded by core's reference quantizers on the portable
//! backend) against the native loader's reading of the same file (`from_gguf_at`): llama.cpp's
//! own files of six architectures (`tests/fixtures/gguf_llama_cpp`, made by
//! `tests/fixtures/gen_gguf_llama_cpp.py`) at F32, Q8_0, Q4_0 and Q4_K_M, read at int8 and
//! at four bits. Then the tokenizer against llama.cpp's ids, chat turns through the file's
//! template feeding only what the model has not read, and bad files refused.

use std::path::{Path, PathBuf};

use rusting_brain::core::checkpoint::read_model;
use rusting_brain::core::models::transformer::{QuantFormat, TokenBatch};
use rusting_brain::core::Sampler;
use rusting_brain::{Precision, TransformerLm};
use rusting_brain_portable::PortableBackend;
use rusting_brain_shaders::block_on;
use rusting_brain_web::chat::{self, Message};
use rusting_brain_web::gguf;
use rusting_brain_web::{DeviceChoice, Engine, WebError};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf_llama_cpp")
}

fn expected() -> Value {
    serde_json::from_slice(&std::fs::read(dir().join("expected.json")).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

const ARCHS: [&str; 6] = ["llama", "llama_tied", "qwen2", "qwen3", "mixtral", "qwen3_moe"];
const KINDS: [&str; 4] = ["f32", "q8_0", "q4_0", "q4_k_m"];

/// Every file, read at int8 and at four bits, is the model the native loader reads from it:
/// the same configuration, and the same rounded weights, bit for bit (core's quantizers
/// are the native ones' reference twins). The weights are compared through the native
/// model saved at that precision (`save_bin`) and read on the page's backend: the logits
/// of every position of the fixture prompt are equal exactly. (Across backends the page's
/// CPU path and the native one differ by summation and activation rounding order, 4e-4 of
/// the logits' range on these files, a seventieth of what int8 itself moves them.)
#[test]
fn the_page_reads_llama_cpp_s_files_as_the_native_loader_does() {
    let exp = expected();
    let tmp = rusting_brain_test_support::TempDir::new("web_gguf");
    for arch in ARCHS {
        let prompt = ids(&exp["cases"][arch]["prompt_ids"]);
        let batch = TokenBatch::new([prompt.iter().copied().chain([0]).collect::<Vec<u32>>()]).unwrap();
        for kind in KINDS {
            let path = dir().join(format!("{arch}.{kind}.gguf"));
            let bytes = std::fs::read(&path).unwrap();
            for (format, precision) in [(QuantFormat::Q8, Precision::Q8), (QuantFormat::Q4, Precision::Q4)] {
                let mut page = gguf::read(&bytes, format, 2048).unwrap();
                let native = TransformerLm::from_gguf_at(&path, precision).unwrap();
                let mut want_config = native.config().clone();
                want_config.max_seq_len = want_config.max_seq_len.min(2048);
                assert_eq!(page.model.config, want_config, "{arch}.{kind}");
                let rbw = tmp.path().join(format!("{arch}.{kind}.{format:?}.rbw"));
                native.save_bin(&rbw, precision).unwrap();
                let mut saved = read_model(&std::fs::read(&rbw).unwrap(), PortableBackend).unwrap();
                let want = saved.forward_logits(&batch).unwrap();
                let got = page.model.forward_logits(&batch).unwrap();
                assert_eq!(got.len(), want.len(), "{arch}.{kind} at {format:?}");
                let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(
                    differ, 0,
                    "{arch}.{kind} at {format:?}: {differ} logits differ from the native reading's"
                );
            }
        }
    }
}

/// The tokenizer the page rebuilds from each file gives llama.cpp's ids for every string
/// (spaces, digits, unicode, code, control tokens).
#[test]
fn the_page_s_tokenizer_gives_llama_cpp_s_ids() {
    let exp = expected();
    for arch in ARCHS {
        let bytes = std::fs::read(dir().join(format!("{arch}.q8_0.gguf"))).unwrap();
        let page = gguf::read(&bytes, QuantFormat::Q8, 64).unwrap();
        let file = &exp["cases"][arch]["files"]["q8_0"];
        for s in exp["strings"].as_array().unwrap() {
            let s = s.as_str().unwrap();
            let ours = page.tokenizer.encode(s, false).unwrap().get_ids().to_vec();
            assert_eq!(ours, ids(&file["llama_cpp_ids"][s]), "{arch}: {s:?}");
        }
        assert_eq!(page.end, page.tokenizer.token_to_id("<|im_end|>"), "{arch}: the file's end of turn");
        assert!(page.template.is_some(), "{arch}: the file's chat template");
    }
}

/// A SentencePiece vocabulary (Llama 2's and Mistral 7B's kind; `tests/fixtures/
/// gen_gguf_spm.py`) read by the page: llama.cpp's ids on every string, `</s>` as the end
/// of a reply, and the model at int8 and at 4 bits giving the native reading's logits.
#[test]
fn the_page_reads_a_sentencepiece_vocabulary_as_llama_cpp_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf_spm");
    let bytes = std::fs::read(dir.join("tiny_llama_spm.gguf")).unwrap();
    let exp: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    for format in [QuantFormat::Q8, QuantFormat::Q4] {
        let page = gguf::read(&bytes, format, 64).unwrap();
        for case in exp["cases"].as_array().unwrap() {
            let s = case["text"].as_str().unwrap();
            let ours = page.tokenizer.encode(s, false).unwrap().get_ids().to_vec();
            assert_eq!(ours, ids(&case["llama_cpp"]), "{s:?}");
        }
        assert_eq!(page.end, page.tokenizer.token_to_id("</s>"), "the file's end of sequence");
        // The native reading, saved and read on the page's backend: the same logits.
        let precision = if format == QuantFormat::Q8 { Precision::Q8 } else { Precision::Q4 };
        let native = TransformerLm::from_gguf_at(dir.join("tiny_llama_spm.gguf"), precision).unwrap();
        let tmp = rusting_brain_test_support::TempDir::new("web_gguf_spm");
        let rbw = tmp.path().join("model.rbw");
        native.save_bin(&rbw, precision).unwrap();
        let mut saved = read_model(&std::fs::read(&rbw).unwrap(), PortableBackend).unwrap();
        let mut page = page;
        let batch = TokenBatch::new([ids(&exp["cases"][0]["llama_cpp_bos"])]).unwrap();
        let (got, want) = (page.model.forward_logits(&batch).unwrap(), saved.forward_logits(&batch).unwrap());
        assert_eq!(got.len(), want.len());
        assert!(
            got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{format:?}: the logits differ"
        );
    }
}

/// A conversation of two turns on the CPU path: the first feeds the whole rendering; the
/// second only what follows the ids the model read and drew (the reply as the template
/// renders it), and its greedy reply is the one a fresh conversation fed the whole
/// rendering draws. A context the rendering does not start with is read again.
#[test]
fn chat_turns_feed_only_what_the_model_has_not_read() {
    let bytes = std::fs::read(dir().join("qwen2.q8_0.gguf")).unwrap();
    let page = gguf::read(&bytes, QuantFormat::Q8, 2048).unwrap();
    let template = page.template.clone().unwrap();
    let tok = page.tokenizer.clone();
    let end = page.end;
    let mut engine = block_on(Engine::from_model(page.model, bytes.len(), DeviceChoice::Cpu)).unwrap();

    let first = chat::turn(
        &template,
        &tok,
        &[],
        engine.context(),
        "What is the capital of France?".into(),
        Some("Be brief.".into()),
        0,
    )
    .unwrap();
    assert_eq!(first.reused, 0);
    let rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(first.ids, tok.encode(rendered, false).unwrap().get_ids());
    let mut sampler = Sampler::greedy();
    let reply = block_on(engine.generate(&first.ids, 12, &mut sampler, end, |_| true, || async {})).unwrap();
    let mut messages = first.messages;
    messages.push(Message::new("assistant", tok.decode(&reply.ids, false).unwrap()));

    let second =
        chat::turn(&template, &tok, &messages, engine.context(), "And of Spain?".into(), None, 0).unwrap();
    let whole: Vec<u32> = engine.context().iter().chain(&second.ids).copied().collect();
    let all = template.render(&second.messages, true, &Default::default(), 0).unwrap();
    // This reply reads back as the ids drawn, so the whole context is kept.
    assert_eq!(second.reused, engine.context().len(), "the second turn reads the context again");
    assert!(second.ids.len() < whole.len() / 2, "{} new ids of {}", second.ids.len(), whole.len());
    assert_eq!(
        whole,
        tok.encode(all.as_str(), false).unwrap().get_ids(),
        "context and new ids are the rendering"
    );
    let continued =
        block_on(engine.generate(&second.ids, 8, &mut sampler, end, |_| true, || async {})).unwrap();
    engine.reset();
    let all_ids = tok.encode(all.as_str(), false).unwrap().get_ids().to_vec();
    let fresh = block_on(engine.generate(&all_ids, 8, &mut sampler, end, |_| true, || async {})).unwrap();
    assert_eq!(continued.ids, fresh.ids, "the cached conversation answers as a fresh reading of it");

    // A context the rendering does not start with (another reply drawn) is read again.
    let other = [engine.context(), &[7, 7, 7]].concat();
    let again = chat::turn(&template, &tok, &messages, &other, "And of Spain?".into(), None, 0).unwrap();
    assert_eq!(again.reused, 0);
    assert_eq!(again.ids, all_ids);
}

fn read_err(bytes: &[u8], context: usize) -> String {
    match gguf::read(bytes, QuantFormat::Q8, context) {
        Ok(_) => panic!("read"),
        Err(e) => {
            assert!(matches!(e, WebError::File(_) | WebError::Invalid(_)), "{e:?}");
            e.to_string()
        }
    }
}

/// A cut file, a file of another kind, a context of 0: errors naming what to change.
#[test]
fn bad_files_are_refused_with_the_key_named() {
    let bytes = std::fs::read(dir().join("llama.q4_0.gguf")).unwrap();
    let e = read_err(&bytes[..bytes.len() - 100], 2048);
    assert!(e.starts_with("bad model file: ") && e.contains("run past the end of the data"), "{e}");
    let e = read_err(&bytes[..20], 2048);
    assert!(e.contains("bad model file: "), "{e}");
    let e = read_err(b"not a gguf file at all", 2048);
    assert!(e.contains("magic: not a GGUF file"), "{e}");
    let e = read_err(&bytes, 0);
    assert!(e.contains("options.context is 0"), "{e}");
}
