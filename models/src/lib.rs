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
//! | [`ctx`] | [`ForwardBatch`], [`KvCache`], the [`AttnBackend`] trait, [`ForwardCtx`] |
//! | [`attn_backend`] | the `--attn` registry and the paged backend |
//! | [`moe_backend`] | the `--moe` registry: fused kernels or the naive loop over experts |
//! | [`layers`] | linear (column/row parallel), embedding, RMSNorm, RoPE attention, gated MLP, sparse MoE |
//! | [`llama`], [`qwen2`], [`qwen3`], [`qwen3_moe`], [`mistral`] | the models, one file each |
//! | [`registry`] | [`CausalLm`], [`MODEL_REGISTRY`], [`load_model`] |
//! | [`generate`] | greedy generation of one prompt |
//! | [`gguf`] | GGUF files as checkpoints |
//!
//! A typical use: `load_model(path, &options)?`, a [`KvCache`] from
//! [`CausalLm::new_kv_cache`], then per step a [`ForwardBatch`] and
//! [`CausalLm::forward`].
#![forbid(unsafe_code)]

pub mod attn_backend;
pub mod config;
pub mod ctx;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod layers;
pub mod llama;
pub mod mistral;
pub mod moe_backend;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_moe;
pub mod registry;
pub mod rotary;
pub mod weights;

pub use attn_backend::{AttnBackendKind, AttnBackendSpec};
pub use config::{ModelConfig, MoeConfig, RopeConfig, RopeScaling};
pub use ctx::{AttnBackend, ForwardBatch, ForwardCtx, KvCache, KvCacheShape, LogitRows, SeqStep};
pub use error::{ModelError, Result};
pub use moe_backend::MoeBackendKind;
pub use registry::{load_model, supported_architectures, CausalLm, LoadOptions, MODEL_REGISTRY};
pub use weights::{LoadFormat, Weights, MERGE_GROUPS};
