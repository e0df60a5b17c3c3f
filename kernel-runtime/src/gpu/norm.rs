//! RMSNorm on CUDA (csrc/kernels/norm.cu): plain, fused with the residual add,
//! and per head on a strided view.
//!
//! The launch shape is chosen here ([`norm_shape`]) so that the GPU fills at any
//! row count: decode steps have few rows (64 tokens = 64 hidden rows, or 1024 q
//! heads), and one block per SM matters more there than few threads per row.

use crate::error::Result;
use crate::sys::kernels::msgl_norm_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, rows_aligned, vec_elems};

/// norm.cu's kNormMaxThreads.
const MAX_THREADS_PER_ROW: usize = 512;
/// norm.cu's kNormVecsPerThread.
const VECS_PER_THREAD: usize = 4;
/// Threads of a block shared by several rows, at most.
const SHARED_BLOCK: usize = 256;

/// How one launch covers the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NormShape {
    threads_per_row: usize,
    rows_per_block: usize,
    vectorized: bool,
}

/// The launch shape for `num_rows` rows of `hidden` elements, `vec` elements per
/// 16-byte vector, `aligned` when every row start is 16-byte aligned, on a GPU of
/// `sm_count` SMs.
///
/// The rule: start from the fewest threads that hold a row in registers (the
/// smallest power of two at 4 vectors a thread), and while that gives fewer
/// blocks than SMs, double the threads per row (down to one vector a thread) and
/// pack fewer rows per block (down to one warp a block), so that few rows still
/// spread over many SMs with short per-thread chains; with many rows (prefill)
/// this is the register-minimal shape with 256-thread blocks.
fn norm_shape(hidden: usize, vec: usize, aligned: bool, num_rows: usize, sm_count: usize) -> NormShape {
    let vectorized = aligned && hidden.is_multiple_of(vec) && hidden / vec <= MAX_THREADS_PER_ROW * VECS_PER_THREAD;
    let units = if vectorized { hidden / vec } else { hidden };
    let target = sm_count.max(1);
    let rows_per_block_for = |tpr: usize| {
        if tpr > 32 {
            return 1;
        }
        // Whole warps per block (the kernel's shuffles use full masks), at most 256 threads.
        let min_rows = (32 / tpr).max(1);
        let max_rows = (SHARED_BLOCK / tpr).max(1);
        let want = num_rows.div_ceil(target).clamp(min_rows, max_rows);
        want.div_ceil(min_rows) * min_rows
    };
    let mut threads_per_row = units.div_ceil(VECS_PER_THREAD).next_power_of_two().clamp(1, MAX_THREADS_PER_ROW);
    while num_rows.div_ceil(rows_per_block_for(threads_per_row)) < target
        && threads_per_row * 2 <= MAX_THREADS_PER_ROW
        && threads_per_row * 2 <= units.next_power_of_two()
    {
        threads_per_row *= 2;
    }
    NormShape { threads_per_row, rows_per_block: rows_per_block_for(threads_per_row), vectorized }
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
    let sms = device_of(OP, &x)?.sm_count().max(1) as usize;
    let shape = norm_shape(h, vec, rows_aligned(&x, 16) && rows_aligned(out, 16) && rows_aligned(w, 16), t, sms);
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
            lib.msgl_rms_norm(
                &a,
                &b,
                &c,
                eps,
                shape.threads_per_row as i32,
                shape.rows_per_block as i32,
                i32::from(shape.vectorized),
                stream,
            )
        }
    })
}

