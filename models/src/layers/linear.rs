//! Linear layers: `y = x @ W^T (+ b)` with `W` in the HF `[out, in]` layout.
//!
//! [`Linear`] is the op; [`ColumnParallelLinear`] and [`RowParallelLinear`] are the
//! two roles a projection has under tensor parallelism (output features split
//! across ranks, or input features split and the partial outputs all-reduced),
//! as in Megatron, vLLM and mini-sglang. Each loads its rank's slice from the
//! builder's tensor-parallel group (`VarBuilder::tp`); with one rank both are a
//! `Linear`.

use std::ops::Range;

use kernel_runtime::{ops, Tensor};

use crate::error::Result;
use crate::layers::norm::PreNorm;
use crate::tp::TpGroup;
use crate::weights::{Slice, VarBuilder};

/// `y = x @ weight^T (+ bias)`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out_features, in_features]`, in the compute dtype.
    weight: Tensor,
    /// `[out_features]`.
    bias: Option<Tensor>,
}

impl Linear {
    /// A layer over already-loaded tensors.
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Linear {
        Linear { weight, bias }
    }

    /// Loads `name.weight` `[out, in]` (and `name.bias` `[out]`).
    pub fn load(
        vb: &VarBuilder<'_>,
        name: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Result<Linear> {
        let vb = vb.pp(name);
        let weight = vb.get("weight", &[out_features, in_features])?;
        let bias = if bias { Some(vb.get("bias", &[out_features])?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// `x` `[t, in]` to a new `[t, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::linear(x, &self.weight, self.bias.as_ref())?)
    }

    /// `silu(gate) * up` of the output's two halves (gate rows first): `x` `[t, in]`
    /// to a new `[t, out / 2]` (one launch where the GPU's skinny rule takes it).
    pub fn forward_silu_mul(&self, x: &Tensor) -> Result<Tensor> {
        Ok(ops::linear_silu_mul(x, &self.weight, self.bias.as_ref())?)
    }

    /// The pre-norm step, then this projection (`gated`: then `silu(gate) * up`, as
    /// [`Linear::forward_silu_mul`]): `(output, residual)`. With a residual, one op
    /// (`ops::fused_add_rms_norm_linear`: one launch where the GPU's skinny rule
    /// takes the product); before the first layer, the norm of `x`, which becomes the
    /// residual.
    pub fn forward_prenorm(&self, pre: PreNorm<'_>, gated: bool) -> Result<(Tensor, Tensor)> {
        match pre.residual {
            Some(residual) => Ok(ops::fused_add_rms_norm_linear(
                pre.x,
                residual,
                pre.norm.weight(),
                pre.norm.eps(),
                &self.weight,
                self.bias.as_ref(),
                gated,
            )?),
            None => {
                let (h, residual) = pre.apply()?;
                let out = if gated { self.forward_silu_mul(&h)? } else { self.forward(&h)? };
                Ok((out, residual))
            }
        }
    }

    /// The `[out, in]` weight.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

/// A projection whose output features would be split across ranks. It may be the
/// fusion of several checkpoint projections (a `MERGE_GROUPS` row), whose outputs
/// are then consecutive column ranges of the result.
#[derive(Debug, Clone)]
pub struct ColumnParallelLinear {
    linear: Linear,
    /// Output features of each fused part (one entry when not fused).
    part_sizes: Vec<usize>,
}

impl ColumnParallelLinear {
    /// Loads the fused projection `fused` (`gate_up_proj`) from its parts, which
    /// have `part_sizes` output features each, every part split evenly over the
    /// ranks (this rank's features of each part, in part order).
    pub fn load_merged(
        vb: &VarBuilder<'_>,
        fused: &str,
        in_features: usize,
        part_sizes: &[usize],
        bias: bool,
    ) -> Result<ColumnParallelLinear> {
        let parts = part_sizes
            .iter()
            .map(|&n| Ok((n, vb.split(n, &format!("the output features of {}", vb.name(fused)))?)))
            .collect::<Result<Vec<_>>>()?;
        ColumnParallelLinear::load_merged_ranges(vb, fused, in_features, &parts, bias)
    }

    /// Loads the rows `parts[i].1` of each part `i` (of `parts[i].0` output
    /// features) of the fused projection `fused`: a rank's heads of `qkv_proj`,
    /// where the KV heads may be replicated rather than split.
    pub fn load_merged_ranges(
        vb: &VarBuilder<'_>,
        fused: &str,
        in_features: usize,
        parts: &[(usize, Range<usize>)],
        bias: bool,
    ) -> Result<ColumnParallelLinear> {
        let weight = vb.get_merged_slices(fused, "weight", parts, &[in_features])?;
        let bias = if bias { Some(vb.get_merged_slices(fused, "bias", parts, &[])?) } else { None };
        let part_sizes = parts.iter().map(|(_, r)| r.len()).collect();
        Ok(ColumnParallelLinear { linear: Linear::new(weight, bias), part_sizes })
    }

    /// `x` `[t, in]` to a new `[t, sum(part_sizes)]` (this rank's features).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.linear.forward(x)
    }

    /// For a gate/up fusion of two equal parts: `silu(gate) * up`, `x` `[t, in]` to
    /// a new `[t, part]` ([`Linear::forward_silu_mul`]).
    pub fn forward_silu_mul(&self, x: &Tensor) -> Result<Tensor> {
        self.linear.forward_silu_mul(x)
    }

    /// [`Linear::forward_prenorm`] on this rank's features.
    pub fn forward_prenorm(&self, pre: PreNorm<'_>, gated: bool) -> Result<(Tensor, Tensor)> {
        self.linear.forward_prenorm(pre, gated)
    }

    /// Output features of each fused part (on this rank).
    pub fn part_sizes(&self) -> &[usize] {
        &self.part_sizes
    }
}

/// A projection whose input features are split across ranks, the partial
/// products then summed with an all-reduce: `o_proj`, `down_proj`.
#[derive(Debug, Clone)]
pub struct RowParallelLinear {
    /// This rank's input columns of the weight; the bias on rank 0 only, so that
    /// the sum adds it once.
    linear: Linear,
    tp: TpGroup,
}

impl RowParallelLinear {
    /// Loads this rank's columns (its equal part of `in_features`) of
    /// `name.weight` `[out, in]`, and `name.bias` on rank 0.
    pub fn load(
        vb: &VarBuilder<'_>,
        name: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Result<RowParallelLinear> {
        let tp = vb.tp().clone();
        let cols = vb.split(in_features, &format!("the input features of {}", vb.name(name)))?;
        let vb = vb.pp(name);
        let slice = tp.shard().is_split().then(|| Slice::of(1, cols));
        let weight = vb.get_slice("weight", &[out_features, in_features], slice)?;
        let bias = if bias && tp.shard().rank() == 0 { Some(vb.get("bias", &[out_features])?) } else { None };
        Ok(RowParallelLinear { linear: Linear::new(weight, bias), tp })
    }

    /// `x` `[t, in / tp]` (this rank's features) to a new `[t, out]`, summed over
    /// the ranks.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.linear.forward(x)?;
        self.tp.all_reduce(&y)?;
        Ok(y)
    }
}
