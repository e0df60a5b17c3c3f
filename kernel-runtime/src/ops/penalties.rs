//! Penalties on the device that holds the logits (the engine's
//! `sampling::penalties` rules, kept as per-slot counters so that a step never
//! needs the host to know the previous step's token):
//!
//! - [`penalty_count`]: counts tokens into a slot's row of `[slots, vocab]` int32
//!   counters (prompt tokens once, when a request's slot is set up; each step's
//!   sampled ids, straight from the device, after sampling);
//! - [`apply_penalties`]: penalises logits rows from their slots' counters before
//!   sampling.
//!
//! CUDA: csrc/kernels/penalty_count.cu, apply_penalties.cu; CPU: `cpu::penalties`.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::staging::Upload;
use crate::tensor::Tensor;

pub use crate::op_types::sampling::{CountKind, PenaltyRow, PROMPT_BIT};

/// Records `tokens[i]` in slot `slots[i]` of `counts` (`[num_slots, vocab]` int32,
/// contiguous): one more output occurrence, or "in the prompt". `slots` and
/// `tokens` are `[n]` int32 on the same device; an entry whose slot is negative
/// or out of range, or whose token is outside the vocabulary, is skipped (on the
/// device too: the tokens may be sampled ids no host has checked).
pub fn penalty_count(counts: &Tensor, slots: &Tensor, tokens: &Tensor, kind: CountKind) -> Result<()> {
    const OP: &str = "penalty_count";
    counts.dims::<2>(OP, "counts")?;
    counts.expect_dtype(OP, "counts", &[DType::I32])?.expect_contiguous(OP, "counts")?;
    let [n] = slots.dims::<1>(OP, "slots")?;
    slots.expect_dtype(OP, "slots", &[DType::I32])?.expect_contiguous(OP, "slots")?;
    tokens.expect_shape(OP, "tokens", &[n])?.expect_dtype(OP, "tokens", &[DType::I32])?;
    tokens.expect_contiguous(OP, "tokens")?;
    if slots.device() != counts.device() || tokens.device() != counts.device() {
        return Err(Error::arg(OP, "arguments `counts`, `slots` and `tokens` must be on one device"));
    }
    if n == 0 {
        return Ok(());
    }
    match counts.device() {
        Device::Cpu => crate::cpu::penalties::penalty_count(counts, slots, tokens, kind),
        Device::Cuda(_) => crate::gpu::penalty_count(counts, slots, tokens, kind),
    }
}

/// Penalises the logits rows of `rows` (`logits` `[num_rows, vocab]`, float, unit
/// stride in the last dimension; changed in place, in f32 arithmetic) from the
/// counters of their slots in `counts` (`[num_slots, vocab]` int32, on the same
/// device). The tables go up through `upload` without waiting for the stream.
pub fn apply_penalties(logits: &Tensor, counts: &Tensor, rows: &[PenaltyRow], upload: &mut Upload) -> Result<()> {
    const OP: &str = "apply_penalties";
    let [num_rows, vocab] = logits.dims::<2>(OP, "logits")?;
    logits.expect_dtype(OP, "logits", &[DType::F32, DType::F16, DType::BF16])?;
    if vocab == 0 || vocab > (1 << 31) - 2 {
        return Err(Error::arg(OP, format!("argument `logits` has {vocab} columns")));
    }
    if num_rows > 1 && logits.strides()[1] != 1 {
        return Err(Error::arg(OP, "argument `logits` must have unit stride in its last dimension"));
    }
    let [num_slots, _] = counts.dims::<2>(OP, "counts")?;
    counts.expect_shape(OP, "counts", &[num_slots, vocab])?.expect_dtype(OP, "counts", &[DType::I32])?;
    counts.expect_contiguous(OP, "counts")?;
    if counts.device() != logits.device() {
        return Err(Error::arg(OP, "argument `counts` is not on the device of `logits`"));
    }
    for r in rows {
        if r.row as usize >= num_rows || r.slot as usize >= num_slots {
            return Err(Error::arg(OP, format!("{r:?} is outside the {num_rows} rows or the {num_slots} slots")));
        }
        if !(r.repetition.is_finite() && r.repetition > 0.0 && r.frequency.is_finite() && r.presence.is_finite()) {
            return Err(Error::arg(OP, format!("{r:?} has a penalty out of range")));
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    let n = rows.len();
    let device = logits.device();
    let (rows_t, slots_t) = (Tensor::empty(&[n], DType::I32, device)?, Tensor::empty(&[n], DType::I32, device)?);
    let pen_t = Tensor::empty(&[n, 3], DType::F32, device)?;
    let row_ids: Vec<i32> = rows.iter().map(|r| r.row as i32).collect();
    let slot_ids: Vec<i32> = rows.iter().map(|r| r.slot as i32).collect();
    let values: Vec<f32> = rows.iter().flat_map(|r| [r.repetition, r.frequency, r.presence]).collect();
    upload.write_rows(&rows_t, &row_ids, n)?;
    upload.write_rows(&slots_t, &slot_ids, n)?;
    upload.write_rows(&pen_t, &values, 3)?;
    match device {
        Device::Cpu => crate::cpu::penalties::apply_penalties(logits, counts, &rows_t, &slots_t, &pen_t),
        Device::Cuda(_) => crate::gpu::apply_penalties(logits, counts, &rows_t, &slots_t, &pen_t),
    }
}
