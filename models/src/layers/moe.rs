//! The sparse MoE block of Qwen3-MoE (`Qwen3MoeSparseMoeBlock`): a router
//! (`gate`, a bias-free linear to one logit per expert) and `num_experts` gated
//! MLPs of `moe_intermediate_size`, each token running through its top-k experts.
//!
//! The experts are held packed, as the fused kernels read them: `w13`
//! `[E, 2I, H]` (expert e's gate rows, then its up rows, as the dense
//! `gate_up_proj`) and `w2` `[E, H, I]`. They are loaded from the checkpoint's
//! packed tensors when it has them (`mlp.experts.gate_up_proj` /
//! `mlp.experts.down_proj`: GGUF files, transformers-5 checkpoints, and the dummy
//! loader, which then makes one random tensor per layer), else packed at load
//! from the per-expert tensors `mlp.experts.{e}.{gate,up,down}_proj.weight` of HF
//! checkpoints.
//!
//! Under tensor parallelism every rank holds every expert, each cut by its
//! intermediate size (vLLM's and SGLang's MoE TP): a rank's `w13` has its gate
//! and up rows `[E, 2I/tp, H]`, its `w2` the matching columns `[E, H, I/tp]`, and
//! the block's output is all-reduced. The router is replicated, so every rank
//! routes every token the same way.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use kernel_runtime::{ops, Tensor};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::layers::linear::Linear;
use crate::moe_backend::MoeBackendKind;
use crate::tp::TpGroup;
use crate::weights::{Slice, VarBuilder};

/// `Qwen3MoeSparseMoeBlock`.
#[derive(Debug, Clone)]
pub struct SparseMoeBlock {
    gate: Linear,
    /// `[E, 2I, H]`: per expert, gate rows then up rows (`I` this rank's part).
    w13: Tensor,
    /// `[E, H, I]`.
    w2: Tensor,
    tp: TpGroup,
    top_k: usize,
    norm_topk_prob: bool,
    backend: MoeBackendKind,
    probe: RouterProbe,
}

/// Records, when switched on, how close each token's routing came to a tie: the
/// gap between its `top_k`-th and `(top_k + 1)`-th router logit, the least over
/// every sparse layer that saw the token. One probe is shared by the layers of a
/// model ([`crate::qwen3_moe::Qwen3MoeForCausalLM::router_probe`]).
///
/// Why: a near-tie is where a rounding of the hidden state (bf16 activations)
/// picks another expert, and that token's output then changes wholesale rather
/// than by a rounding; tests comparing a bf16 run against an exact reference use
/// the probe (on the exact run) to tell such steps from bugs. Off, it costs
/// nothing; on, each sparse layer copies its router logits to the host.
#[derive(Debug, Clone, Default)]
pub struct RouterProbe {
    margins: Arc<Mutex<Option<Vec<f32>>>>,
}

impl RouterProbe {
    /// Starts recording (clearing what was recorded).
    pub fn start(&self) {
        *self.lock() = Some(Vec::new());
    }

    /// Stops recording and returns the least margin of each token of the forward
    /// passes since [`RouterProbe::start`] (one entry per token of the last pass).
    pub fn finish(&self) -> Vec<f32> {
        self.lock().take().unwrap_or_default()
    }

    /// Whether it records (between [`RouterProbe::start`] and [`RouterProbe::finish`]).
    fn recording(&self) -> bool {
        self.lock().is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<f32>>> {
        // A panic elsewhere while holding the lock leaves only numbers behind.
        self.margins.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, router_logits: &Tensor, top_k: usize) -> Result<()> {
        let mut guard = self.lock();
        let Some(margins) = guard.as_mut() else { return Ok(()) };
        let experts = router_logits.shape()[1];
        if top_k >= experts {
            return Ok(());
        }
        let logits = router_logits.to_f32_vec()?;
        let tokens = logits.len() / experts;
        if margins.len() != tokens {
            *margins = vec![f32::INFINITY; tokens];
        }
        for (margin, row) in margins.iter_mut().zip(logits.chunks_exact(experts)) {
            let mut sorted = row.to_vec();
            sorted.sort_by(|a, b| b.total_cmp(a));
            *margin = margin.min(sorted[top_k - 1] - sorted[top_k]);
        }
        Ok(())
    }
}

impl SparseMoeBlock {
    /// Loads the router and the experts under `vb` (`...mlp`) for `config`'s MoE
    /// settings, to run with `backend` (checked here against the shapes, dtype and
    /// device).
    pub fn load(
        vb: &VarBuilder<'_>,
        config: &ModelConfig,
        backend: MoeBackendKind,
        probe: RouterProbe,
    ) -> Result<SparseMoeBlock> {
        let moe = config
            .moe
            .as_ref()
            .ok_or_else(|| config.unsupported("a sparse MoE layer needs num_experts in config.json"))?;
        if !matches!(config.hidden_act.as_str(), "silu" | "swish") {
            return Err(
                config.unsupported(format!("hidden_act `{}` is not supported (supported: silu)", config.hidden_act))
            );
        }
        let (e, h, i) = (moe.num_experts, config.hidden_size, moe.moe_intermediate_size);
        let cols = vb.split(i, "moe_intermediate_size")?;
        backend.check(vb.device(), vb.dtype(), h, cols.len()).map_err(|m| config.unsupported(m))?;
        let (w13, w2) = load_experts(vb, e, h, i, cols)?;
        Ok(SparseMoeBlock {
            gate: Linear::load(vb, "gate", h, e, false)?,
            w13,
            w2,
            tp: vb.tp().clone(),
            top_k: moe.num_experts_per_tok,
            norm_topk_prob: moe.norm_topk_prob,
            backend,
            probe,
        })
    }

