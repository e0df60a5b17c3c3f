//! The MoE backend registry (`--moe`): how a sparse MoE layer runs its experts.
//!
//! The backend is a closed set ([`MoeBackendKind`]), parsed from `--moe`, checked
//! once when the model is loaded ([`MoeBackendKind::check`]: a backend that
//! cannot run the layer's shapes fails then, not at the first request) and handed
//! to every MoE layer, which calls [`MoeBackendKind::forward`].
//!
//! | name | CUDA | CPU |
//! | --- | --- | --- |
//! | `fused` | `ops::fused_moe`: router top-k (with the sort, for decode), sort by expert, two grouped tensor-core GEMMs (SiLU-and-mul and the routing weight fused into their epilogues), top-k sum; bf16/f16, hidden and intermediate sizes multiples of 8 (a k that is not a multiple of a tile's stage zero-fills its last stage) | the fused op's f32 reference (`cpu::moe`): there is nothing to fuse on the CPU, so it runs the same math as `naive` one expert at a time |
//! | `naive` | `ops::moe_route`, then per expert `embedding` (gather), `linear`, `silu_mul`, `linear`, and a weighted `moe_sum`: the reference of the fused kernels, any dtype and shape | the same, on the CPU reference ops |
//!
//! `fused` is the default on CUDA; both give the same results on the CPU within
//! f32 rounding, and within bf16 rounding of the intermediates on CUDA.

use std::fmt;
use std::str::FromStr;

use kernel_runtime::{ops, DType, Device, Tensor};

/// The MoE implementations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MoeBackendKind {
    /// The fused MoE kernels (CUDA; the f32 reference on the CPU).
    Fused,
    /// One expert at a time with the dense ops.
    Naive,
}

/// Every backend: kind and `--moe` name.
pub const MOE_BACKENDS: &[(MoeBackendKind, &str)] =
    &[(MoeBackendKind::Fused, "fused"), (MoeBackendKind::Naive, "naive")];

fn supported() -> String {
    MOE_BACKENDS.iter().map(|b| b.1).collect::<Vec<_>>().join(", ")
}

impl MoeBackendKind {
    /// The `--moe` name.
    pub fn name(self) -> &'static str {
        MOE_BACKENDS.iter().find(|b| b.0 == self).map_or("?", |b| b.1)
    }

    /// Whether this backend runs experts of `hidden` x `inter` in `dtype` on
    /// `device`; the reason (naming `--moe` and the way out) when it does not.
    pub fn check(self, device: Device, dtype: DType, hidden: usize, inter: usize) -> Result<(), String> {
        match (self, device) {
            (MoeBackendKind::Fused, Device::Cuda(_)) => {
                ops::moe::fused_experts_support(dtype, hidden, inter).map_err(|why| {
                    let way_out = if matches!(dtype, DType::BF16 | DType::F16) {
                        "use --moe naive"
                    } else {
                        "use --moe naive, or --dtype bf16"
                    };
                    format!("--moe fused: {why} ({way_out})")
                })
            }
            _ => Ok(()),
        }
    }

    /// The backend to load with: this one, or the naive backend when this is
    /// the fused one and its kernels cannot run the experts (`hidden` x `inter`
    /// in `dtype` on `device`), with the reason for the log. The naive backend
    /// runs any shape and dtype, so a model never fails to load over it.
    pub fn resolve(
        self,
        device: Device,
        dtype: DType,
        hidden: usize,
        inter: usize,
    ) -> (MoeBackendKind, Option<String>) {
        match self.check(device, dtype, hidden, inter) {
            Ok(()) => (self, None),
            Err(why) => (MoeBackendKind::Naive, Some(why)),
        }
    }

    /// The experts of one layer: `x` `[t, H]`, `router_logits` `[t, E]`, `w13`
    /// `[E, 2I, H]` (gate rows then up rows per expert), `w2` `[E, H, I]`; each
    /// token goes to its `top_k` experts by router logit, weighted by their softmax
    /// probabilities (renormalised over the chosen ones when `renormalize`).
    /// Returns a new `[t, H]` tensor.
    pub fn forward(
        self,
        x: &Tensor,
        router_logits: &Tensor,
        w13: &Tensor,
        w2: &Tensor,
        top_k: usize,
        renormalize: bool,
    ) -> kernel_runtime::Result<Tensor> {
        match self {
            MoeBackendKind::Fused => ops::fused_moe(x, router_logits, w13, w2, top_k, renormalize),
            MoeBackendKind::Naive => {
                ops::naive_experts(x, w13, w2, &ops::moe_route(router_logits, top_k, renormalize)?)
            }
        }
    }
}

