//! A GGUF file as llama.cpp's tools write it (`tests/fixtures/gguf_tiny_llama.gguf`, made
//! with the `gguf` package's writer by `tests/fixtures/gen_gguf_blocks.py`: a tiny random
//! Llama, Q8_0 and F32 tensors, a byte-level BPE tokenizer and a chat template) read
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
    assert_eq!((c.vocab_size, c.d_model, c.q_heads, c.kv_heads, c.d_ff), (259, 8, 2, 1, 16));
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
        // Rounded weights move the logits: measured 1.9% of their range at int8 (rows of
        // 8 values are one block, so activations round to int8 a row) and 12% at 4 bits;
        // bounds at twice that.
        let bound = if precision == Precision::Q8 { 0.04 } else { 0.25 };
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
