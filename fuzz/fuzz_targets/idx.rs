//! IDX image and label files (`Dataset::from_idx`), the input split in two.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [images, labels] = rusting_brain_fuzz::put_split(data, ["images.idx", "labels.idx"]);
    let _ = rusting_brain::Dataset::from_idx(&images, &labels);
});
