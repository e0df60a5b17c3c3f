//! SiLU-and-mul on CUDA (csrc/kernels/activation.cu).
//!
//! Each row of `inter` outputs is cut into 256-thread blocks; a thread handles one
//! 16-byte vector when the width allows it, else one element.

use crate::error::Result;
use crate::sys::kernels::msgl_silu_mul_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, rows_aligned, vec_elems};

/// activation.cu's kSiluThreads.
const THREADS: usize = 256;

/// `out[t, j] = silu(x[t, j]) * x[t, inter + j]`; `out` `[t, inter]`, `x` `[t, 2 inter]`,
/// both contiguous.
pub(crate) fn silu_mul(out: &Tensor, x: &Tensor) -> Result<()> {
    const OP: &str = "silu_mul";
    let dev = device_of(OP, x)?;
    let [t, inter] = out.dims::<2>(OP, "out")?;
    if inter == 0 {
        return Ok(());
    }
    let vec = vec_elems(x);
    let vectorized = inter.is_multiple_of(vec) && rows_aligned(x, 16) && rows_aligned(out, 16);
    let per_row = if vectorized { inter / vec } else { inter };
    let blocks_per_row = per_row.div_ceil(THREADS);
    let grid = grid_u32(OP, t * blocks_per_row)?;
    let p = msgl_silu_mul_params {
        out: out.device_ptr() as *mut _,
        x: x.device_ptr() as *const _,
        num_tokens: t as i64,
        inter: inter as i64,
        vectorized: i32::from(vectorized),
        blocks_per_row: blocks_per_row as i32,
    };
    let (a, b) = (out.abi(), x.abi());
    dispatch(
        OP,
        dev,
        "activation",
        &[("DTYPE", dtype_code(x))],
        |lib, stream| {
            // SAFETY: the views describe live, contiguous device tensors checked by the
            // op; the launcher validates them again and only enqueues work on `stream`.
            unsafe { lib.msgl_silu_mul(&a, &b, i32::from(vectorized), stream) }
        },
        |f| {
            // SAFETY: `p` is the msgl_silu_mul_params the entry takes, filled from the
            // contiguous tensors checked by the op (alignment checked above).
            unsafe { f.launch(dev, grid, THREADS as u32, 0, &p) }
        },
    )
}
