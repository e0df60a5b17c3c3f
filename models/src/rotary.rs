//! Rotary position embedding: the cos/sin table `ops::rope` reads, for plain,
//! linear, LLaMA-3 and YaRN scaled RoPE.
//!
//! The table is `[max_position_embeddings, rotary_dim]` f32, row p holding
//! `cos(p * inv_freq)` in its first half and `sin(p * inv_freq)` in its second
//! half; it is built once per model and shared by every layer. Scaling variants
//! differ only in `inv_freq` (and YaRN in a factor on cos and sin), so they are
//! all a function from the config to the inverse frequencies and that factor, as
//! in transformers' `ROPE_INIT_FUNCTIONS`.
//!
//! Precision follows transformers (and vLLM) rather than exact arithmetic, so
//! that long positions agree with the reference: the inverse frequencies are
//! computed in f64 and rounded to f32 (transformers keeps them in an f32 buffer;
//! or to `RopeConfig::inv_freq_dtype` when emulating a model cast to bf16/f16
//! after construction), the angle `p * inv_freq` is rounded to f32 (transformers
//! multiplies in f32 with autocast disabled), and its cos and sin are taken in
//! f64 and rounded once.

use half::{bf16, f16};
use kernel_runtime::{ops, DType, Device, Tensor};

use crate::config::{ModelConfig, RopeConfig, RopeScaling};
use crate::error::{ModelError, Result};

