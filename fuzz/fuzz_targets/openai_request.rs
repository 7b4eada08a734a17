//! The server's request parsers (`rusting_brain_server::api::parse`, `parse_image`): a
//! body as a client may send it to `/v1/chat/completions`, `/v1/completions` and
//! `/v1/images/generations`. Any body is a request or an error naming the field, never a
//! panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rusting_brain_server::api::{parse, parse_image, Kind};

fuzz_target!(|data: &[u8]| {
    for kind in [Kind::Chat, Kind::Completion] {
        if let Err(e) = parse(data, kind) {
            assert!((400..500).contains(&e.status), "a refusal is a 4xx: {e:?}");
        }
    }
    match parse_image(data) {
        Ok(r) => assert!(r.size.is_none_or(|(w, h)| w * h <= rusting_brain_server::api::MAX_IMAGE_PIXELS)),
        Err(e) => assert!((400..500).contains(&e.status), "a refusal is a 4xx: {e:?}"),
    }
});
