//! The chat side of a model folder: `tokenizer_config.json` (chat template, special
//! tokens) rendered over a short conversation, and `generation_config.json`, the input
//! split in two.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rusting_brain::{ChatMessage, ChatTemplate, GenerationConfig};

fuzz_target!(|data: &[u8]| {
    let dir =
        rusting_brain_fuzz::put_folder(data, ["chat/tokenizer_config.json", "chat/generation_config.json"]);
    if let Ok(template) = ChatTemplate::from_pretrained(&dir) {
        let chat = [ChatMessage::system("be brief"), ChatMessage::user("hi")];
        let _ = template.render(&chat, true);
    }
    if let Ok(g) = GenerationConfig::from_pretrained(&dir) {
        let _ = g.sampler(Some(1));
    }
});
