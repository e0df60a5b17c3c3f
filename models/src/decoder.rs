//! The decoder skeleton every model here shares: token embedding, pre-norm
//! decoder layers (RMSNorm, RoPE self-attention, RMSNorm, MLP), a final RMSNorm
//! and an LM head, tied or not. It is the body of transformers'
//! `LlamaForCausalLM` (`LlamaModel`, `LlamaDecoderLayer`), generic over the MLP:
//! LLaMA and its relatives use the dense [`GatedMlp`], Qwen3-MoE a per-layer
//! choice of dense or sparse, so the loading and the forward loop exist once.
//!
//! Unlike the HF files, the attention is paged (the cache and the batch layout
//! come from the caller through `ForwardCtx`), the projections are fused (qkv,
//! gate_up), and the residual add is fused into the next RMSNorm, which is fused
//! into the projection after it where the GPU can (`ops::fused_add_rms_norm_linear`).

use kernel_runtime::{ops, DType, Device, Tensor};

use crate::causal_lm::CausalLm;
use crate::config::ModelConfig;
use crate::ctx::{AttnBackend, ForwardBatch, ForwardCtx, KvCache};
use crate::error::Result;
use crate::layers::{AttnOptions, GatedMlp, ParallelLmHead, PreNorm, RmsNorm, RopeAttention, VocabParallelEmbedding};
use crate::rotary::RotaryEmbedding;
use crate::weights::{VarBuilder, Weights};

/// The MLP of a decoder layer: `[t, hidden]` in, a new `[t, hidden]` out.
pub(crate) trait DecoderMlp: std::fmt::Debug + Send + Sync {
    fn forward(&self, x: &Tensor) -> Result<Tensor>;

    /// The layer's second pre-norm step, then [`DecoderMlp::forward`]: `(output,
    /// residual)`. An MLP whose first projection can take the step fused overrides it.
    fn forward_prenorm(&self, pre: PreNorm<'_>) -> Result<(Tensor, Tensor)> {
        let (x, residual) = pre.apply()?;
        Ok((self.forward(&x)?, residual))
    }

    /// Whether `forward` only enqueues device work whose launches depend on the
    /// row count alone (no host reads, no host-planned shapes), so that a CUDA
    /// graph can capture it.
    fn graph_capturable(&self) -> bool {
        true
    }
}

impl DecoderMlp for GatedMlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        GatedMlp::forward(self, x)
    }

    fn forward_prenorm(&self, pre: PreNorm<'_>) -> Result<(Tensor, Tensor)> {
        GatedMlp::forward_prenorm(self, pre)
    }
}

/// `LlamaDecoderLayer` (and `Qwen3MoeDecoderLayer`, with its MLP).
#[derive(Debug)]
pub(crate) struct DecoderLayer<M> {
    self_attn: RopeAttention,
    mlp: M,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl<M: DecoderMlp> DecoderLayer<M> {
    /// `(hidden, residual)` in, `(hidden, residual)` out; the residual add of the
    /// previous block happens in this layer's first norm. Each norm travels to the
    /// projection after it (qkv, gate_up), which runs both in one launch where it can.
    fn forward(&self, ctx: &ForwardCtx<'_>, x: Tensor, residual: Option<Tensor>) -> Result<(Tensor, Tensor)> {
        let (x, residual) =
            self.self_attn.forward_prenorm(ctx, PreNorm { x, residual, norm: &self.input_layernorm })?;
        self.mlp.forward_prenorm(PreNorm { x, residual: Some(residual), norm: &self.post_attention_layernorm })
    }
}

/// `LlamaModel`: embedding, decoder layers, final norm.
#[derive(Debug)]
struct DecoderModel<M> {
    embed_tokens: VocabParallelEmbedding,
    layers: Vec<DecoderLayer<M>>,
    norm: RmsNorm,
}

impl<M: DecoderMlp> DecoderModel<M> {
    fn load(
        vb: &VarBuilder<'_>,
        config: &ModelConfig,
        options: AttnOptions,
        load_mlp: &dyn Fn(&VarBuilder<'_>, usize) -> Result<M>,
    ) -> Result<Self> {
        let rotary = RotaryEmbedding::new(config, vb.device())?;
        let (h, eps) = (config.hidden_size, config.rms_norm_eps);
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let vb = vb.pp(format!("layers.{i}"));
                Ok(DecoderLayer {
                    self_attn: RopeAttention::load(&vb.pp("self_attn"), config, i, rotary.clone(), options)?,
                    mlp: load_mlp(&vb.pp("mlp"), i)?,
                    input_layernorm: RmsNorm::load(&vb, "input_layernorm", h, eps)?,
                    post_attention_layernorm: RmsNorm::load(&vb, "post_attention_layernorm", h, eps)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DecoderModel {
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

/// A whole decoder-only model (`LlamaForCausalLM`'s layout) with MLPs of type `M`.
#[derive(Debug)]
pub(crate) struct Decoder<M> {
    config: ModelConfig,
    model: DecoderModel<M>,
    lm_head: ParallelLmHead,
    attn: Box<dyn AttnBackend>,
    dtype: DType,
    device: Device,
}

impl<M: DecoderMlp> Decoder<M> {
    /// Loads `model.*` and `lm_head` with the attention `options`; `load_mlp`
    /// builds layer `i`'s MLP under its `model.layers.{i}.mlp` prefix.
    pub(crate) fn load(
        config: &ModelConfig,
        weights: &Weights,
        attn: Box<dyn AttnBackend>,
        options: AttnOptions,
        load_mlp: &dyn Fn(&VarBuilder<'_>, usize) -> Result<M>,
    ) -> Result<Self> {
        let vb = weights.root();
        let model = DecoderModel::load(&vb.pp("model"), config, options, load_mlp)?;
        let lm_head = if config.tie_word_embeddings {
            ParallelLmHead::tied(&model.embed_tokens)
        } else {
            ParallelLmHead::load(&vb, "lm_head", config.vocab_size, config.hidden_size)?
        };
        // The rank's view: its heads (what its KV cache and kernels see).
        let config = crate::tp::rank_config(config, weights.tp().shard())?;
        Ok(Decoder { config, model, lm_head, attn, dtype: weights.dtype(), device: weights.device() })
    }
}

impl<M: DecoderMlp> CausalLm for Decoder<M> {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn graph_capturable(&self) -> bool {
        self.model.layers.iter().all(|l| l.mlp.graph_capturable())
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
