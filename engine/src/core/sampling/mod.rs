//! Next-token sampling: the CPU reference, one batched entry point.
//!
//! [`sample`] takes the logits of a step (one row per request that samples)
//! and one [`SamplingRow`] per logits row, and returns one token per row. A
//! GPU kernel can replace it as long as it keeps the same contract:
//!
//! - `temperature == 0` is greedy: the argmax, the lowest index on ties.
//! - Otherwise, with `p = softmax(logits / temperature)` and tokens ranked by
//!   decreasing `p` (lower index first on ties), a token is kept when all of
//!   these hold (the filters are independent and all see the same `p`, as in
//!   SGLang's `top_k_top_p_min_p_sampling_from_probs`):
//!   - top-k: its rank is below `top_k`;
//!   - top-p: the mass of the tokens ranked before it is below `top_p`
//!     (the smallest head of the ranking whose mass reaches `top_p`);
//!   - min-p: `p >= min_p * max(p)`.
//!
//!   The most likely token always survives. The token is then drawn from the
//!   kept probabilities, renormalised, by inverse CDF in index order.
//! - The uniform number of a draw is a pure function of `(seed, step)`,
//!   where `step` is the request's output index. A request's tokens therefore
//!   depend on its seed and logits only, never on batch composition,
//!   chunking or preemption.
//!
//! Beside it, [`penalties`] (repetition, frequency, presence) and [`logprobs`]
//! (raw log-softmax, top alternatives), the host's definitions: a GPU runner
//! computes both on the device with the same arithmetic ([`extras`]: penalty
//! slots and the step's device-side work), a CPU runner on the host logits.

pub mod extras;
pub mod logprobs;
pub mod penalties;
pub mod penalty_slots;

/// Sampling settings of one logits row. Plain `Copy` data, so that a GPU
/// sampler can upload a batch of them as arrays.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingRow {
    pub temperature: f32,
    pub top_k: Option<usize>,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
    /// Output index of the token being drawn: the position in the random
    /// stream.
    pub step: u64,
}

impl SamplingRow {
    /// Greedy decoding (the random fields are irrelevant).
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_k: None, top_p: 1.0, min_p: 0.0, seed: 0, step: 0 }
    }

    fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == Some(1)
    }

    fn truncates(&self) -> bool {
        self.top_k.is_some() || self.top_p < 1.0 || self.min_p > 0.0
    }
}

/// Logits of a step on the host: `[num_rows, vocab_size]`, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    data: Vec<f32>,
    vocab_size: usize,
}

impl Logits {
    pub fn new(data: Vec<f32>, vocab_size: usize) -> Self {
        assert!(vocab_size > 0, "vocab_size must be positive");
        assert_eq!(
            data.len() % vocab_size,
            0,
            "logits length {} is not a multiple of vocab_size {vocab_size}",
            data.len()
        );
        Self { data, vocab_size }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn num_rows(&self) -> usize {
        self.data.len() / self.vocab_size
    }

    pub fn row(&self, idx: usize) -> &[f32] {
        &self.data[idx * self.vocab_size..(idx + 1) * self.vocab_size]
    }

    pub fn row_mut(&mut self, idx: usize) -> &mut [f32] {
        &mut self.data[idx * self.vocab_size..(idx + 1) * self.vocab_size]
    }
}

/// Samples one token per logits row.
pub fn sample(logits: &Logits, rows: &[SamplingRow]) -> Vec<u32> {
    assert_eq!(logits.num_rows(), rows.len(), "one sampling row per logits row");
    rows.iter().enumerate().map(|(i, row)| sample_row(logits.row(i), row)).collect()
}

/// Samples one token from one row of logits.
pub fn sample_row(logits: &[f32], row: &SamplingRow) -> u32 {
    assert!(!logits.is_empty(), "empty logits row");
    if row.is_greedy() {
        return argmax(logits);
    }
    let probs = softmax(logits, row.temperature);
    if probs.is_empty() {
        // No finite logit: nothing to draw from, fall back deterministically.
        return argmax(logits);
    }
    let kept: Vec<bool> = if row.truncates() { keep_mask(&probs, row) } else { vec![true; probs.len()] };
    let total: f64 = probs.iter().zip(&kept).filter(|(_, &k)| k).map(|(p, _)| p).sum();
    let target = uniform(row.seed, row.step) * total;
    let mut acc = 0.0;
    let mut last = None;
    for (idx, (&p, &k)) in probs.iter().zip(&kept).enumerate() {
        if !k || p == 0.0 {
            continue;
        }
        acc += p;
        last = Some(idx);
        if acc > target {
            return idx as u32;
        }
    }
    // Rounding left `acc` a hair below `target`: the last kept token.
    last.map_or_else(|| argmax(logits), |idx| idx as u32)
}

/// The tokens [`sample_row`] can return for `row`, in index order.
pub fn support(logits: &[f32], row: &SamplingRow) -> Vec<u32> {
    if row.is_greedy() {
        return vec![argmax(logits)];
    }
    let probs = softmax(logits, row.temperature);
    if probs.is_empty() {
        return vec![argmax(logits)];
    }
    let kept = keep_mask(&probs, row);
    (0..probs.len() as u32).filter(|&i| kept[i as usize] && probs[i as usize] > 0.0).collect()
}

/// Index of the largest logit, the lowest index on ties. NaNs never win.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut best_val = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_val {
            best = i;
            best_val = v;
        }
    }
    best as u32
}

