//! llama.cpp's GGUF files (`TransformerLm::from_gguf_at`, F32, Q8 and Q4, where a file's
//! blocks are taken as they are; the tokenizer and chat template they carry). A model that
//! loads must run.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rusting_brain::{ChatTemplate, Precision, TransformerLm};

fuzz_target!(|data: &[u8]| {
    let path = rusting_brain_fuzz::put("model.gguf", data);
    let _ = rusting_brain::gguf::tokenizer_json(&path);
    let _ = ChatTemplate::from_gguf(&path);
    let precision = [Precision::F32, Precision::Q8, Precision::Q4][data.len() % 3];
    if let Ok(mut lm) = TransformerLm::from_gguf_at(&path, precision) {
        rusting_brain_fuzz::run(&mut lm);
    }
});
