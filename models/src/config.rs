//! [`ModelConfig`]: a HuggingFace `config.json`, in either of its two layouts.
//!
//! Checkpoints in the wild come in the classic layout (`rope_theta` and
//! `rope_scaling` at the top level, `torch_dtype`, Qwen3-MoE's `num_experts`) and
//! the transformers-5 layout (`rope_parameters` holding theta and the scaling,
//! `dtype`, `num_local_experts`). Both parse into the same struct, with the HF
//! defaults where transformers has one (`num_key_value_heads` = heads, `head_dim` =
//! hidden / heads, `rope_theta` = 10000, ...). Keys without a sensible default are
//! required, and a missing one is an error naming the key and the file.
//!
//! Parsing is by hand over `serde_json::Value` rather than `#[derive(Deserialize)]`
//! because one field can come from two keys and because the errors must name the
//! file. GGUF checkpoints produce the same classic layout (see `gguf::config`),
//! so they go through [`ModelConfig::from_value`] too.

use std::path::{Path, PathBuf};

use kernel_runtime::DType;
use serde_json::{Map, Value};

use crate::error::{ModelError, Result};

/// The rotary embedding of a model: base, scaling variant, rotated fraction.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// `rope_theta`: the base of the inverse frequencies.
    pub theta: f64,
    /// `rope_scaling` / `rope_parameters.rope_type` and its parameters.
    pub scaling: RopeScaling,
    /// `partial_rotary_factor`: the fraction of each head that is rotated (1.0 for
    /// every model here; parsed so that a checkpoint that sets it is honoured).
    pub partial_rotary_factor: f64,
    /// The dtype transformers' `inv_freq` buffer is in, which the frequencies are
    /// rounded to. Not a config.json key: always f32 when parsed, which is what
    /// `from_pretrained` keeps (and vLLM/SGLang use). A model cast with
    /// `model.to(torch.bfloat16)` after construction has its `inv_freq` cast too;
    /// setting this to bf16/f16 reproduces such a model (the tests' fixtures were
    /// generated that way).
    pub inv_freq_dtype: DType,
}

/// The rope scaling types this crate implements (see `rotary`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type: "default"` or no scaling at all).
    Default,
    /// Position interpolation: every inverse frequency divided by `factor`.
    Linear { factor: f64 },
    /// LLaMA 3.1's frequency-dependent interpolation.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: f64 },
    /// YaRN (static, as in vLLM and transformers): frequencies blended between
    /// interpolated and original by a linear ramp over the dimensions whose
    /// rotations fall between `beta_slow` and `beta_fast` within the original
    /// context, and cos/sin scaled by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        /// Whether the ramp's ends are rounded to whole dimensions (`truncate`).
        truncate: bool,
        attention_factor: f64,
    },
}

impl RopeScaling {
    /// The context these frequencies were scaled for, when the scaling names
    /// one larger than `max_position_embeddings` (YaRN: the original context
    /// times the factor, as vLLM serves it).
    pub fn scaled_context(&self) -> Option<usize> {
        match *self {
            RopeScaling::Yarn { factor, original_max_position_embeddings, .. } => {
                Some((original_max_position_embeddings * factor).round() as usize)
            }
            _ => None,
        }
    }
}

/// The rope types accepted, for error messages.
const SUPPORTED_ROPE_TYPES: &str = "default, linear, llama3, yarn";

/// Qwen3-MoE's sparse MLP settings (parsed now, used by the MoE model).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// `num_experts` (classic) or `num_local_experts` (transformers 5).
    pub num_experts: usize,
    /// `num_experts_per_tok`: experts each token is routed to.
    pub num_experts_per_tok: usize,
    /// `moe_intermediate_size`: the hidden width of one expert.
    pub moe_intermediate_size: usize,
    /// `norm_topk_prob`: renormalise the chosen experts' router weights to sum to 1.
    pub norm_topk_prob: bool,
    /// `decoder_sparse_step`: every n-th layer is sparse.
    pub decoder_sparse_step: usize,
    /// `mlp_only_layers`: layers that keep a dense MLP.
    pub mlp_only_layers: Vec<usize>,
}