impl FromStr for MoeBackendKind {
    type Err = String;

    /// `fused` or `naive` (any case).
    fn from_str(s: &str) -> Result<MoeBackendKind, String> {
        let name = s.trim();
        MOE_BACKENDS
            .iter()
            .find(|b| b.1.eq_ignore_ascii_case(name))
            .map(|b| b.0)
            .ok_or_else(|| format!("unknown MoE backend `{name}` (supported: {})", supported()))
    }
}

impl fmt::Display for MoeBackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_unknown_ones_list_the_supported() {
        assert_eq!("fused".parse::<MoeBackendKind>(), Ok(MoeBackendKind::Fused));
        assert_eq!(" Naive ".parse::<MoeBackendKind>(), Ok(MoeBackendKind::Naive));
        let e = "triton".parse::<MoeBackendKind>().unwrap_err();
        assert!(e.contains("`triton`") && e.contains("supported: fused, naive"), "{e}");
        for (kind, name) in MOE_BACKENDS {
            assert_eq!(kind.to_string(), *name);
        }
    }

    #[test]
    fn fused_refuses_what_its_kernels_do_not_run() {
        let cuda = Device::Cuda(0);
        assert!(MoeBackendKind::Fused.check(cuda, DType::BF16, 2048, 768).is_ok());
        let e = MoeBackendKind::Fused.check(cuda, DType::F32, 2048, 768).unwrap_err();
        assert!(e.contains("--moe naive"), "{e}");
        assert!(MoeBackendKind::Fused.check(cuda, DType::BF16, 100, 768).is_err());
        assert!(MoeBackendKind::Fused.check(Device::Cpu, DType::F32, 100, 30).is_ok());
        assert!(MoeBackendKind::Naive.check(cuda, DType::F32, 100, 30).is_ok());
        // bf16 at an odd size: only the naive backend is the way out.
        let e = MoeBackendKind::Fused.check(cuda, DType::BF16, 100, 768).unwrap_err();
        assert!(e.contains("--moe naive") && !e.contains("--dtype"), "{e}");
    }

    #[test]
    fn fused_falls_back_to_naive_for_what_it_cannot_run() {
        let cuda = Device::Cuda(0);
        assert_eq!(MoeBackendKind::Fused.resolve(cuda, DType::BF16, 2048, 768), (MoeBackendKind::Fused, None));
        // Multiples of 8 that no tile divides: the fused kernels' tail stages.
        assert_eq!(MoeBackendKind::Fused.resolve(cuda, DType::BF16, 2056, 776), (MoeBackendKind::Fused, None));
        let (kind, why) = MoeBackendKind::Fused.resolve(cuda, DType::BF16, 2052, 770);
        assert_eq!(kind, MoeBackendKind::Naive);
        assert!(why.is_some_and(|w| w.contains("multiples of 8")));
        assert_eq!(MoeBackendKind::Fused.resolve(cuda, DType::F32, 2048, 768).0, MoeBackendKind::Naive);
        assert_eq!(MoeBackendKind::Fused.resolve(Device::Cpu, DType::F32, 100, 30), (MoeBackendKind::Fused, None));
        assert_eq!(MoeBackendKind::Naive.resolve(cuda, DType::F32, 100, 30), (MoeBackendKind::Naive, None));
    }
}
