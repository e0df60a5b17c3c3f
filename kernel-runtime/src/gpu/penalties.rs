//! Penalties on CUDA: the per-slot counters (csrc/kernels/penalty_count.cu) and
//! the penalised logits rows (csrc/kernels/apply_penalties.cu). The op uploaded
//! the row and slot tables and checked them; the count kernel checks its
//! entries itself (its tokens may be sampled ids the host has not seen).

use crate::error::Result;
use crate::op_types::sampling::CountKind;
use crate::sys::kernels::{msgl_apply_penalties_params, msgl_penalty_count_params};
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32};

/// penalty_count.cu's kPenaltyCountThreads.
const COUNT_THREADS: usize = 256;
/// apply_penalties.cu's kApplyPenaltiesThreads.
const APPLY_THREADS: usize = 1024;

pub(crate) fn penalty_count(counts: &Tensor, slots: &Tensor, tokens: &Tensor, kind: CountKind) -> Result<()> {
    const OP: &str = "penalty_count";
    let dev = device_of(OP, counts)?;
    let n = slots.numel();
    let p = msgl_penalty_count_params {
        counts: counts.device_ptr() as *mut i32,
        slots: slots.device_ptr() as *const i32,
        tokens: tokens.device_ptr() as *const i32,
        vocab: counts.dim(1) as i64,
        num_slots: counts.dim(0) as i64,
        n: n as i64,
    };
    let grid = grid_u32(OP, n.div_ceil(COUNT_THREADS))?;
    let mode = kind as i32;
    let (a, b, c) = (counts.abi(), slots.abi(), tokens.abi());
    dispatch(
        OP,
        dev,
        "penalty_count",
        &[("MODE", i64::from(mode))],
        // SAFETY: the views describe live device tensors checked by the op; the
        // kernel skips entries whose slot or token is out of range.
        |lib, stream| unsafe { lib.msgl_penalty_count(&a, &b, &c, mode, stream) },
        // SAFETY: `p` is the msgl_penalty_count_params the entry takes, filled from
        // the same tensors.
        |f| unsafe { f.launch(dev, grid, COUNT_THREADS as u32, 0, &p) },
    )
}

pub(crate) fn apply_penalties(
    logits: &Tensor,
    counts: &Tensor,
    rows: &Tensor,
    slots: &Tensor,
    penalties: &Tensor,
) -> Result<()> {
    const OP: &str = "apply_penalties";
    let dev = device_of(OP, logits)?;
    let [num_rows, vocab] = logits.dims::<2>(OP, "logits")?;
    let n = rows.numel();
    let row_stride = if num_rows > 1 { logits.strides()[0] } else { vocab };
    let blocks_per_row = vocab.div_ceil(APPLY_THREADS);
    let p = msgl_apply_penalties_params {
        logits: logits.device_ptr() as *mut _,
        counts: counts.device_ptr() as *const i32,
        rows: rows.device_ptr() as *const i32,
        slots: slots.device_ptr() as *const i32,
        penalties: penalties.device_ptr() as *const f32,
        vocab: vocab as i64,
        row_stride: row_stride as i64,
        n: n as i64,
        blocks_per_row: blocks_per_row as i64,
    };
    let grid = grid_u32(OP, n * blocks_per_row)?;
    let (a, b, c, d, e) = (logits.abi(), counts.abi(), rows.abi(), slots.abi(), penalties.abi());
    dispatch(
        OP,
        dev,
        "apply_penalties",
        &[("DTYPE", dtype_code(logits))],
        // SAFETY: the views describe live device tensors checked by the op, which
        // checked every row and slot index on the host before uploading them.
        |lib, stream| unsafe { lib.msgl_apply_penalties(&a, &b, &c, &d, &e, stream) },
        // SAFETY: `p` is the msgl_apply_penalties_params the entry takes, filled
        // from the same tensors.
        |f| unsafe { f.launch(dev, grid, APPLY_THREADS as u32, 0, &p) },
    )
}
