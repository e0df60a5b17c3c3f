//! The L2 prefetch of small decode steps: which weights a step asks the GPU's L2
//! cache to fetch ahead of the projection that reads them, and when.
//!
//! At small batch a decoder layer alternates projections bound by reading their
//! weights from HBM with stretches that leave HBM mostly idle: RoPE + KV store
//! and attention over a short cache, the norms. The prefetch (`ops::prefetch_l2`,
//! one small launch) fills those stretches:
//!
//! - right after the qkv projection, o_proj's weights and then, while the budget
//!   lasts, the MLP's, in the order the layer reads them (mode `attn` and
//!   `layer`); the first weight that does not fit ends the list, because a later
//!   one would be evicted by the larger reads before it;
//! - before the MLP, the next layer's qkv weights, if they fit beside what the
//!   MLP still has to read (mode `layer`).
//!
//! The budget is the share of the L2 that fetched weights not yet read may
//! occupy (three quarters of it by default), so that nothing fetched is evicted
//! before its projection runs. Steps of more than `max_rows` rows do not
//! prefetch: their attention reads enough KV to keep HBM busy on its own.
//!
//! Settings (read once, when a model loads): `MINISGL_L2_PREFETCH` = `0` | `attn` |
//! `layer`, `MINISGL_L2_PREFETCH_ROWS` (rows, at most), `MINISGL_L2_PREFETCH_MIB`.

use kernel_runtime::{Device, Tensor};

use crate::error::{ModelError, Result};

/// When a step prefetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PrefetchMode {
    /// Never.
    Off,
    /// During attention: o_proj and the MLP's weights.
    Attention,
    /// During attention, and the next layer's qkv weights before the MLP.
    Layer,
}

/// The prefetch settings of one loaded model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct L2Prefetch {
    mode: PrefetchMode,
    /// Steps of more rows do not prefetch.
    max_rows: usize,
    /// Bytes of fetched, not yet read weights the L2 may hold.
    budget: usize,
}

/// What one layer of one step prefetches.
#[derive(Debug, Default)]
pub(crate) struct LayerPrefetch<'a> {
    /// Enqueued right after the qkv projection.
    pub during_attention: Vec<&'a Tensor>,
    /// Enqueued after o_proj, before the MLP.
    pub before_mlp: Vec<&'a Tensor>,
}

const DEFAULT_MODE: PrefetchMode = PrefetchMode::Layer;
const DEFAULT_MAX_ROWS: usize = 16;

impl L2Prefetch {
    /// Never prefetches (the CPU, and devices whose L2 size is unknown).
    pub(crate) const OFF: L2Prefetch = L2Prefetch { mode: PrefetchMode::Off, max_rows: 0, budget: 0 };

    /// The settings for a model on `device`, from the environment.
    pub(crate) fn for_device(device: Device) -> Result<L2Prefetch> {
        let Device::Cuda(ordinal) = device else { return Ok(L2Prefetch::OFF) };
        let l2 = kernel_runtime::cuda::device(ordinal)?.l2_cache_bytes();
        let var = |name| std::env::var(name).ok();
        L2Prefetch::parse(
            var("MINISGL_L2_PREFETCH").as_deref(),
            var("MINISGL_L2_PREFETCH_ROWS").as_deref(),
            var("MINISGL_L2_PREFETCH_MIB").as_deref(),
            l2,
        )
    }

