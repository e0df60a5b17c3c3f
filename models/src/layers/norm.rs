//! RMSNorm (`LlamaRMSNorm`): `x / sqrt(mean(x^2) + eps) * weight`.
//!
//! Besides the plain form, decoders use it fused with the residual add (the
//! pre-norm step `residual += x; x = norm(residual)`, one pass instead of two) and
//! per attention head (Qwen3's q/k norm), all three as kernel-runtime ops.
//! [`PreNorm`] carries the fused step's inputs to the projection that consumes its
//! output, which on the GPU at decode sizes runs both in one launch.

use kernel_runtime::{ops, Tensor};

use crate::error::Result;
use crate::weights::VarBuilder;

/// A decoder block's input before its pre-norm: the previous block's output `x`,
/// the residual stream (none before the first layer) and the norm. The first
/// projection of the block applies it ([`crate::layers::Linear::forward_prenorm`]).
pub struct PreNorm<'a> {
    pub x: Tensor,
    pub residual: Option<Tensor>,
    pub norm: &'a RmsNorm,
}

impl PreNorm<'_> {
    /// The normed input and the residual, as [`RmsNorm::forward_fused`] makes them.
    pub fn apply(self) -> Result<(Tensor, Tensor)> {
        self.norm.forward_fused(self.x, self.residual)
    }
}

/// RMSNorm over the last dimension.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// Loads `name.weight` `[size]`.
    pub fn load(vb: &VarBuilder<'_>, name: &str, size: usize, eps: f64) -> Result<RmsNorm> {
        Ok(RmsNorm { weight: vb.pp(name).get("weight", &[size])?, eps: eps as f32 })
    }

    /// `x` `[t, h]` to a new normalised `[t, h]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::rms_norm(x, &self.weight, self.eps)?)
    }

    /// The pre-norm residual step. Without a residual yet (the first layer), the
    /// input becomes the residual and the output is its norm; with one, `x` is
    /// added to it and `x` is overwritten with the norm of the sum (in place, so
    /// `x` must be a fresh tensor no one else reads). Returns `(normed, residual)`.
    pub fn forward_fused(&self, x: Tensor, residual: Option<Tensor>) -> Result<(Tensor, Tensor)> {
        match residual {
            None => Ok((self.forward(&x)?, x)),
            Some(residual) => {
                ops::fused_add_rms_norm(&x, &residual, &self.weight, self.eps)?;
                Ok((x, residual))
            }
        }
    }

    /// The `[size]` weight.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The epsilon added to the mean square.
    pub fn eps(&self) -> f32 {
        self.eps
    }

    /// Normalises every head of `x` `[t, heads, d]` in place (a view is fine).
    pub fn forward_heads(&self, x: &Tensor) -> Result<()> {
        Ok(ops::head_rms_norm(x, &self.weight, self.eps)?)
    }
}
