//! Dense networks saved as JSON (`Network::load_json`). A network that loads must predict.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = rusting_brain_fuzz::put("network.json", data);
    if let Ok(mut net) = rusting_brain::Network::load_json(&path) {
        let inputs = net.config().map_or(0, |c| c.input_size);
        if inputs <= 1 << 16 {
            let _ = net.predict(&vec![0.5; inputs]);
        }
    }
});