impl MoeConfig {
    /// Whether layer `layer_idx` has the sparse MLP (transformers' rule).
    // `is_multiple_of` needs Rust 1.87; the workspace's rust-version is 1.85.
    #[allow(clippy::manual_is_multiple_of)]
    pub fn is_sparse_layer(&self, layer_idx: usize) -> bool {
        !self.mlp_only_layers.contains(&layer_idx)
            && self.num_experts > 0
            && (layer_idx + 1) % self.decoder_sparse_step.max(1) == 0
    }
}

/// The hyper-parameters of a decoder-only model, from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The file the config came from (`config.json`, or a `.gguf`), for errors.
    pub path: PathBuf,
    /// `architectures[0]`: the key of `MODEL_REGISTRY`.
    pub architecture: String,
    /// `model_type`, when present.
    pub model_type: Option<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Defaults to `num_attention_heads` (no GQA).
    pub num_key_value_heads: usize,
    /// `head_dim` when given (Qwen3, Gemma), else `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    /// `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// `attention_bias`: bias on the attention projections (what it covers is up to
    /// the architecture; Qwen2 has q/k/v bias regardless).
    pub attention_bias: bool,
    /// `mlp_bias` (LLaMA): bias on the MLP projections.
    pub mlp_bias: bool,
    /// `hidden_act` of the MLP (default `silu`).
    pub hidden_act: String,
    pub rope: RopeConfig,
    /// `dtype` / `torch_dtype`: the dtype the weights were saved in, if stated.
    pub torch_dtype: Option<DType>,
    /// `sliding_window`, when not null.
    pub sliding_window: Option<usize>,
    /// `use_sliding_window` (Qwen2/Qwen3's switch; false when absent).
    pub use_sliding_window: bool,
    pub bos_token_id: Option<u32>,
    /// `eos_token_id` (an id or a list), merged with `generation_config.json`'s
    /// when the config comes from a folder that has one.
    pub eos_token_ids: Vec<u32>,
    /// The sparse-MLP settings, when the config has experts.
    pub moe: Option<MoeConfig>,
}

/// Typed access to the keys of one JSON object, with errors naming the file and
/// the (dotted) key.
struct Keys<'a> {
    obj: &'a Map<String, Value>,
    path: &'a Path,
    /// Prefix of nested objects in error messages (`rope_scaling.`).
    prefix: &'a str,
}

impl<'a> Keys<'a> {
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    fn missing(&self, key: &str) -> ModelError {
        ModelError::MissingKey { path: self.path.to_path_buf(), key: self.name(key) }
    }

    fn invalid(&self, key: &str, message: impl Into<String>) -> ModelError {
        ModelError::InvalidKey { path: self.path.to_path_buf(), key: self.name(key), message: message.into() }
    }

    /// The value of `key`, `None` when absent or null.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.invalid(key, format!("expected a non-negative integer, got {v}")))
            })
            .transpose()
    }

    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }

    /// A required positive integer (a size that cannot be zero).
    fn positive(&self, key: &str) -> Result<usize> {
        match self.usize(key)? {
            0 => Err(self.invalid(key, "must be positive")),
            n => Ok(n),
        }
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| v.as_f64().ok_or_else(|| self.invalid(key, format!("expected a number, got {v}"))))
            .transpose()
    }

    fn f64(&self, key: &str) -> Result<f64> {
        self.opt_f64(key)?.ok_or_else(|| self.missing(key))
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| self.invalid(key, format!("expected true or false, got {v}"))))
            .transpose()
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| self.invalid(key, format!("expected a string, got {v}"))))
            .transpose()
    }

    /// A token id or a list of them (`eos_token_id`).
    fn ids(&self, key: &str) -> Result<Vec<u32>> {
        let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| one(v).ok_or_else(|| self.invalid(key, format!("expected token ids, got {v}"))))
                .collect(),
            Some(v) => one(v)
                .map(|id| vec![id])
                .ok_or_else(|| self.invalid(key, format!("expected a token id or a list, got {v}"))),
        }
    }

    /// A nested object (`rope_scaling`), `None` when absent or null.
    fn object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>> {
        self.get(key)
            .map(|v| v.as_object().ok_or_else(|| self.invalid(key, format!("expected an object, got {v}"))))
            .transpose()
    }
}

