//! The image pipelines' prompt tokenizers. T5's Unigram and Qwen's byte-level BPE (with
//! FLUX.2-klein's chat string) from `tokenizer.json` files written for the test
//! (`tests/fixtures/gen_prompt_tokenizers.py`), against transformers' fast tokenizers.
//! CLIP's from a folder with vocab.json and merges.txt only (no tokenizer.json):
//! the ids transformers' `CLIPTokenizer` gives on a small vocabulary written for the test
//! (`tests/fixtures/gen_clip_tokenizer.py`), and, when `RB_CLIP_BPE` names open_clip's
//! `bpe_simple_vocab_16e6.txt.gz` (shipped in the open_clip_torch wheel, not committed;
//! `.ci/run` installs the wheel and sets it),
//! the ids of the real OpenAI vocabulary that `../shared/notes/text_to_image.md` lists.

use std::io::Read;

use rusting_brain::ClipTokenizer;
use rusting_brain_test_support::TempDir;

fn fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/clip_tokenizer")
}

#[test]
fn ids_and_masks_match_transformers_clip_tokenizer() {
    let tok = ClipTokenizer::load(fixture()).unwrap();
    assert_eq!(tok.max_length(), 77);
    let expected: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture().join("expected.json")).unwrap()).unwrap();
    let cases = expected.as_array().unwrap();
    assert!(cases.len() >= 6, "the fixture lists its prompts");
    for case in cases {
        let prompt = case["prompt"].as_str().unwrap();
        let want: Vec<u32> =
            case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let want_mask: Vec<bool> =
            case["mask"].as_array().unwrap().iter().map(|v| v.as_u64() == Some(1)).collect();
        let (ids, mask) = tok.encode(prompt).unwrap();
        assert_eq!(ids, want, "ids of {prompt:?}");
        assert_eq!(mask, want_mask, "mask of {prompt:?}");
    }
}

#[test]
fn a_folder_without_the_files_is_an_error() {
    let t = TempDir::new("clip-tok");
    std::fs::copy(fixture().join("vocab.json"), t.join("vocab.json")).unwrap();
    let e = ClipTokenizer::load(t.path()).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("no tokenizer.json, and no merges.txt"), "{e}");
    std::fs::write(t.join("merges.txt"), "#version: 0.2\nzz qq\n").unwrap();
    let e = ClipTokenizer::load(t.path()).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("merges.txt") || e.contains("vocab.json"), "{e}");
}

/// GPT-2's byte-to-character table, which CLIP's vocabulary is written in, in the order
/// the vocabulary lists it (the printable bytes first).
fn bytes_to_unicode() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    cs.iter().map(|&c| char::from_u32(c).unwrap()).collect()
}

#[test]
fn the_real_openai_vocabulary_gives_the_published_ids() {
    let Ok(gz) = std::env::var("RB_CLIP_BPE") else {
        eprintln!("SKIPPED: set RB_CLIP_BPE to open_clip's bpe_simple_vocab_16e6.txt.gz");
        return;
    };
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&gz).unwrap()).read_to_string(&mut text).unwrap();
    // As transformers' conversion does: the first line is a header, then 49152 - 256 - 2
    // merges are used.
    let merges: Vec<&str> = text.lines().skip(1).take(49152 - 256 - 2).collect();
    let symbols: Vec<String> = bytes_to_unicode().iter().map(|c| c.to_string()).collect();
    let mut vocab: Vec<String> = symbols.clone();
    vocab.extend(symbols.iter().map(|s| format!("{s}</w>")));
    vocab.extend(merges.iter().map(|m| m.replace(' ', "")));
    vocab.extend(["<|startoftext|>".to_string(), "<|endoftext|>".to_string()]);
    assert_eq!(vocab.len(), 49408);
    let t = TempDir::new("clip-real");
    let map: serde_json::Map<String, serde_json::Value> =
        vocab.iter().enumerate().map(|(i, v)| (v.clone(), i.into())).collect();
    std::fs::write(t.join("vocab.json"), serde_json::to_vec(&map).unwrap()).unwrap();
    std::fs::write(t.join("merges.txt"), format!("#version: 0.2\n{}\n", merges.join("\n"))).unwrap();
    let tok = ClipTokenizer::load(t.path()).unwrap();
    for (prompt, want) in [
        (
            "a photograph of an astronaut riding a horse",
            &[49406u32, 320, 8853, 539, 550, 18376, 6765, 320, 4558, 49407][..],
        ),
        (
            "A painting of a squirrel eating a burger",
            &[49406, 320, 3086, 539, 320, 14004, 4371, 320, 6548, 49407],
        ),
        (
            "a lovely cat holding a sign says 'flux.cpp'",
            &[49406, 320, 2165, 2368, 5050, 320, 2292, 1563, 262, 25249, 269, 66, 4186, 262, 49407],
        ),
        ("", &[49406, 49407]),
    ] {
        assert_eq!(tok.ids(prompt).unwrap(), want, "{prompt:?}");
    }
    let (ids, mask) = tok.encode("a photograph of an astronaut riding a horse").unwrap();
    assert_eq!((ids.len(), ids[76], mask.iter().filter(|m| **m).count()), (77, 49407, 10));
}

