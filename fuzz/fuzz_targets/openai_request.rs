//! The server's request parser (`rusting_brain_server::api::parse`): a body as a client
//! may send it to `/v1/chat/completions` and to `/v1/completions`. Any body is a request or
//! an error naming the field, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rusting_brain_server::api::{parse, Kind};

fuzz_target!(|data: &[u8]| {
    for kind in [Kind::Chat, Kind::Completion] {
        if let Err(e) = parse(data, kind) {
            assert!((400..500).contains(&e.status), "a refusal is a 4xx: {e:?}");
        }
    }
});
