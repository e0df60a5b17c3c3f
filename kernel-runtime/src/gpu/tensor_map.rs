//! CUDA tensor maps (`CUtensorMap`, built by `cuTensorMapEncodeTiled`) for the
//! kernels that copy boxes of a tensor into shared memory by TMA (sm_90): the
//! streaming GEMM's weight and activation views and the prefill kernel's views of
//! the paged K/V caches. A map is 128 opaque bytes passed by value in a kernel's
//! params (tensor.h's `msgl_tensor_map`).

use cudarc::driver::sys;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sys::kernels::msgl_tensor_map;
use crate::tensor::Tensor;

/// How the copy engine lays a box out in shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Swizzle {
    /// Rows as they are in memory.
    None,
    /// The 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)): the
    /// canonical wgmma operand layout; the box's inner extent must be 128 bytes.
    B128,
}

/// The tensor map of `t`'s 16-bit elements viewed from its first element as a
/// tensor of extents `dims` (innermost first), dimension i + 1 `strides[i]` bytes
/// apart (multiples of 16), copied in boxes of `boxes` elements, zeros outside.
/// `op` names the operation in errors (the driver refuses a bad layout with an
/// error, never a fault).
pub(crate) fn encode<const R: usize>(
    op: &'static str,
    t: &Tensor,
    dims: [u64; R],
    strides: &[u64],
    boxes: [u32; R],
    swizzle: Swizzle,
) -> Result<msgl_tensor_map> {
    use sys::CUtensorMapDataType as D;
    let data_type = match t.dtype() {
        DType::BF16 => D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        other => return Err(Error::arg(op, format!("no tensor map for {other}"))),
    };
    if strides.len() + 1 != R || !(1..=5).contains(&R) {
        return Err(Error::arg(op, format!("a rank-{R} tensor map takes {} strides, not {}", R - 1, strides.len())));
    }
    let element_strides = [1u32; R];
    let swizzle = match swizzle {
        Swizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
    };
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: the pointers name live arrays of the rank the call reads (R extents,
    // boxes and element strides, R - 1 strides: checked above) and an output of
    // CUtensorMap's size; the global address is a live device buffer (the call
    // checks its alignment and the strides and reports a bad layout as an error).
    let status = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            R as u32,
            t.device_ptr() as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if status != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::arg(
            op,
            format!(
                "cuTensorMapEncodeTiled of extents {dims:?}, strides {strides:?}, boxes {boxes:?} failed: {status:?}"
            ),
        ));
    }
    // SAFETY: written by the successful call above.
    let map = unsafe { map.assume_init() };
    Ok(msgl_tensor_map { opaque: map.opaque })
}
