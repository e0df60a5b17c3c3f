//! The building blocks of the dense decoders, shared by every model file.
//!
//! | module | what |
//! | --- | --- |
//! | [`linear`] | `Linear`, and its tensor-parallel roles: column (qkv, gate_up) and row (o, down) |
//! | [`embedding`] | the token embedding and the LM head (tied or not) |
//! | [`norm`] | RMSNorm, plain, fused with the residual add, and per head |
//! | [`attention`] | the RoPE attention block: fused QKV, optional q/k norm, rope, backend, o_proj |
//! | [`mlp`] | the gated MLP: fused gate_up, SiLU-and-mul, down |
//! | [`moe`] | the sparse MoE block: router and packed experts, run by a MoE backend |
//!
//! Layers hold weights only; each `forward` takes what varies per step
//! (`ForwardCtx`). Under tensor parallelism the layers that split are their own
//! types ([`linear::ColumnParallelLinear`], [`linear::RowParallelLinear`],
//! [`embedding::VocabParallelEmbedding`], [`embedding::ParallelLmHead`], and the
//! experts of [`moe::SparseMoeBlock`]): each loads its rank's slice from the
//! builder's `TpGroup` and calls its collective, so the models do not change.

pub mod attention;
pub mod embedding;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod norm;

pub use attention::{AttnOptions, RopeAttention};
pub use embedding::{ParallelLmHead, VocabParallelEmbedding};
pub use linear::{ColumnParallelLinear, Linear, RowParallelLinear};
pub use mlp::GatedMlp;
pub use moe::{RouterProbe, SparseMoeBlock};
pub use norm::{PreNorm, RmsNorm};
