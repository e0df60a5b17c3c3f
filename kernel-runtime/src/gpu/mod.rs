//! CUDA implementations of the dense ops, called by `crate::ops` after their
//! argument checks: cuBLASLt GEMMs ([`gemm`]) and the kernels of csrc/kernels/.
//!
//! | module | kernel family | ops |
//! | --- | --- | --- |
//! | [`gemm`] | cuBLASLt | `linear` |
//! | [`norm`] | `norm` | `rms_norm`, `fused_add_rms_norm`, `head_rms_norm` |
//! | [`rope`] | `rope` | `rope` |
//! | [`rope_store`] | `rope_store` | `rope_store` (q/k norm + rope + KV store) |
//! | [`skinny`] | `skinny_gemm` | `linear` and `linear_silu_mul` at m <= 16 (by rule), `skinny_gemm`, `skinny_gemm_silu_mul` |
//! | [`stream_gemm`] | `stream_gemm` | `linear` at m <= 16 of large weights (by rule), `stream_gemm` |
//! | [`activation`] | `activation` | `silu_mul` |
//! | [`argmax`] | `argmax` | `argmax` |
//! | [`attention`] | `attention` | `paged_attention` |
//! | [`prefill`] | `prefill_attention` | `paged_attention` for batches of long query runs |
//! | [`convert`] | `cast`, `copy` | `cast`, strided `copy` |
//! | [`sampling`] | `sampling` | `sample` |
//! | [`token_mask`] | `token_mask` | `apply_token_mask` |
//! | [`penalties`] | `penalty_count`, `apply_penalties` | `penalty_count`, `apply_penalties` |
//! | [`logprobs`] | `logprobs` | `logprobs` |
//! | [`random`] | `random` | `fill_uniform` |
//! | [`moe`] | `moe_route`, `moe_align`, `moe_gemm`, `moe_sum` | the MoE ops and the tile plan |
//!
//! Every launcher follows `ops::store`: it checks what the kernel needs beyond the
//! op contract (alignment for the 16-byte vector paths), computes the launch shape
//! on the host (threads per row, split counts: STYLE rule 6), resolves the family
//! instance with [`kernels::resolve`], and runs either the AOT library's C launcher
//! (which validates again) or the loaded function with its params struct.

mod activation;
mod argmax;
mod attention;
mod convert;
mod decode_plan;
pub(crate) mod gemm;
pub(crate) mod gemm_tune;
mod launch;
mod logprobs;
pub(crate) mod moe;
mod norm;
mod penalties;
mod prefill;
mod random;
mod rope;
mod rope_store;
mod sampling;
pub(crate) mod skinny;
pub(crate) mod skinny_tiled;
pub(crate) mod stream_gemm;
mod tensor_map;
mod token_mask;

pub(crate) use activation::silu_mul;
pub(crate) use argmax::argmax;
pub(crate) use attention::{
    decode_graph_splits, decode_kernel_fits, fused_rope_enabled, paged_attention, set_fused_rope,
};
pub(crate) use convert::{cast, copy};
pub(crate) use decode_plan::{set_split_merge, set_tuning as set_decode_tuning, tuning as decode_tuning};
pub(crate) use gemm::linear;
pub(crate) use logprobs::logprobs;
pub(crate) use norm::{fused_add_rms_norm, head_rms_norm, rms_norm};
pub(crate) use penalties::{apply_penalties, penalty_count};
pub(crate) use prefill::{set_prefill_grid_limit, set_prefill_ranked, set_prefill_tile};
pub(crate) use random::fill_uniform;
pub(crate) use rope::rope;
pub(crate) use rope_store::rope_store;
pub(crate) use sampling::{sample, sample_into, sample_table, sample_with};
pub(crate) use token_mask::apply_token_mask;