impl ModelConfig {
    /// Reads `dir/config.json` (and the eos ids of `dir/generation_config.json`,
    /// when there is one).
    pub fn from_folder(dir: &Path) -> Result<ModelConfig> {
        let mut config = ModelConfig::from_file(&dir.join("config.json"))?;
        let gen_path = dir.join("generation_config.json");
        if gen_path.is_file() {
            let value = read_json(&gen_path)?;
            if let Some(obj) = value.as_object() {
                let keys = Keys { obj, path: &gen_path, prefix: "" };
                for id in keys.ids("eos_token_id")? {
                    if !config.eos_token_ids.contains(&id) {
                        config.eos_token_ids.push(id);
                    }
                }
            }
        }
        Ok(config)
    }

    /// Reads one `config.json` file.
    pub fn from_file(path: &Path) -> Result<ModelConfig> {
        ModelConfig::from_value(&read_json(path)?, path)
    }

    /// Parses a `config.json` value; `path` is named in errors.
    pub fn from_value(value: &Value, path: &Path) -> Result<ModelConfig> {
        let obj = value.as_object().ok_or_else(|| ModelError::InvalidKey {
            path: path.to_path_buf(),
            key: "(top level)".into(),
            message: "expected a JSON object".into(),
        })?;
        let keys = Keys { obj, path, prefix: "" };

        let architecture = match keys.get("architectures") {
            None => return Err(keys.missing("architectures")),
            Some(Value::Array(a)) => a
                .first()
                .and_then(Value::as_str)
                .ok_or_else(|| keys.invalid("architectures", "expected a non-empty list of strings"))?
                .to_owned(),
            Some(v) => return Err(keys.invalid("architectures", format!("expected a list, got {v}"))),
        };

        let hidden_size = keys.positive("hidden_size")?;
        let num_attention_heads = keys.positive("num_attention_heads")?;
        let num_key_value_heads = keys.opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads);
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(keys.invalid(
                "num_key_value_heads",
                format!("{num_key_value_heads} does not divide num_attention_heads = {num_attention_heads}"),
            ));
        }
        let head_dim = match keys.opt_usize("head_dim")? {
            Some(0) => return Err(keys.invalid("head_dim", "must be positive")),
            Some(d) => d,
            None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            None => {
                return Err(keys.invalid(
                    "hidden_size",
                    format!("{hidden_size} is not a multiple of num_attention_heads = {num_attention_heads} and there is no head_dim"),
                ))
            }
        };

        let torch_dtype = match keys.opt_str("dtype")?.or(keys.opt_str("torch_dtype")?) {
            Some(s) => {
                let dtype = DType::parse(s);
                if dtype.is_none() {
                    log::warn!("{}: unknown dtype `{s}`, ignored", path.display());
                }
                dtype
            }
            None => None,
        };

        let mut config = ModelConfig {
            path: path.to_path_buf(),
            architecture,
            model_type: keys.opt_str("model_type")?.map(str::to_owned),
            vocab_size: keys.positive("vocab_size")?,
            hidden_size,
            intermediate_size: keys.positive("intermediate_size")?,
            num_hidden_layers: keys.usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: keys.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
            max_position_embeddings: keys.positive("max_position_embeddings")?,
            tie_word_embeddings: keys.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            attention_bias: keys.opt_bool("attention_bias")?.unwrap_or(false),
            mlp_bias: keys.opt_bool("mlp_bias")?.unwrap_or(false),
            hidden_act: keys.opt_str("hidden_act")?.unwrap_or("silu").to_owned(),
            rope: parse_rope(&keys)?,
            torch_dtype,
            sliding_window: keys.opt_usize("sliding_window")?,
            use_sliding_window: keys.opt_bool("use_sliding_window")?.unwrap_or(false),
            bos_token_id: keys.ids("bos_token_id")?.first().copied(),
            eos_token_ids: keys.ids("eos_token_id")?,
            moe: parse_moe(&keys)?,
        };
        // A YaRN checkpoint serves its scaled context even when
        // `max_position_embeddings` still names the original one (Qwen2.5's
        // and Qwen3's instructions add rope_scaling only).
        if let Some(scaled) = config.rope.scaling.scaled_context() {
            config.max_position_embeddings = config.max_position_embeddings.max(scaled);
        }
        check_bounds(&keys, &config)?;
        Ok(config)
    }

    /// The number of rotated dimensions of each head (`head_dim` unless the
    /// config sets `partial_rotary_factor`), always even.
    pub fn rotary_dim(&self) -> usize {
        let dim = (self.head_dim as f64 * self.rope.partial_rotary_factor) as usize;
        dim - dim % 2
    }

    /// An error for a setting of this config the model cannot run.
    pub fn unsupported(&self, message: impl Into<String>) -> ModelError {
        ModelError::Unsupported { path: self.path.clone(), message: message.into() }
    }
}

