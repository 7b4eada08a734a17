//! CSV tables, numeric (`Dataset::from_csv`) and labelled (`Dataset::from_csv_labeled`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = rusting_brain_fuzz::put("table.csv", data);
    let targets = data.first().map_or(1, |b| (b % 4) as usize);
    let _ = rusting_brain::Dataset::from_csv(&path, targets);
    let _ = rusting_brain::Dataset::from_csv_labeled(&path);
});
