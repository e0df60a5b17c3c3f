//! A model folder from arbitrary bytes: `config.json` and `model.safetensors`
//! (the input split at the first NUL byte), loaded on the CPU. Every broken
//! config, header or shape must be a `ModelError`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use models::{load_model, LoadFormat, LoadOptions};

fuzz_target!(|data: &[u8]| {
    let (config, weights) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(dir) = tempfile::tempdir() else { return };
    if std::fs::write(dir.path().join("config.json"), config).is_err()
        || std::fs::write(dir.path().join("model.safetensors"), weights).is_err()
    {
        return;
    }
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(config) {
        let _ = models::ModelConfig::from_value(&value, &dir.path().join("config.json"));
    }
    let options = LoadOptions {
        device: kernel_runtime::Device::Cpu,
        dtype: None,
        load_format: LoadFormat::Auto,
        attn: "paged".parse().expect("a backend name"),
        moe: "naive".parse().expect("a backend name"),
        // The served context, as `--max-model-len` gives it.
        max_context: Some(256),
    };
    let _ = load_model(dir.path(), &options);
});
