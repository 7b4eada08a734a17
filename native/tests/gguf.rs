//! A GGUF file as llama.cpp's tools write it (`tests/fixtures/gguf_tiny_llama.gguf`, made
//! with the `gguf` package's writer by `tests/fixtures/gen_gguf_blocks.py`: a tiny random
//! Llama (d_model 32), Q8_0 and F32 tensors, a byte-level BPE tokenizer and a chat template) read
//! through the public API: the model at every precision, the tokenizer it carries, its
//! template and end ids. The decoders' bits and the bad files are tested beside the reader
//! (`native/src/io/gguf.rs`); the real model in `real_model.rs`.

use std::path::PathBuf;

use rusting_brain::{ChatMessage, ChatTemplate, GenerationConfig, Precision, Sampler, TransformerLm};
use tokenizers::Tokenizer;

fn tiny() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf_tiny_llama.gguf")
}

#[test]
fn a_gguf_model_loads_at_every_precision_and_generates() {
    let mut f32_model = TransformerLm::from_gguf(tiny()).unwrap();
    let c = f32_model.config().clone();
    assert_eq!((c.vocab_size, c.d_model, c.q_heads, c.kv_heads, c.d_ff), (259, 32, 2, 1, 64));
    assert!(c.tie_embeddings);
    let prompt = [257u32, 104, 105];
    let want = f32_model.generate(&prompt, 8, &mut Sampler::greedy()).unwrap();
    assert_eq!(want.len(), 8);
    let logits = f32_model.forward_cached(&prompt, &mut f32_model.new_kv_caches()).unwrap();
    for precision in [Precision::Q8, Precision::Q4] {
        let mut m = TransformerLm::from_gguf_at(tiny(), precision).unwrap();
        assert_eq!(m.precision(), precision);
        let got = m.forward_cached(&prompt, &mut m.new_kv_caches()).unwrap();
        let scale = logits.iter().fold(0f32, |a, v| a.max(v.abs()));
        let worst = got.iter().zip(&logits).fold(0f32, |a, (g, w)| a.max((g - w).abs()));
        // Rounded weights move the logits of this small random model: measured 1.1% of
        // their range at int8 and 17.5% at 4 bits; bounds at twice that.
        let bound = if precision == Precision::Q8 { 0.022 } else { 0.35 };
        eprintln!("{precision:?}: worst logit {:.4} of the range", worst / scale);
        assert!(worst <= bound * scale, "{precision:?}: {worst} of a range of {scale}");
    }
}

#[test]
fn the_tokenizer_template_and_end_ids_come_from_the_file() {
    let tok: Tokenizer = rusting_brain::gguf::tokenizer_json(tiny()).unwrap().parse().unwrap();
    // Bytes as GPT-2's byte-level tokens, " t" merged (id 256), control tokens whole.
    let ids = tok.encode("hi to<|im_end|>", false).unwrap().get_ids().to_vec();
    assert_eq!(ids, [b'h' as u32, b'i' as u32, 256, b'o' as u32, 258]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "hi to<|im_end|>");
    let template = ChatTemplate::from_gguf(tiny()).unwrap();
    let text = template.render(&[ChatMessage::user("hi")], true).unwrap();
    assert_eq!(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    let gen = GenerationConfig::from_gguf(tiny()).unwrap();
    assert_eq!((gen.eos_token_ids.as_slice(), gen.bos_token_id), (&[258u32][..], Some(257)));
    assert!(!gen.do_sample, "GGUF files carry no sampling settings: greedy");
}

/// A SentencePiece vocabulary (`tokenizer.ggml.model` `llama`, as Llama 2, Mistral 7B and
/// TinyLlama files carry it; `tests/fixtures/gen_gguf_spm.py`: sentencepiece's BPE of 640
/// pieces with byte fallback, written as llama.cpp's converter writes one) rebuilt from the
/// file gives llama.cpp's ids (`llama-tokenize`) on every string: spaces, tabs and
/// newlines, digits, unicode (characters the vocabulary lacks as bytes), code, a
/// user-defined token glued to text, BOS and `[INST]` text; with special tokens parsed and
/// not, with BOS added and not. On the strings without special tokens the ids are also
/// sentencepiece's own, and decoding gives sentencepiece's text back. The file loads as a
/// model, its Llama 2 style template renders with the file's `<s>` and `</s>`, and
/// `save_gguf` writes the vocabulary out again.
#[test]
fn a_sentencepiece_vocabulary_gives_llama_cpp_s_ids() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf_spm");
    let file = dir.join("tiny_llama_spm.gguf");
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let mut tok: Tokenizer = rusting_brain::gguf::tokenizer_json(&file).unwrap().parse().unwrap();
    let list = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
    };
    let mut failures = Vec::new();
    for case in expected["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let check = |failures: &mut Vec<String>, what: &str, got: Vec<u32>, want: &serde_json::Value| {
            if got != list(want) {
                failures.push(format!("{text:?} {what}: ours {got:?}, expected {:?}", list(want)));
            }
        };
        tok.set_encode_special_tokens(false);
        let ids = |t: &Tokenizer, bos: bool| t.encode(text, bos).unwrap().get_ids().to_vec();
        check(&mut failures, "llama.cpp", ids(&tok, false), &case["llama_cpp"]);
        check(&mut failures, "llama.cpp with BOS", ids(&tok, true), &case["llama_cpp_bos"]);
        if !case["sentencepiece"].is_null() {
            check(&mut failures, "sentencepiece", ids(&tok, false), &case["sentencepiece"]);
            let back = tok.decode(&ids(&tok, false), true).unwrap();
            if back != case["sentencepiece_decoded"].as_str().unwrap() {
                failures.push(format!("{text:?} decodes to {back:?}"));
            }
        }
        tok.set_encode_special_tokens(true);
        check(
            &mut failures,
            "llama.cpp, special tokens as text",
            ids(&tok, false),
            &case["llama_cpp_no_special"],
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let mut model = TransformerLm::from_gguf(&file).unwrap();
    assert_eq!(model.config().vocab_size, tok.get_vocab_size(true));
    assert_eq!(model.generate(&[1, 300], 4, &mut Sampler::greedy()).unwrap().len(), 4);
    let template = ChatTemplate::from_gguf(&file).unwrap();
    let text = template.render(&[ChatMessage::user("hi"), ChatMessage::assistant("yo")], false).unwrap();
    assert_eq!(text, "<s>[INST] hi [/INST]yo</s>");
    // Written back out, the file carries the same vocabulary.
    let out = rusting_brain_test_support::TempDir::new("gguf_spm_written");
    let written = out.path().join("model.gguf");
    model.save_gguf(&written, Precision::F32).unwrap();
    let json = |p: &std::path::Path| rusting_brain::gguf::tokenizer_json(p).unwrap();
    assert_eq!(json(&written), json(&file));
}