    /// `x` `[t, hidden]` to a new `[t, hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = if self.backend == MoeBackendKind::Fused && !self.probe.recording() {
            // The router's GEMM inside the op, which can fuse it with the routing.
            let (w, k, norm) = (self.gate.weight(), self.top_k, self.norm_topk_prob);
            ops::fused_moe_routed(x, w, &self.w13, &self.w2, k, norm)?
        } else {
            let router_logits = self.gate.forward(x)?;
            self.probe.record(&router_logits, self.top_k)?;
            self.backend.forward(x, &router_logits, &self.w13, &self.w2, self.top_k, self.norm_topk_prob)?
        };
        self.tp.all_reduce(&y)?;
        Ok(y)
    }

    /// Whether its forward pass can be captured in a CUDA graph: the fused
    /// kernels size every launch from the row count and read the routing on the
    /// device; the naive backend copies the routing to the host. (The router
    /// probe records in eager passes only.)
    pub fn graph_capturable(&self) -> bool {
        self.backend == MoeBackendKind::Fused
    }

    /// The packed experts `(w13 [E, 2I, H], w2 [E, H, I])`.
    pub fn experts(&self) -> (&Tensor, &Tensor) {
        (&self.w13, &self.w2)
    }
}

/// The packed expert weights of one layer (see the module docs), with this
/// rank's intermediate columns `cols` of `i`.
fn load_experts(vb: &VarBuilder<'_>, e: usize, h: usize, i: usize, cols: Range<usize>) -> Result<(Tensor, Tensor)> {
    let il = cols.len();
    let split = il != i;
    match vb.get_slice("experts.down_proj", &[e, h, i], split.then(|| Slice::of(2, cols.clone()))) {
        Ok(w2) => {
            if !split {
                return Ok((vb.get("experts.gate_up_proj", &[e, 2 * i, h])?, w2));
            }
            // The rank's gate rows and up rows of each expert, side by side.
            let full = [e, 2 * i, h];
            let gate = vb.get_slice("experts.gate_up_proj", &full, Some(Slice::of(1, cols.clone())))?;
            let up = vb.get_slice("experts.gate_up_proj", &full, Some(Slice::of(1, i + cols.start..i + cols.end)))?;
            let w13 = Tensor::empty(&[e, 2 * il, h], vb.dtype(), vb.device())?;
            ops::copy(&w13.narrow(1, 0, il)?, &gate)?;
            ops::copy(&w13.narrow(1, il, il)?, &up)?;
            return Ok((w13, w2));
        }
        Err(ModelError::MissingTensor { .. }) => {}
        Err(other) => return Err(other),
    }
    let w13 = Tensor::empty(&[e, 2 * il, h], vb.dtype(), vb.device())?;
    let w2 = Tensor::empty(&[e, h, il], vb.dtype(), vb.device())?;
    for expert in 0..e {
        let ev = vb.pp(format!("experts.{expert}"));
        let gate_up = ev.get_merged_slices("gate_up_proj", "weight", &[(i, cols.clone()), (i, cols.clone())], &[h])?;
        ops::copy(&w13.narrow(0, expert, 1)?.reshape(&[2 * il, h])?, &gate_up)?;
        let down = ev.get_slice("down_proj.weight", &[h, i], split.then(|| Slice::of(1, cols.clone())))?;
        ops::copy(&w2.narrow(0, expert, 1)?.reshape(&[h, il])?, &down)?;
    }
    Ok((w13, w2))
}