fn prompt_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/prompt_tokenizers").join(name)
}

fn expected(name: &str) -> Vec<serde_json::Value> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(prompt_fixture(name).join("expected.json")).unwrap()).unwrap();
    v.as_array().unwrap().clone()
}

fn ids_and_mask(case: &serde_json::Value) -> (Vec<u32>, Vec<bool>) {
    let ids = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let mask = case["mask"].as_array().unwrap().iter().map(|v| v.as_u64() == Some(1)).collect();
    (ids, mask)
}

/// T5's Unigram from `tokenizer.json` (`tests/fixtures/gen_prompt_tokenizers.py`): ids,
/// `</s>` kept through truncation, padding with `<pad>`, as `T5TokenizerFast` gives them.
#[test]
fn t5_unigram_matches_transformers() {
    let mut tok = rusting_brain::PromptTokenizer::load(prompt_fixture("t5")).unwrap();
    let cases = expected("t5");
    assert!(cases.len() >= 5);
    for case in &cases {
        let prompt = case["prompt"].as_str().unwrap();
        assert_eq!(tok.encode(prompt, 16).unwrap(), ids_and_mask(case), "{prompt:?}");
    }
}

/// Qwen's byte-level BPE on FLUX.2-klein's chat string: the template exact, the ids and
/// padding as the klein pipeline's tokenizer call gives them.
#[test]
fn qwen_chat_prompt_matches_transformers() {
    let mut tok = rusting_brain::PromptTokenizer::load(prompt_fixture("qwen")).unwrap();
    let cases = expected("qwen");
    assert!(cases.len() >= 4);
    for case in &cases {
        let prompt = case["prompt"].as_str().unwrap();
        let text = rusting_brain::klein_prompt(prompt);
        assert_eq!(text, case["text"].as_str().unwrap(), "the chat string of {prompt:?}");
        assert_eq!(tok.encode(&text, 40).unwrap(), ids_and_mask(case), "{prompt:?}");
    }
    assert_eq!(
        rusting_brain::klein_prompt("a cat"),
        "<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
}

#[test]
fn tokenizer_folders_that_cannot_be_read_say_why() {
    let t = TempDir::new("spiece");
    std::fs::write(t.join("spiece.model"), b"\x0a\x03abc").unwrap();
    let e = rusting_brain::PromptTokenizer::load(t.path()).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("only spiece.model") && e.contains("T5TokenizerFast"), "{e}");
    std::fs::copy(prompt_fixture("t5").join("tokenizer.json"), t.join("tokenizer.json")).unwrap();
    let e = rusting_brain::PromptTokenizer::load(t.path()).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("no pad_token"), "{e}");
    std::fs::write(t.join("tokenizer_config.json"), r#"{"pad_token": "<nope>"}"#).unwrap();
    let e = rusting_brain::PromptTokenizer::load(t.path()).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("\"<nope>\" is not in the vocabulary"), "{e}");
    std::fs::write(t.join("tokenizer_config.json"), r#"{"pad_token": "<pad>", "padding_side": "left"}"#)
        .unwrap();
    let e = rusting_brain::PromptTokenizer::load(t.path()).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("padding_side \"left\""), "{e}");
    std::fs::write(t.join("tokenizer.json"), b"{ not json").unwrap();
    let e = rusting_brain::PromptTokenizer::load(t.path()).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("tokenizer.json"), "{e}");
}
