//! The CPU reference of every op: plain loops in f32, written for clarity. They
//! run the models end to end on machines without a GPU (CI) and are the oracle
//! every CUDA kernel is tested against.
//!
//! Callers (the typed launchers in `crate::ops`) have already checked shapes,
//! dtypes and devices; these functions only index memory.

pub mod attention;
pub mod dense;
pub mod logprobs;
pub mod moe;
pub mod penalties;
pub mod random;
pub mod sampling;

use half::{bf16, f16};

use crate::dtype::{DType, Element, FloatElement};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Index `i` of an int32/int64 host tensor as i64.
fn index_at(t: &Tensor, i: usize) -> Result<i64> {
    // SAFETY: read-only access to a host tensor (ops' ordering rule).
    unsafe {
        Ok(match t.dtype() {
            DType::I32 => i64::from(t.host_slice::<i32>()?[i * t.strides()[0]]),
            DType::I64 => t.host_slice::<i64>()?[i * t.strides()[0]],
            other => return Err(Error::arg("index", format!("indices have dtype {other}"))),
        })
    }
}

/// Byte pointer of row `i` of a 2-D host tensor.
pub(crate) fn row_ptr(t: &Tensor, i: usize) -> *mut u8 {
    // SAFETY: callers pass i < rows; the offset stays inside the buffer.
    unsafe { t.host_ptr().add(i * t.strides()[0] * t.dtype().size_in_bytes()) }
}

/// `k_cache[indices[i]] = k[i]`, `v_cache[indices[i]] = v[i]`; out-of-range slots are
/// skipped (as the kernel does). Caches: `[num_slots, row]`; k/v: `[n, row]` rows.
pub fn store_kv(k_cache: &Tensor, v_cache: &Tensor, indices: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
    let row_bytes = k.dim(1) * k.dtype().size_in_bytes();
    let num_slots = k_cache.dim(0);
    for i in 0..k.dim(0) {
        let slot = index_at(indices, i)?;
        if slot < 0 || slot as usize >= num_slots {
            continue;
        }
        for (dst, src) in [(k_cache, k), (v_cache, v)] {
            // SAFETY: both rows hold row_bytes bytes inside their buffers; a cache and
            // its input never share memory.
            unsafe { std::ptr::copy_nonoverlapping(row_ptr(src, i), row_ptr(dst, slot as usize), row_bytes) }
        }
    }
    Ok(())
}

/// `out[i] = weight[ids[i] - vocab_start]`, zero rows for ids outside the table.
pub fn index(out: &Tensor, weight: &Tensor, ids: &Tensor, vocab_start: i64) -> Result<()> {
    let row_bytes = weight.dim(1) * weight.dtype().size_in_bytes();
    for i in 0..ids.dim(0) {
        let row = index_at(ids, i)? - vocab_start;
        let dst = row_ptr(out, i);
        // SAFETY: rows of row_bytes bytes inside their buffers; out and weight are
        // distinct buffers.
        unsafe {
            if row < 0 || row as usize >= weight.dim(0) {
                std::ptr::write_bytes(dst, 0, row_bytes);
            } else {
                std::ptr::copy_nonoverlapping(row_ptr(weight, row as usize), dst, row_bytes);
            }
        }
    }
    Ok(())
}

/// Visits every element offset (in elements, relative to [0, ...]) of a strided
/// shape in row-major order.
pub(crate) fn for_each_offset(shape: &[usize], strides: &[usize], mut f: impl FnMut(usize)) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0usize; shape.len()];
    let mut off = 0usize;
    loop {
        f(off);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            off += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            off -= strides[d] * shape[d];
            idx[d] = 0;
        }
    }
}

fn copy_typed<T: Element>(dst: &Tensor, src: &Tensor) -> Result<()> {
    // SAFETY: host tensors of element type T; dst is written through its own span,
    // src read through its span; a copy onto itself is harmless element by element.
    unsafe {
        let s = src.host_slice::<T>()?;
        let d = dst.host_slice_mut::<T>()?;
        let mut src_offsets = Vec::with_capacity(src.numel());
        for_each_offset(src.shape(), src.strides(), |o| src_offsets.push(o));
        let mut i = 0;
        for_each_offset(dst.shape(), dst.strides(), |o| {
            d[o] = s[src_offsets[i]];
            i += 1;
        });
    }
    Ok(())
}

/// Strided copy between host tensors of one shape and dtype.
pub fn copy(dst: &Tensor, src: &Tensor) -> Result<()> {
    match dst.dtype().size_in_bytes() {
        1 => copy_typed::<u8>(dst, src),
        2 => copy_typed::<bf16>(dst, src),
        4 => copy_typed::<f32>(dst, src),
        _ => copy_typed::<i64>(dst, src),
    }
}

/// Reads a float host tensor into f32, in row-major order.
pub fn read_f32(t: &Tensor) -> Result<Vec<f32>> {
    fn go<T: FloatElement>(t: &Tensor) -> Result<Vec<f32>> {
        // SAFETY: read-only access to a host tensor.
        let s = unsafe { t.host_slice::<T>()? };
        let mut out = Vec::with_capacity(t.numel());
        for_each_offset(t.shape(), t.strides(), |o| out.push(s[o].to_f32()));
        Ok(out)
    }
    match t.dtype() {
        DType::F32 => go::<f32>(t),
        DType::F16 => go::<f16>(t),
        DType::BF16 => go::<bf16>(t),
        other => Err(Error::arg("read_f32", format!("dtype {other} is not a float type"))),
    }
}