/// The longest context a config may declare (2^24 tokens: beyond every
/// model published; the rotary table alone would be gigabytes).
pub const MAX_CONTEXT: usize = 1 << 24;

/// Upper bounds on the sizes a config may declare, so that a hostile or
/// broken config.json is a named error rather than an allocation that
/// aborts the process (`--load-format dummy` builds weights from it alone).
const MAX_DIMS: &[(&str, usize)] = &[
    ("vocab_size", 1 << 24),
    ("hidden_size", 1 << 18),
    ("intermediate_size", 1 << 20),
    ("num_hidden_layers", 1 << 12),
    ("num_attention_heads", 1 << 12),
    ("num_key_value_heads", 1 << 12),
    ("head_dim", 1 << 12),
    ("max_position_embeddings", MAX_CONTEXT),
];

/// The largest rotary scaling factor accepted (real checkpoints use 2 to 64).
pub const MAX_ROPE_FACTOR: f64 = 1024.0;

fn check_bounds(keys: &Keys<'_>, c: &ModelConfig) -> Result<()> {
    let values = [
        c.vocab_size,
        c.hidden_size,
        c.intermediate_size,
        c.num_hidden_layers,
        c.num_attention_heads,
        c.num_key_value_heads,
        c.head_dim,
        c.max_position_embeddings,
    ];
    if let Some(moe) = &c.moe {
        if moe.num_experts > 1 << 12 || moe.moe_intermediate_size > 1 << 20 {
            return Err(keys.invalid(
                "num_experts",
                format!(
                    "{} experts of {} exceed the supported maximum of 4096 experts of 2^20",
                    moe.num_experts, moe.moe_intermediate_size
                ),
            ));
        }
    }
    if !(c.rms_norm_eps.is_finite() && c.rms_norm_eps > 0.0 && c.rms_norm_eps < 1.0) {
        return Err(keys.invalid("rms_norm_eps", format!("{} is not in (0, 1)", c.rms_norm_eps)));
    }
    if !(c.rope.theta.is_finite() && c.rope.theta > 0.0) {
        return Err(keys.invalid("rope_theta", format!("{} is not a finite number > 0", c.rope.theta)));
    }
    let factor = |key: &str, f: f64| {
        if f.is_finite() && f > 0.0 && f <= MAX_ROPE_FACTOR {
            Ok(())
        } else {
            Err(keys.invalid(&format!("rope_scaling.{key}"), format!("{f} is not in (0, {MAX_ROPE_FACTOR}]")))
        }
    };
    let context = |key: &str, n: f64| {
        if n.is_finite() && n >= 1.0 && n <= MAX_CONTEXT as f64 {
            Ok(())
        } else {
            Err(keys.invalid(&format!("rope_scaling.{key}"), format!("{n} is not in [1, {MAX_CONTEXT}]")))
        }
    };
    match c.rope.scaling {
        RopeScaling::Default => {}
        RopeScaling::Linear { factor: f } => factor("factor", f)?,
        RopeScaling::Llama3 { factor: f, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            factor("factor", f)?;
            factor("low_freq_factor", low_freq_factor)?;
            factor("high_freq_factor", high_freq_factor)?;
            context("original_max_position_embeddings", original_max_position_embeddings)?;
        }
        RopeScaling::Yarn { factor: f, original_max_position_embeddings, beta_fast, attention_factor, .. } => {
            factor("factor", f)?;
            context("original_max_position_embeddings", original_max_position_embeddings)?;
            factor("beta_fast", beta_fast)?;
            factor("attention_factor", attention_factor)?;
        }
    }
    // After the rope checks: an absurd YaRN factor shows up here too, as
    // the scaled context, but its own error names the cause.
    for (&(key, max), value) in MAX_DIMS.iter().zip(values) {
        if value > max {
            return Err(keys.invalid(key, format!("{value} exceeds the supported maximum of {max}")));
        }
    }
    Ok(())
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(ModelError::io(path))?;
    serde_json::from_str(&text).map_err(|source| ModelError::Json { path: path.to_path_buf(), source })
}