/// A uniform number in `[0, 1)`, a pure function of `(seed, step)`
/// (SplitMix64 over a counter, as a Philox-style GPU kernel would do).
pub fn uniform(seed: u64, step: u64) -> f64 {
    let bits = splitmix64(seed ^ splitmix64(step));
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `softmax(logits / temperature)` in f64; empty if no logit is finite.
fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    let t = f64::from(temperature);
    let max = logits.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return Vec::new();
    }
    let max = f64::from(max);
    let mut probs: Vec<f64> =
        logits.iter().map(|&v| if v.is_nan() { 0.0 } else { ((f64::from(v) - max) / t).exp() }).collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    probs
}

/// Which tokens survive top-k, top-p and min-p (see the module docs).
fn keep_mask(probs: &[f64], row: &SamplingRow) -> Vec<bool> {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    let by_rank = |a: &usize, b: &usize| probs[*b].total_cmp(&probs[*a]).then(a.cmp(b));
    // Only the first `top_k` of the ranking can be kept: select them before
    // sorting (the order is total, so they are the full sort's first k).
    if let Some(k) = row.top_k.filter(|&k| k < order.len()) {
        order.select_nth_unstable_by(k, by_rank);
        order.truncate(k);
    }
    order.sort_by(by_rank);
    let p_max = probs[order[0]];
    let min_p = f64::from(row.min_p) * p_max;
    let top_p = f64::from(row.top_p);
    let top_k = row.top_k.unwrap_or(usize::MAX);
    let mut kept = vec![false; probs.len()];
    let mut mass_before = 0.0;
    for (rank, &idx) in order.iter().enumerate() {
        let p = probs[idx];
        if rank >= top_k || (rank > 0 && mass_before >= top_p) {
            break;
        }
        kept[idx] = rank == 0 || p >= min_p;
        mass_before += p;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5, 0.5]), 1);
    }

    #[test]
    fn uniform_is_in_range_and_deterministic() {
        for step in 0..1000 {
            let u = uniform(42, step);
            assert!((0.0..1.0).contains(&u));
            assert_eq!(u, uniform(42, step));
        }
        assert_ne!(uniform(1, 0), uniform(2, 0));
    }

    #[test]
    fn masked_logits_are_never_drawn() {
        let logits = [0.0, f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
        for step in 0..200 {
            let row = SamplingRow { temperature: 1.0, seed: 5, step, ..SamplingRow::greedy() };
            let t = sample_row(&logits, &row);
            assert!(t == 0 || t == 2);
        }
    }
}
