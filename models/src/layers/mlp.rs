//! The gated MLP of LLaMA-family decoders: `down(silu(gate(x)) * up(x))`, with gate
//! and up fused into one `gate_up_proj` (gate rows first, as `ops::silu_mul` reads).

use kernel_runtime::Tensor;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::layers::linear::{ColumnParallelLinear, RowParallelLinear};
use crate::layers::norm::PreNorm;
use crate::weights::VarBuilder;

/// `LlamaMLP` / `Qwen2MLP` / `Qwen3MLP` / `MistralMLP`.
#[derive(Debug, Clone)]
pub struct GatedMlp {
    gate_up_proj: ColumnParallelLinear,
    down_proj: RowParallelLinear,
}

impl GatedMlp {
    /// Loads `gate_proj`, `up_proj` (fused) and `down_proj` under `vb` (`...mlp`),
    /// with `intermediate_size` hidden features and the config's `mlp_bias`.
    pub fn load(vb: &VarBuilder<'_>, config: &ModelConfig, intermediate_size: usize) -> Result<GatedMlp> {
        if !matches!(config.hidden_act.as_str(), "silu" | "swish") {
            return Err(
                config.unsupported(format!("hidden_act `{}` is not supported (supported: silu)", config.hidden_act))
            );
        }
        let (h, i, bias) = (config.hidden_size, intermediate_size, config.mlp_bias);
        Ok(GatedMlp {
            gate_up_proj: ColumnParallelLinear::load_merged(vb, "gate_up_proj", h, &[i, i], bias)?,
            down_proj: RowParallelLinear::load(vb, "down_proj", i, h, bias)?,
        })
    }

    /// `x` `[t, hidden]` to a new `[t, hidden]`. The activation is fused into the
    /// gate_up projection (`ops::linear_silu_mul`: one launch on the GPU's skinny
    /// path, the two ops elsewhere).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.down_proj.forward(&self.gate_up_proj.forward_silu_mul(x)?)
    }

    /// The layer's pre-norm step and [`GatedMlp::forward`], the step fused into the
    /// gate_up projection: `(output, residual)`.
    pub fn forward_prenorm(&self, pre: PreNorm<'_>) -> Result<(Tensor, Tensor)> {
        let (act, residual) = self.gate_up_proj.forward_prenorm(pre, true)?;
        Ok((self.down_proj.forward(&act)?, residual))
    }
}
