//! [`CausalLm`], [`MODEL_REGISTRY`] and [`load_model`]: from a path to a model.
//!
//! `load_model` takes an HF folder (config.json + safetensors) or a `.gguf` file,
//! reads the config, finds the architecture in `MODEL_REGISTRY` (so that an
//! unsupported one fails before any weight is read), opens the weights in the
//! requested format and builds the model with its attention backend. Adding an
//! architecture is one model file and one line of `MODEL_REGISTRY`.

use std::io::Read;
use std::path::Path;

use kernel_runtime::{DType, Device, Tensor};

use crate::attn_backend::AttnBackendSpec;
use crate::config::ModelConfig;
use crate::ctx::{AttnBackend, ForwardBatch, KvCache, KvCacheShape};
use crate::error::{ModelError, Result};
use crate::gguf::GgufCheckpoint;
use crate::moe_backend::MoeBackendKind;
use crate::weights::{has_safetensors, LoadFormat, Weights};
use crate::{llama, mistral, qwen2, qwen3, qwen3_moe};

/// A decoder-only language model: a batch of new tokens in, logits out.
///
/// Implementations hold weights only; the KV cache and the batch layout are the
/// caller's, passed to every call.
pub trait CausalLm: Send + Sync + std::fmt::Debug {
    /// The parsed `config.json`.
    fn config(&self) -> &ModelConfig;

    /// The compute dtype (of the weights, activations, KV cache and logits).
    fn dtype(&self) -> DType;

    /// Where the weights live.
    fn device(&self) -> Device;

    /// The attention backend the model was loaded with.
    fn attn_backend(&self) -> &dyn AttnBackend;

    /// Runs one step: stores the new tokens' K/V in `kv` and returns the logits
    /// `[batch.num_logit_rows(), vocab_size]` in the compute dtype, one row per
    /// logit row of the batch in order.
    fn forward(&self, batch: &ForwardBatch, kv: &KvCache) -> Result<Tensor>;

    /// Rows of the LM head (`vocab_size`; may exceed the tokenizer's vocabulary).
    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    /// Decoder layers.
    fn num_layers(&self) -> usize {
        self.config().num_hidden_layers
    }

    /// KV heads per layer.
    fn num_kv_heads(&self) -> usize {
        self.config().num_key_value_heads
    }

    /// Dimensions per head.
    fn head_dim(&self) -> usize {
        self.config().head_dim
    }

    /// End-of-sequence ids (config.json and generation_config.json).
    fn eos_token_ids(&self) -> &[u32] {
        &self.config().eos_token_ids
    }

    /// The longest sequence the model's positions cover.
    fn max_position_embeddings(&self) -> usize {
        self.config().max_position_embeddings
    }

    /// The shape of a KV cache of `num_pages` pages of `page_size` tokens for this model.
    fn kv_cache_shape(&self, num_pages: usize, page_size: usize) -> KvCacheShape {
        KvCacheShape { num_layers: self.num_layers(), num_pages, page_size, num_kv_heads: self.num_kv_heads(), head_dim: self.head_dim() }
    }

    /// A zeroed KV cache for this model, in its dtype, on its device.
    fn new_kv_cache(&self, num_pages: usize, page_size: usize) -> Result<KvCache> {
        KvCache::new(self.kv_cache_shape(num_pages, page_size), self.dtype(), self.device())
    }
}

/// Implements [`CausalLm`] for a newtype over `LlamaForCausalLM` (the relatives
/// that only change how the body is loaded).
macro_rules! delegate_causal_lm {
    ($ty:ty) => {
        impl $crate::registry::CausalLm for $ty {
            fn config(&self) -> &$crate::config::ModelConfig {
                self.0.config()
            }
            fn dtype(&self) -> kernel_runtime::DType {
                self.0.dtype()
            }
            fn device(&self) -> kernel_runtime::Device {
                self.0.device()
            }
            fn attn_backend(&self) -> &dyn $crate::ctx::AttnBackend {
                self.0.attn_backend()
            }
            fn forward(&self, batch: &$crate::ctx::ForwardBatch, kv: &$crate::ctx::KvCache) -> $crate::error::Result<kernel_runtime::Tensor> {
                self.0.forward(batch, kv)
            }
        }
    };
}
pub(crate) use delegate_causal_lm;

/// The config a model with a sliding attention `window` runs with: its context
/// capped at the window. Within it every token sees all the tokens before it,
/// so full attention computes exactly the windowed one (vLLM served
/// Mistral-7B-v0.1 this way, at 4096 tokens); longer sequences are refused by
/// the engine's context limit rather than computed wrongly. No backend masks a
/// window yet.
pub(crate) fn within_sliding_window(config: &ModelConfig, window: Option<usize>) -> ModelConfig {
    let mut config = config.clone();
    if let Some(w) = window.filter(|&w| w > 0 && w < config.max_position_embeddings) {
        log::warn!(
            "{}: sliding_window = {w} is shorter than max_position_embeddings = {}: serving sequences of up to {w} tokens, \
             where full attention equals the windowed one",
            config.path.display(),
            config.max_position_embeddings
        );
        config.max_position_embeddings = w;
    }
    config
}

