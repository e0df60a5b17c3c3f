//! The ops of a dense decoder layer: linear (GEMM), RMSNorm (plain, fused with
//! the residual add, per head), rotary embedding, SiLU-and-mul (alone, or fused
//! with the gate_up projection before it), argmax.
//!
//! Each op checks its arguments here, then calls the CPU reference
//! (`crate::cpu::dense`) or the CUDA implementation (`crate::gpu`). Ops that write
//! in place say so; their outputs may be strided views (e.g. q and k inside a fused
//! QKV projection output) as documented per op.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

use super::check::common_device;

const FLOATS: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// `x @ w^T (+ bias)`: `x` `[m, k]`, `w` `[n, k]` (the HuggingFace `Linear` layout),
/// `bias` `[n]`; returns a new contiguous `[m, n]` tensor of x's dtype. Compute is
/// f32 (accumulate) on every device.
pub fn linear(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "linear";
    let device = check_projection(OP, x, w, bias, false)?;
    let [m, _] = x.dims::<2>(OP, "x")?;
    let n = w.dim(0);
    let out = Tensor::empty(&[m, n], x.dtype(), device)?;
    if m == 0 || n == 0 {
        return Ok(out);
    }
    match device {
        Device::Cpu => crate::cpu::dense::linear(&out, x, w, bias)?,
        Device::Cuda(_) => crate::gpu::linear(&out, x, w, bias)?,
    }
    Ok(out)
}

/// `out = x / rms(x) * w` over the last dimension: `x` `[t, h]`, `w` `[h]`;
/// returns a new `[t, h]` tensor.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    const OP: &str = "rms_norm";
    let device = common_device(OP, &[("x", x), ("w", w)])?;
    let [t, h] = x.dims::<2>(OP, "x")?;
    w.expect_shape(OP, "w", &[h])?.expect_dtype(OP, "w", &[x.dtype()])?;
    x.expect_dtype(OP, "x", FLOATS)?;
    let out = Tensor::empty(&[t, h], x.dtype(), device)?;
    if t == 0 {
        return Ok(out);
    }
    match device {
        Device::Cpu => crate::cpu::dense::rms_norm(&out, x, w, eps)?,
        Device::Cuda(_) => crate::gpu::rms_norm(&out, x, w, eps)?,
    }
    Ok(out)
}

/// The pre-norm residual step, in place: `residual += x; x = rms_norm(residual) * w`.
/// `x`, `residual`: `[t, h]` contiguous, same dtype (both written); `w`: `[h]`.
pub fn fused_add_rms_norm(x: &Tensor, residual: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    const OP: &str = "fused_add_rms_norm";
    let device = common_device(OP, &[("x", x), ("residual", residual), ("w", w)])?;
    let [t, h] = x.dims::<2>(OP, "x")?;
    residual.expect_shape(OP, "residual", &[t, h])?.expect_dtype(OP, "residual", &[x.dtype()])?;
    w.expect_shape(OP, "w", &[h])?.expect_dtype(OP, "w", &[x.dtype()])?;
    x.expect_dtype(OP, "x", FLOATS)?.expect_contiguous(OP, "x")?;
    residual.expect_contiguous(OP, "residual")?;
    if x.same_buffer(residual) {
        return Err(Error::arg(OP, "`x` and `residual` must not share memory"));
    }
    if t == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => crate::cpu::dense::fused_add_rms_norm(x, residual, w, eps),
        Device::Cuda(_) => crate::gpu::fused_add_rms_norm(x, residual, w, eps),
    }
}

/// Per-head RMSNorm in place (Qwen3's q/k norm): `x` `[t, heads, d]` with unit
/// stride in the last dimension (any other strides, e.g. a view into a fused QKV
/// output); `w` `[d]`.
pub fn head_rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    const OP: &str = "head_rms_norm";
    common_device(OP, &[("x", x), ("w", w)])?;
    let [t, _heads, d] = x.dims::<3>(OP, "x")?;
    x.expect_dtype(OP, "x", FLOATS)?;
    w.expect_shape(OP, "w", &[d])?.expect_dtype(OP, "w", &[x.dtype()])?;
    if x.strides()[2] != 1 {
        return Err(Error::arg(OP, "argument `x` must have unit stride in its last dimension"));
    }
    if t == 0 {
        return Ok(());
    }
    match x.device() {
        Device::Cpu => crate::cpu::dense::head_rms_norm(x, w, eps),
        Device::Cuda(_) => crate::gpu::head_rms_norm(x, w, eps),
    }
}

