//! `skinny_gemm`: `x @ w^T (+ bias)` through the decode GEMM kernel
//! (csrc/kernels/skinny_gemm.cu) whatever the dispatch rule says, its gated
//! variant `skinny_gemm_silu_mul` (a gate_up projection with SiLU-and-mul in the
//! epilogue), `skinny_tiled` (the pipelined kernel of mid batch sizes and large
//! weights, csrc/kernels/skinny_tiled.cu, with an explicit plan), `stream_gemm`
//! (the copy-engine kernel of large weights at m <= 16,
//! csrc/kernels/stream_gemm.cu), and the switches of the rules and of the
//! kernels' weight prefetch.
//! Models call [`super::linear`] and [`super::linear_silu_mul`], which pick the
//! kernels by rule on CUDA (see `gpu::skinny::plan`, `plan_gated`); these ops are
//! for tests and benchmarks.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

use super::check::common_device;

/// The operand checks the decode GEMM ops share: `x` `[m, k]` and `w` `[n, k]`
/// contiguous on one device, one 16-bit dtype, `bias` `[n]` contiguous of the same
/// dtype and device. Returns the device and `[m, n, k]`.
fn gemm_operands(op: &'static str, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<(Device, [usize; 3])> {
    let device = common_device(op, &[("x", x), ("w", w)])?;
    let [m, k] = x.dims::<2>(op, "x")?;
    let [n, wk] = w.dims::<2>(op, "w")?;
    if wk != k {
        return Err(Error::arg(
            op,
            format!("argument `w` has shape {:?}, expected [_, {k}] to match `x` {:?}", w.shape(), x.shape()),
        ));
    }
    x.expect_dtype(op, "x", &[DType::BF16, DType::F16])?;
    w.expect_dtype(op, "w", &[x.dtype()])?.expect_contiguous(op, "w")?;
    if let Some(b) = bias {
        b.expect_shape(op, "bias", &[n])?.expect_device(op, "bias", device)?.expect_dtype(op, "bias", &[x.dtype()])?;
        b.expect_contiguous(op, "bias")?;
    }
    Ok((device, [m, n, k]))
}

/// Forces the skinny path of [`super::linear`] on (`Some(true)`) or off
/// (`Some(false)`) for this process, or back to `MINISGL_SKINNY_GEMM` (`None`;
/// the path is on unless that variable is `0`). For A/B benchmarks.
pub fn set_skinny_gemm(on: Option<bool>) {
    crate::gpu::skinny::set_enabled(on);
}

/// Turns the skinny kernels' weight prefetch (staged in shared memory before
/// their grid dependency wait) on or off for this process, or back to
/// `MINISGL_SKINNY_PREFETCH` (`None`; on unless that variable is `0`). For A/B
/// benchmarks: results are the same bits either way.
pub fn set_skinny_prefetch(on: Option<bool>) {
    crate::gpu::skinny::set_prefetch(on);
}

/// Turns the skinny kernels' bulk prefetch (the block's whole slice of weights
/// copied into shared memory by the copy engine before the grid dependency wait,
/// on sm_90, where it fits) on or off for this process, or back to
/// `MINISGL_SKINNY_BULK` (`None`; on unless that variable is `0`). For A/B
/// benchmarks: results are the same bits either way.
pub fn set_skinny_bulk(on: Option<bool>) {
    crate::gpu::skinny::set_bulk(on);
}

/// Turns the pre-norm variant of the skinny kernel (the residual add and RMSNorm
/// in front of the projection, [`super::fused_add_rms_norm_linear`]) on or off for
/// this process, or back to `MINISGL_SKINNY_NORM` (`None`; on unless that
/// variable is `0`). For A/B benchmarks and tests.
pub fn set_skinny_norm(on: Option<bool>) {
    crate::gpu::skinny::set_norm(on);
}

/// Forces the tiled path of [`super::linear`] (the rule after the skinny one) on
/// or off for this process, or back to `MINISGL_SKINNY_TILED` (`None`; on unless
/// that variable is `0`). For A/B benchmarks.
pub fn set_skinny_tiled(on: Option<bool>) {
    crate::gpu::skinny_tiled::set_enabled(on);
}

pub use crate::gpu::skinny_tiled::TiledPlan;

/// The plan the tiled kernel's rule starts from for `m` rows of `[n, k]` weights
/// on `sms` SMs, before the `MINISGL_SKINNY_TILED_*` overrides (benchmarks sweep
/// around it; `gpu::skinny_tiled::default_plan` says why each choice).
pub fn skinny_tiled_default_plan(m: usize, n: usize, k: usize, sms: usize) -> TiledPlan {
    crate::gpu::skinny_tiled::default_plan(m, n, k, sms)
}

