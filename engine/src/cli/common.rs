//! Options shared by every command that loads a model, and the code that turns
//! them into a running engine.

use std::path::PathBuf;

use clap::Args;

/// Which model and how to run it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A HuggingFace model folder (config.json, safetensors, tokenizer) or a .gguf file.
    #[arg(long)]
    pub model: PathBuf,
    /// cpu, cuda, cuda:N, or auto (the GPU when there is one).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Compute dtype: auto (bf16 on the GPU, f32 on the CPU), bf16, f16, f32.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// auto (from the folder), safetensors, gguf, or dummy (random weights from config.json).
    #[arg(long, default_value = "auto")]
    pub load_format: String,
    /// Attention backend: a name, or `prefill,decode`.
    #[arg(long, default_value = "paged")]
    pub attn: String,
}

/// Engine sizing and scheduling.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// KV pages in the pool (default: sized from --mem-fraction on the GPU, 4096 on the CPU).
    #[arg(long)]
    pub num_pages: Option<usize>,
    /// Share of the GPU's free memory (after the weights) given to the KV cache.
    #[arg(long, default_value_t = 0.85)]
    pub mem_fraction: f64,
    /// Most prompt tokens prefilled per step (chunked prefill).
    #[arg(long, default_value_t = 8192)]
    pub max_prefill_length: usize,
    /// Most requests running at once.
    #[arg(long, default_value_t = 256)]
    pub max_running_requests: usize,
    /// Prefix cache: radix or naive.
    #[arg(long, default_value = "radix")]
    pub cache: String,
}

/// A model ready to serve: the engine (scheduler + model runner), the tokenizer
/// and the chat template configuration, and the name clients address it by.
pub struct LoadedModel {
    pub engine: crate::engine::Engine<Box<dyn crate::engine::ModelRunner + Send>>,
    pub tokenizer: crate::tokenizer::Tokenizer,
    pub chat: crate::chat_template::ModelChatConfig,
    /// The served model name (the folder or file name).
    pub name: String,
}

/// Loads the model, its tokenizer and chat template, sizes the KV pool and builds
/// the engine.
pub fn load_model(_model: &ModelArgs, _engine: &EngineArgs) -> anyhow::Result<LoadedModel> {
    anyhow::bail!("model loading is not wired yet")
}