/// Rotary position embedding in place, neox layout (the rotated pairs are
/// `(i, i + rotary_dim / 2)`), on `q` `[t, heads_q, d]` and `k` `[t, heads_k, d]`
/// (unit stride in the last dimension, any other strides). `positions`: `[t]`
/// int32/int64; `cos_sin`: `[max_positions, rotary_dim]` f32, row p holding
/// `cos(p * inv_freq)` in its first half and `sin(p * inv_freq)` in its second half
/// (see models' rotary module for how scaling variants fill it). Dimensions past
/// `rotary_dim` are left as they are.
pub fn rope(q: &Tensor, k: &Tensor, positions: &Tensor, cos_sin: &Tensor) -> Result<()> {
    const OP: &str = "rope";
    let device = common_device(OP, &[("q", q), ("k", k), ("positions", positions), ("cos_sin", cos_sin)])?;
    let [t, _hq, d] = q.dims::<3>(OP, "q")?;
    let [tk, _hk, dk] = k.dims::<3>(OP, "k")?;
    if (tk, dk) != (t, d) {
        return Err(Error::arg(OP, format!("argument `k` has shape {:?}, expected [{t}, _, {d}]", k.shape())));
    }
    q.expect_dtype(OP, "q", FLOATS)?;
    k.expect_dtype(OP, "k", &[q.dtype()])?;
    positions.expect_dtype(OP, "positions", &[DType::I32, DType::I64])?.expect_shape(OP, "positions", &[t])?;
    positions.expect_contiguous(OP, "positions")?;
    let [_max_pos, rotary_dim] = cos_sin.dims::<2>(OP, "cos_sin")?;
    cos_sin.expect_dtype(OP, "cos_sin", &[DType::F32])?.expect_contiguous(OP, "cos_sin")?;
    if rotary_dim == 0 || rotary_dim % 2 != 0 || rotary_dim > d {
        return Err(Error::arg(
            OP,
            format!("rotary dimension {rotary_dim} must be even and at most the head dimension {d}"),
        ));
    }
    if q.strides()[2] != 1 || k.strides()[2] != 1 {
        return Err(Error::arg(OP, "arguments `q` and `k` must have unit stride in their last dimension"));
    }
    if t == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => crate::cpu::dense::rope(q, k, positions, cos_sin),
        Device::Cuda(_) => crate::gpu::rope(q, k, positions, cos_sin),
    }
}

/// `silu(x[:, :i]) * x[:, i:]` for `x` `[t, 2i]` (gate then up, as a fused
/// gate_up projection produces); returns a new `[t, i]` tensor.
pub fn silu_mul(x: &Tensor) -> Result<Tensor> {
    const OP: &str = "silu_mul";
    let [t, two_i] = x.dims::<2>(OP, "x")?;
    x.expect_dtype(OP, "x", FLOATS)?.expect_contiguous(OP, "x")?;
    if two_i % 2 != 0 {
        return Err(Error::arg(OP, format!("argument `x` has odd width {two_i}")));
    }
    let out = Tensor::empty(&[t, two_i / 2], x.dtype(), x.device())?;
    if t == 0 {
        return Ok(out);
    }
    match x.device() {
        Device::Cpu => crate::cpu::dense::silu_mul(&out, x)?,
        Device::Cuda(_) => crate::gpu::silu_mul(&out, x)?,
    }
    Ok(out)
}

/// Turns the measured choice of cuBLASLt algorithm for decode-sized products on
/// or off for this process, or back to `MINISGL_GEMM_TUNE` (`None`; on unless
/// that variable is `0`). Shapes already planned keep their algorithm. For A/B
/// benchmarks.
pub fn set_gemm_tuning(on: Option<bool>) {
    crate::gpu::gemm_tune::set_enabled(on);
}

/// One line per cuBLASLt shape whose algorithm was measured in this process:
/// the heuristic's first pick, the one kept, and every candidate's median time.
pub fn gemm_tuning_report() -> Vec<String> {
    crate::gpu::gemm_tune::report()
}

/// `silu_mul(linear(x, w, bias))`: the gated MLP's gate_up projection and its
/// activation, `w` `[2 i, k]` holding the gate rows then the up rows (a fused
/// `gate_up_proj`), `bias` `[2 i]`; returns a new `[m, i]`. On CUDA, where the
/// skinny rule takes the product (decode-sized m, 16-bit, 1-16 MiB of weights:
/// `gpu::skinny::plan_gated`), one launch with SiLU-and-mul in the GEMM's
/// epilogue, bitwise equal to the two ops (the gate and up sums are rounded to
/// the dtype first, as `linear` writes them); elsewhere, and on the CPU, the two
/// ops.
pub fn linear_silu_mul(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "linear_silu_mul";
    let device = check_projection(OP, x, w, bias, true)?;
    if let Device::Cuda(_) = device {
        if x.dim(0) > 0 && w.dim(0) > 0 {
            if let Some(out) = crate::gpu::skinny::linear_silu_mul(x, w, bias)? {
                return Ok(out);
            }
        }
    }
    silu_mul(&linear(x, w, bias)?)
}