/// `x @ w^T (+ bias)` with the tiled skinny kernel: `x` `[m, k]` (m >= 1, unit
/// inner stride, rows 16-byte aligned), `w` `[n, k]` contiguous, `bias` `[n]`
/// contiguous, bf16/f16, `k` a multiple of 32; `plan` overrides the rule's plan
/// (whatever the rule's row limit). Returns a new `[m, n]`. On the CPU this is
/// the reference `linear`.
pub fn skinny_tiled(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, plan: Option<TiledPlan>) -> Result<Tensor> {
    const OP: &str = "skinny_tiled";
    let (device, [m, n, k]) = gemm_operands(OP, x, w, bias)?;
    if m == 0 || k == 0 || !k.is_multiple_of(32) {
        return Err(Error::arg(OP, format!("needs m >= 1 and k a positive multiple of 32, got x {:?}", x.shape())));
    }
    let out = Tensor::empty(&[m, n], x.dtype(), device)?;
    if n == 0 {
        return Ok(out);
    }
    match device {
        Device::Cpu => crate::cpu::dense::linear(&out, x, w, bias)?,
        Device::Cuda(_) => {
            let sms = x.cuda_device().map_or(1, |d| d.sm_count().max(1) as usize);
            let plan = plan.unwrap_or_else(|| crate::gpu::skinny_tiled::rule_plan(m, n, k, sms));
            crate::gpu::skinny_tiled::skinny_tiled(&out, x, w, bias, plan)?;
        }
    }
    Ok(out)
}

/// Forces the streaming path of [`super::linear`] (m <= 16 of large weights on
/// sm_90) on or off for this process, or back to `MINISGL_STREAM_GEMM` (`None`;
/// off unless that variable is `1` or `all`). For A/B benchmarks and tests.
pub fn set_stream_gemm(on: Option<bool>) {
    crate::gpu::stream_gemm::set_enabled(on);
}

pub use crate::gpu::stream_gemm::StreamPlan;

/// `x @ w^T (+ bias)` with the streaming kernel (csrc/kernels/stream_gemm.cu)
/// whatever the rule says: `x` `[m, k]` (1 <= m <= 16, unit inner stride, rows
/// 16-byte aligned), `w` `[n, k]` contiguous, `bias` `[n]` contiguous, bf16/f16,
/// `k` a multiple of 32, an sm_90 or newer GPU; `plan` overrides the default
/// (1024-wide stages, deepest ring, one block an SM, whole rows when k % 256 == 0). Returns a new `[m, n]`. On the CPU this is
/// the reference `linear`.
pub fn stream_gemm(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, plan: Option<StreamPlan>) -> Result<Tensor> {
    const OP: &str = "stream_gemm";
    let (device, [m, n, k]) = gemm_operands(OP, x, w, bias)?;
    if !(1..=crate::gpu::stream_gemm::MAX_ROWS).contains(&m) || k == 0 || !k.is_multiple_of(32) {
        return Err(Error::arg(
            OP,
            format!("needs 1..=16 rows and k a positive multiple of 32, got x {:?}", x.shape()),
        ));
    }
    let out = Tensor::empty(&[m, n], x.dtype(), device)?;
    if n == 0 {
        return Ok(out);
    }
    match device {
        Device::Cpu => crate::cpu::dense::linear(&out, x, w, bias)?,
        Device::Cuda(_) => {
            let sms = x.cuda_device().map_or(1, |d| d.sm_count().max(1) as usize);
            let plan = plan.unwrap_or_else(|| crate::gpu::stream_gemm::default_plan(m, n, k, sms));
            crate::gpu::stream_gemm::stream_gemm(&out, x, w, bias, plan)?;
        }
    }
    Ok(out)
}

