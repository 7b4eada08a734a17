//! LoRA adapters (`.rbl`) loaded onto a model without adapters; a model that took them runs.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = rusting_brain_fuzz::put("adapters.rbl", data);
    rusting_brain_fuzz::with_tiny_lm(|lm| {
        let loaded = lm.load_lora(&path).is_ok();
        if loaded {
            rusting_brain_fuzz::run(lm);
        }
        loaded
    });
});
