//! The RoPE self-attention block of LLaMA-family decoders.
//!
//! `x -> qkv_proj -> (q, k, v) -> [q_norm, k_norm] -> rope(q, k) -> backend -> o_proj`.
//! q, k and v are views into the one fused projection output (no copies); the
//! per-head norms and rope write them in place, and the attention backend stores
//! k and v into the paged cache before attending. The variants of the family
//! differ only in [`AttnOptions`]: LLaMA's `attention_bias` covers all four
//! projections, Qwen2 has q/k/v bias and none on o_proj, Qwen3 adds the q/k
//! RMSNorm, Mistral has no bias at all.

use kernel_runtime::Tensor;

use crate::config::ModelConfig;
use crate::ctx::{AttnInputs, ForwardCtx};
use crate::error::Result;
use crate::layers::linear::{ColumnParallelLinear, RowParallelLinear};
use crate::layers::norm::RmsNorm;
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
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    scale: f32,
}

impl RopeAttention {
    /// Loads the block under `vb` (`model.layers.N.self_attn`).
    pub fn load(vb: &VarBuilder<'_>, config: &ModelConfig, layer_idx: usize, rotary: RotaryEmbedding, options: AttnOptions) -> Result<RopeAttention> {
        let (h, hq, hkv, d) = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim);
        let qkv_proj = ColumnParallelLinear::load_merged(vb, "qkv_proj", h, &[hq * d, hkv * d, hkv * d], options.qkv_bias)?;
        let o_proj = RowParallelLinear::load(vb, "o_proj", hq * d, h, options.o_bias)?;
        let (q_norm, k_norm) = if options.qk_norm {
            (Some(RmsNorm::load(vb, "q_norm", d, config.rms_norm_eps)?), Some(RmsNorm::load(vb, "k_norm", d, config.rms_norm_eps)?))
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
        let t = x.dim(0);
        let (hq, hkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        // [t, (hq + 2 hkv) * d] viewed as [t, hq + 2 hkv, d], then split by heads.
        let qkv = self.qkv_proj.forward(x)?.reshape(&[t, hq + 2 * hkv, d])?;
        let q = qkv.narrow(1, 0, hq)?;
        let k = qkv.narrow(1, hq, hkv)?;
        let v = qkv.narrow(1, hq + hkv, hkv)?;
        if let (Some(q_norm), Some(k_norm)) = (&self.q_norm, &self.k_norm) {
            q_norm.forward_heads(&q)?;
            k_norm.forward_heads(&k)?;
        }
        self.rotary.forward(&q, &k, ctx.batch.positions())?;
        let out = ctx.attn.forward(ctx, AttnInputs { layer_idx: self.layer_idx, q: &q, k: &k, v: &v, scale: self.scale })?;
        self.o_proj.forward(&out.reshape(&[t, hq * d])?)
    }
}
