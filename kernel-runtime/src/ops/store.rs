//! `store_kv`: scatter the new K and V rows of a batch into the paged KV caches.

use kernel_build::Instance;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::kernels::{self, Resolved};
use crate::sys::kernels::msgl_store_params;
use crate::tensor::Tensor;

const OP: &str = "store_kv";
/// Warps (tokens) per block of the store kernel (csrc/kernels/store.cu).
const WARPS_PER_BLOCK: usize = 4;

/// Writes `k[i]` and `v[i]` into row `indices[i]` of `k_cache` and `v_cache`.
///
/// `k`, `v`: `[num_tokens, ...]` with one dense row per token (a strided view of a
/// fused QKV output is fine); caches: contiguous, `[num_slots, ...]` with the same
/// row length (e.g. `[num_pages, page_size, num_kv_heads, head_dim]`); `indices`:
/// `[num_tokens]` int32 or int64 slot numbers. Indices outside the cache are
/// skipped. Writes the caches.
pub fn store_kv(k_cache: &Tensor, v_cache: &Tensor, indices: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
    let device = super::check::common_device(
        OP,
        &[("k_cache", k_cache), ("v_cache", v_cache), ("indices", indices), ("k", k), ("v", v)],
    )?;
    let k2 = super::check::rows_view(OP, "k", k)?;
    let v2 = super::check::rows_view(OP, "v", v)?;
    let [num_tokens, row] = k2.dims::<2>(OP, "k")?;
    v2.expect_shape(OP, "v", &[num_tokens, row])?;
    indices.expect_dtype(OP, "indices", &[DType::I32, DType::I64])?.expect_shape(OP, "indices", &[num_tokens])?;
    indices.expect_contiguous(OP, "indices")?;
    for (name, t) in [("k_cache", k_cache), ("v_cache", v_cache), ("v", v)] {
        if t.dtype() != k.dtype() {
            return Err(Error::arg(OP, format!("argument `{name}` has dtype {}, `k` has {}", t.dtype(), k.dtype())));
        }
    }
    k_cache.expect_contiguous(OP, "k_cache")?;
    v_cache.expect_contiguous(OP, "v_cache")?;
    if k_cache.shape() != v_cache.shape() {
        return Err(Error::arg(
            OP,
            format!("argument `v_cache` has shape {:?}, `k_cache` has {:?}", v_cache.shape(), k_cache.shape()),
        ));
    }
    if row == 0
        || !k_cache.numel().is_multiple_of(row)
        || k_cache.shape().last().is_none_or(|&last| !row.is_multiple_of(last))
    {
        return Err(Error::arg(
            OP,
            format!("argument `k_cache` of shape {:?} does not hold rows of {row} elements", k_cache.shape()),
        ));
    }
    let num_slots = k_cache.numel() / row;
    let kc = k_cache.reshape(&[num_slots, row])?;
    let vc = v_cache.reshape(&[num_slots, row])?;
    if num_tokens == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => crate::cpu::store_kv(&kc, &vc, indices, &k2, &v2),
        Device::Cuda(_) => {
            let row_bytes = row * k.dtype().size_in_bytes();
            let align = vec_bytes_for(row_bytes);
            for (name, t) in [("k", &k2), ("v", &v2), ("k_cache", &kc), ("v_cache", &vc)] {
                if !(t.device_ptr() as usize).is_multiple_of(align)
                    || !(t.strides()[0] * t.dtype().size_in_bytes()).is_multiple_of(align)
                {
                    return Err(Error::arg(OP, format!("argument `{name}` rows are not {align}-byte aligned")));
                }
            }
            let dev = k.cuda_device().ok_or_else(|| Error::arg(OP, "missing device"))?;
            let family = kernels::Registry::get()?.family("store")?;
            let instance: Instance = family.instance(&[("ROW_BYTES", row_bytes as i64)])?;
            match kernels::resolve(dev, "store", &instance)? {
                Resolved::Library(lib) => {
                    let (a, b, c, d, e) = (kc.abi(), vc.abi(), indices.abi(), k2.abi(), v2.abi());
                    dev.bind()?;
                    // SAFETY: the five views describe live device tensors checked above
                    // (device, dtypes, shapes, alignment); the launcher validates again
                    // and only enqueues work on this device's stream.
                    let status = unsafe { lib.launchers().msgl_store_kv(&a, &b, &c, &d, &e, dev.cu_stream().cast()) };
                    kernels::check_status(lib, OP, status)
                }
                Resolved::Function(f) => {
                    let elem = k.dtype().size_in_bytes();
                    let params = msgl_store_params {
                        k_cache: kc.device_ptr() as *mut _,
                        v_cache: vc.device_ptr() as *mut _,
                        indices: indices.device_ptr() as *const _,
                        k: k2.device_ptr() as *const _,
                        v: v2.device_ptr() as *const _,
                        k_row_stride: (k2.strides()[0] * elem) as i64,
                        v_row_stride: (v2.strides()[0] * elem) as i64,
                        num_tokens: num_tokens as i64,
                        num_slots: num_slots as i64,
                        index_is_64: (indices.dtype() == DType::I64) as i32,
                        reserved: 0,
                    };
                    let grid = num_tokens.div_ceil(WARPS_PER_BLOCK) as u32;
                    // SAFETY: `params` is the msgl_store_params the entry takes, filled
                    // from tensors validated above.
                    unsafe { f.launch(dev, grid, (WARPS_PER_BLOCK * 32) as u32, 0, &params) }
                }
            }
        }
    }
}

/// The widest copy unit dividing `bytes` (device.cuh's `vec_bytes_for`).
pub(crate) fn vec_bytes_for(bytes: usize) -> usize {
    [16, 8, 4, 2].into_iter().find(|&v| bytes.is_multiple_of(v)).unwrap_or(1)
}
