//! Qwen2 (`Qwen2ForCausalLM`, also Qwen2.5).
//!
//! Reference: transformers `models/qwen2/modeling_qwen2.py` (modular: derives from
//! LLaMA). Same as LLaMA except that q/k/v always have a bias and o_proj never
//! does, whatever `attention_bias` says; and a sliding window that this crate
//! does not implement yet (rejected when `use_sliding_window` would make it bite).

use crate::causal_lm::within_sliding_window;
use crate::config::ModelConfig;
use crate::ctx::AttnBackend;
use crate::error::Result;
use crate::layers::AttnOptions;
use crate::llama::LlamaForCausalLM;
use crate::weights::Weights;

/// `Qwen2ForCausalLM`: the LLaMA body with q/k/v bias.
#[derive(Debug)]
pub struct Qwen2ForCausalLM(LlamaForCausalLM);

impl Qwen2ForCausalLM {
    /// Loads Qwen2.
    pub fn load(config: &ModelConfig, weights: &Weights, attn: Box<dyn AttnBackend>) -> Result<Self> {
        let config =
            &within_sliding_window(config, config.use_sliding_window.then_some(config.sliding_window).flatten());
        let options = AttnOptions { qkv_bias: true, o_bias: false, qk_norm: false };
        Ok(Qwen2ForCausalLM(LlamaForCausalLM::load_with(config, weights, attn, options)?))
    }
}

crate::causal_lm::delegate_causal_lm!(Qwen2ForCausalLM);
