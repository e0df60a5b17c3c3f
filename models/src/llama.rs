//! LLaMA (`LlamaForCausalLM`): the base of the dense family.
//!
//! Reference: transformers `models/llama/modeling_llama.py`. Pre-norm decoder
//! layers (RMSNorm, RoPE self-attention with GQA, RMSNorm, gated SiLU MLP), a
//! final RMSNorm and an LM head, tied or not: the [`Decoder`] skeleton with the
//! dense gated MLP. Qwen2, Qwen3 and Mistral are this model with other
//! [`AttnOptions`] (as their modular HF files derive from it), so their files
//! reuse it.

use crate::config::ModelConfig;
use crate::ctx::AttnBackend;
use crate::decoder::Decoder;
use crate::error::Result;
use crate::layers::{AttnOptions, GatedMlp as LlamaMlp};
use crate::weights::{VarBuilder, Weights};

/// `LlamaForCausalLM`, also the body of the Qwen2, Qwen3 and Mistral models.
#[derive(Debug)]
pub struct LlamaForCausalLM(Decoder<LlamaMlp>);

impl LlamaForCausalLM {
    /// Loads LLaMA: `attention_bias` applies to all four attention projections.
    pub fn load(config: &ModelConfig, weights: &Weights, attn: Box<dyn AttnBackend>) -> Result<Self> {
        let options = AttnOptions { qkv_bias: config.attention_bias, o_bias: config.attention_bias, qk_norm: false };
        LlamaForCausalLM::load_with(config, weights, attn, options)
    }

    /// Loads the LLaMA body with the attention of a relative.
    pub(crate) fn load_with(
        config: &ModelConfig,
        weights: &Weights,
        attn: Box<dyn AttnBackend>,
        options: AttnOptions,
    ) -> Result<Self> {
        let load_mlp = &|vb: &VarBuilder<'_>, _layer_idx: usize| LlamaMlp::load(vb, config, config.intermediate_size);
        Ok(LlamaForCausalLM(Decoder::load(config, weights, attn, options, load_mlp)?))
    }
}

crate::causal_lm::delegate_causal_lm!(LlamaForCausalLM);
