//! The RoPE self-attention block of LLaMA-family decoders.
//!
//! `x -> qkv_proj -> (q, k, v) -> [q_norm, k_norm] -> rope(q, k) -> store(k, v) -> backend -> o_proj`.
//! q, k and v are views into the one fused projection output (no copies). The
//! norms, the rotation and the store into the paged cache are one op,
//! `ops::rope_store` (one launch on CUDA instead of four; the unfused sequence on
//! the CPU), handed to the attention backend with q, k and v
//! (`AttnBackend::forward_rope`): it runs the prologue, which writes the rotated k
//! and v into the layer's cache, then attends; on CUDA the decode kernel can run
//! both in one launch (`ops::rope_store_attention`). The variants of the family
//! differ only in [`AttnOptions`]: LLaMA's `attention_bias` covers all four
//! projections, Qwen2 has q/k/v bias and none on o_proj, Qwen3 adds the q/k
//! RMSNorm, Mistral has no bias at all. Under tensor parallelism a rank holds
//! its query heads and KV heads (`tp::Shard::heads`) and o_proj all-reduces.

use kernel_runtime::{ops, Tensor};

use crate::config::ModelConfig;
use crate::ctx::{AttnInputs, ForwardCtx};
use crate::error::Result;
use crate::layers::linear::{ColumnParallelLinear, RowParallelLinear};
use crate::layers::norm::{PreNorm, RmsNorm};
use crate::rotary::RotaryEmbedding;
use crate::weights::VarBuilder;

/// What distinguishes the attention of one architecture from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnOptions {
    /// Bias on q_proj, k_proj and v_proj.
    pub qkv_bias: bool,
    /// Bias on o_proj.
    pub o_bias: bool,
    /// Per-head RMSNorm of q and k before rope (`q_norm`, `k_norm`; Qwen3).
    pub qk_norm: bool,
}

/// `LlamaAttention` and its relatives.
#[derive(Debug, Clone)]
pub struct RopeAttention {
    qkv_proj: ColumnParallelLinear,
    o_proj: RowParallelLinear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    rotary: RotaryEmbedding,
    layer_idx: usize,
    /// Query heads of this rank.
    num_heads: usize,
    /// KV heads of this rank.
    num_kv_heads: usize,
    head_dim: usize,
    scale: f32,
}

impl RopeAttention {
    /// Loads the block under `vb` (`model.layers.N.self_attn`).
    pub fn load(
        vb: &VarBuilder<'_>,
        config: &ModelConfig,
        layer_idx: usize,
        rotary: RotaryEmbedding,
        options: AttnOptions,
    ) -> Result<RopeAttention> {
        let (h, hq, hkv, d) =
            (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim);
        // This rank's query heads and KV heads (replicated when fewer than ranks);
        // o_proj's input columns are its query heads' (the even split).
        let heads = vb.tp().shard().heads(hq, hkv).map_err(|m| config.unsupported(m))?;
        let rows = |r: &std::ops::Range<usize>| r.start * d..r.end * d;
        let parts = [(hq * d, rows(&heads.q)), (hkv * d, rows(&heads.kv)), (hkv * d, rows(&heads.kv))];
        let qkv_proj = ColumnParallelLinear::load_merged_ranges(vb, "qkv_proj", h, &parts, options.qkv_bias)?;
        let o_proj = RowParallelLinear::load(vb, "o_proj", hq * d, h, options.o_bias)?;
        let (hq, hkv) = (heads.q.len(), heads.kv.len());
        let (q_norm, k_norm) = if options.qk_norm {
            (
                Some(RmsNorm::load(vb, "q_norm", d, config.rms_norm_eps)?),
                Some(RmsNorm::load(vb, "k_norm", d, config.rms_norm_eps)?),
            )
        } else {
            (None, None)
        };
        Ok(RopeAttention {
            qkv_proj,
            o_proj,
            q_norm,
            k_norm,
            rotary,
            layer_idx,
            num_heads: hq,
            num_kv_heads: hkv,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
        })
    }

    /// `x` `[t, hidden]` (normed hidden states) to a new `[t, hidden]`.
    pub fn forward(&self, ctx: &ForwardCtx<'_>, x: &Tensor) -> Result<Tensor> {
        self.attend(ctx, self.qkv_proj.forward(x)?)
    }

    /// The layer's pre-norm step and [`RopeAttention::forward`], the step fused into
    /// the qkv projection: `(output, residual)`.
    pub fn forward_prenorm(&self, ctx: &ForwardCtx<'_>, pre: PreNorm<'_>) -> Result<(Tensor, Tensor)> {
        let (qkv, residual) = self.qkv_proj.forward_prenorm(pre, false)?;
        Ok((self.attend(ctx, qkv)?, residual))
    }

    /// Everything after the qkv projection: `qkv` `[t, (hq + 2 hkv) d]` to `[t, hidden]`.
    fn attend(&self, ctx: &ForwardCtx<'_>, qkv: Tensor) -> Result<Tensor> {
        let t = qkv.dim(0);
        let (hq, hkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        // [t, (hq + 2 hkv) * d] viewed as [t, hq + 2 hkv, d], then split by heads.
        let qkv = qkv.reshape(&[t, hq + 2 * hkv, d])?;
        let q = qkv.narrow(1, 0, hq)?;
        let k = qkv.narrow(1, hq, hkv)?;
        let v = qkv.narrow(1, hq + hkv, hkv)?;
        let qk_norm = match (&self.q_norm, &self.k_norm) {
            (Some(q_norm), Some(k_norm)) if q_norm.eps() == k_norm.eps() => {
                Some(ops::QkNorm { q_weight: q_norm.weight(), k_weight: k_norm.weight(), eps: q_norm.eps() })
            }
            (Some(q_norm), Some(k_norm)) => {
                // Different epsilons (no known checkpoint): normalise apart, fuse the rest.
                q_norm.forward_heads(&q)?;
                k_norm.forward_heads(&k)?;
                None
            }
            _ => None,
        };
        let (k_cache, v_cache) = ctx.kv.layer(self.layer_idx)?;
        let rope = ops::RopeStore {
            q: &q,
            k: &k,
            v: &v,
            k_cache,
            v_cache,
            positions: ctx.batch.positions(),
            out_loc: ctx.batch.out_loc(),
            cos_sin: self.rotary.cos_sin(),
            qk_norm,
        };
        let inputs = AttnInputs { layer_idx: self.layer_idx, q: &q, k: &k, v: &v, scale: self.scale, kv_stored: true };
        let out = ctx.attn.forward_rope(ctx, inputs, &rope)?;
        self.o_proj.forward(&out.reshape(&[t, hq * d])?)
    }
}