#[test]
fn a_file_that_is_not_gguf_is_an_error_naming_it() {
    let bad = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/flow_match.json");
    for e in [
        TransformerLm::from_gguf(&bad).err().map(|e| e.to_string()),
        rusting_brain::gguf::tokenizer_json(&bad).err().map(|e| e.to_string()),
        ChatTemplate::from_gguf(&bad).err().map(|e| e.to_string()),
    ] {
        let e = e.expect("not a GGUF file, and no error");
        assert!(e.contains("flow_match.json: magic: not a GGUF file"), "{e}");
    }
    let blocks = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf_blocks.gguf");
    let e = TransformerLm::from_gguf(&blocks).err().unwrap().to_string();
    assert!(e.contains("general.architecture: fixture is not an architecture"), "{e}");
    let e = ChatTemplate::from_gguf(&blocks).err().unwrap().to_string();
    assert!(e.contains("tokenizer.chat_template: missing"), "{e}");
}

/// `save_gguf` writes what `from_gguf` reads back: at F32 the same logits to the bit, at
/// Q8_0 and Q4_0 the rounded model, with the tokenizer and chat template carried over
/// from the file the model came from. (That llama.cpp reads these files, and that their
/// tensors are `llama-quantize`'s bytes, is measured by hand: `docs/baseline.md`.)
#[test]
fn save_gguf_writes_what_from_gguf_reads_with_the_tokenizer() {
    let dir = rusting_brain_test_support::TempDir::new("save_gguf");
    let mut model = TransformerLm::from_gguf(tiny()).unwrap();
    let prompt = [257u32, 104, 105, 32];
    let want = model.forward_cached(&prompt, &mut model.new_kv_caches()).unwrap();
    let tokenizer = rusting_brain::gguf::tokenizer_json(tiny()).unwrap();
    for precision in [Precision::F32, Precision::Q8, Precision::Q4] {
        let path = dir.path().join(format!("{precision:?}.gguf"));
        model.save_gguf(&path, precision).unwrap();
        let mut back = TransformerLm::from_gguf(&path).unwrap();
        assert_eq!(back.config(), model.config(), "{precision:?}");
        let got = back.forward_cached(&prompt, &mut back.new_kv_caches()).unwrap();
        if precision == Precision::F32 {
            let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "an F32 file reads back to the same logits");
        } else {
            let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            let worst = got.iter().zip(&want).fold(0f32, |a, (g, w)| a.max((g - w).abs()));
            // The file's Q8_0 blocks are the very values the source file held (Q8_0 again:
            // measured 0); Q4_0 rounds them again (measured 13.5% of the range).
            eprintln!("{precision:?} file: worst logit {:.4} of the range", worst / scale);
            let bound = if precision == Precision::Q8 { 1e-6 } else { 0.27 };
            assert!(worst <= bound * scale, "{precision:?}: {worst} of {scale}");
        }
        assert_eq!(rusting_brain::gguf::tokenizer_json(&path).unwrap(), tokenizer, "{precision:?}");
        assert_eq!(
            ChatTemplate::from_gguf(&path).unwrap().source(),
            ChatTemplate::from_gguf(tiny()).unwrap().source()
        );
    }
    // Q4_K where rows are whole 256-value super-blocks; this model's rows are 32 wide, so
    // its block matrices fall back to Q5_0 as llama.cpp's do (the embedding Q8_0).
    let path = dir.path().join("q4k.gguf");
    model.save_gguf_as(&path, rusting_brain::gguf::GgufType::Q4K).unwrap();
    let file = rusting_brain_formats::gguf::Gguf::parse(std::fs::read(&path).unwrap()).unwrap();
    use rusting_brain_formats::gguf::blocks::GgmlType;
    for t in file.tensors.iter().filter(|t| t.dims.len() == 2) {
        let want = if t.name == "token_embd.weight" { GgmlType::Q8_0 } else { GgmlType::Q5_0 };
        assert_eq!(t.kind, want, "{}", t.name);
    }
    let mut back = TransformerLm::from_gguf(&path).unwrap();
    let got = back.forward_cached(&prompt, &mut back.new_kv_caches()).unwrap();
    let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
    let worst = got.iter().zip(&want).fold(0f32, |a, (g, w)| a.max((g - w).abs()));
    // Five bits round the Q8_0 values again: measured 10.0% of the range (Q4_0: 13.5%);
    // bound twice that.
    eprintln!("Q4_K (Q5_0) file: worst logit {:.4} of the range", worst / scale);
    assert!(worst <= 0.2 * scale, "Q5_0: {worst} of {scale}");
    // A quantized model, or one with adapters, is refused, and nothing is written.
    let path = dir.path().join("refused.gguf");
    let mut q = TransformerLm::from_gguf_at(tiny(), Precision::Q8).unwrap();
    let e = q.save_gguf(&path, Precision::Q8).unwrap_err().to_string();
    assert!(e.contains("quantized"), "{e}");
    q = TransformerLm::from_gguf(tiny()).unwrap();
    q.add_lora(rusting_brain::LoraConfig::new(2)).unwrap();
    let e = q.save_gguf(&path, Precision::F32).unwrap_err().to_string();
    assert!(e.contains("merge_lora"), "{e}");
    assert!(!path.exists());
    // A model from no file has no tokenizer to write.
    let fresh = rusting_brain_test_support::rule_model(32, 16).build().unwrap();
    let e = fresh.save_gguf(&path, Precision::F32).unwrap_err().to_string();
    assert!(e.contains("tokenizer"), "{e}");
    assert!(!path.exists());
}

