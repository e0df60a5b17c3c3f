//! Rotary embedding on CUDA (csrc/kernels/rope.cu), neox layout, in place on
//! strided q and k views.
//!
//! One thread per (token, head, 16-byte chunk of the rotated half) over a
//! grid-stride loop; the grid is sized here to the work, capped at a few waves.

use crate::dtype::DType;
use crate::error::Result;
use crate::sys::kernels::msgl_rope_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, rows_aligned, vec_elems};

/// rope.cu's kRopeThreads.
const THREADS: usize = 256;
/// Blocks per SM beyond which the grid-stride loop takes over.
const BLOCKS_PER_SM: usize = 16;

/// Rotates `q` `[t, hq, d]` and `k` `[t, hk, d]` in place by `cos_sin[positions]`.
pub(crate) fn rope(q: &Tensor, k: &Tensor, positions: &Tensor, cos_sin: &Tensor) -> Result<()> {
    const OP: &str = "rope";
    let dev = device_of(OP, q)?;
    let [t, hq, _d] = q.dims::<3>(OP, "q")?;
    let [_, hk, _] = k.dims::<3>(OP, "k")?;
    let [max_positions, rotary_dim] = cos_sin.dims::<2>(OP, "cos_sin")?;
    let half = rotary_dim / 2;
    let vec = vec_elems(q);
    let vectorized =
        half.is_multiple_of(vec) && rows_aligned(q, 16) && rows_aligned(k, 16) && rows_aligned(cos_sin, 16);
    let chunks = if vectorized { half / vec } else { half };
    let items = t * (hq + hk) * chunks;
    if items == 0 {
        return Ok(());
    }
    let grid = grid_u32(OP, items.div_ceil(THREADS).min(dev.sm_count().max(1) as usize * BLOCKS_PER_SM))?;
    let p = msgl_rope_params {
        q: q.device_ptr() as *mut _,
        k: k.device_ptr() as *mut _,
        positions: positions.device_ptr() as *const _,
        cos_sin: cos_sin.device_ptr() as *const f32,
        num_tokens: t as i64,
        q_token_stride: q.strides()[0] as i64,
        q_head_stride: q.strides()[1] as i64,
        k_token_stride: k.strides()[0] as i64,
        k_head_stride: k.strides()[1] as i64,
        max_positions: max_positions as i64,
        num_q_heads: hq as i32,
        num_k_heads: hk as i32,
        rotary_dim: rotary_dim as i32,
        index_is_64: i32::from(positions.dtype() == DType::I64),
        vectorized: i32::from(vectorized),
        reserved: 0,
    };
    let (a, b, c, d) = (q.abi(), k.abi(), positions.abi(), cos_sin.abi());
    dispatch(
        OP,
        dev,
        "rope",
        &[("DTYPE", dtype_code(q))],
        |lib, stream| {
            // SAFETY: the views describe live device tensors checked by the op; the
            // launcher validates them again and only enqueues work on `stream`.
            unsafe { lib.msgl_rope(&a, &b, &c, &d, i32::from(vectorized), grid as i32, stream) }
        },
        |f| {
            // SAFETY: `p` is the msgl_rope_params the entry takes, filled from the
            // tensors checked by the op (alignment checked above for the vector path).
            unsafe { f.launch(dev, grid, THREADS as u32, 0, &p) }
        },
    )
}
