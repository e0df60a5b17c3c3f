//! GGUF metadata to a HuggingFace-style `config.json`.
//!
//! The model code is written against HF configs, so rather than teach it a
//! second vocabulary, a GGUF file's `<arch>.*` hyper-parameters are rewritten
//! into the classic `config.json` layout (`rope_theta`, `torch_dtype`,
//! `num_experts`) that the config parser already reads. The mapping mirrors
//! `convert_hf_to_gguf.py` in reverse; where the converter drops information
//! (e.g. `head_dim`), it is recovered the way llama.cpp recovers it.

use serde_json::{json, Map, Value};

use super::error::{GgufError, Result};
use super::reader::{GgufFile, MetadataArray, MetadataValue};

/// The `general.architecture` values this engine serves. A closed set: an
/// unknown architecture is an error that lists these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgufArchitecture {
    /// `llama` (also Mistral and SmolLM, which llama.cpp converts as llama).
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
}

/// (variant, GGUF name, HF `architectures[0]`, HF `model_type`).
const ARCHITECTURES: &[(GgufArchitecture, &str, &str, &str)] = &[
    (GgufArchitecture::Llama, "llama", "LlamaForCausalLM", "llama"),
    (GgufArchitecture::Qwen2, "qwen2", "Qwen2ForCausalLM", "qwen2"),
    (GgufArchitecture::Qwen3, "qwen3", "Qwen3ForCausalLM", "qwen3"),
    (GgufArchitecture::Qwen3Moe, "qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe"),
];

impl GgufArchitecture {
    /// Every supported GGUF architecture name.
    pub fn supported() -> Vec<&'static str> {
        ARCHITECTURES.iter().map(|a| a.1).collect()
    }

    /// The architecture named `name` in `general.architecture`.
    pub fn from_gguf_name(name: &str) -> Option<Self> {
        ARCHITECTURES.iter().find(|a| a.1 == name).map(|a| a.0)
    }

    /// `general.architecture` of `file`, or an error listing the supported ones.
    pub fn of(file: &GgufFile) -> Result<Self> {
        let arch = file.architecture()?;
        Self::from_gguf_name(arch).ok_or_else(|| GgufError::UnsupportedArchitecture {
            path: file.path().to_path_buf(),
            arch: arch.to_owned(),
            supported: Self::supported(),
        })
    }

    fn row(self) -> &'static (GgufArchitecture, &'static str, &'static str, &'static str) {
        // Every variant has a row; the fallback keeps this panic-free.
        ARCHITECTURES.iter().find(|a| a.0 == self).unwrap_or(&ARCHITECTURES[0])
    }

    /// The metadata key prefix (`"llama"` for `llama.block_count`).
    pub fn gguf_name(self) -> &'static str {
        self.row().1
    }

    /// HF `architectures[0]`, the key of the model registry.
    pub fn hf_architecture(self) -> &'static str {
        self.row().2
    }

    /// HF `model_type`.
    pub fn model_type(self) -> &'static str {
        self.row().3
    }

    /// Whether llama.cpp's converter permuted Q/K rows for this architecture
    /// (only LLaMA: Qwen models use NeoX-style RoPE in llama.cpp, which is
    /// HF's rotate-half and needs no permutation).
    pub fn permutes_qk(self) -> bool {
        self == GgufArchitecture::Llama
    }

    /// Whether the architecture stores its FFN as packed experts.
    pub fn is_moe(self) -> bool {
        self == GgufArchitecture::Qwen3Moe
    }
}

