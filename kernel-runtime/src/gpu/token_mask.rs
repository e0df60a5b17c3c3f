//! Token masks on CUDA (csrc/kernels/token_mask.cu): the packed masks of
//! constrained decoding go up as one `[num_masked, words]` int32 tensor with the
//! row index of each, and the kernel sets the disallowed logits to -inf in place.

use std::sync::Mutex;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::staging::Upload;
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
    let device = Device::Cuda(dev.ordinal());
    let mask_t = Tensor::empty(&[rows.len(), words_per_row], DType::I32, device)?;
    let rows_t = Tensor::empty(&[rows.len()], DType::I32, device)?;
    {
        // The masks go up through pinned staging, without waiting for the
        // stream: the forward pass that makes these logits may still be running
        // (a synchronous copy would wait for it, then leave the GPU idle).
        let mut staging = STAGING.lock().map_err(|_| Error::arg(OP, "the mask staging was poisoned by a panic"))?;
        let upload = match staging.iter_mut().position(|(o, _)| *o == dev.ordinal()) {
            Some(i) => &mut staging[i].1,
            None => {
                staging.push((dev.ordinal(), Upload::new(device)?));
                let last = staging.len() - 1;
                &mut staging[last].1
            }
        };
        upload.begin()?;
        // The kernel reads the words as unsigned: the cast keeps the bits.
        upload.write_rows(&mask_t, bytemuck::cast_slice::<u32, i32>(mask), words_per_row)?;
        upload.write_rows(&rows_t, bytemuck::cast_slice::<u32, i32>(rows), rows.len())?;
    }
    apply_token_mask_tensors(logits, &mask_t, &rows_t)
}

/// Pinned staging for the masks, one per device (the engine's thread is the
/// only user in a server; a lock keeps other callers correct).
static STAGING: Mutex<Vec<(usize, Upload)>> = Mutex::new(Vec::new());

/// Applies the masks already on the device: `mask` `[n, words]` int32 (the
/// words' bits), `rows` `[n]` int32 row indices of `logits`, both contiguous
/// (the op checked the host copies against the logits).
fn apply_token_mask_tensors(logits: &Tensor, mask_t: &Tensor, rows_t: &Tensor) -> Result<()> {
    const OP: &str = "apply_token_mask";
    let dev = device_of(OP, logits)?;
    let [num_rows, vocab] = logits.dims::<2>(OP, "logits")?;
    let [num_masked, words_per_row] = mask_t.dims::<2>(OP, "mask")?;
    let row_stride = if num_rows > 1 { logits.strides()[0] } else { vocab };
    let blocks_per_row = vocab.div_ceil(THREADS);
    let p = msgl_token_mask_params {
        logits: logits.device_ptr() as *mut _,
        mask: mask_t.device_ptr() as *const u32,
        rows: rows_t.device_ptr() as *const i32,
        vocab: vocab as i64,
        row_stride: row_stride as i64,
        words_per_row: words_per_row as i64,
        num_masked: num_masked as i64,
        blocks_per_row: blocks_per_row as i64,
    };
    let grid = grid_u32(OP, num_masked * blocks_per_row)?;
    let (a, b, c) = (logits.abi(), mask_t.abi(), rows_t.abi());
    dispatch(
        OP,
        dev,
        "token_mask",
        &[("DTYPE", dtype_code(logits))],
        // SAFETY: the views describe live device tensors checked by the op (the
        // logits, and the masks and rows it was given or uploaded), which the
        // caching allocator only reuses for work enqueued later on the same stream.
        |lib, stream| unsafe { lib.msgl_token_mask(&a, &b, &c, stream) },
        // SAFETY: `p` is the msgl_token_mask_params the entry takes, filled from the
        // same tensors; the op checked every row index against the logits' rows.
        |f| unsafe { f.launch(dev, grid, THREADS as u32, 0, &p) },
    )
}
