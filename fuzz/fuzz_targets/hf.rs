//! Hugging Face model folders (`TransformerLm::from_pretrained`, F32 and Q8): `config.json`
//! and `model.safetensors`, the input split in two. A model that loads must run.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rusting_brain::{Precision, TransformerLm};

fuzz_target!(|data: &[u8]| {
    let dir = rusting_brain_fuzz::put_folder(data, ["hf/config.json", "hf/model.safetensors"]);
    let precision = if data.len() % 2 == 0 { Precision::F32 } else { Precision::Q8 };
    if let Ok(mut lm) = TransformerLm::from_pretrained_at(&dir, precision) {
        rusting_brain_fuzz::run(&mut lm);
    }
});