/// `x @ w^T (+ bias)` with the skinny kernel: `x` `[m, k]` (1 <= m <= 16, unit
/// inner stride, rows 16-byte aligned), `w` `[n, k]` contiguous, `bias` `[n]`
/// contiguous, bf16/f16, `k` a multiple of 32; `m_tiles` (1 or 2) and `k_splits`
/// (1..=8, at most k / 32) override the rule's choices. Returns a new `[m, n]`. On
/// the CPU this is the reference `linear` (the kernel's contract is the same
/// function).
pub fn skinny_gemm(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    m_tiles: Option<usize>,
    k_splits: Option<usize>,
) -> Result<Tensor> {
    const OP: &str = "skinny_gemm";
    let (device, [m, n, k]) = gemm_operands(OP, x, w, bias)?;
    if !(1..=crate::gpu::skinny::MAX_ROWS).contains(&m) || k == 0 || !k.is_multiple_of(32) {
        return Err(Error::arg(
            OP,
            format!("needs 1..=16 rows and k a positive multiple of 32, got x {:?}", x.shape()),
        ));
    }
    if let Some(t) = m_tiles.filter(|t| !matches!(t, 1 | 2)) {
        return Err(Error::arg(OP, format!("m_tiles {t} must be 1 or 2")));
    }
    if let Some(s) = k_splits.filter(|&s| !(1..=8).contains(&s) || s > k / 32) {
        return Err(Error::arg(OP, format!("k_splits {s} must be 1..=8 and at most k / 32 = {}", k / 32)));
    }
    let out = Tensor::empty(&[m, n], x.dtype(), device)?;
    if n == 0 {
        return Ok(out);
    }
    match device {
        Device::Cpu => crate::cpu::dense::linear(&out, x, w, bias)?,
        Device::Cuda(_) => {
            let sms = x.cuda_device().map_or(1, |d| d.sm_count().max(1) as usize);
            let rule = crate::gpu::skinny::plan(m, n, k, x.dtype(), true, sms);
            let m_tiles = m_tiles.or(rule.map(|p| p.m_tiles)).unwrap_or(1);
            let k_splits = k_splits.or(rule.map(|p| p.k_splits)).unwrap_or(1);
            let plan = crate::gpu::skinny::SkinnyPlan { m_tiles, k_splits };
            crate::gpu::skinny::skinny_gemm(&out, x, w, bias, plan)?;
        }
    }
    Ok(out)
}

/// `silu(g) * u` of `[g | u] = x @ w^T (+ bias)` with the gated skinny kernel:
/// `x` `[m, k]` as [`skinny_gemm`] takes it, `w` `[2 i, k]` contiguous (the gate
/// rows, then the up rows), `bias` `[2 i]`; `m_tiles` (1: 8 outputs a block, 2:
/// 16) overrides the rule's choice. Returns a new `[m, i]`, the bits of
/// `silu_mul(skinny_gemm(x, w, bias))`. On the CPU this is the reference
/// `linear` then `silu_mul`.
pub fn skinny_gemm_silu_mul(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, m_tiles: Option<usize>) -> Result<Tensor> {
    const OP: &str = "skinny_gemm_silu_mul";
    let device = common_device(OP, &[("x", x), ("w", w)])?;
    let [m, k] = x.dims::<2>(OP, "x")?;
    let [n2, wk] = w.dims::<2>(OP, "w")?;
    if wk != k || !n2.is_multiple_of(2) {
        return Err(Error::arg(
            OP,
            format!("argument `w` has shape {:?}, expected [2 i, {k}] to match `x` {:?}", w.shape(), x.shape()),
        ));
    }
    x.expect_dtype(OP, "x", &[DType::BF16, DType::F16])?;
    w.expect_dtype(OP, "w", &[x.dtype()])?.expect_contiguous(OP, "w")?;
    if let Some(b) = bias {
        b.expect_shape(OP, "bias", &[n2])?.expect_device(OP, "bias", device)?.expect_dtype(OP, "bias", &[x.dtype()])?;
        b.expect_contiguous(OP, "bias")?;
    }
    if !(1..=crate::gpu::skinny::MAX_ROWS).contains(&m) || k == 0 || !k.is_multiple_of(32) {
        return Err(Error::arg(
            OP,
            format!("needs 1..=16 rows and k a positive multiple of 32, got x {:?}", x.shape()),
        ));
    }
    if let Some(t) = m_tiles.filter(|t| !matches!(t, 1 | 2)) {
        return Err(Error::arg(OP, format!("m_tiles {t} must be 1 or 2")));
    }
    match device {
        Device::Cpu => {
            let gate_up = Tensor::empty(&[m, n2], x.dtype(), device)?;
            crate::cpu::dense::linear(&gate_up, x, w, bias)?;
            let out = Tensor::empty(&[m, n2 / 2], x.dtype(), device)?;
            crate::cpu::dense::silu_mul(&out, &gate_up)?;
            Ok(out)
        }
        Device::Cuda(_) => {
            let out = Tensor::empty(&[m, n2 / 2], x.dtype(), device)?;
            if n2 == 0 {
                return Ok(out);
            }
            let sms = x.cuda_device().map_or(1, |d| d.sm_count().max(1) as usize);
            let rule = crate::gpu::skinny::plan_gated(m, n2 / 2, k, x.dtype(), true, sms);
            let m_tiles = m_tiles.or(rule.map(|p| p.m_tiles)).unwrap_or(1);
            let plan = crate::gpu::skinny::SkinnyPlan { m_tiles, k_splits: 1 };
            crate::gpu::skinny::skinny_gemm_silu_mul(&out, x, w, bias, plan)?;
            Ok(out)
        }
    }
}
