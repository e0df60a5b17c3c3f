//! Chat-template rendering with arbitrary messages: bytes as a `messages`
//! JSON array, checked by the server's parser, rendered by the fixture
//! models' real templates (Qwen3's and LLaMA's). Rendering may refuse a
//! conversation; it must not panic or hang.
#![no_main]

use std::sync::OnceLock;

use engine::frontend::server::request::parse_messages;
use engine::text::chat_template::{ChatTemplate, ModelChatConfig, RenderOptions};
use libfuzzer_sys::fuzz_target;

fn templates() -> &'static [(ChatTemplate, ModelChatConfig)] {
    static T: OnceLock<Vec<(ChatTemplate, ModelChatConfig)>> = OnceLock::new();
    T.get_or_init(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
        ["qwen3-tiny", "llama-tiny"]
            .iter()
            .filter_map(|m| {
                let chat = ModelChatConfig::load(&root.join(m)).ok()?;
                let template = ChatTemplate::new(chat.chat_template.as_deref()?).ok()?;
                Some((template, chat))
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let Ok(messages) = parse_messages(value) else { return };
    for (template, chat) in templates() {
        for generation_prompt in [false, true] {
            let opts = RenderOptions::new(generation_prompt, chat.special_tokens.clone());
            let _ = template.render(&messages, &opts);
        }
    }
});
