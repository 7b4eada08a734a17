//! Token files (`TokenFile`): raw little-endian u32 ids, read in random and sequential
//! windows.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = rusting_brain_fuzz::put("corpus.tok", data);
    if let Ok(mut file) = rusting_brain::TokenFile::open(&path, 3) {
        let _ = file.batch(0, 2, 4);
        let _ = file.chunk(1, 1, 3);
    }
});
