//! CPU reference of `ops::sample`: the algorithm of csrc/kernels/sampling.cu
//! (bisection over the order-preserving integer image of the logits for the top-k
//! and top-p thresholds, min-p in the scaled log domain, inverse CDF in index
//! order), with sums in f64.

use crate::dtype::DType;
use crate::error::Result;
use crate::op_types::sampling::SampleRow;
use crate::tensor::Tensor;

/// Orders floats as unsigned integers, as the kernel's `sample_key`.
fn key(v: f32) -> u32 {
    let b = v.to_bits();
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The token of one row.
pub fn sample_row(x: &[f32], p: &SampleRow) -> u32 {
    let mut best = f32::NEG_INFINITY;
    let mut best_i = None;
    for (i, &v) in x.iter().enumerate() {
        if v > best || best_i.is_none() && v == best {
            best = v;
            best_i = Some(i);
        }
    }
    let best_i = best_i.unwrap_or(0);
    // Not greater than zero, NaN included, is greedy.
    if p.temperature.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) || p.top_k == 1 {
        return best_i as u32;
    }
    let inv_t = 1.0 / f64::from(p.temperature);
    let m = f64::from(best);
    let weight = |v: f32| ((f64::from(v) - m) * inv_t).exp();
    let vocab = x.len();
    let mut t_key = 0u32;
    if p.top_k > 1 && (p.top_k as usize) < vocab {
        for bit in (0..32).rev() {
            let cand = t_key | (1 << bit);
            if x.iter().filter(|&&v| key(v) >= cand).count() >= p.top_k as usize {
                t_key = cand;
            }
        }
    }
    if p.top_p < 1.0 {
        let target = f64::from(p.top_p) * x.iter().map(|&v| weight(v)).sum::<f64>();
        let mut t_p = 0u32;
        for bit in (0..32).rev() {
            let cand = t_p | (1 << bit);
            if x.iter().filter(|&&v| key(v) >= cand).map(|&v| weight(v)).sum::<f64>() >= target {
                t_p = cand;
            }
        }
        t_key = t_key.max(t_p);
    }
    let min_scaled = if p.min_p > 0.0 { f64::from(p.min_p).ln() } else { f64::NEG_INFINITY };
    let kept = |v: f32| key(v) >= t_key && (f64::from(v) - m) * inv_t >= min_scaled;
    let z: f64 = x.iter().filter(|&&v| kept(v)).map(|&v| weight(v)).sum();
    let target = f64::from(p.u) * z;
    let mut running = 0.0;
    let mut last = best_i;
    for (i, &v) in x.iter().enumerate() {
        if kept(v) {
            running += weight(v);
            last = i;
            if running > target {
                return i as u32;
            }
        }
    }
    last as u32
}

/// One token per row of a host tensor of logits.
pub fn sample(logits: &Tensor, params: &[SampleRow]) -> Result<Vec<u32>> {
    let values = super::read_f32(logits)?;
    let vocab = logits.dim(1);
    Ok(values.chunks(vocab).zip(params).map(|(row, p)| sample_row(row, p)).collect())
}

/// CPU reference of `ops::apply_token_mask` (csrc/kernels/token_mask.cu): row
/// `rows[i]` of `logits` gets -inf wherever mask `i` (`words_per_row` packed
/// words, bit `t % 32` of word `t / 32`) does not allow token `t`.
pub fn apply_token_mask(logits: &Tensor, mask: &[u32], words_per_row: usize, rows: &[u32]) -> Result<()> {
    let vocab = logits.dim(1);
    let elem = logits.dtype().size_in_bytes();
    let neg_inf: [u8; 4] = match logits.dtype() {
        DType::F16 => [0x00, 0xfc, 0, 0],
        DType::BF16 => [0x80, 0xff, 0, 0],
        _ => f32::NEG_INFINITY.to_le_bytes(),
    };
    for (i, &r) in rows.iter().enumerate() {
        let words = &mask[i * words_per_row..(i + 1) * words_per_row];
        let row = super::row_ptr(logits, r as usize);
        for t in 0..vocab {
            let allowed = words.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1);
            if !allowed {
                // SAFETY: t < vocab elements of a row the op checked (unit inner
                // stride); the source is a local array of at least `elem` bytes.
                unsafe { std::ptr::copy_nonoverlapping(neg_inf.as_ptr(), row.add(t * elem), elem) }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: f32, k: u32, top_p: f32, min_p: f32, u: f32) -> SampleRow {
        SampleRow { temperature: t, top_k: k, top_p, min_p, u }
    }

    #[test]
    fn greedy_and_filters_keep_the_documented_support() {
        let x = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        assert_eq!(sample_row(&x, &SampleRow::greedy()), 1, "first maximum");
        assert_eq!(sample_row(&x, &row(1.0, 1, 1.0, 0.0, 0.9)), 1);
        // top_k = 2: both 3.0 survive (ties), u near 1 picks the later one.
        assert_eq!(sample_row(&x, &row(1.0, 2, 1.0, 0.0, 0.999)), 3);
        assert_eq!(sample_row(&x, &row(1.0, 2, 1.0, 0.0, 0.0)), 1);
        // top_k = 3 keeps 2.0 too; with u just below 1 the last kept index is 3.
        let support: Vec<u32> = (0..100).map(|i| sample_row(&x, &row(1.0, 3, 1.0, 0.0, i as f32 / 100.0))).collect();
        assert!(support.contains(&2) && !support.contains(&0) && !support.contains(&4));
        // min_p = 0.5: exp(2 - 3) = 0.37 < 0.5, so only the two maxima remain.
        let support: Vec<u32> = (0..100).map(|i| sample_row(&x, &row(1.0, 0, 1.0, 0.5, i as f32 / 100.0))).collect();
        assert!(support.iter().all(|&t| t == 1 || t == 3), "{support:?}");
        // top_p small: the smallest head whose mass reaches it: the tied maxima.
        let support: Vec<u32> = (0..100).map(|i| sample_row(&x, &row(1.0, 0, 0.3, 0.0, i as f32 / 100.0))).collect();
        assert!(support.iter().all(|&t| t == 1 || t == 3), "{support:?}");
    }

    #[test]
    fn stratified_draws_follow_the_tempered_softmax() {
        let x: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3 - 1.0).collect();
        let t = 0.7f32;
        let n = 20_000;
        let mut counts = vec![0usize; x.len()];
        for i in 0..n {
            counts[sample_row(&x, &row(t, 0, 1.0, 0.0, (i as f32 + 0.5) / n as f32)) as usize] += 1;
        }
        let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f64> = x.iter().map(|&v| ((v - m) as f64 / t as f64).exp()).collect();
        let z: f64 = w.iter().sum();
        for (i, c) in counts.iter().enumerate() {
            let expected = w[i] / z * n as f64;
            assert!((*c as f64 - expected).abs() <= 2.0, "token {i}: {c} draws, expected {expected:.1}");
        }
    }
}
