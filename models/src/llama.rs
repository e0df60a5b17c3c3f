//! LLaMA (`LlamaForCausalLM`): the base of the dense family.
//!
//! Reference: transformers `models/llama/modeling_llama.py`. Pre-norm decoder
//! layers (RMSNorm, RoPE self-attention with GQA, RMSNorm, gated SiLU MLP), a
//! final RMSNorm and an LM head, tied or not. Qwen2, Qwen3 and Mistral are this
//! model with other [`AttnOptions`] (as their modular HF files derive from it),
//! so their files reuse these blocks by alias.
//!
//! Unlike the HF file, the attention is paged (the cache and the batch layout
//! come from the caller through `ForwardCtx`), the projections are fused (qkv,
//! gate_up), and the residual add is fused into the next RMSNorm.

use kernel_runtime::{ops, DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::ctx::{AttnBackend, ForwardBatch, ForwardCtx, KvCache};
use crate::error::Result;
use crate::layers::{AttnOptions, GatedMlp as LlamaMlp, ParallelLmHead, RmsNorm, RopeAttention as LlamaAttention, VocabParallelEmbedding};
use crate::registry::CausalLm;
use crate::rotary::RotaryEmbedding;
use crate::weights::{VarBuilder, Weights};

/// `LlamaDecoderLayer`.
#[derive(Debug)]
pub(crate) struct LlamaDecoderLayer {
    self_attn: LlamaAttention,
    mlp: LlamaMlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl LlamaDecoderLayer {
    fn load(vb: &VarBuilder<'_>, config: &ModelConfig, layer_idx: usize, rotary: &RotaryEmbedding, options: AttnOptions) -> Result<Self> {
        let (h, eps) = (config.hidden_size, config.rms_norm_eps);
        Ok(LlamaDecoderLayer {
            self_attn: LlamaAttention::load(&vb.pp("self_attn"), config, layer_idx, rotary.clone(), options)?,
            mlp: LlamaMlp::load(&vb.pp("mlp"), config, config.intermediate_size)?,
            input_layernorm: RmsNorm::load(vb, "input_layernorm", h, eps)?,
            post_attention_layernorm: RmsNorm::load(vb, "post_attention_layernorm", h, eps)?,
        })
    }

    /// `(hidden, residual)` in, `(hidden, residual)` out; the residual add of the
    /// previous block happens in this layer's first norm.
    fn forward(&self, ctx: &ForwardCtx<'_>, x: Tensor, residual: Option<Tensor>) -> Result<(Tensor, Tensor)> {
        let (x, residual) = self.input_layernorm.forward_fused(x, residual)?;
        let x = self.self_attn.forward(ctx, &x)?;
        let (x, residual) = self.post_attention_layernorm.forward_fused(x, Some(residual))?;
        Ok((self.mlp.forward(&x)?, residual))
    }
}

/// `LlamaModel`: embedding, decoder layers, final norm.
#[derive(Debug)]
pub(crate) struct LlamaModel {
    embed_tokens: VocabParallelEmbedding,
    layers: Vec<LlamaDecoderLayer>,
    norm: RmsNorm,
}

impl LlamaModel {
    fn load(vb: &VarBuilder<'_>, config: &ModelConfig, options: AttnOptions) -> Result<Self> {
        let rotary = RotaryEmbedding::new(config, vb.device())?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| LlamaDecoderLayer::load(&vb.pp(format!("layers.{i}")), config, i, &rotary, options))
            .collect::<Result<Vec<_>>>()?;
        Ok(LlamaModel {
            embed_tokens: VocabParallelEmbedding::load(vb, "embed_tokens", config.vocab_size, config.hidden_size)?,
            layers,
            norm: RmsNorm::load(vb, "norm", config.hidden_size, config.rms_norm_eps)?,
        })
    }

    /// The final hidden states `[t, hidden]` of the batch's new tokens.
    fn forward(&self, ctx: &ForwardCtx<'_>) -> Result<Tensor> {
        let mut x = self.embed_tokens.forward(ctx.batch.input_ids())?;
        let mut residual = None;
        for layer in &self.layers {
            let (h, r) = layer.forward(ctx, x, residual)?;
            x = h;
            residual = Some(r);
        }
        Ok(self.norm.forward_fused(x, residual)?.0)
    }
}

/// `LlamaForCausalLM`, also the body of the Qwen2, Qwen3 and Mistral models.
#[derive(Debug)]
pub struct LlamaForCausalLM {
    config: ModelConfig,
    model: LlamaModel,
    lm_head: ParallelLmHead,
    attn: Box<dyn AttnBackend>,
    dtype: DType,
    device: Device,
}

impl LlamaForCausalLM {
    /// Loads LLaMA: `attention_bias` applies to all four attention projections.
    pub fn load(config: &ModelConfig, weights: &Weights, attn: Box<dyn AttnBackend>) -> Result<Self> {
        let options = AttnOptions { qkv_bias: config.attention_bias, o_bias: config.attention_bias, qk_norm: false };
        LlamaForCausalLM::load_with(config, weights, attn, options)
    }

    /// Loads the LLaMA body with the attention of a relative.
    pub(crate) fn load_with(config: &ModelConfig, weights: &Weights, attn: Box<dyn AttnBackend>, options: AttnOptions) -> Result<Self> {
        let vb = weights.root();
        let model = LlamaModel::load(&vb.pp("model"), config, options)?;
        let lm_head = if config.tie_word_embeddings {
            ParallelLmHead::tied(&model.embed_tokens)
        } else {
            ParallelLmHead::load(&vb, "lm_head", config.vocab_size, config.hidden_size)?
        };
        Ok(LlamaForCausalLM { config: config.clone(), model, lm_head, attn, dtype: weights.dtype(), device: weights.device() })
    }
}

impl CausalLm for LlamaForCausalLM {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn device(&self) -> Device {
        self.device
    }

    fn attn_backend(&self) -> &dyn AttnBackend {
        &*self.attn
    }

    fn forward(&self, batch: &ForwardBatch, kv: &KvCache) -> Result<Tensor> {
        crate::ctx::check_step(&self.config, self.dtype, self.device, batch, kv)?;
        let plan = self.attn.plan(batch)?;
        let ctx = ForwardCtx { batch, kv, attn: &*self.attn, plan: &plan };
        let hidden = self.model.forward(&ctx)?;
        let hidden = match batch.logit_rows() {
            Some(rows) => ops::embedding(&hidden, rows, 0)?,
            None => hidden,
        };
        self.lm_head.forward(&hidden)
    }
}
