//! minisgl models: HuggingFace folder (or GGUF file) in, logits out.
//!
//! Nothing here knows about requests, HTTP or tokenizers; the engine drives the
//! models through the forward context declared in [`ctx`].
//!
//! | module | what |
//! | --- | --- |
//! | [`config`] | [`ModelConfig`] from `config.json` (classic and transformers-5 layouts) |
//! | [`weights`] | safetensors / GGUF / dummy weights by HF name, fused per `MERGE_GROUPS` |
//! | [`rotary`] | the cos/sin table of RoPE (default, linear, llama3 scaling) |
//! | [`layout`] | [`StepLayout`]: a step's tokens, positions, slots and page table, built once by the scheduler |
//! | [`ctx`] | [`ForwardBatch`], [`KvCache`], the [`AttnBackend`] trait, [`ForwardCtx`] |
//! | [`attn_backend`] | the `--attn` registry and the paged backend |
//! | [`moe_backend`] | the `--moe` registry: fused kernels or the naive loop over experts |
//! | [`layers`] | linear (column/row parallel), embedding, RMSNorm, RoPE attention, gated MLP, sparse MoE |
//! | [`causal_lm`] | [`CausalLm`], the trait of every model, and the helpers the model files share |
//! | `decoder` | the decoder skeleton (embedding, layers, norm, LM head) every model is built on, generic over the MLP |
//! | [`llama`], [`qwen2`], [`qwen3`], [`qwen3_moe`], [`mistral`] | the models, one file each |
//! | [`registry`] | [`MODEL_REGISTRY`], [`load_model`] |
//! | [`generate`] | greedy generation of one prompt |
//! | [`gguf`] | GGUF files as checkpoints |
//! | [`tp`] | tensor parallelism: shard arithmetic, the `Collective` trait, its TCP (CPU) and NCCL (GPU) backends |
//!
//! A typical use: `load_model(path, &options)?`, a [`KvCache`] from
//! [`CausalLm::new_kv_cache`], then per step a [`ForwardBatch`] and
//! [`CausalLm::forward`].
#![forbid(unsafe_code)]

pub mod attn_backend;
pub mod causal_lm;
pub mod config;
pub mod ctx;
mod decoder;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod graph_inputs;
pub mod layers;
pub mod layout;
pub mod llama;
pub mod mistral;
pub mod moe_backend;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_moe;
pub mod registry;
pub mod rotary;
pub mod tp;
pub mod weights;

pub use attn_backend::{AttnBackendKind, AttnBackendSpec};
pub use causal_lm::CausalLm;
pub use config::{ModelConfig, MoeConfig, RopeConfig, RopeScaling};
pub use ctx::{AttnBackend, ForwardBatch, ForwardCtx, KvCache, KvCacheShape, LogitRows, SeqStep};
pub use error::{ModelError, Result};
pub use graph_inputs::{DecodeGraphInputs, Padding, StepInputs};
pub use layout::StepLayout;
pub use moe_backend::MoeBackendKind;
pub use registry::{
    load_model, load_model_counting, load_model_sharded, supported_architectures, LoadOptions, MODEL_REGISTRY,
};
pub use tp::{Collective, Shard, TpGroup};
pub use weights::{LoadFormat, Slice, Weights, MERGE_GROUPS};
