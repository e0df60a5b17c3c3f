//! Typed launchers: every op checks its arguments once, at this boundary, then
//! runs the CPU reference (`crate::cpu`) or a CUDA kernel on the tensors' device.
//!
//! | op | what |
//! | --- | --- |
//! | [`store_kv`] | scatter new K/V rows into the paged KV caches |
//! | [`index`], [`embedding`] | embedding gather (with the vocab-parallel range) |
//! | [`copy`], [`cast`] | strided copy, dtype conversion |
//! | [`linear`], [`set_gemm_tuning`], [`gemm_tuning_report`] | `x @ w^T + b` (cuBLASLt on CUDA; decode shapes' algorithm measured on first use), its switch and what it measured |
//! | [`rms_norm`], [`fused_add_rms_norm`], [`head_rms_norm`] | RMSNorm variants |
//! | [`fused_add_rms_norm_linear`] | the pre-norm residual step and the projection after it |
//! | [`rope`] | rotary embedding (neox layout), in place |
//! | [`rope_store`] | q/k norm (optional) + rotary embedding + KV store, fused |
//! | [`skinny_gemm`], [`set_skinny_gemm`], [`set_skinny_prefetch`] | the decode GEMM `linear` picks at m <= 16, its switch and its weight prefetch's |
//! | [`skinny_tiled`], [`TiledPlan`], [`set_skinny_tiled`] | the pipelined decode GEMM `linear` picks next (mid batches, large weights), its plan and switch |
//! | [`stream_gemm`], [`StreamPlan`], [`set_stream_gemm`] | the copy-engine decode GEMM `linear` picks for large weights at m <= 16 (sm_90), its plan and switch |
//! | [`linear_silu_mul`], [`skinny_gemm_silu_mul`] | gate_up projection + SiLU-and-mul (one launch on the skinny path) |
//! | [`silu_mul`] | SiLU(gate) * up |
//! | [`argmax`] | greedy token choice |
//! | [`sample`] | one token per row: greedy, temperature, top-k, top-p, min-p |
//! | [`apply_token_mask`] | constrained decoding's token masks, -inf where disallowed |
//! | [`penalty_count`], [`apply_penalties`] | repetition/frequency/presence penalties from per-slot counters |
//! | [`logprobs`] | log probabilities of sampled tokens and the top alternatives |
//! | [`fill_uniform`] | deterministic uniform values, the same on every device (dummy weights) |
//! | [`paged_attention`], [`set_decode_split_merge`], [`set_decode_tuning`] | attention over the paged KV cache (prefill and decode), and the decode kernel's split merge switch and run-time tuning |
//! | [`moe_route`], [`moe_align`], [`moe_gemm`], [`moe_sum`], [`fused_experts`], [`fused_moe`] | mixture of experts (`moe` module) |

mod attention;
mod check;
mod convert;
mod dense;
mod fused;
mod index;
mod logprobs;
pub mod moe;
mod penalties;
mod random;
mod sampling;
mod skinny;
mod store;

pub use attention::{
    decode_graph_splits, decode_kernel_fits, decode_tuning, paged_attention, paged_attention_with,
    rope_store_attention, set_decode_fused_rope, set_decode_split_merge, set_decode_tuning, set_prefill_grid_limit,
    set_prefill_ranked, set_prefill_tile, AttnKernel, DecodePlanKind, DecodeTuning, PagedAttnMeta, SplitMerge,
};
pub use convert::{cast, copy};
pub use dense::{
    argmax, fused_add_rms_norm, fused_add_rms_norm_linear, gemm_tuning_report, head_rms_norm, linear, linear_silu_mul,
    rms_norm, rope, set_gemm_tuning, silu_mul,
};
pub use fused::{rope_store, QkNorm, RopeStore};
pub use index::{embedding, index};
pub use logprobs::{logprobs, logprobs_cols, RowLogprobs, MAX_TOP_LOGPROBS};
pub use moe::{
    fused_experts, fused_experts_with, fused_moe, fused_moe_routed, moe_align, moe_decode_bulk_launches,
    moe_fused_router_launches, moe_gemm, moe_route, moe_router_route, moe_sum, naive_experts, set_moe_decode_bulk,
    set_moe_decode_cols, set_moe_decode_unroll, set_moe_fused_router, MoeAlignment, MoePlan, MoeRouting,
};
pub use penalties::{apply_penalties, penalty_count, CountKind, PenaltyRow, PROMPT_BIT};
pub use random::fill_uniform;
pub use sampling::{apply_token_mask, sample, sample_into, sample_with, SampleRow, SampleTable};
pub use skinny::{
    set_skinny_bulk, set_skinny_gemm, set_skinny_norm, set_skinny_prefetch, set_skinny_tiled, set_stream_gemm,
    skinny_gemm, skinny_gemm_silu_mul, skinny_tiled, skinny_tiled_default_plan, stream_gemm, StreamPlan, TiledPlan,
};
pub use store::store_kv;
