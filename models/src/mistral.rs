//! Mistral (`MistralForCausalLM`).
//!
//! Reference: transformers `models/mistral/modeling_mistral.py`, a copy of LLaMA
//! with no attention bias at all and an optional sliding window. Checkpoints
//! since v0.2 set `sliding_window: null`, which is plain LLaMA; a window shorter
//! than `max_position_embeddings` (Mistral-7B-v0.1's 4096) caps the context at the
//! window, where full attention is exact (see `causal_lm::within_sliding_window`).

use crate::causal_lm::within_sliding_window;
use crate::config::ModelConfig;
use crate::ctx::AttnBackend;
use crate::error::Result;
use crate::layers::AttnOptions;
use crate::llama::LlamaForCausalLM;
use crate::weights::Weights;

/// `MistralForCausalLM`: the LLaMA body without bias.
#[derive(Debug)]
pub struct MistralForCausalLM(LlamaForCausalLM);

impl MistralForCausalLM {
    /// Loads Mistral.
    pub fn load(config: &ModelConfig, weights: &Weights, attn: Box<dyn AttnBackend>) -> Result<Self> {
        let config = &within_sliding_window(config, config.sliding_window);
        let options = AttnOptions { qkv_bias: false, o_bias: false, qk_norm: false };
        Ok(MistralForCausalLM(LlamaForCausalLM::load_with(config, weights, attn, options)?))
    }
}

crate::causal_lm::delegate_causal_lm!(MistralForCausalLM);
