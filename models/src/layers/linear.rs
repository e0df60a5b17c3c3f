//! Linear layers: `y = x @ W^T (+ b)` with `W` in the HF `[out, in]` layout.
//!
//! [`Linear`] is the op; [`ColumnParallelLinear`] and [`RowParallelLinear`] are the
//! two roles a projection has under tensor parallelism (output features split
//! across ranks, or input features split and the partial outputs all-reduced),
//! as in Megatron, vLLM and mini-sglang. With one rank both are a `Linear`; the
//! models already use the role types so that sharding is added here only.

use kernel_runtime::{ops, Tensor};

use crate::error::Result;
use crate::weights::VarBuilder;

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
    /// Loads the fused projection `fused` (`qkv_proj`) from its parts, which have
    /// `part_sizes` output features each.
    pub fn load_merged(
        vb: &VarBuilder<'_>,
        fused: &str,
        in_features: usize,
        part_sizes: &[usize],
        bias: bool,
    ) -> Result<ColumnParallelLinear> {
        let weight = vb.get_merged(fused, "weight", part_sizes, &[in_features])?;
        let bias = if bias { Some(vb.get_merged(fused, "bias", part_sizes, &[])?) } else { None };
        Ok(ColumnParallelLinear { linear: Linear::new(weight, bias), part_sizes: part_sizes.to_vec() })
    }

    /// `x` `[t, in]` to a new `[t, sum(part_sizes)]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.linear.forward(x)
    }

    /// For a gate/up fusion of two equal parts: `silu(gate) * up`, `x` `[t, in]` to
    /// a new `[t, part]` ([`Linear::forward_silu_mul`]).
    pub fn forward_silu_mul(&self, x: &Tensor) -> Result<Tensor> {
        self.linear.forward_silu_mul(x)
    }

    /// Output features of each fused part.
    pub fn part_sizes(&self) -> &[usize] {
        &self.part_sizes
    }
}

/// A projection whose input features would be split across ranks (the partial
/// products then summed with an all-reduce): `o_proj`, `down_proj`.
#[derive(Debug, Clone)]
pub struct RowParallelLinear {
    linear: Linear,
}

impl RowParallelLinear {
    /// Loads `name.weight` `[out, in]` (and `name.bias`).
    pub fn load(
        vb: &VarBuilder<'_>,
        name: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Result<RowParallelLinear> {
        Ok(RowParallelLinear { linear: Linear::load(vb, name, in_features, out_features, bias)? })
    }

    /// `x` `[t, in]` to a new `[t, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.linear.forward(x)
    }
}
