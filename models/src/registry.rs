//! [`MODEL_REGISTRY`] and [`load_model`]: from a path to a model.
//!
//! `load_model` takes an HF folder (config.json + safetensors) or a `.gguf` file,
//! reads the config, finds the architecture in `MODEL_REGISTRY` (so that an
//! unsupported one fails before any weight is read), opens the weights in the
//! requested format and builds the model with its attention backend. Adding an
//! architecture is one model file and one line of `MODEL_REGISTRY`.

use std::io::Read;
use std::path::Path;

use kernel_runtime::{DType, Device};

use crate::attn_backend::AttnBackendSpec;
use crate::causal_lm::CausalLm;
use crate::config::ModelConfig;
use crate::ctx::AttnBackend;
use crate::error::{ModelError, Result};
use crate::gguf::GgufCheckpoint;
use crate::moe_backend::MoeBackendKind;
use crate::tp::TpGroup;
use crate::weights::{has_safetensors, LoadFormat, Weights};
use crate::{llama, mistral, qwen2, qwen3, qwen3_moe};

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
        ModelError::UnsupportedArchitecture {
            architecture: architecture.to_owned(),
            supported: supported_architectures().join(", "),
        }
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
    /// The context to serve (`--max-model-len`), at most the config's: the
    /// rotary table and the model's reported context shrink to it, so memory
    /// follows what is served rather than what the config declares.
    pub max_context: Option<usize>,
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
    load_model_sharded(path, options, TpGroup::single())
}

/// [`load_model`] for one rank of a tensor-parallel group: each layer reads its
/// slice of the checkpoint and keeps `tp`'s collectives.
pub fn load_model_sharded(path: &Path, options: &LoadOptions, tp: TpGroup) -> Result<Box<dyn CausalLm>> {
    let (model, _) = load_model_counting(path, options, tp)?;
    Ok(model)
}

/// [`load_model_sharded`], also returning the bytes read from safetensors
/// files (what a rank's slice cost; tests assert it).
pub fn load_model_counting(path: &Path, options: &LoadOptions, tp: TpGroup) -> Result<(Box<dyn CausalLm>, u64)> {
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
        return Err(ModelError::NoWeights {
            path: path.to_path_buf(),
            message: "expected a model folder or a .gguf file".into(),
        });
    } else {
        return Err(ModelError::NoWeights { path: path.to_path_buf(), message: "no such file or folder".into() });
    };
    let mut config = config;
    if let Some(n) = options.max_context {
        if n == 0 || n > config.max_position_embeddings {
            return Err(ModelError::InvalidKey {
                path: config.path.clone(),
                key: "max_position_embeddings".into(),
                message: format!("the served context of {n} tokens must be in 1..={}", config.max_position_embeddings),
            });
        }
        config.max_position_embeddings = n;
    }
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
            return Err(ModelError::NoWeights {
                path: path.to_path_buf(),
                message: "--load-format safetensors needs an HF folder, not a GGUF file".into(),
            })
        }
    };
    let shard = tp.shard();
    let weights = weights.with_tp(tp);
    let attn = options.attn.create()?;
    log::info!(
        "loading {} from {} ({dtype} on {device}, attention {}, moe {}{})",
        config.architecture,
        path.display(),
        options.attn,
        options.moe,
        if shard.is_split() { format!(", tp rank {} of {}", shard.rank(), shard.size()) } else { String::new() }
    );
    let model = loader(&config, &weights, attn, options.moe)?;
    Ok((model, weights.bytes_read()))
}