/// Builds a model from its config and opened weights, with its attention backend
/// and the MoE backend of its sparse layers (ignored by dense models).
pub type ModelLoader = fn(&ModelConfig, &Weights, Box<dyn AttnBackend>, MoeBackendKind) -> Result<Box<dyn CausalLm>>;

/// Every architecture: the `architectures[0]` string of config.json and its loader.
pub const MODEL_REGISTRY: &[(&str, ModelLoader)] = &[
    ("LlamaForCausalLM", |c, w, a, _| Ok(Box::new(llama::LlamaForCausalLM::load(c, w, a)?))),
    ("Qwen2ForCausalLM", |c, w, a, _| Ok(Box::new(qwen2::Qwen2ForCausalLM::load(c, w, a)?))),
    ("Qwen3ForCausalLM", |c, w, a, _| Ok(Box::new(qwen3::Qwen3ForCausalLM::load(c, w, a)?))),
    ("Qwen3MoeForCausalLM", |c, w, a, m| Ok(Box::new(qwen3_moe::Qwen3MoeForCausalLM::load(c, w, a, m)?))),
    ("MistralForCausalLM", |c, w, a, _| Ok(Box::new(mistral::MistralForCausalLM::load(c, w, a)?))),
];

/// The architectures `MODEL_REGISTRY` serves.
pub fn supported_architectures() -> Vec<&'static str> {
    MODEL_REGISTRY.iter().map(|(name, _)| *name).collect()
}

/// The loader of `architecture`, or an error listing the supported ones.
pub fn model_loader(architecture: &str) -> Result<ModelLoader> {
    MODEL_REGISTRY.iter().find(|(name, _)| *name == architecture).map(|(_, load)| *load).ok_or_else(|| {
        ModelError::UnsupportedArchitecture { architecture: architecture.to_owned(), supported: supported_architectures().join(", ") }
    })
}

/// How to load a model (no `Default`: the caller picks each on purpose).
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Where the weights and activations live.
    pub device: Device,
    /// The compute dtype; `None` picks f32 on the CPU (the reference path
    /// computes in f32 whatever it stores) and the checkpoint's dtype (bf16 when
    /// unstated) on CUDA.
    pub dtype: Option<DType>,
    pub load_format: LoadFormat,
    pub attn: AttnBackendSpec,
    /// How sparse MoE layers run their experts (`--moe`).
    pub moe: MoeBackendKind,
}

/// The seed of `--load-format dummy` weights (fixed: the same model every run).
pub const DUMMY_SEED: u64 = 0x6d69_6e69_7367_6c00;

/// Whether `path` is a GGUF file (by extension or magic bytes).
fn is_gguf(path: &Path) -> bool {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return true;
    }
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

/// Loads the model at `path`: an HF folder (config.json + safetensors, or config
/// alone with dummy weights) or a `.gguf` file.
pub fn load_model(path: &Path, options: &LoadOptions) -> Result<Box<dyn CausalLm>> {
    enum Input {
        Folder,
        Gguf(Box<GgufCheckpoint>),
    }
    let (config, input) = if path.is_dir() {
        (ModelConfig::from_folder(path)?, Input::Folder)
    } else if path.is_file() && is_gguf(path) {
        let checkpoint = GgufCheckpoint::open(path)?;
        (ModelConfig::from_value(checkpoint.hf_config(), path)?, Input::Gguf(Box::new(checkpoint)))
    } else if path.is_file() {
        return Err(ModelError::NoWeights { path: path.to_path_buf(), message: "expected a model folder or a .gguf file".into() });
    } else {
        return Err(ModelError::NoWeights { path: path.to_path_buf(), message: "no such file or folder".into() });
    };
    let loader = model_loader(&config.architecture)?;

    let dtype = match (options.dtype, options.device) {
        (Some(d), _) => d,
        (None, Device::Cpu) => DType::F32,
        (None, Device::Cuda(_)) => config.torch_dtype.filter(|d| d.is_float()).unwrap_or(DType::BF16),
    };
    if !dtype.is_float() {
        return Err(ModelError::ComputeDtype { dtype });
    }
    let device = options.device;
    let weights = match (options.load_format, input) {
        (LoadFormat::Dummy, _) => Weights::dummy(path, DUMMY_SEED, dtype, device),
        (LoadFormat::Auto | LoadFormat::Safetensors, Input::Folder) => {
            if options.load_format == LoadFormat::Auto && !has_safetensors(path) {
                return Err(ModelError::NoWeights {
                    path: path.to_path_buf(),
                    message: "no model.safetensors or model.safetensors.index.json (use --load-format dummy for random weights)".into(),
                });
            }
            Weights::safetensors(path, dtype, device)?
        }
        (LoadFormat::Auto, Input::Gguf(checkpoint)) => Weights::gguf(*checkpoint, path, dtype, device)?,
        (LoadFormat::Safetensors, Input::Gguf(_)) => {
            return Err(ModelError::NoWeights { path: path.to_path_buf(), message: "--load-format safetensors needs an HF folder, not a GGUF file".into() })
        }
    };
    let attn = options.attn.create()?;
    log::info!(
        "loading {} from {} ({dtype} on {device}, attention {}, moe {})",
        config.architecture,
        path.display(),
        options.attn,
        options.moe
    );
    loader(&config, &weights, attn, options.moe)
}