/// The inverse frequencies of `rotary_dim` rotated dimensions (`rotary_dim / 2`
/// values), in f64 before the final rounding to f32.
///
/// Default: `1 / theta^(2i / rotary_dim)` (transformers'
/// `_compute_default_rope_parameters`); linear: that divided by the factor;
/// llama3: transformers' `_compute_llama3_parameters`, which keeps high
/// frequencies, divides low ones by the factor and blends in between.
pub fn inv_freq(rope: &RopeConfig, rotary_dim: usize) -> Vec<f64> {
    let base: Vec<f64> =
        (0..rotary_dim / 2).map(|i| 1.0 / rope.theta.powf((2 * i) as f64 / rotary_dim as f64)).collect();
    match rope.scaling {
        RopeScaling::Default => base,
        RopeScaling::Linear { factor } => base.into_iter().map(|f| f / factor).collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old_context,
        } => {
            let low_freq_wavelen = old_context / low_freq_factor;
            let high_freq_wavelen = old_context / high_freq_factor;
            base.into_iter()
                .map(|f| {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings: old_context,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => {
            // The dimension whose frequency turns `rotations` times over the
            // original context (YaRN's correction dimension).
            let dim = rotary_dim as f64;
            let correction_dim = |rotations: f64| {
                dim * (old_context / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * rope.theta.ln())
            };
            let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
            if truncate {
                (low, high) = (low.floor(), high.ceil());
            }
            let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
            if low == high {
                high += 0.001; // as the reference does, to avoid 0 / 0
            }
            base.into_iter()
                .enumerate()
                .map(|(i, f)| {
                    // 0 below `low` (keep the frequency), 1 above `high` (interpolate).
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    f / factor * (1.0 - extrapolation) + f * extrapolation
                })
                .collect()
        }
    }
}

/// The factor on cos and sin (YaRN's attention scaling; 1 otherwise).
pub fn attention_scaling(rope: &RopeConfig) -> f64 {
    match rope.scaling {
        RopeScaling::Yarn { attention_factor, .. } => attention_factor,
        _ => 1.0,
    }
}

/// The row-major `[max_positions, rotary_dim]` table (cos half, then sin half).
pub fn cos_sin_table(rope: &RopeConfig, rotary_dim: usize, max_positions: usize) -> Vec<f32> {
    let round: fn(f32) -> f32 = match rope.inv_freq_dtype {
        DType::BF16 => |f| bf16::from_f32(f).to_f32(),
        DType::F16 => |f| f16::from_f32(f).to_f32(),
        _ => |f| f,
    };
    let inv_freq: Vec<f32> = inv_freq(rope, rotary_dim).into_iter().map(|f| round(f as f32)).collect();
    let half = rotary_dim / 2;
    let scale = attention_scaling(rope);
    let mut table = vec![0f32; max_positions * rotary_dim];
    for (p, row) in table.chunks_exact_mut(rotary_dim.max(1)).enumerate() {
        let (cos, sin) = row.split_at_mut(half);
        for (i, &f) in inv_freq.iter().enumerate() {
            let angle = f64::from(p as f32 * f);
            cos[i] = (angle.cos() * scale) as f32;
            sin[i] = (angle.sin() * scale) as f32;
        }
    }
    table
}

/// The largest cos/sin table built (2^28 f32 values, 1 GiB): a 1M-token
/// context with 128 rotated dimensions fits.
pub const MAX_TABLE_ELEMENTS: usize = 1 << 28;

/// The rotary embedding of one model: its cos/sin table on the device.
///
/// Cloning shares the table (tensors are reference-counted), so every attention
/// layer holds its own handle to the one table.
#[derive(Debug, Clone)]
pub struct RotaryEmbedding {
    cos_sin: Tensor,
    rotary_dim: usize,
}

impl RotaryEmbedding {
    /// Builds the table for `config` (its `max_position_embeddings` rows) on `device`.
    pub fn new(config: &ModelConfig, device: Device) -> Result<RotaryEmbedding> {
        let rotary_dim = config.rotary_dim();
        if rotary_dim == 0 || rotary_dim > config.head_dim {
            return Err(config.unsupported(format!("rotary dimension {rotary_dim} for head_dim {}", config.head_dim)));
        }
        let max_positions = config.max_position_embeddings;
        // The table is f32 on the device: bound it, so a long declared context
        // asks for --max-model-len instead of an allocation that aborts.
        if max_positions.checked_mul(rotary_dim).is_none_or(|n| n > MAX_TABLE_ELEMENTS) {
            return Err(config.unsupported(format!(
                "a rotary table of {max_positions} positions x {rotary_dim} dimensions exceeds {MAX_TABLE_ELEMENTS} \
                 values (1 GiB); serve a shorter context with --max-model-len"
            )));
        }
        let table = cos_sin_table(&config.rope, rotary_dim, max_positions);
        let cos_sin = Tensor::from_slice(&table, &[max_positions, rotary_dim], device).map_err(ModelError::from)?;
        Ok(RotaryEmbedding { cos_sin, rotary_dim })
    }

    /// The `[max_positions, rotary_dim]` f32 table.
    pub fn cos_sin(&self) -> &Tensor {
        &self.cos_sin
    }

    /// Rotated dimensions per head.
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// Rotates `q` `[t, heads_q, d]` and `k` `[t, heads_k, d]` in place by `positions` `[t]`.
    pub fn forward(&self, q: &Tensor, k: &Tensor, positions: &Tensor) -> Result<()> {
        Ok(ops::rope(q, k, positions, &self.cos_sin)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(scaling: RopeScaling) -> RopeConfig {
        RopeConfig { theta: 500000.0, scaling, partial_rotary_factor: 1.0, inv_freq_dtype: DType::F32 }
    }

    #[test]
    fn default_inv_freq_and_table() {
        let f = inv_freq(&rope(RopeScaling::Default), 8);
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 500000f64.powf(-0.25)).abs() < 1e-15);
        let t = cos_sin_table(&rope(RopeScaling::Default), 8, 3);
        assert_eq!(&t[..8], &[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(t[2 * 8], 2f64.cos() as f32);
        assert_eq!(t[2 * 8 + 4], 2f64.sin() as f32);
    }

    #[test]
    fn llama3_scaling_matches_transformers() {
        // Llama-3.1-8B: theta 500000, head_dim 128, factor 8, low 1, high 4, 8192.
        let scaled = inv_freq(
            &rope(RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            }),
            128,
        );
        let plain = inv_freq(&rope(RopeScaling::Default), 128);
        // High frequencies (wavelength < 2048) are kept, low ones (> 8192) divided by 8.
        assert_eq!(scaled[0], plain[0]);
        assert_eq!(scaled[63], plain[63] / 8.0);
        // transformers' `_compute_llama3_parameters` replayed in numpy float32 (the
        // dtype it runs in), at high, medium (blended: 29..=34) and low frequencies.
        let want = [
            (0, 1.0f32),
            (20, 1.656044e-02),
            (29, 2.1665706e-03),
            (31, 8.5675146e-04),
            (34, 1.7850779e-04),
            (40, 3.4281024e-05),
            (63, 3.068926e-07),
        ];
        for (i, w) in want {
            let got = scaled[i] as f32;
            assert!((got - w).abs() <= w * 1e-6, "inv_freq[{i}] = {got}, transformers {w}");
        }
    }

    fn yarn(factor: f64, original: f64) -> RopeConfig {
        RopeConfig {
            theta: 1e6,
            scaling: RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: original,
                beta_fast: 32.0,
                beta_slow: 1.0,
                truncate: true,
                attention_factor: 0.1 * factor.ln() + 1.0,
            },
            partial_rotary_factor: 1.0,
            inv_freq_dtype: DType::F32,
        }
    }

    #[test]
    fn yarn_keeps_high_frequencies_interpolates_low_ones_and_scales_the_table() {
        // Qwen2.5's recipe: theta 1e6, head_dim 128, factor 4 over 32768. The
        // ramp runs over dimensions 23..=40 (correction dimensions 23.6 and
        // 39.65, floored and ceiled); the values are the reference's formula
        // evaluated in float64 with numpy.
        let f = inv_freq(&yarn(4.0, 32768.0), 128);
        let want = [
            (0, 1.0),
            (10, 0.1154781984689458),
            (23, 0.006978305848598663),
            (24, 0.005375321490790102),
            (30, 0.0010643609812470017),
            (39, 6.490394320837028e-05),
            (40, 4.445698525097307e-05),
            (63, 3.102344401879299e-07),
        ];
        for (i, w) in want {
            assert!((f[i] - w).abs() <= w * 1e-12, "inv_freq[{i}] = {}, want {w}", f[i]);
        }
        let plain6 = inv_freq(&RopeConfig { theta: 1e6, ..rope(RopeScaling::Default) }, 128);
        assert_eq!(f[..24], plain6[..24], "below the ramp the frequencies are kept");
        assert_eq!(f[63], plain6[63] / 4.0, "above it they are interpolated");
        // cos and sin carry the attention factor 0.1 ln 4 + 1.
        let t = cos_sin_table(&yarn(4.0, 32768.0), 128, 2);
        let scale = 0.1 * 4f64.ln() + 1.0;
        assert_eq!(t[0], scale as f32);
        assert_eq!(t[128 + 64], (1f64.sin() * scale) as f32);
    }

    #[test]
    fn linear_scaling_divides() {
        let plain = inv_freq(&rope(RopeScaling::Default), 64);
        let lin = inv_freq(&rope(RopeScaling::Linear { factor: 4.0 }), 64);
        for (a, b) in plain.iter().zip(&lin) {
            assert_eq!(a / 4.0, *b);
        }
    }

    #[test]
    fn inv_freq_can_be_rounded_like_a_cast_model() {
        let mut r = rope(RopeScaling::Default);
        let exact = cos_sin_table(&r, 64, 2);
        r.inv_freq_dtype = DType::BF16;
        let rounded = cos_sin_table(&r, 64, 2);
        // Row 1 holds cos(inv_freq): the bf16-rounded frequencies differ.
        let f = inv_freq(&r, 64)[5] as f32;
        assert_eq!(rounded[64 + 5], f64::from(bf16::from_f32(f).to_f32()).cos() as f32);
        assert_ne!(exact[64..], rounded[64..]);
    }
}
