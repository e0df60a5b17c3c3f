//! CPU reference of `ops::penalty_count` and `ops::apply_penalties`
//! (csrc/kernels/penalty_count.cu, apply_penalties.cu): the same counters and
//! the same f32 operations, so that a row penalised on either device is equal
//! bit for bit.

use crate::error::Result;
use crate::op_types::sampling::{CountKind, PROMPT_BIT};
use crate::tensor::Tensor;

/// Counter bits of the output occurrences.
const COUNT_MASK: i32 = PROMPT_BIT - 1;

/// `counts[slots[i], tokens[i]]` += 1 (`Output`) or |= the prompt bit
/// (`Prompt`); entries with a slot or token out of range are skipped.
pub fn penalty_count(counts: &Tensor, slots: &Tensor, tokens: &Tensor, kind: CountKind) -> Result<()> {
    let [num_slots, vocab] = [counts.dim(0), counts.dim(1)];
    let slots = slots.to_vec::<i32>()?;
    let tokens = tokens.to_vec::<i32>()?;
    // SAFETY: exclusive write access to a contiguous host tensor (ops' ordering rule).
    let c = unsafe { counts.host_slice_mut::<i32>()? };
    for (&s, &t) in slots.iter().zip(&tokens) {
        if s < 0 || s as usize >= num_slots || t < 0 || t as usize >= vocab {
            continue;
        }
        let counter = &mut c[s as usize * vocab + t as usize];
        match kind {
            CountKind::Output => *counter += 1,
            CountKind::Prompt => *counter |= PROMPT_BIT,
        }
    }
    Ok(())
}

/// Penalises row `rows[i]` of `logits` from the counters of slot `slots[i]`
/// with `penalties[i] = (repetition, frequency, presence)` (see
/// apply_penalties.cu); the op checked every index.
pub fn apply_penalties(
    logits: &Tensor,
    counts: &Tensor,
    rows: &Tensor,
    slots: &Tensor,
    penalties: &Tensor,
) -> Result<()> {
    let vocab = logits.dim(1);
    let rows = rows.to_vec::<i32>()?;
    let slots = slots.to_vec::<i32>()?;
    let penalties = penalties.to_vec::<f32>()?;
    let counts = counts.to_vec::<i32>()?;
    for (i, (&r, &s)) in rows.iter().zip(&slots).enumerate() {
        let [repetition, frequency, presence] = [penalties[3 * i], penalties[3 * i + 1], penalties[3 * i + 2]];
        let row = logits.narrow(0, r as usize, 1)?;
        let mut values = super::read_f32(&row)?;
        let counters = &counts[s as usize * vocab..(s as usize + 1) * vocab];
        for (v, &c) in values.iter_mut().zip(counters) {
            if c == 0 {
                continue;
            }
            if repetition != 1.0 {
                *v = if *v > 0.0 { *v / repetition } else { *v * repetition };
            }
            let k = c & COUNT_MASK;
            if k > 0 {
                *v -= frequency * k as f32 + presence;
            }
        }
        super::write_f32(&row, &values)?;
    }
    Ok(())
}
