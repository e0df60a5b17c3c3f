//! The arguments of the fused attention prologue ([`crate::ops::rope_store`]),
//! shared by its CPU and CUDA implementations.

use crate::tensor::Tensor;

/// The per-head RMSNorm applied to q and k before the rotation.
#[derive(Debug, Clone, Copy)]
pub struct QkNorm<'a> {
    /// `[head_dim]`, q's norm weight.
    pub q_weight: &'a Tensor,
    /// `[head_dim]`, k's norm weight.
    pub k_weight: &'a Tensor,
    pub eps: f32,
}

/// The arguments of [`rope_store`] (a config struct rather than ten positional
/// tensors: STYLE rule 11).
#[derive(Debug, Clone, Copy)]
pub struct RopeStore<'a> {
    /// `[t, heads_q, d]`, unit last stride (a view of a fused QKV output is fine);
    /// rotated (and normalised) in place.
    pub q: &'a Tensor,
    /// `[t, heads_kv, d]`, unit last stride; read only.
    pub k: &'a Tensor,
    /// `[t, heads_kv, d]`, unit last stride; read only.
    pub v: &'a Tensor,
    /// Contiguous, `[..., heads_kv, d]` (e.g. `[num_pages, page_size, heads_kv, d]`):
    /// slot s is the s-th `[heads_kv, d]` block.
    pub k_cache: &'a Tensor,
    /// Same shape as `k_cache`.
    pub v_cache: &'a Tensor,
    /// `[t]` int32/int64 positions (rows of `cos_sin`).
    pub positions: &'a Tensor,
    /// `[t]` int32/int64 KV slots; slots outside the cache are skipped.
    pub out_loc: &'a Tensor,
    /// `[max_positions, rotary_dim]` f32, the table of [`super::rope`].
    pub cos_sin: &'a Tensor,
    /// The q/k norm, or `None` for models without one (LLaMA, Qwen2, Mistral).
    pub qk_norm: Option<QkNorm<'a>>,
}