/// `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (classic).
fn parse_rope(keys: &Keys<'_>) -> Result<RopeConfig> {
    let top_theta = keys.opt_f64("rope_theta")?;
    let top_partial = keys.opt_f64("partial_rotary_factor")?;
    let (params, prefix) = match keys.object("rope_parameters")? {
        Some(p) => (Some(p), "rope_parameters."),
        None => (keys.object("rope_scaling")?, "rope_scaling."),
    };
    let Some(params) = params else {
        return Ok(RopeConfig {
            theta: top_theta.unwrap_or(10000.0),
            scaling: RopeScaling::Default,
            partial_rotary_factor: top_partial.unwrap_or(1.0),
            inv_freq_dtype: DType::F32,
        });
    };
    let p = Keys { obj: params, path: keys.path, prefix };
    // transformers 5 keeps theta inside rope_parameters; classic configs at the top.
    let theta = p.opt_f64("rope_theta")?.or(top_theta).unwrap_or(10000.0);
    let partial_rotary_factor = p.opt_f64("partial_rotary_factor")?.or(top_partial).unwrap_or(1.0);
    if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) {
        return Err(p.invalid("partial_rotary_factor", format!("{partial_rotary_factor} is not in (0, 1]")));
    }
    let kind = match p.opt_str("rope_type")? {
        Some(k) => Some(k),
        None => p.opt_str("type")?,
    };
    let scaling = match kind.unwrap_or("default") {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: p.f64("factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: p.f64("factor")?,
            low_freq_factor: p.f64("low_freq_factor")?,
            high_freq_factor: p.f64("high_freq_factor")?,
            original_max_position_embeddings: p.f64("original_max_position_embeddings")?,
        },
        "yarn" => {
            let factor = p.f64("factor")?;
            if !(factor.is_finite() && factor >= 1.0) {
                return Err(p.invalid("factor", format!("{factor} must be >= 1 for yarn")));
            }
            let original = match p.opt_f64("original_max_position_embeddings")? {
                Some(o) => o,
                None => keys.f64("max_position_embeddings")?,
            };
            // DeepSeek-style `mscale`/`mscale_all_dim` give the attention factor as
            // a ratio; otherwise YaRN's 0.1 ln(s) + 1.
            let mscale = |m: f64| if factor <= 1.0 { 1.0 } else { 0.1 * m * factor.ln() + 1.0 };
            let attention_factor =
                match (p.opt_f64("attention_factor")?, p.opt_f64("mscale")?, p.opt_f64("mscale_all_dim")?) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => mscale(m) / mscale(all),
                    _ => mscale(1.0),
                };
            let (beta_fast, beta_slow) =
                (p.opt_f64("beta_fast")?.unwrap_or(32.0), p.opt_f64("beta_slow")?.unwrap_or(1.0));
            if !(beta_fast > beta_slow && beta_slow > 0.0) {
                return Err(
                    p.invalid("beta_fast", format!("beta_fast = {beta_fast} must exceed beta_slow = {beta_slow} > 0"))
                );
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast,
                beta_slow,
                truncate: p.opt_bool("truncate")?.unwrap_or(true),
                attention_factor,
            }
        }
        "dynamic" => {
            return Err(ModelError::Unsupported {
                path: keys.path.to_path_buf(),
                message: format!(
                    "{prefix}rope_type `dynamic` is not supported: its frequencies change with the sequence length, \
                     which a fixed cos/sin table cannot express (supported: {SUPPORTED_ROPE_TYPES})"
                ),
            })
        }
        other => {
            return Err(ModelError::Unsupported {
                path: keys.path.to_path_buf(),
                message: format!("{prefix}rope_type `{other}` is not supported (supported: {SUPPORTED_ROPE_TYPES})"),
            })
        }
    };
    if let RopeScaling::Llama3 { low_freq_factor, high_freq_factor, .. } = scaling {
        if high_freq_factor <= low_freq_factor {
            return Err(p.invalid(
                "high_freq_factor",
                format!("{high_freq_factor} must exceed low_freq_factor = {low_freq_factor}"),
            ));
        }
    }
    Ok(RopeConfig { theta, scaling, partial_rotary_factor, inv_freq_dtype: DType::F32 })
}

