//! Tests of the CPU reference sampler: greedy, temperature (by a chi-square
//! goodness-of-fit test), top-k, top-p, min-p, and seeded reproducibility.

use engine::core::sampling::{argmax, sample, sample_row, support, Logits, SamplingRow};

fn row(temperature: f32, seed: u64, step: u64) -> SamplingRow {
    SamplingRow { temperature, top_k: None, top_p: 1.0, min_p: 0.0, seed, step }
}

/// Deterministic pseudo-random logits, with deliberate ties.
fn logits_rows(num_rows: usize, vocab: usize) -> Vec<Vec<f32>> {
    let mut x: u64 = 12345;
    (0..num_rows)
        .map(|_| {
            (0..vocab)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    // Quantised to a few levels, so rows often tie for the max.
                    ((x >> 59) as f32) * 0.5 - 4.0
                })
                .collect()
        })
        .collect()
}

fn softmax(logits: &[f32], temperature: f64) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.iter().map(|&l| ((l as f64 - max) / temperature).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|v| v / sum).collect()
}

fn counts(logits: &[f32], r: SamplingRow, draws: u64) -> Vec<u64> {
    let mut counts = vec![0u64; logits.len()];
    for step in 0..draws {
        counts[sample_row(logits, &SamplingRow { step, ..r }) as usize] += 1;
    }
    counts
}

/// Pearson's statistic of observed counts against expected probabilities.
fn chi_square(counts: &[u64], probs: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&o, &p)| {
            let e = p * n as f64;
            (o as f64 - e).powi(2) / e
        })
        .sum()
}

/// Critical value of the chi-square distribution with 5 degrees of freedom
/// at p = 0.001: a correct sampler exceeds it once in a thousand seeds.
const CHI2_DF5_P001: f64 = 20.515;

#[test]
fn greedy_is_argmax_with_first_index_on_ties() {
    assert_eq!(argmax(&[1.0, 5.0, 5.0, -2.0]), 1);
    for (i, logits) in logits_rows(200, 17).iter().enumerate() {
        let expected = logits.iter().enumerate().fold(0, |best, (j, &v)| if v > logits[best] { j } else { best });
        assert_eq!(sample_row(logits, &SamplingRow::greedy()) as usize, expected, "row {i}");
        // The seed is irrelevant to greedy decoding.
        assert_eq!(sample_row(logits, &row(0.0, i as u64, 3)) as usize, expected, "row {i}");
    }
}

#[test]
fn top_k_1_equals_greedy() {
    for (i, logits) in logits_rows(300, 23).iter().enumerate() {
        for temperature in [0.3, 1.0, 2.5] {
            let r = SamplingRow { top_k: Some(1), ..row(temperature, 99, i as u64) };
            assert_eq!(sample_row(logits, &r), argmax(logits), "row {i}, temperature {temperature}");
        }
    }
}

#[test]
fn same_seed_same_tokens_whatever_the_batch() {
    let rows = logits_rows(8, 31);
    let params: Vec<SamplingRow> = (0..8).map(|i| SamplingRow { top_p: 0.9, ..row(1.2, 1000 + i, 4 * i) }).collect();
    let flat: Vec<f32> = rows.iter().flatten().copied().collect();
    let batched = sample(&Logits::new(flat, 31), &params);
    for i in 0..8 {
        // Alone, and in a reversed batch with other rows around it.
        assert_eq!(sample_row(&rows[i], &params[i]), batched[i]);
        let order: Vec<usize> = (0..8).rev().collect();
        let flat: Vec<f32> = order.iter().flat_map(|&j| rows[j].clone()).collect();
        let reversed = sample(&Logits::new(flat, 31), &order.iter().map(|&j| params[j]).collect::<Vec<_>>());
        assert_eq!(reversed[7 - i], batched[i]);
    }
    // A fixed seed replays the same stream; another seed gives another.
    let logits = vec![0.0f32; 64];
    let stream = |seed| (0..40).map(|step| sample_row(&logits, &row(1.0, seed, step))).collect::<Vec<_>>();
    assert_eq!(stream(7), stream(7));
    assert_ne!(stream(7), stream(8));
}

