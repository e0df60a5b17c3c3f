//! RMSNorm on CUDA (csrc/kernels/norm.cu): plain, fused with the residual add,
//! and per head on a strided view.
//!
//! The launch shape is chosen here: a row of `hidden` elements gets the smallest
//! power-of-two group of threads that holds it in registers at 4 16-byte vectors
//! per thread (at most 512 threads); groups of up to 32 threads share 256-thread
//! blocks, wider ones own a block. Unaligned rows take the kernel's scalar path.

use crate::error::Result;
use crate::sys::kernels::msgl_norm_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, rows_aligned, vec_elems};

/// norm.cu's kNormMaxThreads.
const MAX_THREADS_PER_ROW: usize = 512;
/// norm.cu's kNormVecsPerThread.
const VECS_PER_THREAD: usize = 4;
/// Threads of a block shared by several rows.
const SHARED_BLOCK: usize = 256;

/// How one launch covers the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NormShape {
    threads_per_row: usize,
    rows_per_block: usize,
    vectorized: bool,
}

/// The launch shape for rows of `hidden` elements of `vec` elements per 16-byte
/// vector, `aligned` when every row start is 16-byte aligned.
fn norm_shape(hidden: usize, vec: usize, aligned: bool) -> NormShape {
    let vectorized = aligned && hidden.is_multiple_of(vec) && hidden / vec <= MAX_THREADS_PER_ROW * VECS_PER_THREAD;
    let units = if vectorized { hidden / vec } else { hidden };
    let threads_per_row = units.div_ceil(VECS_PER_THREAD).next_power_of_two().clamp(1, MAX_THREADS_PER_ROW);
    let rows_per_block = if threads_per_row > 32 { 1 } else { SHARED_BLOCK / threads_per_row };
    NormShape { threads_per_row, rows_per_block, vectorized }
}

/// Launches the norm kernel over `p.num_rows` rows (p's pointers and strides filled).
fn launch(
    op: &'static str,
    x: &Tensor,
    mut p: msgl_norm_params,
    shape: NormShape,
    library: impl FnOnce(&crate::sys::kernels::KernelLibrary, crate::sys::kernels::msgl_stream) -> i32,
) -> Result<()> {
    let dev = device_of(op, x)?;
    p.threads_per_row = shape.threads_per_row as i32;
    p.rows_per_block = shape.rows_per_block as i32;
    p.vectorized = i32::from(shape.vectorized);
    let grid = grid_u32(op, (p.num_rows as usize).div_ceil(shape.rows_per_block))?;
    let block = (shape.threads_per_row * shape.rows_per_block) as u32;
    dispatch(op, dev, "norm", &[("DTYPE", dtype_code(x))], library, |f| {
        // SAFETY: `p` is the msgl_norm_params the entry takes; its pointers and
        // strides describe live device tensors of `p.num_rows` rows checked by the op
        // and above (alignment for the vector path).
        unsafe { f.launch(dev, grid, block, 0, &p) }
    })
}

/// `out = x / rms(x) * w`; `out` `[t, h]` contiguous, `x` `[t, h]`, `w` `[h]`.
pub(crate) fn rms_norm(out: &Tensor, x: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    const OP: &str = "rms_norm";
    let x = if x.dim(1) > 1 && x.strides()[1] != 1 { x.contiguous()? } else { x.clone() };
    let [t, h] = x.dims::<2>(OP, "x")?;
    let vec = vec_elems(&x);
    let shape = norm_shape(h, vec, rows_aligned(&x, 16) && rows_aligned(out, 16) && rows_aligned(w, 16));
    let x_row = if t > 1 { x.strides()[0] } else { h };
    let p = msgl_norm_params {
        out: out.device_ptr() as *mut _,
        x: x.device_ptr() as *mut _,
        residual: std::ptr::null_mut(),
        weight: w.device_ptr() as *const _,
        num_rows: t as i64,
        hidden: h as i64,
        heads: 1,
        x_token_stride: x_row as i64,
        out_token_stride: h as i64,
        eps,
        ..Default::default()
    };
    let (a, b, c) = (out.abi(), x.abi(), w.abi());
    launch(OP, &x, p, shape, |lib, stream| {
        // SAFETY: the views describe live device tensors checked by the op; the
        // launcher validates them again and only enqueues work on `stream`.
        unsafe {
            lib.msgl_rms_norm(&a, &b, &c, eps, shape.threads_per_row as i32, shape.rows_per_block as i32, i32::from(shape.vectorized), stream)
        }
    })
}

