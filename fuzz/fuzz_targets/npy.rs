//! NumPy `.npy` arrays (`Dataset::from_npy`): inputs and targets, the input split in two.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (x, y) = rusting_brain_fuzz::split(data);
    let x = rusting_brain_fuzz::put("x.npy", x);
    let y = rusting_brain_fuzz::put("y.npy", y);
    let _ = rusting_brain::Dataset::from_npy(&x, &y);
});