/// Writes row-major f32 values into a float host tensor, rounding to its dtype.
pub fn write_f32(t: &Tensor, values: &[f32]) -> Result<()> {
    fn go<T: FloatElement>(t: &Tensor, values: &[f32]) -> Result<()> {
        // SAFETY: exclusive write access to a host tensor (ops' ordering rule).
        let d = unsafe { t.host_slice_mut::<T>()? };
        let mut i = 0;
        for_each_offset(t.shape(), t.strides(), |o| {
            d[o] = T::from_f32(values[i]);
            i += 1;
        });
        Ok(())
    }
    if values.len() != t.numel() {
        return Err(Error::arg("write_f32", format!("{} values for {} elements", values.len(), t.numel())));
    }
    match t.dtype() {
        DType::F32 => go::<f32>(t, values),
        DType::F16 => go::<f16>(t, values),
        DType::BF16 => go::<bf16>(t, values),
        other => Err(Error::arg("write_f32", format!("dtype {other} is not a float type"))),
    }
}

/// Elements per parallel task of the contiguous conversions.
const CAST_CHUNK: usize = 1 << 16;

/// Converts contiguous float slices in parallel (weights are converted at load,
/// billions of elements for real models).
fn convert_slices<S: FloatElement, D: FloatElement>(src: &[S], dst: &mut [D]) {
    use rayon::prelude::*;
    dst.par_chunks_mut(CAST_CHUNK).zip(src.par_chunks(CAST_CHUNK)).for_each(|(d, s)| {
        for (o, i) in d.iter_mut().zip(s) {
            *o = D::from_f32(i.to_f32());
        }
    });
}

fn cast_contiguous_float(dst: &Tensor, src: &Tensor) -> Result<()> {
    fn to<S: FloatElement>(dst: &Tensor, s: &[S]) -> Result<()> {
        // SAFETY: exclusive write access to the contiguous host tensor `dst`, which
        // does not share memory with `src` (a fresh output of `ops::cast`).
        unsafe {
            match dst.dtype() {
                DType::F32 => convert_slices(s, dst.host_slice_mut::<f32>()?),
                DType::F16 => convert_slices(s, dst.host_slice_mut::<f16>()?),
                DType::BF16 => convert_slices(s, dst.host_slice_mut::<bf16>()?),
                other => return Err(Error::arg("cast", format!("dtype {other} is not a float type"))),
            }
        }
        Ok(())
    }
    // SAFETY: read-only access to the contiguous host tensor `src`.
    unsafe {
        match src.dtype() {
            DType::F32 => to(dst, src.host_slice::<f32>()?),
            DType::F16 => to(dst, src.host_slice::<f16>()?),
            DType::BF16 => to(dst, src.host_slice::<bf16>()?),
            other => Err(Error::arg("cast", format!("dtype {other} is not a float type"))),
        }
    }
}

/// Converts between float dtypes (round to nearest even) or integer dtypes.
pub fn cast(dst: &Tensor, src: &Tensor) -> Result<()> {
    if src.dtype().is_float() {
        if src.is_contiguous() && dst.is_contiguous() && !dst.same_buffer(src) {
            return cast_contiguous_float(dst, src);
        }
        return write_f32(dst, &read_f32(src)?);
    }
    let values: Vec<i64> = match src.dtype() {
        DType::I32 => src.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
        DType::I64 => src.to_vec::<i64>()?,
        DType::U8 => src.to_vec::<u8>()?.into_iter().map(i64::from).collect(),
        _ => unreachable!("float handled above"),
    };
    let bytes: Vec<u8> = match dst.dtype() {
        DType::I32 => bytemuck::cast_slice(&values.iter().map(|&v| v as i32).collect::<Vec<_>>()).to_vec(),
        DType::I64 => bytemuck::cast_slice(&values).to_vec(),
        DType::U8 => values.iter().map(|&v| v as u8).collect(),
        other => return Err(Error::arg("cast", format!("cannot convert {} to {other}", src.dtype()))),
    };
    let tmp = Tensor::from_bytes(&bytes, dst.dtype(), dst.shape(), crate::device::Device::Cpu)?;
    copy(dst, &tmp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;

    /// `ops::cast` on the host: a fresh output, then this module's `cast`.
    fn cast_to(src: &Tensor, dtype: DType) -> Tensor {
        let out = Tensor::empty(src.shape(), dtype, Device::Cpu).unwrap();
        cast(&out, src).unwrap();
        out
    }

    #[test]
    fn contiguous_and_strided_casts_agree_and_round_to_nearest_even() {
        let n = 3 * CAST_CHUNK + 17;
        let values: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin() * 1000.0 + 1.0 / 3.0).collect();
        let src = Tensor::from_slice(&values, &[n], Device::Cpu).unwrap();
        for dtype in [DType::BF16, DType::F16] {
            let fast = cast_to(&src, dtype);
            let expected: Vec<f32> = match dtype {
                DType::BF16 => values.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
                _ => values.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
            };
            assert_eq!(fast.to_f32_vec().unwrap(), expected);
            let back = cast_to(&fast, DType::F32);
            assert_eq!(back.to_vec::<f32>().unwrap(), expected);
            // A strided source goes through the generic path and agrees.
            let strided = src.as_strided(&[n / 2], &[2], 0).unwrap();
            let slow = cast_to(&strided, dtype).to_f32_vec().unwrap();
            let want: Vec<f32> = expected.iter().step_by(2).take(n / 2).copied().collect();
            assert_eq!(slow, want);
        }
    }
}
