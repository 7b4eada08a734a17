//! NumPy `.npy` arrays (`Dataset::from_npy`): inputs and targets, the input split in two.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [x, y] = rusting_brain_fuzz::put_split(data, ["x.npy", "y.npy"]);
    let _ = rusting_brain::Dataset::from_npy(&x, &y);
});
