//! Qwen3-MoE (`Qwen3MoeForCausalLM`: Qwen3-30B-A3B, Qwen3-235B-A22B).
//!
//! Reference: transformers `models/qwen3_moe/modeling_qwen3_moe.py`. Qwen3's
//! decoder (RoPE attention with a per-head RMSNorm of q and k, GQA, pre-norm
//! residual blocks, final norm, LM head) whose MLP is, in sparse layers, a
//! [`SparseMoeBlock`]: a router over `num_experts` experts of
//! `moe_intermediate_size`, each token running through its `num_experts_per_tok`
//! best, weighted by their softmax probabilities (renormalised over the chosen
//! experts when `norm_topk_prob`). A layer is sparse unless it is listed in
//! `mlp_only_layers` or `(layer + 1) % decoder_sparse_step != 0`; the others keep
//! a dense [`GatedMlp`] of `intermediate_size`.
//!
//! How the experts run is the MoE backend handed to the loader (`--moe`, see
//! `moe_backend`), chosen once and shared by every sparse layer.

use kernel_runtime::{ops, DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::ctx::{AttnBackend, ForwardBatch, ForwardCtx, KvCache};
use crate::error::Result;
use crate::layers::{AttnOptions, GatedMlp, ParallelLmHead, RmsNorm, RopeAttention, RouterProbe, SparseMoeBlock, VocabParallelEmbedding};
use crate::moe_backend::MoeBackendKind;
use crate::registry::{within_sliding_window, CausalLm};
use crate::rotary::RotaryEmbedding;
use crate::weights::{VarBuilder, Weights};

/// The MLP of one decoder layer.
#[derive(Debug)]
enum Qwen3MoeMlp {
    Dense(GatedMlp),
    Sparse(SparseMoeBlock),
}

impl Qwen3MoeMlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Qwen3MoeMlp::Dense(mlp) => mlp.forward(x),
            Qwen3MoeMlp::Sparse(moe) => moe.forward(x),
        }
    }
}

/// `Qwen3MoeDecoderLayer`.
#[derive(Debug)]
struct Qwen3MoeDecoderLayer {
    self_attn: RopeAttention,
    mlp: Qwen3MoeMlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl Qwen3MoeDecoderLayer {
    fn load(
        vb: &VarBuilder<'_>,
        config: &ModelConfig,
        layer_idx: usize,
        rotary: &RotaryEmbedding,
        moe: MoeBackendKind,
        probe: &RouterProbe,
    ) -> Result<Self> {
        let options = AttnOptions { qkv_bias: config.attention_bias, o_bias: config.attention_bias, qk_norm: true };
        let sparse = config.moe.as_ref().is_some_and(|m| m.is_sparse_layer(layer_idx));
        let mlp = if sparse {
            Qwen3MoeMlp::Sparse(SparseMoeBlock::load(&vb.pp("mlp"), config, moe, probe.clone())?)
        } else {
            Qwen3MoeMlp::Dense(GatedMlp::load(&vb.pp("mlp"), config, config.intermediate_size)?)
        };
        let (h, eps) = (config.hidden_size, config.rms_norm_eps);
        Ok(Qwen3MoeDecoderLayer {
            self_attn: RopeAttention::load(&vb.pp("self_attn"), config, layer_idx, rotary.clone(), options)?,
            mlp,
            input_layernorm: RmsNorm::load(vb, "input_layernorm", h, eps)?,
            post_attention_layernorm: RmsNorm::load(vb, "post_attention_layernorm", h, eps)?,
        })
    }

    /// `(hidden, residual)` in and out; the previous block's residual add happens
    /// in this layer's first norm.
    fn forward(&self, ctx: &ForwardCtx<'_>, x: Tensor, residual: Option<Tensor>) -> Result<(Tensor, Tensor)> {
        let (x, residual) = self.input_layernorm.forward_fused(x, residual)?;
        let x = self.self_attn.forward(ctx, &x)?;
        let (x, residual) = self.post_attention_layernorm.forward_fused(x, Some(residual))?;
        Ok((self.mlp.forward(&x)?, residual))
    }
}

/// `Qwen3MoeForCausalLM`.
#[derive(Debug)]
pub struct Qwen3MoeForCausalLM {
    config: ModelConfig,
    embed_tokens: VocabParallelEmbedding,
    layers: Vec<Qwen3MoeDecoderLayer>,
    norm: RmsNorm,
    lm_head: ParallelLmHead,
    attn: Box<dyn AttnBackend>,
    moe: MoeBackendKind,
    probe: RouterProbe,
    dtype: DType,
    device: Device,
}

impl Qwen3MoeForCausalLM {
    /// Loads Qwen3-MoE with its sparse layers on the `moe` backend.
    pub fn load(config: &ModelConfig, weights: &Weights, attn: Box<dyn AttnBackend>, moe: MoeBackendKind) -> Result<Self> {
        if config.moe.is_none() {
            return Err(config.unsupported("Qwen3MoeForCausalLM needs num_experts (or num_local_experts) in config.json"));
        }
        let config = &within_sliding_window(config, config.use_sliding_window.then_some(config.sliding_window).flatten());
        let vb = weights.root();
        let mvb = vb.pp("model");
        let rotary = RotaryEmbedding::new(config, weights.device())?;
        let probe = RouterProbe::default();
        let layers = (0..config.num_hidden_layers)
            .map(|i| Qwen3MoeDecoderLayer::load(&mvb.pp(format!("layers.{i}")), config, i, &rotary, moe, &probe))
            .collect::<Result<Vec<_>>>()?;
        let embed_tokens = VocabParallelEmbedding::load(&mvb, "embed_tokens", config.vocab_size, config.hidden_size)?;
        let lm_head = if config.tie_word_embeddings {
            ParallelLmHead::tied(&embed_tokens)
        } else {
            ParallelLmHead::load(&vb, "lm_head", config.vocab_size, config.hidden_size)?
        };
        Ok(Qwen3MoeForCausalLM {
            config: config.clone(),
            embed_tokens,
            layers,
            norm: RmsNorm::load(&mvb, "norm", config.hidden_size, config.rms_norm_eps)?,
            lm_head,
            attn,
            moe,
            probe,
            dtype: weights.dtype(),
            device: weights.device(),
        })
    }

    /// The MoE backend the sparse layers run on.
    pub fn moe_backend(&self) -> MoeBackendKind {
        self.moe
    }

    /// The probe of how close each token's routing came to a tie (see
    /// [`RouterProbe`]), shared by every sparse layer.
    pub fn router_probe(&self) -> &RouterProbe {
        &self.probe
    }
}

impl CausalLm for Qwen3MoeForCausalLM {
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
        let mut x = self.embed_tokens.forward(batch.input_ids())?;
        let mut residual = None;
        for layer in &self.layers {
            let (h, r) = layer.forward(&ctx, x, residual)?;
            x = h;
            residual = Some(r);
        }
        let hidden = self.norm.forward_fused(x, residual)?.0;
        let hidden = match batch.logit_rows() {
            Some(rows) => ops::embedding(&hidden, rows, 0)?,
            None => hidden,
        };
        self.lm_head.forward(&hidden)
    }
}
