//! PEFT adapter folders: `adapter_config.json` and `adapter_model.safetensors` (the input
//! split in two), loaded onto a model; a model that took them runs.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (config, weights) = rusting_brain_fuzz::split(data);
    rusting_brain_fuzz::put("peft/adapter_config.json", config);
    let path = rusting_brain_fuzz::put("peft/adapter_model.safetensors", weights);
    let dir = path.parent().expect("a folder");
    rusting_brain_fuzz::with_tiny_lm(|lm| {
        let loaded = lm.load_lora(dir).is_ok();
        if loaded {
            rusting_brain_fuzz::run(lm);
        }
        loaded
    });
});
