//! Float casts and strided copies on CUDA (csrc/kernels/cast.cu, copy.cu).
//!
//! Both fill one `msgl_convert_params`: the shape with dimensions merged where
//! both views are contiguous across them (so a dense view becomes one run of unit
//! strides), then a grid-stride loop of one element per thread per step.

use crate::error::{Error, Result};
use crate::sys::kernels::{msgl_convert_params, MSGL_MAX_DIMS};
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, grid_u32};

/// convert.cuh's kConvertThreads.
const THREADS: usize = 256;
/// convert.cuh's grid cap (the loop strides over the rest).
const MAX_BLOCKS: usize = 65536;

/// Params for `dst[i] = f(src[i])` (same shape): merged dims, strides, dense flag.
fn convert_params(op: &'static str, dst: &Tensor, src: &Tensor) -> Result<msgl_convert_params> {
    if dst.shape() != src.shape() {
        return Err(Error::Shape { op, expected: dst.shape().to_vec(), got: src.shape().to_vec() });
    }
    let mut p = msgl_convert_params {
        dst: dst.device_ptr() as *mut _,
        src: src.device_ptr() as *const _,
        numel: dst.numel() as i64,
        ..Default::default()
    };
    let mut nd = 0usize;
    for (d, &size) in dst.shape().iter().enumerate() {
        if size == 1 {
            continue;
        }
        let (ds, ss) = (dst.strides()[d] as i64, src.strides()[d] as i64);
        let n = size as i64;
        if nd > 0 && p.dst_strides[nd - 1] == ds * n && p.src_strides[nd - 1] == ss * n {
            p.shape[nd - 1] *= n;
            p.dst_strides[nd - 1] = ds;
            p.src_strides[nd - 1] = ss;
            continue;
        }
        if nd == MSGL_MAX_DIMS as usize {
            return Err(Error::arg(op, format!("shape {:?} has too many dimensions", dst.shape())));
        }
        p.shape[nd] = n;
        p.dst_strides[nd] = ds;
        p.src_strides[nd] = ss;
        nd += 1;
    }
    p.ndim = nd as i32;
    p.contiguous = i32::from(nd == 0 || (nd == 1 && p.dst_strides[0] == 1 && p.src_strides[0] == 1));
    Ok(p)
}

fn grid(op: &'static str, numel: usize) -> Result<u32> {
    grid_u32(op, numel.div_ceil(THREADS).clamp(1, MAX_BLOCKS))
}

/// `dst = src` converted between float dtypes (f32, f16, bf16); same shape, any strides.
pub(crate) fn cast(dst: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "cast";
    let dev = device_of(OP, dst)?;
    let p = convert_params(OP, dst, src)?;
    if p.numel == 0 {
        return Ok(());
    }
    let grid = grid(OP, dst.numel())?;
    let (a, b) = (dst.abi(), src.abi());
    let values = [("SRC", i64::from(src.dtype().abi_code())), ("DST", i64::from(dst.dtype().abi_code()))];
    dispatch(
        OP,
        dev,
        "cast",
        &values,
        |lib, stream| {
            // SAFETY: the views describe live device tensors of one shape; the
            // launcher validates them again and only enqueues work on `stream`.
            unsafe { lib.msgl_cast(&a, &b, stream) }
        },
        |f| {
            // SAFETY: `p` is the msgl_convert_params the entry takes; its shape and
            // strides are those of the two views, so every offset stays in them.
            unsafe { f.launch(dev, grid, THREADS as u32, 0, &p) }
        },
    )
}

/// `dst = src` for views of one shape and dtype with any strides.
pub(crate) fn copy(dst: &Tensor, src: &Tensor) -> Result<()> {
    const OP: &str = "copy";
    let dev = device_of(OP, dst)?;
    let p = convert_params(OP, dst, src)?;
    if p.numel == 0 {
        return Ok(());
    }
    let grid = grid(OP, dst.numel())?;
    let (a, b) = (dst.abi(), src.abi());
    dispatch(
        OP,
        dev,
        "copy",
        &[("ELEM_BYTES", dst.dtype().size_in_bytes() as i64)],
        |lib, stream| {
            // SAFETY: as in cast.
            unsafe { lib.msgl_copy(&a, &b, stream) }
        },
        |f| {
            // SAFETY: as in cast.
            unsafe { f.launch(dev, grid, THREADS as u32, 0, &p) }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;
    use crate::dtype::DType;

    #[test]
    fn dense_views_merge_into_one_run_and_strided_ones_keep_their_dims() {
        let a = Tensor::zeros(&[4, 6, 8], DType::F32, Device::Cpu).unwrap();
        let b = Tensor::zeros(&[4, 6, 8], DType::F32, Device::Cpu).unwrap();
        let p = convert_params("t", &a, &b).unwrap();
        assert_eq!((p.ndim, p.contiguous, p.shape[0], p.numel), (1, 1, 192, 192));
        // A column slice: rows of 3 out of 8; the inner dims stay apart in src.
        let big = Tensor::zeros(&[4, 6, 16], DType::F32, Device::Cpu).unwrap();
        let s = big.narrow(2, 4, 8).unwrap();
        let p = convert_params("t", &a, &s).unwrap();
        assert_eq!(p.ndim, 2);
        assert_eq!(&p.shape[..2], &[24, 8]);
        assert_eq!(&p.src_strides[..2], &[16, 1]);
        assert_eq!(&p.dst_strides[..2], &[8, 1]);
        assert_eq!(p.contiguous, 0);
        // A transpose does not merge.
        let t = Tensor::zeros(&[8, 4], DType::F32, Device::Cpu).unwrap().permute(&[1, 0]).unwrap();
        let d = Tensor::zeros(&[4, 8], DType::F32, Device::Cpu).unwrap();
        let p = convert_params("t", &d, &t).unwrap();
        assert_eq!((p.ndim, p.contiguous), (2, 0));
        assert_eq!(&p.src_strides[..2], &[1, 4]);
        // Size-1 dims vanish; an all-ones shape is one dense element.
        let one = Tensor::zeros(&[1, 1], DType::F32, Device::Cpu).unwrap();
        let p = convert_params("t", &one, &one).unwrap();
        assert_eq!((p.ndim, p.contiguous, p.numel), (0, 1, 1));
    }
}
