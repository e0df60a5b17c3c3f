//! A GGUF file from arbitrary bytes: the reader, the checkpoint view (HF
//! names and layout, the config from metadata) and the tokenizer rebuilt
//! from metadata must return errors, never panic or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use models::gguf::{GgufCheckpoint, GgufFile};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else { return };
    let _ = engine::text::gguf_tokenizer::tokenizer_from_gguf(&file);
    let Ok(checkpoint) = GgufCheckpoint::from_file(file) else { return };
    let _ = models::ModelConfig::from_value(checkpoint.hf_config(), std::path::Path::new("fuzz.gguf"));
    let names: Vec<String> = checkpoint.tensor_names().map(str::to_owned).collect();
    for name in names.iter().take(8) {
        let _ = checkpoint.load_f32(name);
    }
});
