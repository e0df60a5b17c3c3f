//! `fill_uniform`: deterministic uniform values, the same on every device (dummy
//! weights; csrc/kernels/random.cu and its reference `cpu::random`).

use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// Fills `out` (contiguous, f32/f16/bf16, any shape) in place with
/// `center + half_width * (2 u - 1)`, `u` in [0, 1) a counter-based function of
/// `seed` and the element's index: the same values on the CPU and on CUDA, for
/// any launch shape. `half_width` must be finite and non-negative.
pub fn fill_uniform(out: &Tensor, seed: u64, center: f32, half_width: f32) -> Result<()> {
    const OP: &str = "fill_uniform";
    out.expect_dtype(OP, "out", &[DType::F32, DType::F16, DType::BF16])?.expect_contiguous(OP, "out")?;
    if !(center.is_finite() && half_width.is_finite() && half_width >= 0.0) {
        return Err(crate::error::Error::arg(
            OP,
            format!("center {center} and half_width {half_width} must be finite, half_width >= 0"),
        ));
    }
    if out.numel() == 0 {
        return Ok(());
    }
    let flat = out.reshape(&[out.numel()])?;
    match out.device() {
        Device::Cpu => crate::cpu::random::fill_uniform(&flat, seed, center, half_width),
        Device::Cuda(_) => crate::gpu::fill_uniform(&flat, seed, center, half_width),
    }
}
