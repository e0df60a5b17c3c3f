//! Log probabilities on CUDA (csrc/kernels/logprobs.cu): one block of 512
//! threads per reported row; the op uploaded and checked the row table.

use crate::error::Result;
use crate::sys::kernels::msgl_logprobs_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32};

/// logprobs.cu's kLogprobsThreads.
const THREADS: u32 = 512;

pub(crate) fn logprobs(logits: &Tensor, rows: &Tensor, sampled: &Tensor, top_n: usize, out: &Tensor) -> Result<()> {
    const OP: &str = "logprobs";
    let dev = device_of(OP, logits)?;
    let [num_rows, vocab] = logits.dims::<2>(OP, "logits")?;
    let n = rows.numel();
    let row_stride = if num_rows > 1 { logits.strides()[0] } else { vocab };
    let p = msgl_logprobs_params {
        logits: logits.device_ptr() as *const _,
        rows: rows.device_ptr() as *const i32,
        sampled: sampled.device_ptr() as *const i32,
        out: out.device_ptr() as *mut i32,
        vocab: vocab as i64,
        row_stride: row_stride as i64,
        n: n as i64,
        top_n: top_n as i64,
        out_stride: out.dim(1) as i64,
    };
    let grid = grid_u32(OP, n)?;
    let (a, b, c, d) = (logits.abi(), rows.abi(), sampled.abi(), out.abi());
    dispatch(
        OP,
        dev,
        "logprobs",
        &[("DTYPE", dtype_code(logits))],
        // SAFETY: the views describe live device tensors checked by the op, which
        // checked every row index on the host; the kernel checks the sampled ids.
        |lib, stream| unsafe { lib.msgl_logprobs(&a, &b, &c, &d, top_n as i64, stream) },
        // SAFETY: `p` is the msgl_logprobs_params the entry takes, filled from the
        // same tensors.
        |f| unsafe { f.launch(dev, grid, THREADS, 0, &p) },
    )
}
