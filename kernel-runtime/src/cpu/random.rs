//! The CPU reference of `fill_uniform` (csrc/kernels/random.cu): the same
//! counter-based values, bit for bit, so that dummy weights made on the host and
//! on a GPU are one model.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Elements per rayon task.
const CHUNK: usize = 1 << 16;

fn splitmix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Element `i` of a fill: `center + half_width * (2 u - 1)`, `u` the top 24 bits
/// of `splitmix64(seed + (i + 1) * golden)` over 2^24, in f32 (no fused
/// multiply-add, as the kernel spells it).
pub fn uniform_value(seed: u64, i: u64, center: f32, half_width: f32) -> f32 {
    let z = splitmix64(seed.wrapping_add(i.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let u = (z >> 40) as f32 * (1.0 / 16_777_216.0);
    center + half_width * (2.0 * u - 1.0)
}

/// Fills the contiguous host tensor `out` (f32, f16 or bf16; values rounded to
/// nearest even) with [`uniform_value`] of its element indices.
pub fn fill_uniform(out: &Tensor, seed: u64, center: f32, half_width: f32) -> Result<()> {
    fn fill<T: Send>(dst: &mut [T], seed: u64, center: f32, half_width: f32, conv: impl Fn(f32) -> T + Sync) {
        dst.par_chunks_mut(CHUNK).enumerate().for_each(|(c, chunk)| {
            let base = (c * CHUNK) as u64;
            for (j, v) in chunk.iter_mut().enumerate() {
                *v = conv(uniform_value(seed, base + j as u64, center, half_width));
            }
        });
    }
    // SAFETY: the caller (ops::fill_uniform) holds the only reference to `out`
    // for the call (ops' ordering rule); the span is the tensor's own elements.
    unsafe {
        match out.dtype() {
            DType::F32 => fill(out.host_slice_mut::<f32>()?, seed, center, half_width, |v| v),
            DType::F16 => fill(out.host_slice_mut::<f16>()?, seed, center, half_width, f16::from_f32),
            DType::BF16 => fill(out.host_slice_mut::<bf16>()?, seed, center, half_width, bf16::from_f32),
            other => return Err(Error::arg("fill_uniform", format!("argument `out` has dtype {other}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_uniform_in_the_range_and_depend_on_seed_and_index() {
        let n = 1 << 16;
        let vals: Vec<f32> = (0..n).map(|i| uniform_value(7, i, 1.0, 0.5)).collect();
        assert!(vals.iter().all(|v| (0.5..1.5).contains(v)));
        let mean = vals.iter().sum::<f32>() / n as f32;
        let var = vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
        assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
        // Uniform on [-a, a): variance a^2 / 3.
        assert!((var - 0.25 / 3.0).abs() < 0.003, "variance {var}");
        assert_ne!(uniform_value(7, 0, 0.0, 1.0), uniform_value(8, 0, 0.0, 1.0));
        assert_ne!(uniform_value(7, 0, 0.0, 1.0), uniform_value(7, 1, 0.0, 1.0));
    }

    #[test]
    fn a_fill_is_the_values_rounded_to_the_dtype() {
        let t = Tensor::zeros(&[3, 100_000], DType::BF16, crate::Device::Cpu).unwrap();
        fill_uniform(&t, 3, 0.0, 0.2).unwrap();
        let got = t.to_vec::<bf16>().unwrap();
        for i in [0usize, 1, 65_535, 65_536, 299_999] {
            assert_eq!(got[i], bf16::from_f32(uniform_value(3, i as u64, 0.0, 0.2)), "element {i}");
        }
    }
}
