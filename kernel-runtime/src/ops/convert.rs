//! [`copy`] and [`cast`], and the [`Tensor`] methods built on them
//! ([`Tensor::contiguous`], [`Tensor::to_dtype`]).
//!
//! The methods are defined here rather than in `tensor.rs` because they launch
//! ops: `tensor` stays below `ops` and never imports it.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

use super::check::common_device;

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

impl Tensor {
    /// A contiguous copy (or a clone when already contiguous).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let out = Tensor::empty(self.shape(), self.dtype(), self.device())?;
        copy(&out, self)?;
        Ok(out)
    }

    /// A copy converted to `dtype` (float <-> float, and integer <-> integer).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        cast(self, dtype)
    }
}
