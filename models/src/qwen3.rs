//! Qwen3 dense (`Qwen3ForCausalLM`).
//!
//! Reference: transformers `models/qwen3/modeling_qwen3.py` (modular: derives from
//! Qwen2). Same as Qwen2 plus a per-head RMSNorm of q and k (`q_norm`, `k_norm`)
//! before rope, an explicit `head_dim` (128 where hidden / heads would be 64 on
//! some sizes), and bias following `attention_bias` on all four projections
//! (false in every released checkpoint) instead of Qwen2's fixed q/k/v bias.

use crate::causal_lm::within_sliding_window;
use crate::config::ModelConfig;
use crate::ctx::AttnBackend;
use crate::error::Result;
use crate::layers::AttnOptions;
use crate::llama::LlamaForCausalLM;
use crate::weights::Weights;

/// `Qwen3ForCausalLM`: the LLaMA body with q/k norm.
#[derive(Debug)]
pub struct Qwen3ForCausalLM(LlamaForCausalLM);

impl Qwen3ForCausalLM {
    /// Loads Qwen3.
    pub fn load(config: &ModelConfig, weights: &Weights, attn: Box<dyn AttnBackend>) -> Result<Self> {
        let config =
            &within_sliding_window(config, config.use_sliding_window.then_some(config.sliding_window).flatten());
        let options = AttnOptions { qkv_bias: config.attention_bias, o_bias: config.attention_bias, qk_norm: true };
        Ok(Qwen3ForCausalLM(LlamaForCausalLM::load_with(config, weights, attn, options)?))
    }
}

crate::causal_lm::delegate_causal_lm!(Qwen3ForCausalLM);