/// The argument checks of a projection `x` `[m, k]` @ `w^T` (+ `bias`): `w` `[n, k]`
/// contiguous (`gated`: `[2 i, k]`, gate rows then up rows), `bias` `[n]`, one
/// float dtype, one device (returned).
fn check_projection(op: &'static str, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, gated: bool) -> Result<Device> {
    let device = common_device(op, &[("x", x), ("w", w)])?;
    let [_, k] = x.dims::<2>(op, "x")?;
    let [n, wk] = w.dims::<2>(op, "w")?;
    if wk != k || (gated && n % 2 != 0) {
        let rows = if gated { "2 i" } else { "_" };
        return Err(Error::arg(
            op,
            format!("argument `w` has shape {:?}, expected [{rows}, {k}] to match `x` {:?}", w.shape(), x.shape()),
        ));
    }
    x.expect_dtype(op, "x", FLOATS)?;
    if w.dtype() != x.dtype() {
        return Err(Error::arg(op, format!("argument `w` has dtype {}, `x` has {}", w.dtype(), x.dtype())));
    }
    w.expect_contiguous(op, "w")?;
    if let Some(b) = bias {
        b.expect_shape(op, "bias", &[n])?.expect_device(op, "bias", device)?.expect_dtype(op, "bias", &[x.dtype()])?;
    }
    Ok(device)
}

/// A decoder layer's pre-norm residual step and the projection after it:
/// `residual += x; h = rms_norm(residual) * norm_w; out = h @ w^T (+ bias)`, or with
/// `gated` `silu(gate) * up` of that product's halves (as [`linear_silu_mul`]).
/// `x` and `residual` `[t, k]` contiguous, same dtype (distinct buffers), `norm_w`
/// `[k]`. Consumes both and returns `(out, residual)`: the residual may come back
/// in another buffer, since on the GPU at decode sizes the two steps are one skinny
/// launch (whose blocks all read the old residual while one writes the new); else
/// this is [`fused_add_rms_norm`] then the projection.
pub fn fused_add_rms_norm_linear(
    x: Tensor,
    residual: Tensor,
    norm_w: &Tensor,
    eps: f32,
    w: &Tensor,
    bias: Option<&Tensor>,
    gated: bool,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "fused_add_rms_norm_linear";
    let device = check_projection(OP, &x, w, bias, gated)?;
    common_device(OP, &[("x", &x), ("residual", &residual), ("norm_w", norm_w)])?;
    if let (Device::Cuda(_), true) = (device, x.dim(0) > 0 && w.dim(0) > 0) {
        let [t, k] = x.dims::<2>(OP, "x")?;
        residual.expect_shape(OP, "residual", &[t, k])?.expect_dtype(OP, "residual", &[x.dtype()])?;
        norm_w.expect_shape(OP, "norm_w", &[k])?.expect_dtype(OP, "norm_w", &[x.dtype()])?;
        if !x.same_buffer(&residual) {
            if let Some(done) =
                crate::gpu::skinny::fused_add_rms_norm_linear(&x, &residual, norm_w, eps, w, bias, gated)?
            {
                return Ok(done);
            }
        }
    }
    fused_add_rms_norm(&x, &residual, norm_w, eps)?;
    let out = if gated { linear_silu_mul(&x, w, bias)? } else { linear(&x, w, bias)? };
    Ok((out, residual))
}

/// Index of the largest value of each row of `x` `[b, v]` (the first one on ties);
/// returns `[b]` int32.
pub fn argmax(x: &Tensor) -> Result<Tensor> {
    const OP: &str = "argmax";
    let [b, v] = x.dims::<2>(OP, "x")?;
    x.expect_dtype(OP, "x", FLOATS)?.expect_contiguous(OP, "x")?;
    if v == 0 {
        return Err(Error::arg(OP, "argument `x` has empty rows"));
    }
    let out = Tensor::empty(&[b], DType::I32, x.device())?;
    if b == 0 {
        return Ok(out);
    }
    match x.device() {
        Device::Cpu => crate::cpu::dense::argmax(&out, x)?,
        Device::Cuda(_) => crate::gpu::argmax(&out, x)?,
    }
    Ok(out)
}
