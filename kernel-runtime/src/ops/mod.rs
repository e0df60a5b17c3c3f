//! Typed launchers: every op checks its arguments once, at this boundary, then
//! runs the CPU reference (`crate::cpu`) or a CUDA kernel on the tensors' device.
//!
//! | op | what |
//! | --- | --- |
//! | [`store_kv`] | scatter new K/V rows into the paged KV caches |
//! | [`index`], [`embedding`] | embedding gather (with the vocab-parallel range) |
//! | [`copy`], [`cast`] | strided copy, dtype conversion |
//! | [`linear`] | `x @ w^T + b` (cuBLASLt on CUDA) |
//! | [`rms_norm`], [`fused_add_rms_norm`], [`head_rms_norm`] | RMSNorm variants |
//! | [`rope`] | rotary embedding (neox layout), in place |
//! | [`rope_store`] | q/k norm (optional) + rotary embedding + KV store, fused |
//! | [`skinny_gemm`], [`set_skinny_gemm`] | the decode GEMM `linear` picks at m <= 16, and its switch |
//! | [`silu_mul`] | SiLU(gate) * up |
//! | [`argmax`] | greedy token choice |
//! | [`sample`] | one token per row: greedy, temperature, top-k, top-p, min-p |
//! | [`paged_attention`] | attention over the paged KV cache (prefill and decode) |
//! | [`moe_route`], [`moe_align`], [`moe_gemm`], [`moe_sum`], [`fused_experts`], [`fused_moe`] | mixture of experts (`moe` module) |

mod attention;
mod dense;
mod fused;
mod index;
mod sampling;
pub mod moe;
mod skinny;
mod store;

pub use attention::{paged_attention, paged_attention_with, AttnKernel, PagedAttnMeta};
pub use dense::{argmax, fused_add_rms_norm, head_rms_norm, linear, rms_norm, rope, silu_mul};
pub use index::{embedding, index};
pub use sampling::{sample, SampleRow};
pub use moe::{
    fused_experts, fused_experts_with, fused_moe, moe_align, moe_gemm, moe_route, moe_sum, naive_experts, MoeAlignment, MoePlan,
    MoeRouting,
};
pub use fused::{rope_store, QkNorm, RopeStore};
pub use skinny::{set_skinny_gemm, skinny_gemm};
pub use store::store_kv;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// All tensors are on one device; returns it.
pub(crate) fn common_device(op: &'static str, tensors: &[(&str, &Tensor)]) -> Result<Device> {
    let Some((first_name, first)) = tensors.first() else {
        return Err(Error::arg(op, "no tensors"));
    };
    for (name, t) in &tensors[1..] {
        if t.device() != first.device() {
            return Err(Error::arg(op, format!("argument `{name}` is on {} but `{first_name}` is on {}", t.device(), first.device())));
        }
    }
    Ok(first.device())
}

/// A 2-D row view `[rows, row_len]` of `t`: the first dimension indexes rows, the
/// other dimensions must be contiguous among themselves (one dense row each).
pub(crate) fn rows_view(op: &'static str, what: &str, t: &Tensor) -> Result<Tensor> {
    if t.rank() < 2 {
        return Err(Error::arg(op, format!("argument `{what}` must have at least 2 dimensions, got shape {:?}", t.shape())));
    }
    let inner = &t.shape()[1..];
    let inner_strides = &t.strides()[1..];
    let expected = crate::tensor::contiguous_strides(inner);
    let dense = inner.iter().zip(inner_strides.iter().zip(&expected)).all(|(d, (s, e))| *d == 1 || s == e);
    if !dense {
        return Err(Error::arg(
            op,
            format!("argument `{what}` must have dense rows (shape {:?}, strides {:?})", t.shape(), t.strides()),
        ));
    }
    let row: usize = inner.iter().product();
    // With a single row the outer stride is irrelevant; make it the dense one.
    let stride0 = if t.dim(0) <= 1 { row } else { t.strides()[0] };
    t.as_strided(&[t.dim(0), row], &[stride0, 1], t.offset())
}

/// Copies `src` into `dst` (same shape and dtype; any strides; same device).
pub fn copy(dst: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "copy";
    common_device(OP, &[("dst", dst), ("src", src)])?;
    if dst.shape() != src.shape() {
        return Err(Error::Shape { op: OP, expected: dst.shape().to_vec(), got: src.shape().to_vec() });
    }
    if dst.dtype() != src.dtype() {
        return Err(Error::arg(OP, format!("argument `src` has dtype {}, `dst` has {}", src.dtype(), dst.dtype())));
    }
    match dst.device() {
        Device::Cpu => crate::cpu::copy(dst, src),
        Device::Cuda(_) => {
            if !(dst.is_contiguous() && src.is_contiguous()) {
                return crate::gpu::copy(dst, src);
            }
            let dev = dst.cuda_device().ok_or_else(|| Error::arg(OP, "missing device"))?;
            dev.copy_dtod(dst.device_ptr(), src.device_ptr(), dst.size_in_bytes())
        }
    }
}

/// A copy of `src` converted to `dtype` (floats to floats, integers to integers).
pub fn cast(src: &Tensor, dtype: DType) -> Result<Tensor> {
    const OP: &str = "cast";
    if src.dtype().is_float() != dtype.is_float() {
        return Err(Error::arg(OP, format!("cannot convert {} to {dtype}", src.dtype())));
    }
    match src.device() {
        Device::Cpu => {
            let out = Tensor::empty(src.shape(), dtype, Device::Cpu)?;
            crate::cpu::cast(&out, src)?;
            Ok(out)
        }
        Device::Cuda(_) if dtype.is_float() => {
            let out = Tensor::empty(src.shape(), dtype, src.device())?;
            crate::gpu::cast(&out, src)?;
            Ok(out)
        }
        // Integer conversions are rare (host-side index building): go through the host.
        Device::Cuda(_) => src.to_device(Device::Cpu)?.to_dtype(dtype)?.to_device(src.device()),
    }
}
