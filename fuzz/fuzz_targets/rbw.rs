//! `.rbw` checkpoints (`TransformerLm::load_bin`): safetensors container, configuration
//! JSON in the metadata, F32 or int8 tensors. A model that loads must also run.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = rusting_brain_fuzz::put("model.rbw", data);
    if let Ok(mut lm) = rusting_brain::TransformerLm::load_bin(&path) {
        rusting_brain_fuzz::run(&mut lm);
    }
});