/// `residual += x; x = rms_norm(residual) * w`, in place; `x`, `residual` `[t, h]`
/// contiguous.
pub(crate) fn fused_add_rms_norm(x: &Tensor, residual: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    const OP: &str = "fused_add_rms_norm";
    let [t, h] = x.dims::<2>(OP, "x")?;
    let vec = vec_elems(x);
    let shape = norm_shape(h, vec, rows_aligned(x, 16) && rows_aligned(residual, 16) && rows_aligned(w, 16));
    let p = msgl_norm_params {
        out: x.device_ptr() as *mut _,
        x: x.device_ptr() as *mut _,
        residual: residual.device_ptr() as *mut _,
        weight: w.device_ptr() as *const _,
        num_rows: t as i64,
        hidden: h as i64,
        heads: 1,
        x_token_stride: h as i64,
        out_token_stride: h as i64,
        residual_row_stride: h as i64,
        eps,
        ..Default::default()
    };
    let (a, b, c) = (x.abi(), residual.abi(), w.abi());
    launch(OP, x, p, shape, |lib, stream| {
        // SAFETY: as in rms_norm.
        unsafe {
            lib.msgl_fused_add_rms_norm(&a, &b, &c, eps, shape.threads_per_row as i32, shape.rows_per_block as i32, i32::from(shape.vectorized), stream)
        }
    })
}

/// Per-head RMSNorm in place on `x` `[t, heads, d]` (unit last stride), `w` `[d]`.
pub(crate) fn head_rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    const OP: &str = "head_rms_norm";
    let [t, heads, d] = x.dims::<3>(OP, "x")?;
    if heads == 0 || d == 0 {
        return Ok(());
    }
    let vec = vec_elems(x);
    let shape = norm_shape(d, vec, rows_aligned(x, 16) && rows_aligned(w, 16));
    let (s0, s1) = (x.strides()[0] as i64, x.strides()[1] as i64);
    let p = msgl_norm_params {
        out: x.device_ptr() as *mut _,
        x: x.device_ptr() as *mut _,
        residual: std::ptr::null_mut(),
        weight: w.device_ptr() as *const _,
        num_rows: (t * heads) as i64,
        hidden: d as i64,
        heads: heads as i64,
        x_token_stride: s0,
        x_head_stride: s1,
        out_token_stride: s0,
        out_head_stride: s1,
        eps,
        ..Default::default()
    };
    let (a, b) = (x.abi(), w.abi());
    launch(OP, x, p, shape, |lib, stream| {
        // SAFETY: as in rms_norm.
        unsafe {
            lib.msgl_head_rms_norm(&a, &b, eps, shape.threads_per_row as i32, shape.rows_per_block as i32, i32::from(shape.vectorized), stream)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_fit_in_registers_of_a_power_of_two_group() {
        // Qwen3 q/k norm: head_dim 128 bf16 = 16 vectors -> 4 threads, 64 rows a block.
        assert_eq!(norm_shape(128, 8, true), NormShape { threads_per_row: 4, rows_per_block: 64, vectorized: true });
        // Llama-3-8B hidden 4096 bf16: 512 vectors -> 128 threads, one row a block.
        assert_eq!(norm_shape(4096, 8, true), NormShape { threads_per_row: 128, rows_per_block: 1, vectorized: true });
        // f32 8192: 2048 vectors -> the 512-thread maximum.
        assert_eq!(norm_shape(8192, 4, true).threads_per_row, 512);
        // Too wide for registers, odd widths and unaligned rows take the scalar path.
        assert!(!norm_shape(32768, 4, true).vectorized);
        assert!(!norm_shape(100, 8, true).vectorized);
        assert!(!norm_shape(128, 8, false).vectorized);
        for hidden in [1, 7, 64, 100, 4096, 8192, 40000] {
            for vec in [4, 8] {
                let s = norm_shape(hidden, vec, true);
                assert!(s.threads_per_row.is_power_of_two() && s.threads_per_row <= MAX_THREADS_PER_ROW);
                assert!(s.threads_per_row * s.rows_per_block <= MAX_THREADS_PER_ROW);
                assert!(s.threads_per_row <= 32 || s.rows_per_block == 1);
                if s.vectorized {
                    assert!(hidden / vec <= s.threads_per_row * VECS_PER_THREAD);
                }
            }
        }
    }
}
