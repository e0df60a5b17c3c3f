//! Deterministic uniform fills on CUDA (csrc/kernels/random.cu): dummy weights
//! made where they are used.

use crate::error::Result;
use crate::sys::kernels::msgl_fill_uniform_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32};

/// random.cu's kRandomThreads.
const THREADS: usize = 256;
/// Blocks per SM of the grid-stride loop: enough to keep HBM busy with stores.
const BLOCKS_PER_SM: usize = 8;

/// `out[i] = center + half_width * (2 u(seed, i) - 1)`; `out` a contiguous 1-D
/// float tensor (the op flattens it).
pub(crate) fn fill_uniform(out: &Tensor, seed: u64, center: f32, half_width: f32) -> Result<()> {
    const OP: &str = "fill_uniform";
    let dev = device_of(OP, out)?;
    let numel = out.numel();
    if numel == 0 {
        return Ok(());
    }
    let grid = grid_u32(OP, numel.div_ceil(THREADS).min(BLOCKS_PER_SM * dev.sm_count().max(1) as usize))?;
    let p = msgl_fill_uniform_params { out: out.device_ptr() as *mut _, numel: numel as i64, seed, center, half_width };
    let a = out.abi();
    dispatch(
        OP,
        dev,
        "random",
        &[("DTYPE", dtype_code(out))],
        |lib, stream| {
            // SAFETY: the view describes a live, contiguous device tensor checked by the
            // op; the launcher validates it again and only enqueues work on `stream`.
            unsafe { lib.msgl_fill_uniform(&a, seed, center, half_width, grid as i32, stream) }
        },
        |f| {
            // SAFETY: `p` is the msgl_fill_uniform_params the entry takes, for the
            // contiguous tensor checked by the op; the loop is grid-stride.
            unsafe { f.launch(dev, grid, THREADS as u32, 0, &p) }
        },
    )
}