/// The HF `config.json` equivalent of `file`'s metadata.
///
/// Keys: `architectures`, `model_type`, `hidden_size`, `intermediate_size`,
/// `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`,
/// `head_dim`, `max_position_embeddings`, `rms_norm_eps`, `rope_theta`,
/// `rope_scaling` (when the file has linear or YaRN scaling), `vocab_size`,
/// `tie_word_embeddings`, `attention_bias`, `hidden_act`, `torch_dtype`
/// (`"float32"`: tensors come out dequantised to f32), token ids, and for
/// Qwen3-MoE `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
/// `norm_topk_prob`, `decoder_sparse_step`, `mlp_only_layers`.
pub fn hf_config(file: &GgufFile) -> Result<Value> {
    let arch = GgufArchitecture::of(file)?;
    let p = arch.gguf_name();
    let key = |k: &str| format!("{p}.{k}");
    let invalid = |reason: String| GgufError::InvalidConfig { path: file.path().to_path_buf(), reason };

    let hidden_size: u64 = file.get_as(&key("embedding_length"))?;
    let num_layers: u64 = file.get_as(&key("block_count"))?;
    let num_heads: u64 = file.get_as(&key("attention.head_count"))?;
    let kv_key = key("attention.head_count_kv");
    let num_kv_heads: u64 = match file.get(&kv_key) {
        None => num_heads,
        Some(MetadataValue::Array(_)) => uniform_per_layer(file, &kv_key)?.unwrap_or(num_heads),
        Some(_) => file.get_as(&kv_key)?,
    };
    if num_heads == 0 || num_kv_heads == 0 || !num_heads.is_multiple_of(num_kv_heads) {
        return Err(invalid(format!("{num_heads} attention heads cannot be shared by {num_kv_heads} key/value heads")));
    }
    // head_dim: attention.key_length when present (Qwen3 sets it), else
    // the rotary dimension llama.cpp uses, else hidden / heads.
    let head_dim: u64 = match file.get_opt(&key("attention.key_length"))? {
        Some(k) => k,
        None => match file.get_opt(&key("rope.dimension_count"))? {
            Some(r) => r,
            None => hidden_size / num_heads,
        },
    };
    if let Some(v) = file.get_opt::<u64>(&key("attention.value_length"))? {
        if v != head_dim {
            return Err(invalid(format!("key length {head_dim} differs from value length {v}")));
        }
    }

    let mut c = Map::new();
    c.insert("architectures".into(), json!([arch.hf_architecture()]));
    c.insert("model_type".into(), json!(arch.model_type()));
    c.insert("hidden_size".into(), json!(hidden_size));
    c.insert("num_hidden_layers".into(), json!(num_layers));
    c.insert("num_attention_heads".into(), json!(num_heads));
    c.insert("num_key_value_heads".into(), json!(num_kv_heads));
    c.insert("head_dim".into(), json!(head_dim));
    c.insert("max_position_embeddings".into(), json!(file.get_as::<u64>(&key("context_length"))?));
    c.insert("rms_norm_eps".into(), json!(file.get_as::<f32>(&key("attention.layer_norm_rms_epsilon"))?));
    // llama.cpp's default when the key is absent.
    c.insert("rope_theta".into(), json!(file.get_opt::<f32>(&key("rope.freq_base"))?.unwrap_or(10_000.0)));
    if let Some(scaling) = rope_scaling(file, p)? {
        c.insert("rope_scaling".into(), scaling);
    }
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("torch_dtype".into(), json!("float32"));

    let ffn: Option<u64> = file.get_opt(&key("feed_forward_length"))?;
    if arch.is_moe() {
        c.insert("num_experts".into(), json!(file.get_as::<u64>(&key("expert_count"))?));
        c.insert("num_experts_per_tok".into(), json!(file.get_as::<u64>(&key("expert_used_count"))?));
        let moe_ffn: u64 = match file.get_opt(&key("expert_feed_forward_length"))? {
            Some(n) => n,
            // Older files: read it off the packed gate tensor ([E, I, H]).
            None => match file.tensor("blk.0.ffn_gate_exps.weight") {
                Some(t) => t.dims().get(1).copied().unwrap_or(0),
                None => {
                    return Err(GgufError::MissingKey {
                        path: file.path().to_path_buf(),
                        key: key("expert_feed_forward_length"),
                    })
                }
            },
        };
        c.insert("moe_intermediate_size".into(), json!(moe_ffn));
        c.insert("intermediate_size".into(), json!(ffn.unwrap_or(moe_ffn)));
        // llama.cpp's qwen3moe graph always renormalises the top-k weights.
        c.insert("norm_topk_prob".into(), json!(file.get_opt::<bool>(&key("expert_weights_norm"))?.unwrap_or(true)));
        c.insert("decoder_sparse_step".into(), json!(1));
        c.insert("mlp_only_layers".into(), json!([]));
    } else {
        let ffn = ffn.ok_or_else(|| GgufError::MissingKey {
            path: file.path().to_path_buf(),
            key: key("feed_forward_length"),
        })?;
        c.insert("intermediate_size".into(), json!(ffn));
    }

    let has_output = file.tensor("output.weight").is_some();
    c.insert("tie_word_embeddings".into(), json!(!has_output));
    c.insert("vocab_size".into(), json!(vocab_size(file)?));
    match arch {
        // Qwen2 always has q/k/v biases; its config has no switch for them.
        GgufArchitecture::Qwen2 => {
            c.insert("use_sliding_window".into(), json!(false));
        }
        _ => {
            c.insert("attention_bias".into(), json!(file.tensor("blk.0.attn_q.bias").is_some()));
        }
    }
    for (gguf_key, hf_key) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
    ] {
        if let Some(id) = file.get_opt::<u32>(gguf_key)? {
            c.insert(hf_key.into(), json!(id));
        }
    }
    Ok(Value::Object(c))
}

