//! `logprobs`: log probabilities of sampled tokens and the most likely
//! alternatives, on the device that holds the logits, so that a step whose
//! requests ask for them keeps its logits there (CUDA: csrc/kernels/logprobs.cu;
//! CPU: `cpu::logprobs`). Decode a row of the output with [`RowLogprobs::decode`].

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::staging::Upload;
use crate::tensor::Tensor;

pub use crate::op_types::sampling::{logprobs_cols, RowLogprobs, MAX_TOP_LOGPROBS};

/// For each `rows[i]`, writes into `out[i]` (`out` `[rows.len(), >=
/// logprobs_cols(top_n)]` int32, contiguous) the token `sampled[rows[i]]`
/// (`sampled`: `[num_rows]` int32, the step's sampled ids on the device), its log
/// probability under log_softmax of the raw logits row, and the `top_n` most
/// likely tokens with theirs. The row table goes up through `upload`.
pub fn logprobs(
    logits: &Tensor,
    rows: &[u32],
    sampled: &Tensor,
    top_n: usize,
    out: &Tensor,
    upload: &mut Upload,
) -> Result<()> {
    const OP: &str = "logprobs";
    let [num_rows, vocab] = logits.dims::<2>(OP, "logits")?;
    logits.expect_dtype(OP, "logits", &[DType::F32, DType::F16, DType::BF16])?;
    if vocab == 0 || vocab > (1 << 31) - 2 {
        return Err(Error::arg(OP, format!("argument `logits` has {vocab} columns")));
    }
    if num_rows > 1 && logits.strides()[1] != 1 {
        return Err(Error::arg(OP, "argument `logits` must have unit stride in its last dimension"));
    }
    if top_n > MAX_TOP_LOGPROBS {
        return Err(Error::arg(OP, format!("at most {MAX_TOP_LOGPROBS} alternatives, got {top_n}")));
    }
    sampled.expect_shape(OP, "sampled", &[num_rows])?.expect_dtype(OP, "sampled", &[DType::I32])?;
    sampled.expect_contiguous(OP, "sampled")?;
    let [out_rows, cols] = out.dims::<2>(OP, "out")?;
    out.expect_dtype(OP, "out", &[DType::I32])?.expect_contiguous(OP, "out")?;
    if out_rows != rows.len() || cols < logprobs_cols(top_n) {
        return Err(Error::arg(
            OP,
            format!("argument `out` is [{out_rows}, {cols}] for {} rows of {top_n}", rows.len()),
        ));
    }
    if sampled.device() != logits.device() || out.device() != logits.device() {
        return Err(Error::arg(OP, "arguments `sampled` and `out` must be on the device of `logits`"));
    }
    if let Some(&r) = rows.iter().find(|&&r| r as usize >= num_rows) {
        return Err(Error::arg(OP, format!("row {r} is outside the {num_rows} logits rows")));
    }
    if rows.is_empty() {
        return Ok(());
    }
    let rows_t = Tensor::empty(&[rows.len()], DType::I32, logits.device())?;
    upload.write_rows(&rows_t, bytemuck::cast_slice::<u32, i32>(rows), rows.len())?;
    match logits.device() {
        Device::Cpu => crate::cpu::logprobs::logprobs(logits, &rows_t, sampled, top_n, out),
        Device::Cuda(_) => crate::gpu::logprobs(logits, &rows_t, sampled, top_n, out),
    }
}
