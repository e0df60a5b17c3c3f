//! CPU reference of `ops::logprobs` (csrc/kernels/logprobs.cu): the sampled
//! token's log probability under log_softmax of the raw row, and the most likely
//! tokens, ordered by value (total order: -0 below +0), lower id first on ties;
//! NaN counts as -inf. Sums in f64 (the kernel's are f32: values agree to
//! rounding, ids exactly).

use crate::error::Result;
use crate::op_types::sampling::logprobs_cols;
use crate::tensor::Tensor;

/// Fills `out[i]` for logits row `rows[i]` and the token `sampled[rows[i]]`.
pub fn logprobs(logits: &Tensor, rows: &Tensor, sampled: &Tensor, top_n: usize, out: &Tensor) -> Result<()> {
    let rows = rows.to_vec::<i32>()?;
    let sampled = sampled.to_vec::<i32>()?;
    let cols = out.dim(1);
    let mut words = out.to_vec::<i32>()?;
    for (i, &r) in rows.iter().enumerate() {
        let row = super::read_f32(&logits.narrow(0, r as usize, 1)?)?;
        let token = sampled[r as usize];
        let dst = &mut words[i * cols..i * cols + logprobs_cols(top_n)];
        row_logprobs(&row, token, top_n, dst);
    }
    out.write_rows(&words, cols)
}

fn row_logprobs(row: &[f32], token: i32, top_n: usize, dst: &mut [i32]) {
    let clean = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let max = row.iter().copied().map(clean).fold(f32::NEG_INFINITY, f32::max);
    let log_sum = if max.is_finite() {
        let sum: f64 = row.iter().map(|&v| (f64::from(clean(v)) - f64::from(max)).exp()).sum();
        f64::from(max) + sum.ln()
    } else {
        f64::INFINITY
    };
    let logprob = |v: f32| -> f32 {
        if v.is_finite() && log_sum.is_finite() {
            (f64::from(v) - log_sum) as f32
        } else {
            f32::NEG_INFINITY
        }
    };
    let token_value = usize::try_from(token).ok().and_then(|t| row.get(t)).map_or(f32::NEG_INFINITY, |&v| clean(v));
    dst[0] = token;
    dst[1] = logprob(token_value).to_bits() as i32;
    let mut order: Vec<usize> = (0..row.len()).collect();
    let by_value = |a: &usize, b: &usize| clean(row[*b]).total_cmp(&clean(row[*a])).then(a.cmp(b));
    let n = top_n.min(order.len());
    if n < order.len() {
        order.select_nth_unstable_by(n, by_value);
        order.truncate(n);
    }
    order.sort_by(by_value);
    for k in 0..top_n {
        let (id, lp) = match order.get(k) {
            Some(&id) => (id as i32, logprob(clean(row[id]))),
            None => (i32::MAX, f32::NEG_INFINITY),
        };
        dst[2 + 2 * k] = id;
        dst[3 + 2 * k] = lp.to_bits() as i32;
    }
}
