//! CUDA implementations of the dense ops, called by `crate::ops` after their
//! argument checks: cuBLASLt GEMMs ([`gemm`]) and the kernels of csrc/kernels/.
//!
//! | module | kernel family | ops |
//! | --- | --- | --- |
//! | [`gemm`] | cuBLASLt | `linear` |
//! | [`norm`] | `norm` | `rms_norm`, `fused_add_rms_norm`, `head_rms_norm` |
//! | [`rope`] | `rope` | `rope` |
//! | [`rope_store`] | `rope_store` | `rope_store` (q/k norm + rope + KV store) |
//! | [`skinny`] | `skinny_gemm` | `linear` at m <= 16 (by rule), `skinny_gemm` |
//! | [`activation`] | `activation` | `silu_mul` |
//! | [`argmax`] | `argmax` | `argmax` |
//! | [`attention`] | `attention` | `paged_attention` |
//! | [`convert`] | `cast`, `copy` | `cast`, strided `copy` |
//! | [`sampling`] | `sampling` | `sample` |
//! | [`moe`] | `moe_route`, `moe_align`, `moe_gemm`, `moe_sum` | the MoE ops and the tile plan |
//!
//! Every launcher follows `ops::store`: it checks what the kernel needs beyond the
//! op contract (alignment for the 16-byte vector paths), computes the launch shape
//! on the host (threads per row, split counts: STYLE rule 6), resolves the family
//! instance with [`kernels::resolve`], and runs either the AOT library's C launcher
//! (which validates again) or the loaded function with its params struct.

mod activation;
mod argmax;
mod attention;
mod convert;
pub(crate) mod gemm;
pub(crate) mod moe;
mod norm;
mod rope;
mod rope_store;
mod sampling;
pub(crate) mod skinny;

pub(crate) use activation::silu_mul;
pub(crate) use argmax::argmax;
pub(crate) use attention::paged_attention;
pub(crate) use convert::{cast, copy};
pub(crate) use gemm::linear;
pub(crate) use norm::{fused_add_rms_norm, head_rms_norm, rms_norm};
pub(crate) use rope::rope;
pub(crate) use rope_store::rope_store;
pub(crate) use sampling::sample;

use std::sync::Arc;

use crate::cuda::CudaDevice;
use crate::error::{Error, Result};
use crate::kernels::{self, LoadedFunction, Resolved};
use crate::sys::kernels::{msgl_stream, KernelLibrary};
use crate::tensor::Tensor;

/// The CUDA device of `t` (ops have already checked that every tensor is on it).
fn device_of<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a Arc<CudaDevice>> {
    t.cuda_device().ok_or_else(|| Error::arg(op, format!("expected a CUDA tensor, got one on {}", t.device())))
}

/// Resolves `family[values]` on `dev` and runs it: through the AOT library's C
/// launcher (`library`, given the launchers and the compute stream, returning the
/// status), or through the loaded cubin (`function`).
fn dispatch(
    op: &'static str,
    dev: &CudaDevice,
    family: &str,
    values: &[(&str, i64)],
    library: impl FnOnce(&KernelLibrary, msgl_stream) -> i32,
    function: impl FnOnce(&LoadedFunction) -> Result<()>,
) -> Result<()> {
    let instance = kernels::Registry::get()?.family(family)?.instance(values)?;
    match kernels::resolve(dev, family, &instance)? {
        Resolved::Library(lib) => {
            dev.bind()?;
            let status = library(lib.launchers(), dev.cu_stream().cast());
            kernels::check_status(lib, op, status)
        }
        Resolved::Function(f) => function(&f),
    }
}

/// Whether `t`'s first element and every stride of a non-trivial dimension are
/// multiples of `align` bytes, with a unit (or irrelevant) innermost stride: what a
/// kernel reading rows with `align`-byte vectors needs.
fn rows_aligned(t: &Tensor, align: usize) -> bool {
    let elem = t.dtype().size_in_bytes();
    let last = t.rank().saturating_sub(1);
    let inner_ok = t.rank() == 0 || t.dim(last) <= 1 || t.strides()[last] == 1;
    inner_ok
        && (t.device_ptr() as usize).is_multiple_of(align)
        && t.shape().iter().zip(t.strides()).take(last).all(|(&d, &s)| d <= 1 || (s * elem).is_multiple_of(align))
}

/// The msgl_dtype code of a float dtype, as an instance parameter value.
fn dtype_code(t: &Tensor) -> i64 {
    i64::from(t.dtype().abi_code())
}

/// Elements in one 16-byte vector of `t`'s dtype.
fn vec_elems(t: &Tensor) -> usize {
    16 / t.dtype().size_in_bytes()
}

/// A u32 grid dimension, or an error naming the op when the work is too large.
fn grid_u32(op: &'static str, blocks: usize) -> Result<u32> {
    u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| Error::arg(op, format!("{blocks} blocks exceed the grid limit")))
}