/// Some converters write per-layer arrays (e.g. `head_count_kv`); accept one
/// when every layer agrees.
fn uniform_per_layer(file: &GgufFile, key: &str) -> Result<Option<u64>> {
    let Some(values) = file.get_opt::<&MetadataArray>(key)? else {
        return Ok(None);
    };
    let ints = values.to_i64_vec().unwrap_or_default();
    match ints.first() {
        Some(&first) if first > 0 && ints.iter().all(|&v| v == first) => Ok(Some(first as u64)),
        _ => Err(GgufError::InvalidMetadata {
            path: file.path().to_path_buf(),
            key: key.to_owned(),
            reason: "per-layer values must be equal positive integers".into(),
        }),
    }
}

/// `rope_scaling` from `<arch>.rope.scaling.*`, in the classic HF layout.
fn rope_scaling(file: &GgufFile, p: &str) -> Result<Option<Value>> {
    let kind: Option<&str> = file.get_opt(&format!("{p}.rope.scaling.type"))?;
    let factor: Option<f32> = file.get_opt(&format!("{p}.rope.scaling.factor"))?;
    // Older files: `rope.scale_linear` alone means linear scaling.
    let (kind, factor) = match (kind, factor) {
        (None, None) => match file.get_opt::<f32>(&format!("{p}.rope.scale_linear"))? {
            Some(f) if f != 1.0 => ("linear", f),
            _ => return Ok(None),
        },
        (None | Some("none"), _) => return Ok(None),
        (Some(k), f) => (k, f.unwrap_or(1.0)),
    };
    let mut s = Map::new();
    match kind {
        "linear" => {}
        "yarn" => {
            let orig: Option<u64> = file.get_opt(&format!("{p}.rope.scaling.original_context_length"))?;
            if let Some(orig) = orig {
                s.insert("original_max_position_embeddings".into(), json!(orig));
            }
        }
        other => {
            return Err(GgufError::InvalidMetadata {
                path: file.path().to_path_buf(),
                key: format!("{p}.rope.scaling.type"),
                reason: format!("unsupported rope scaling `{other}` (supported: none, linear, yarn)"),
            })
        }
    }
    s.insert("rope_type".into(), json!(kind));
    s.insert("type".into(), json!(kind));
    s.insert("factor".into(), json!(factor));
    Ok(Some(Value::Object(s)))
}

/// The vocabulary size: the rows of `token_embd.weight` (what the weights
/// need), else `<arch>.vocab_size`, else the token list length.
fn vocab_size(file: &GgufFile) -> Result<u64> {
    let from_tokens = match file.get("tokenizer.ggml.tokens") {
        Some(_) => Some(file.get_array("tokenizer.ggml.tokens")?.len() as u64),
        None => None,
    };
    if let Some(embd) = file.tensor("token_embd.weight") {
        let rows = embd.dims().get(1).copied().unwrap_or(1);
        if let Some(n) = from_tokens.filter(|&n| n != rows) {
            log::warn!("{}: {n} tokens but token_embd.weight has {rows} rows; using {rows}", file.path().display());
        }
        return Ok(rows);
    }
    let arch_key = format!("{}.vocab_size", file.architecture()?);
    match (file.get_opt::<u64>(&arch_key)?, from_tokens) {
        (Some(n), _) | (None, Some(n)) => Ok(n),
        (None, None) => {
            Err(GgufError::MissingKey { path: file.path().to_path_buf(), key: "tokenizer.ggml.tokens".into() })
        }
    }
}
