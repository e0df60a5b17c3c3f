//! `index` / `embedding`: gather rows of an embedding table by token id.

use kernel_build::Instance;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{self, Resolved};
use crate::sys::kernels::msgl_index_params;
use crate::tensor::Tensor;

use super::store::vec_bytes_for;

const OP: &str = "index";
/// Threads per block of the index kernel (csrc/kernels/index.cu).
const THREADS: usize = 256;

/// Warps sharing one row: index.cu's `index_warps_per_row`.
fn warps_per_row(row_bytes: usize) -> usize {
    let mut w = if row_bytes >= 16384 {
        8
    } else if row_bytes >= 8192 {
        4
    } else if row_bytes >= 4096 {
        2
    } else {
        1
    };
    while w > 1 && !row_bytes.is_multiple_of(w * vec_bytes_for(row_bytes)) {
        w /= 2;
    }
    w
}

/// Writes `out[i] = weight[ids[i] - vocab_start]`, or zeros when the id is outside
/// `[vocab_start, vocab_start + weight rows)` (a vocab-parallel shard).
///
/// `out`: `[num_tokens, hidden]` contiguous (written); `weight`: `[rows, hidden]`
/// contiguous, same dtype; `ids`: `[num_tokens]` int32 or int64.
pub fn index(out: &Tensor, weight: &Tensor, ids: &Tensor, vocab_start: i64) -> Result<()> {
    let device = super::check::common_device(OP, &[("out", out), ("weight", weight), ("ids", ids)])?;
    let [num_rows, hidden] = weight.dims::<2>(OP, "weight")?;
    ids.expect_dtype(OP, "ids", &[DType::I32, DType::I64])?;
    let [num_tokens] = ids.dims::<1>(OP, "ids")?;
    out.expect_shape(OP, "out", &[num_tokens, hidden])?;
    if out.dtype() != weight.dtype() {
        return Err(Error::arg(
            OP,
            format!("argument `out` has dtype {}, `weight` has {}", out.dtype(), weight.dtype()),
        ));
    }
    for (name, t) in [("out", out), ("weight", weight), ("ids", ids)] {
        t.expect_contiguous(OP, name)?;
    }
    if num_tokens == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => crate::cpu::index(out, weight, ids, vocab_start),
        Device::Cuda(_) => {
            let row_bytes = hidden * weight.dtype().size_in_bytes();
            let align = vec_bytes_for(row_bytes);
            for (name, t) in [("out", out), ("weight", weight)] {
                if !(t.device_ptr() as usize).is_multiple_of(align) {
                    return Err(Error::arg(OP, format!("argument `{name}` is not {align}-byte aligned")));
                }
            }
            let dev = out.cuda_device().ok_or_else(|| Error::arg(OP, "missing device"))?;
            let family = kernels::Registry::get()?.family("index")?;
            let instance: Instance = family.instance(&[("ROW_BYTES", row_bytes as i64)])?;
            match kernels::resolve(dev, "index", &instance)? {
                Resolved::Library(lib) => {
                    let (a, b, c) = (out.abi(), weight.abi(), ids.abi());
                    dev.bind()?;
                    // SAFETY: the views describe live device tensors checked above; the
                    // launcher validates again and only enqueues work on this stream.
                    let status = unsafe { lib.launchers().msgl_index(&a, &b, &c, vocab_start, dev.cu_stream().cast()) };
                    kernels::check_status(lib, OP, status)
                }
                Resolved::Function(f) => {
                    let params = msgl_index_params {
                        out: out.device_ptr() as *mut _,
                        weight: weight.device_ptr() as *const _,
                        ids: ids.device_ptr() as *const _,
                        num_tokens: num_tokens as i64,
                        num_rows: num_rows as i64,
                        vocab_start,
                        index_is_64: (ids.dtype() == DType::I64) as i32,
                        reserved: 0,
                    };
                    let rows_per_block = THREADS / 32 / warps_per_row(row_bytes);
                    let grid = num_tokens.div_ceil(rows_per_block) as u32;
                    // SAFETY: `params` is the msgl_index_params the entry takes, filled
                    // from tensors validated above.
                    unsafe { f.launch(dev, grid, THREADS as u32, 0, &params) }
                }
            }
        }
    }
}

/// A new `[num_tokens, hidden]` tensor of the rows of `weight` selected by `ids`.
pub fn embedding(weight: &Tensor, ids: &Tensor, vocab_start: i64) -> Result<Tensor> {
    let [_, hidden] = weight.dims::<2>("embedding", "weight")?;
    let out = Tensor::empty(&[ids.dim(0), hidden], weight.dtype(), weight.device())?;
    index(&out, weight, ids, vocab_start)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warp_split_matches_the_kernel() {
        assert_eq!(warps_per_row(64), 1);
        assert_eq!(warps_per_row(4096), 2);
        assert_eq!(warps_per_row(8192), 4);
        assert_eq!(warps_per_row(16384), 8);
        // 8194 bytes: 4 warps would cut a 2-byte unit; fall back to 1.
        assert_eq!(warps_per_row(8194), 1);
        assert_eq!(warps_per_row(10240), 4);
    }
}
