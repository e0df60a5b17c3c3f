//! [`CausalLm`], the trait every model implements, and what the model files
//! share around it: [`delegate_causal_lm!`] for the relatives that wrap LLaMA,
//! and [`within_sliding_window`].
//!
//! This sits below both the model files and `registry` (which lists them), so
//! that a model file never imports the module that imports it.

use kernel_runtime::{DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::ctx::{AttnBackend, ForwardBatch, KvCache, KvCacheShape};
use crate::error::Result;

/// A decoder-only language model: a batch of new tokens in, logits out.
///
/// Implementations hold weights only; the KV cache and the batch layout are the
/// caller's, passed to every call.
pub trait CausalLm: Send + Sync + std::fmt::Debug {
    /// The parsed `config.json`.
    fn config(&self) -> &ModelConfig;

    /// The compute dtype (of the weights, activations, KV cache and logits).
    fn dtype(&self) -> DType;

    /// Where the weights live.
    fn device(&self) -> Device;

    /// The attention backend the model was loaded with.
    fn attn_backend(&self) -> &dyn AttnBackend;

    /// Runs one step: stores the new tokens' K/V in `kv` and returns the logits
    /// `[batch.num_logit_rows(), vocab_size]` in the compute dtype, one row per
    /// logit row of the batch in order.
    fn forward(&self, batch: &ForwardBatch, kv: &KvCache) -> Result<Tensor>;

    /// Whether a decode step's `forward` can be captured in a CUDA graph: it
    /// enqueues only device work on the compute stream, without host reads, and
    /// its launches depend on the row count alone (given the attention backend's
    /// fixed split count). Models whose layers plan on the host say no.
    fn graph_capturable(&self) -> bool {
        true
    }

    /// Rows of the LM head (`vocab_size`; may exceed the tokenizer's vocabulary).
    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    /// Decoder layers.
    fn num_layers(&self) -> usize {
        self.config().num_hidden_layers
    }

    /// KV heads per layer.
    fn num_kv_heads(&self) -> usize {
        self.config().num_key_value_heads
    }

    /// Dimensions per head.
    fn head_dim(&self) -> usize {
        self.config().head_dim
    }

    /// End-of-sequence ids (config.json and generation_config.json).
    fn eos_token_ids(&self) -> &[u32] {
        &self.config().eos_token_ids
    }

    /// The longest sequence the model's positions cover.
    fn max_position_embeddings(&self) -> usize {
        self.config().max_position_embeddings
    }

    /// The shape of a KV cache of `num_pages` pages of `page_size` tokens for this model.
    fn kv_cache_shape(&self, num_pages: usize, page_size: usize) -> KvCacheShape {
        KvCacheShape {
            num_layers: self.num_layers(),
            num_pages,
            page_size,
            num_kv_heads: self.num_kv_heads(),
            head_dim: self.head_dim(),
        }
    }

    /// A zeroed KV cache for this model, in its dtype, on its device.
    fn new_kv_cache(&self, num_pages: usize, page_size: usize) -> Result<KvCache> {
        KvCache::new(self.kv_cache_shape(num_pages, page_size), self.dtype(), self.device())
    }
}

/// Implements [`CausalLm`] for a type that wraps another model (`self.0`, or the
/// field named): the relatives of LLaMA that only change how the body is
/// loaded, and the models built on the shared `Decoder`.
macro_rules! delegate_causal_lm {
    ($ty:ty) => {
        $crate::causal_lm::delegate_causal_lm!($ty, 0);
    };
    ($ty:ty, $field:tt) => {
        impl $crate::causal_lm::CausalLm for $ty {
            fn config(&self) -> &$crate::config::ModelConfig {
                $crate::causal_lm::CausalLm::config(&self.$field)
            }
            fn dtype(&self) -> kernel_runtime::DType {
                $crate::causal_lm::CausalLm::dtype(&self.$field)
            }
            fn device(&self) -> kernel_runtime::Device {
                $crate::causal_lm::CausalLm::device(&self.$field)
            }
            fn attn_backend(&self) -> &dyn $crate::ctx::AttnBackend {
                $crate::causal_lm::CausalLm::attn_backend(&self.$field)
            }
            fn graph_capturable(&self) -> bool {
                $crate::causal_lm::CausalLm::graph_capturable(&self.$field)
            }
            fn forward(
                &self,
                batch: &$crate::ctx::ForwardBatch,
                kv: &$crate::ctx::KvCache,
            ) -> $crate::error::Result<kernel_runtime::Tensor> {
                $crate::causal_lm::CausalLm::forward(&self.$field, batch, kv)
            }
        }
    };
}
pub(crate) use delegate_causal_lm;

/// The config a model with a sliding attention `window` runs with: its context
/// capped at the window. Within it every token sees all the tokens before it,
/// so full attention computes exactly the windowed one (vLLM served
/// Mistral-7B-v0.1 this way, at 4096 tokens); longer sequences are refused by
/// the engine's context limit rather than computed wrongly. No backend masks a
/// window yet.
pub(crate) fn within_sliding_window(config: &ModelConfig, window: Option<usize>) -> ModelConfig {
    let mut config = config.clone();
    if let Some(w) = window.filter(|&w| w > 0 && w < config.max_position_embeddings) {
        log::warn!(
            "{}: sliding_window = {w} is shorter than max_position_embeddings = {}: serving sequences of up to {w} tokens, \
             where full attention equals the windowed one",
            config.path.display(),
            config.max_position_embeddings
        );
        config.max_position_embeddings = w;
    }
    config
}
