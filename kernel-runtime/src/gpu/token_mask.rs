//! Token masks on CUDA (csrc/kernels/token_mask.cu): the packed masks of
//! constrained decoding go up as one `[num_masked, words]` int32 tensor with the
//! row index of each, and the kernel sets the disallowed logits to -inf in place.

use crate::device::Device;
use crate::error::Result;
use crate::sys::kernels::msgl_token_mask_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32};

/// token_mask.cu's kTokenMaskThreads.
const THREADS: usize = 1024;

/// Applies `mask` (`rows.len()` masks of `words_per_row` words) to the rows
/// `rows` of `logits`; the op checked the shapes and the row indices.
pub(crate) fn apply_token_mask(logits: &Tensor, mask: &[u32], words_per_row: usize, rows: &[u32]) -> Result<()> {
    const OP: &str = "apply_token_mask";
    let dev = device_of(OP, logits)?;
    let [num_rows, vocab] = logits.dims::<2>(OP, "logits")?;
    let device = Device::Cuda(dev.ordinal());
    // The kernel reads the words as unsigned: the cast keeps the bits.
    let bits: Vec<i32> = mask.iter().map(|&w| w as i32).collect();
    let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
    let mask_t = Tensor::from_slice(&bits, &[rows.len(), words_per_row], device)?;
    let rows_t = Tensor::from_slice(&idx, &[rows.len()], device)?;
    let row_stride = if num_rows > 1 { logits.strides()[0] } else { vocab };
    let blocks_per_row = vocab.div_ceil(THREADS);
    let p = msgl_token_mask_params {
        logits: logits.device_ptr() as *mut _,
        mask: mask_t.device_ptr() as *const u32,
        rows: rows_t.device_ptr() as *const i32,
        vocab: vocab as i64,
        row_stride: row_stride as i64,
        words_per_row: words_per_row as i64,
        num_masked: rows.len() as i64,
        blocks_per_row: blocks_per_row as i64,
    };
    let grid = grid_u32(OP, rows.len() * blocks_per_row)?;
    let (a, b, c) = (logits.abi(), mask_t.abi(), rows_t.abi());
    dispatch(
        OP,
        dev,
        "token_mask",
        &[("DTYPE", dtype_code(logits))],
        // SAFETY: the views describe live device tensors: the logits checked by the
        // op, and the mask and rows uploaded above, which the caching allocator only
        // reuses for work enqueued later on the same stream.
        |lib, stream| unsafe { lib.msgl_token_mask(&a, &b, &c, stream) },
        // SAFETY: `p` is the msgl_token_mask_params the entry takes, filled from the
        // same tensors; the op checked every row index against the logits' rows.
        |f| unsafe { f.launch(dev, grid, THREADS as u32, 0, &p) },
    )
}
