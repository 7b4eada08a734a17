//! Optimizer state (`.opt`) loaded onto a model: a refused file must leave the model as it was.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = rusting_brain_fuzz::put("state.opt", data);
    rusting_brain_fuzz::with_tiny_lm(|lm| lm.load_optimizer_state(&path).is_ok());
});