    /// The settings from the three variables' values (`None`: unset) and the L2 size.
    fn parse(mode: Option<&str>, rows: Option<&str>, mib: Option<&str>, l2_bytes: usize) -> Result<L2Prefetch> {
        let invalid = |var: &'static str, message: String| ModelError::InvalidSetting { var, message };
        let mode = match mode.map(str::trim) {
            None | Some("") => DEFAULT_MODE,
            Some("0" | "off") => PrefetchMode::Off,
            Some("attn") => PrefetchMode::Attention,
            Some("1" | "layer") => PrefetchMode::Layer,
            Some(other) => {
                return Err(invalid("MINISGL_L2_PREFETCH", format!("expected 0, attn or layer, got `{other}`")))
            }
        };
        let number = |var: &'static str, value: Option<&str>| -> Result<Option<usize>> {
            value
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(|v| v.parse::<usize>().map_err(|_| invalid(var, format!("expected a whole number, got `{v}`"))))
                .transpose()
        };
        let max_rows = number("MINISGL_L2_PREFETCH_ROWS", rows)?.unwrap_or(DEFAULT_MAX_ROWS);
        let budget = match number("MINISGL_L2_PREFETCH_MIB", mib)? {
            Some(mib) => {
                mib.checked_mul(1 << 20).ok_or_else(|| invalid("MINISGL_L2_PREFETCH_MIB", "too large".into()))?
            }
            None => l2_bytes / 4 * 3,
        };
        if budget == 0 {
            return Ok(L2Prefetch::OFF);
        }
        Ok(L2Prefetch { mode, max_rows, budget })
    }

    /// What a layer of a step of `rows` rows prefetches: `o_proj` and `mlp` are its
    /// weights in the order it reads them after qkv, `next_qkv` the next layer's.
    pub(crate) fn layer<'a>(
        &self,
        rows: usize,
        o_proj: &'a Tensor,
        mlp: &[&'a Tensor],
        next_qkv: Option<&'a Tensor>,
    ) -> LayerPrefetch<'a> {
        let sized = |t: &'a Tensor| (t, t.numel() * t.dtype().size_in_bytes());
        let mlp: Vec<_> = mlp.iter().map(|&t| sized(t)).collect();
        let (during_attention, before_mlp) = self.choose(rows, sized(o_proj), &mlp, next_qkv.map(sized));
        LayerPrefetch { during_attention, before_mlp }
    }

    /// [`L2Prefetch::layer`] over `(weight, bytes)` pairs.
    fn choose<T: Copy>(
        &self,
        rows: usize,
        o_proj: (T, usize),
        mlp: &[(T, usize)],
        next_qkv: Option<(T, usize)>,
    ) -> (Vec<T>, Vec<T>) {
        let (mut during_attention, mut before_mlp) = (Vec::new(), Vec::new());
        if self.mode == PrefetchMode::Off || rows == 0 || rows > self.max_rows {
            return (during_attention, before_mlp);
        }
        let mut fetched = 0;
        for &(w, bytes) in std::iter::once(&o_proj).chain(mlp) {
            if fetched + bytes > self.budget {
                break;
            }
            fetched += bytes;
            during_attention.push(w);
        }
        if self.mode == PrefetchMode::Layer && !during_attention.is_empty() {
            if let Some((qkv, bytes)) = next_qkv {
                // When the MLP starts, o_proj has been read; the MLP's fetched weights wait.
                if fetched - o_proj.1 + bytes <= self.budget {
                    before_mlp.push(qkv);
                }
            }
        }
        (during_attention, before_mlp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// A bf16 `[out, in]` weight's name and bytes.
    fn w(name: &'static str, out: usize, inp: usize) -> (&'static str, usize) {
        (name, out * inp * 2)
    }

    #[test]
    fn settings_parse_with_clear_errors() {
        let l2 = 50 * MIB;
        let p = L2Prefetch::parse(None, None, None, l2).unwrap();
        assert_eq!(p, L2Prefetch { mode: DEFAULT_MODE, max_rows: DEFAULT_MAX_ROWS, budget: l2 / 4 * 3 });
        assert_eq!(L2Prefetch::parse(Some("attn"), Some(" 64 "), Some("10"), l2).unwrap().budget, 10 * MIB);
        assert_eq!(L2Prefetch::parse(Some("0"), None, None, l2).unwrap().mode, PrefetchMode::Off);
        assert_eq!(L2Prefetch::parse(None, None, None, 0).unwrap(), L2Prefetch::OFF);
        let err = L2Prefetch::parse(Some("all"), None, None, l2).unwrap_err().to_string();
        assert!(err.contains("MINISGL_L2_PREFETCH") && err.contains("`all`"), "{err}");
        let err = L2Prefetch::parse(None, Some("-1"), None, l2).unwrap_err().to_string();
        assert!(err.contains("MINISGL_L2_PREFETCH_ROWS"), "{err}");
    }

    #[test]
    fn a_small_model_fetches_its_whole_layer_ahead() {
        // Qwen3-0.6B: o 4 MiB, gate_up 12 MiB, down 6 MiB, qkv 8 MiB; a 50 MiB L2.
        let (o, gu, down, qkv) = (w("o", 1024, 2048), w("gu", 6144, 1024), w("down", 1024, 3072), w("qkv", 4096, 1024));
        let p = L2Prefetch::parse(None, None, None, 50 * MIB).unwrap();
        assert_eq!(p.choose(1, o, &[gu, down], Some(qkv)), (vec!["o", "gu", "down"], vec!["qkv"]));
        // The last layer has no next qkv; a batch past the row limit fetches nothing.
        assert_eq!(p.choose(16, o, &[gu, down], None), (vec!["o", "gu", "down"], vec![]));
        assert_eq!(p.choose(17, o, &[gu, down], Some(qkv)), (vec![], vec![]));
        // `attn` never fetches the next layer's weights; `0` nothing.
        let attn = L2Prefetch::parse(Some("attn"), None, None, 50 * MIB).unwrap();
        assert_eq!(attn.choose(1, o, &[gu, down], Some(qkv)).1, Vec::<&str>::new());
        let off = L2Prefetch::parse(Some("0"), None, None, 50 * MIB).unwrap();
        assert_eq!(off.choose(1, o, &[gu, down], Some(qkv)), (vec![], vec![]));
    }

    #[test]
    fn a_large_model_fetches_what_fits_in_read_order() {
        // Llama-3-8B: o 32 MiB fits a 37.5 MiB budget, gate_up (224 MiB) does not, so
        // down (read after it) is not fetched either; the next qkv (48 MiB) never fits.
        let (o, gu, down, qkv) =
            (w("o", 4096, 4096), w("gu", 28672, 4096), w("down", 4096, 14336), w("qkv", 6144, 4096));
        let p = L2Prefetch::parse(None, None, None, 50 * MIB).unwrap();
        assert_eq!(p.choose(1, o, &[gu, down], Some(qkv)), (vec!["o"], vec![]));
        // With a budget below o_proj nothing is fetched at all.
        let small = L2Prefetch::parse(None, None, Some("16"), 50 * MIB).unwrap();
        assert_eq!(small.choose(1, o, &[gu, down], Some(qkv)), (vec![], vec![]));
        // Qwen3-30B-A3B: o 16 MiB and the router (0.5 MiB) during attention; the next
        // qkv (20 MiB) beside the router before the experts.
        let (o, router, qkv) = (w("o", 2048, 4096), w("router", 128, 2048), w("qkv", 5120, 2048));
        assert_eq!(p.choose(1, o, &[router], Some(qkv)), (vec!["o", "router"], vec!["qkv"]));
    }
}