/// Every family through GGUF and back: each Hugging Face fixture (transformers wrote
/// them; `tests/fixtures/gen_hf.py`) read with `from_pretrained`, written with `save_gguf`
/// at F32 (llama.cpp's names; Llama's, Mistral's and Mixtral's q/k rows interleaved,
/// Qwen2's biases, Qwen3's q/k norms, linear RoPE scaling in the metadata, Mixtral's and
/// Qwen3-MoE's experts stacked per projection) and read back with `from_gguf`:
/// the same configuration and the same logits to the bit. The fixtures have no tokenizer,
/// so each gets a stand-in byte-level BPE `tokenizer.json` of its vocabulary's size.
#[test]
fn every_family_goes_through_gguf_and_back_to_the_bit() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/hf");
    let tmp = rusting_brain_test_support::TempDir::new("hf_gguf");
    for name in
        ["llama", "llama_tied", "mistral", "qwen2", "qwen2_rope_linear", "qwen3", "mixtral", "qwen3_moe"]
    {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["config.json", "model.safetensors", "generation_config.json"] {
            let from = fixtures.join(name).join(f);
            if from.exists() {
                std::fs::copy(&from, dir.join(f)).unwrap();
            }
        }
        let mut model = TransformerLm::from_pretrained(&dir).unwrap();
        let vocab: serde_json::Map<String, serde_json::Value> =
            (0..model.config().vocab_size).map(|i| (format!("t{i}"), serde_json::json!(i))).collect();
        let tokenizer = serde_json::json!({
            "version": "1.0", "added_tokens": [], "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": null, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": vocab, "merges": []},
        });
        std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
        let file = dir.join("model.gguf");
        model.save_gguf(&file, Precision::F32).unwrap();
        let mut back = TransformerLm::from_gguf(&file).unwrap();
        assert_eq!(back.config(), model.config(), "{name}");
        let ids: Vec<u32> = (0..12).map(|i| (i * 7 + 3) % model.config().vocab_size as u32).collect();
        let want = model.forward_cached(&ids, &mut model.new_kv_caches()).unwrap();
        let got = back.forward_cached(&ids, &mut back.new_kv_caches()).unwrap();
        let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{name}: {differ} logits differ after GGUF and back");
    }
}