#[test]
fn temperature_follows_softmax_of_scaled_logits() {
    let logits = [1.0f32, 2.0, 0.5, 3.0, 0.0, -1.0];
    let draws = 20_000;
    for (temperature, seed) in [(0.7f32, 1u64), (1.0, 2), (1.6, 3)] {
        let observed = counts(&logits, row(temperature, seed, 0), draws);
        let stat = chi_square(&observed, &softmax(&logits, temperature as f64));
        assert!(stat < CHI2_DF5_P001, "temperature {temperature}: chi-square {stat:.1} with counts {observed:?}");
    }
    // The same test rejects a sampler that ignores the temperature: draws
    // at temperature 1 tested against softmax(logits / 0.7).
    let ignoring = counts(&logits, row(1.0, 1, 0), draws);
    let stat = chi_square(&ignoring, &softmax(&logits, 0.7));
    assert!(stat > CHI2_DF5_P001, "chi-square {stat:.1} should reject");
}

/// Logits whose softmax at temperature 1 is exactly
/// `[1/2, 1/4, 1/8, 1/16, 1/16]`.
fn halving() -> Vec<f32> {
    [0.5f64, 0.25, 0.125, 0.0625, 0.0625].iter().map(|p| p.ln() as f32).collect()
}

/// The support predicted by [`support`] is what sampling actually reaches.
fn check_support(logits: &[f32], r: SamplingRow, expected: &[u32]) {
    assert_eq!(support(logits, &r), expected, "{r:?}");
    let observed = counts(logits, r, 4000);
    let reached: Vec<u32> = (0..logits.len() as u32).filter(|&t| observed[t as usize] > 0).collect();
    assert_eq!(reached, expected, "{r:?}: counts {observed:?}");
}

#[test]
fn top_p_keeps_the_smallest_head_reaching_p() {
    let l = halving();
    let with = |top_p| SamplingRow { top_p, ..row(1.0, 11, 0) };
    check_support(&l, with(0.45), &[0]);
    check_support(&l, with(0.55), &[0, 1]);
    check_support(&l, with(0.8), &[0, 1, 2]);
    // Tokens 3 and 4 tie; the lower index ranks first.
    check_support(&l, with(0.9), &[0, 1, 2, 3]);
    check_support(&l, with(0.99), &[0, 1, 2, 3, 4]);
    check_support(&l, with(1.0), &[0, 1, 2, 3, 4]);
    // Filters see the temperature-scaled distribution: at 0.5 the head has
    // 0.25 / (0.25 + 0.0625 + ...) = 0.74 of the mass.
    check_support(&l, SamplingRow { top_p: 0.7, ..row(0.5, 11, 0) }, &[0]);
}

#[test]
fn min_p_keeps_tokens_above_a_share_of_the_max() {
    let l = halving();
    let with = |min_p| SamplingRow { min_p, ..row(1.0, 12, 0) };
    check_support(&l, with(0.45), &[0, 1]);
    check_support(&l, with(0.2), &[0, 1, 2]);
    check_support(&l, with(0.1), &[0, 1, 2, 3, 4]);
    check_support(&l, with(1.0), &[0]);
}

#[test]
fn top_k_and_combined_filters() {
    let l = halving();
    check_support(&l, SamplingRow { top_k: Some(2), ..row(1.0, 13, 0) }, &[0, 1]);
    check_support(&l, SamplingRow { top_k: Some(4), ..row(1.0, 13, 0) }, &[0, 1, 2, 3]);
    check_support(&l, SamplingRow { top_k: Some(100), ..row(1.0, 13, 0) }, &[0, 1, 2, 3, 4]);
    // The filters intersect.
    check_support(&l, SamplingRow { top_k: Some(3), top_p: 0.55, ..row(1.0, 13, 0) }, &[0, 1]);
    check_support(&l, SamplingRow { top_k: Some(4), min_p: 0.2, ..row(1.0, 13, 0) }, &[0, 1, 2]);
}

#[test]
fn kept_tokens_are_drawn_in_renormalised_proportions() {
    // top-k 3 of the halving distribution: [4/7, 2/7, 1/7, 0, 0].
    let l = halving();
    let observed = counts(&l, SamplingRow { top_k: Some(3), ..row(1.0, 21, 0) }, 14_000);
    assert_eq!(&observed[3..], [0, 0]);
    let stat = chi_square(&observed[..3], &[4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0]);
    // 2 degrees of freedom, p = 0.001.
    assert!(stat < 13.816, "chi-square {stat:.1} with counts {observed:?}");
}