/// The MoE keys, when the config has experts (`num_experts` or `num_local_experts`).
fn parse_moe(keys: &Keys<'_>) -> Result<Option<MoeConfig>> {
    let num_experts = match keys.opt_usize("num_local_experts")? {
        Some(n) => Some(n),
        None => keys.opt_usize("num_experts")?,
    };
    let Some(num_experts) = num_experts.filter(|&n| n > 0) else {
        return Ok(None);
    };
    let mlp_only_layers = match keys.get("mlp_only_layers") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .map(|n| n as usize)
                    .ok_or_else(|| keys.invalid("mlp_only_layers", format!("expected layer indices, got {v}")))
            })
            .collect::<Result<_>>()?,
        Some(v) => return Err(keys.invalid("mlp_only_layers", format!("expected a list, got {v}"))),
    };
    let num_experts_per_tok = keys.positive("num_experts_per_tok")?;
    if num_experts_per_tok > num_experts {
        return Err(
            keys.invalid("num_experts_per_tok", format!("{num_experts_per_tok} exceeds the {num_experts} experts"))
        );
    }
    Ok(Some(MoeConfig {
        num_experts,
        num_experts_per_tok,
        moe_intermediate_size: keys.positive("moe_intermediate_size")?,
        norm_topk_prob: keys.opt_bool("norm_topk_prob")?.unwrap_or(false),
        decoder_sparse_step: keys.opt_usize("decoder_sparse_step")?.unwrap_or(1).max(1),
        mlp_only_layers,
    }))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn base() -> Value {
        json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512,
            "max_position_embeddings": 1024
        })
    }

    fn parse(v: &Value) -> Result<ModelConfig> {
        ModelConfig::from_value(v, Path::new("/x/config.json"))
    }

    #[test]
    fn defaults_follow_transformers() {
        let c = parse(&base()).unwrap();
        assert_eq!((c.num_key_value_heads, c.head_dim, c.rotary_dim()), (4, 64, 64));
        assert_eq!(
            c.rope,
            RopeConfig {
                theta: 10000.0,
                scaling: RopeScaling::Default,
                partial_rotary_factor: 1.0,
                inv_freq_dtype: DType::F32
            }
        );
        assert!(!c.tie_word_embeddings && c.moe.is_none() && c.eos_token_ids.is_empty());
        assert_eq!(c.hidden_act, "silu");
    }

    #[test]
    fn classic_and_transformers5_layouts_agree() {
        let mut classic = base();
        classic["rope_theta"] = json!(500000.0);
        classic["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        classic["torch_dtype"] = json!("bfloat16");
        classic["eos_token_id"] = json!([1, 2]);
        let mut tf5 = base();
        tf5["rope_parameters"] = json!({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
        tf5["dtype"] = json!("bfloat16");
        tf5["eos_token_id"] = json!([1, 2]);
        let (a, b) = (parse(&classic).unwrap(), parse(&tf5).unwrap());
        assert_eq!(a, b);
        assert_eq!(a.torch_dtype, Some(DType::BF16));
        assert_eq!(a.eos_token_ids, [1, 2]);
        assert!(matches!(a.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
        // The old `type` spelling of rope_scaling.
        let mut old = base();
        old["rope_scaling"] = json!({"type": "linear", "factor": 2.0});
        assert_eq!(parse(&old).unwrap().rope.scaling, RopeScaling::Linear { factor: 2.0 });
    }

    #[test]
    fn moe_keys_in_both_layouts() {
        let mut classic = base();
        for (k, v) in [
            ("num_experts", json!(8)),
            ("num_experts_per_tok", json!(2)),
            ("moe_intermediate_size", json!(128)),
            ("norm_topk_prob", json!(true)),
            ("decoder_sparse_step", json!(1)),
            ("mlp_only_layers", json!([1])),
        ] {
            classic[k] = v;
        }
        let mut tf5 = classic.clone();
        let n = tf5.as_object_mut().unwrap().remove("num_experts").unwrap();
        tf5["num_local_experts"] = n;
        let (a, b) = (parse(&classic).unwrap(), parse(&tf5).unwrap());
        assert_eq!(a, b);
        let moe = a.moe.unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size), (8, 2, 128));
        assert!(moe.is_sparse_layer(0) && !moe.is_sparse_layer(1));
    }

    #[test]
    fn yarn_parses_like_vllm_and_serves_its_scaled_context() {
        // Qwen2.5's recipe: rope_scaling added, max_position_embeddings left at 32768.
        let mut c = base();
        c["max_position_embeddings"] = json!(32768);
        c["rope_scaling"] = json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768});
        let config = parse(&c).unwrap();
        assert_eq!(config.max_position_embeddings, 131072);
        match config.rope.scaling {
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                attention_factor,
            } => {
                assert_eq!(
                    (factor, original_max_position_embeddings, beta_fast, beta_slow, truncate),
                    (4.0, 32768.0, 32.0, 1.0, true)
                );
                assert!((attention_factor - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
            }
            other => panic!("{other:?}"),
        }
        // DeepSeek-style mscale ratio, an explicit attention factor, no original
        // (the config's own context is the original one).
        let mut c = base();
        c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0});
        let config = parse(&c).unwrap();
        assert_eq!(config.max_position_embeddings, 1024 * 40);
        assert!(matches!(config.rope.scaling, RopeScaling::Yarn { attention_factor, .. } if attention_factor == 1.0));
        c["rope_scaling"]["attention_factor"] = json!(0.5);
        assert!(
            matches!(parse(&c).unwrap().rope.scaling, RopeScaling::Yarn { attention_factor, .. } if attention_factor == 0.5)
        );
    }

    #[test]
    fn errors_name_the_key_and_file() {
        let mut c = base();
        c.as_object_mut().unwrap().remove("hidden_size");
        let e = parse(&c).unwrap_err().to_string();
        assert!(e.contains("/x/config.json") && e.contains("`hidden_size`"), "{e}");

        let mut c = base();
        c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0});
        let e = parse(&c).unwrap_err().to_string();
        assert!(e.contains("rope_scaling.low_freq_factor"), "{e}");

        let mut c = base();
        c["rope_scaling"] = json!({"rope_type": "longrope", "factor": 4.0});
        let e = parse(&c).unwrap_err().to_string();
        assert!(e.contains("`longrope`") && e.contains("default, linear, llama3, yarn"), "{e}");

        let mut c = base();
        c["rope_scaling"] = json!({"rope_type": "yarn", "factor": 0.5});
        assert!(parse(&c).unwrap_err().to_string().contains("rope_scaling.factor"));

        let mut c = base();
        c["num_key_value_heads"] = json!(3);
        assert!(parse(&c).unwrap_err().to_string().contains("num_key_value_heads"));

        let mut c = base();
        c["vocab_size"] = json!("many");
        assert!(parse(&c).unwrap_err().to_string().contains("`vocab_size`: expected a non-negative integer"));
    }
}