/// `residual += x; x = rms_norm(residual) * w`, in place; `x`, `residual` `[t, h]`
/// contiguous.
pub(crate) fn fused_add_rms_norm(x: &Tensor, residual: &Tensor, w: &Tensor, eps: f32) -> Result<()> {
    const OP: &str = "fused_add_rms_norm";
    let [t, h] = x.dims::<2>(OP, "x")?;
    let vec = vec_elems(x);
    let sms = device_of(OP, x)?.sm_count().max(1) as usize;
    let shape = norm_shape(h, vec, rows_aligned(x, 16) && rows_aligned(residual, 16) && rows_aligned(w, 16), t, sms);
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
            lib.msgl_fused_add_rms_norm(
                &a,
                &b,
                &c,
                eps,
                shape.threads_per_row as i32,
                shape.rows_per_block as i32,
                i32::from(shape.vectorized),
                stream,
            )
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
    let sms = device_of(OP, x)?.sm_count().max(1) as usize;
    let shape = norm_shape(d, vec, rows_aligned(x, 16) && rows_aligned(w, 16), t * heads, sms);
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
            lib.msgl_head_rms_norm(
                &a,
                &b,
                eps,
                shape.threads_per_row as i32,
                shape.rows_per_block as i32,
                i32::from(shape.vectorized),
                stream,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Many rows (prefill): the register-minimal shape, whatever the SM count.
    const MANY: usize = 1 << 20;

    #[test]
    fn many_rows_take_the_fewest_threads_that_hold_a_row() {
        // Qwen3 q/k norm: head_dim 128 bf16 = 16 vectors -> 4 threads, 64 rows a block.
        assert_eq!(
            norm_shape(128, 8, true, MANY, 132),
            NormShape { threads_per_row: 4, rows_per_block: 64, vectorized: true }
        );
        // Llama-3-8B hidden 4096 bf16: 512 vectors -> 128 threads, one row a block.
        assert_eq!(
            norm_shape(4096, 8, true, MANY, 132),
            NormShape { threads_per_row: 128, rows_per_block: 1, vectorized: true }
        );
        // f32 8192: 2048 vectors -> the 512-thread maximum.
        assert_eq!(norm_shape(8192, 4, true, MANY, 132).threads_per_row, 512);
        // Too wide for registers, odd widths and unaligned rows take the scalar path.
        assert!(!norm_shape(32768, 4, true, MANY, 132).vectorized);
        assert!(!norm_shape(100, 8, true, MANY, 132).vectorized);
        assert!(!norm_shape(128, 8, false, MANY, 132).vectorized);
    }

    #[test]
    fn few_rows_spread_over_the_sms() {
        // Qwen3-0.6B decode at 64 rows, hidden 1024 bf16 (128 vectors): was 8 blocks
        // of 8 rows; now one vector a thread, one row a block, 64 blocks.
        assert_eq!(
            norm_shape(1024, 8, true, 64, 132),
            NormShape { threads_per_row: 128, rows_per_block: 1, vectorized: true }
        );
        // Its q norm, 64 tokens x 16 heads of 128: 128 blocks of 8 rows of 16 threads.
        let q = norm_shape(128, 8, true, 1024, 132);
        assert_eq!(q, NormShape { threads_per_row: 16, rows_per_block: 8, vectorized: true });
        assert_eq!(1024usize.div_ceil(q.rows_per_block), 128);
        // One row of 4096: the whole row in one 512-thread block, one vector each.
        assert_eq!(
            norm_shape(4096, 8, true, 1, 132),
            NormShape { threads_per_row: 512, rows_per_block: 1, vectorized: true }
        );
    }

    #[test]
    fn every_shape_is_one_the_kernel_accepts() {
        for hidden in [1, 7, 64, 100, 128, 1024, 4096, 8192, 40000] {
            for vec in [4, 8] {
                for rows in [1, 3, 64, 1000, MANY] {
                    for sms in [1, 132] {
                        let s = norm_shape(hidden, vec, true, rows, sms);
                        assert!(s.threads_per_row.is_power_of_two() && s.threads_per_row <= MAX_THREADS_PER_ROW);
                        let block = s.threads_per_row * s.rows_per_block;
                        assert!(
                            block <= MAX_THREADS_PER_ROW && (block.is_multiple_of(32) || block == s.threads_per_row),
                            "{s:?}"
                        );
                        assert!(s.threads_per_row <= 32 || s.rows_per_block == 1);
                        if s.vectorized {
                            assert!(hidden / vec <= s.threads_per_row * VECS_PER_THREAD);
                        }
                    }
                }
            }
        }
    }
}
