//! Qwen3-MoE (`Qwen3MoeForCausalLM`: Qwen3-30B-A3B, Qwen3-235B-A22B).
//!
//! Reference: transformers `models/qwen3_moe/modeling_qwen3_moe.py`. Qwen3's
//! decoder (RoPE attention with a per-head RMSNorm of q and k, GQA, pre-norm
//! residual blocks, final norm, LM head) whose MLP is, in sparse layers, a
//! [`SparseMoeBlock`]: a router over `num_experts` experts of
//! `moe_intermediate_size`, each token running through its `num_experts_per_tok`
//! best, weighted by their softmax probabilities (renormalised over the chosen
//! experts when `norm_topk_prob`). A layer is sparse unless it is listed in
//! `mlp_only_layers` or `(layer + 1) % decoder_sparse_step != 0`; the others keep
//! a dense [`GatedMlp`] of `intermediate_size`.
//!
//! How the experts run is the MoE backend handed to the loader (`--moe`, see
//! `moe_backend`), chosen once and shared by every sparse layer.

use kernel_runtime::Tensor;

use crate::causal_lm::within_sliding_window;
use crate::config::ModelConfig;
use crate::ctx::AttnBackend;
use crate::decoder::{Decoder, DecoderMlp};
use crate::error::Result;
use crate::layers::{AttnOptions, GatedMlp, PreNorm, RouterProbe, SparseMoeBlock};
use crate::moe_backend::MoeBackendKind;
use crate::weights::{VarBuilder, Weights};

/// The MLP of one decoder layer (`Qwen3MoeDecoderLayer.mlp`).
#[derive(Debug)]
enum Qwen3MoeMlp {
    Dense(GatedMlp),
    Sparse(SparseMoeBlock),
}

impl DecoderMlp for Qwen3MoeMlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Qwen3MoeMlp::Dense(mlp) => mlp.forward(x),
            Qwen3MoeMlp::Sparse(moe) => moe.forward(x),
        }
    }

    /// A dense layer takes the pre-norm step into its gate_up projection; a sparse
    /// one normalises first (its router and experts both read the normed rows).
    fn forward_prenorm(&self, pre: PreNorm<'_>) -> Result<(Tensor, Tensor)> {
        match self {
            Qwen3MoeMlp::Dense(mlp) => mlp.forward_prenorm(pre),
            Qwen3MoeMlp::Sparse(moe) => {
                let (x, residual) = pre.apply()?;
                Ok((moe.forward(&x)?, residual))
            }
        }
    }

    /// Dense layers, and sparse ones on the fused backend (launches sized by the
    /// row count, routing read on the device); the naive backend reads the
    /// routing back to the host, so its layers run eagerly.
    fn graph_capturable(&self) -> bool {
        match self {
            Qwen3MoeMlp::Dense(_) => true,
            Qwen3MoeMlp::Sparse(moe) => moe.graph_capturable(),
        }
    }
}

/// `Qwen3MoeForCausalLM`: the shared [`Decoder`] with Qwen3's attention and an
/// MLP per layer that is sparse or dense.
#[derive(Debug)]
pub struct Qwen3MoeForCausalLM {
    decoder: Decoder<Qwen3MoeMlp>,
    moe: MoeBackendKind,
    probe: RouterProbe,
}

impl Qwen3MoeForCausalLM {
    /// Loads Qwen3-MoE with its sparse layers on the `moe` backend.
    pub fn load(
        config: &ModelConfig,
        weights: &Weights,
        attn: Box<dyn AttnBackend>,
        moe: MoeBackendKind,
    ) -> Result<Self> {
        if config.moe.is_none() {
            return Err(
                config.unsupported("Qwen3MoeForCausalLM needs num_experts (or num_local_experts) in config.json")
            );
        }
        // Fused by default, naive where the fused kernels cannot run the experts.
        let moe = match config.moe.as_ref() {
            Some(m) => {
                // The experts' intermediate size on this rank (all of it with one).
                let local_i = m.moe_intermediate_size / weights.tp().shard().size();
                let (kind, why) = moe.resolve(weights.device(), weights.dtype(), config.hidden_size, local_i);
                if let Some(why) = why {
                    log::warn!("{why}; running the experts on --moe naive");
                }
                kind
            }
            None => moe,
        };
        let config =
            &within_sliding_window(config, config.use_sliding_window.then_some(config.sliding_window).flatten());
        let options = AttnOptions { qkv_bias: config.attention_bias, o_bias: config.attention_bias, qk_norm: true };
        let probe = RouterProbe::default();
        let load_mlp = &|vb: &VarBuilder<'_>, layer_idx: usize| {
            let sparse = config.moe.as_ref().is_some_and(|m| m.is_sparse_layer(layer_idx));
            Ok(if sparse {
                Qwen3MoeMlp::Sparse(SparseMoeBlock::load(vb, config, moe, probe.clone())?)
            } else {
                Qwen3MoeMlp::Dense(GatedMlp::load(vb, config, config.intermediate_size)?)
            })
        };
        let decoder = Decoder::load(config, weights, attn, options, load_mlp)?;
        Ok(Qwen3MoeForCausalLM { decoder, moe, probe })
    }

    /// The MoE backend the sparse layers run on.
    pub fn moe_backend(&self) -> MoeBackendKind {
        self.moe
    }

    /// The probe of how close each token's routing came to a tie (see
    /// [`RouterProbe`]), shared by every sparse layer.
    pub fn router_probe(&self) -> &RouterProbe {
        &self.probe
    }
}

crate::causal_lm::delegate_causal_lm!(Qwen3MoeForCausalLM, decoder);
