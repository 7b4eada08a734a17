//! PEFT adapter folders: `adapter_config.json` and `adapter_model.safetensors` (the input
//! split in two), loaded onto a model; a model that took them runs.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir =
        rusting_brain_fuzz::put_folder(data, ["peft/adapter_config.json", "peft/adapter_model.safetensors"]);
    rusting_brain_fuzz::with_tiny_lm(|lm| {
        let loaded = lm.load_lora(&dir).is_ok();
        if loaded {
            rusting_brain_fuzz::run(lm);
        }
        loaded
    });
});
