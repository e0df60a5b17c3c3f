//! `ops::sample` on CUDA against the CPU reference (the same algorithm): greedy
//! rows agree exactly, filtered and tempered draws agree on (nearly) every row
//! (sums in f32 on the GPU and f64 on the CPU may split a draw that lands within
//! rounding of a CDF boundary), and stratified draws of one row follow the
//! tempered softmax.
//!
//! Runs only with MINISGL_GPU_TESTS=1 on a machine with a GPU.

mod common;

use common::enabled;
use kernel_runtime::ops::{sample, SampleRow};
use kernel_runtime::{DType, Device, Tensor};
use rand::{Rng, SeedableRng};

#[test]
fn gpu_sampling_matches_the_cpu_reference() {
    if !enabled() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for (rows, vocab) in [(1, 7), (3, 1000), (64, 32_000), (17, 151_936)] {
        let values: Vec<f32> = (0..rows * vocab).map(|_| rng.gen_range(-6.0f32..6.0)).collect();
        let params: Vec<SampleRow> = (0..rows)
            .map(|r| match r % 5 {
                0 => SampleRow::greedy(),
                1 => SampleRow { temperature: 0.7, top_k: 0, top_p: 1.0, min_p: 0.0, u: rng.gen_range(0.0..1.0) },
                2 => SampleRow { temperature: 1.0, top_k: 50, top_p: 1.0, min_p: 0.0, u: rng.gen_range(0.0..1.0) },
                3 => SampleRow { temperature: 0.9, top_k: 0, top_p: 0.8, min_p: 0.0, u: rng.gen_range(0.0..1.0) },
                _ => SampleRow { temperature: 1.3, top_k: 20, top_p: 0.9, min_p: 0.05, u: rng.gen_range(0.0..1.0) },
            })
            .collect();
        for dtype in [DType::F32, DType::BF16] {
            let host = Tensor::from_slice(&values, &[rows, vocab], Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let want = sample(&host, &params).unwrap();
            let got = sample(&host.to_device(Device::Cuda(0)).unwrap(), &params).unwrap();
            let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
            for (r, p) in params.iter().enumerate() {
                if p.temperature == 0.0 {
                    assert_eq!(got[r], want[r], "{rows}x{vocab} {dtype}: greedy row {r}");
                }
                assert!((got[r] as usize) < vocab);
            }
            assert!(differ <= rows / 32, "{rows}x{vocab} {dtype}: {differ} rows differ: {want:?} vs {got:?}");
        }
    }
}

#[test]
fn gpu_stratified_draws_follow_the_tempered_softmax() {
    if !enabled() {
        return;
    }
    let vocab = 64;
    let rows = 8192;
    let t = 0.8f32;
    let logits: Vec<f32> = (0..vocab).map(|i| ((i * 29 % 13) as f32) * 0.25 - 1.5).collect();
    let all: Vec<f32> = (0..rows).flat_map(|_| logits.iter().copied()).collect();
    let x = Tensor::from_slice(&all, &[rows, vocab], Device::Cuda(0)).unwrap();
    let params: Vec<SampleRow> = (0..rows)
        .map(|i| SampleRow { temperature: t, top_k: 0, top_p: 1.0, min_p: 0.0, u: (i as f32 + 0.5) / rows as f32 })
        .collect();
    let tokens = sample(&x, &params).unwrap();
    let mut counts = vec![0usize; vocab];
    for tok in tokens {
        counts[tok as usize] += 1;
    }
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = logits.iter().map(|&v| ((v - m) as f64 / t as f64).exp()).collect();
    let z: f64 = w.iter().sum();
    for (i, c) in counts.iter().enumerate() {
        let expected = w[i] / z * rows as f64;
        assert!((*c as f64 - expected).abs() <= 2.0, "token {i}: {c} draws, expected {expected:.1}");
    }
}

/// Random masks (some rows all allowed, some with only a few tokens, words that
/// stop short of the vocabulary) on random rows of a batch.
fn token_mask_case(rng: &mut rand::rngs::StdRng, rows: usize, vocab: usize) -> (Vec<f32>, Vec<u32>, usize, Vec<u32>) {
    let values: Vec<f32> = (0..rows * vocab).map(|_| rng.gen_range(-6.0f32..6.0)).collect();
    let masked: Vec<u32> = (0..rows as u32).filter(|_| rng.gen_bool(0.5)).collect();
    let words = vocab.div_ceil(32) - usize::from(vocab > 64 && rng.gen_bool(0.3));
    let mask: Vec<u32> = (0..masked.len() * words)
        .map(|i| match (i / words) % 3 {
            0 => u32::MAX,
            1 => rng.gen::<u32>() & rng.gen::<u32>() & rng.gen::<u32>(),
            _ => rng.gen(),
        })
        .collect();
    (values, mask, words, masked)
}

#[test]
fn gpu_token_mask_matches_the_cpu_reference() {
    if !enabled() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    for (rows, vocab) in [(1, 7), (3, 1000), (64, 32_000), (17, 151_936), (5, 262_145)] {
        let (values, mask, words, masked) = token_mask_case(&mut rng, rows, vocab);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let host = Tensor::from_slice(&values, &[rows, vocab], Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let gpu = host.to_device(Device::Cuda(0)).unwrap();
            kernel_runtime::ops::apply_token_mask(&host, &mask, words, &masked).unwrap();
            kernel_runtime::ops::apply_token_mask(&gpu, &mask, words, &masked).unwrap();
            let (want, got) = (host.to_f32_vec().unwrap(), gpu.to_f32_vec().unwrap());
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(&want) == bits(&got), "{rows}x{vocab} {dtype}: the GPU masks differently");
            // Some -inf exactly when a masked row disallows a token: a zero bit,
            // or a token past the mask's words (an all-allowed row masks nothing).
            let covered = words * 32;
            let disallows = (0..masked.len())
                .any(|r| (0..vocab).any(|t| t >= covered || (mask[r * words + t / 32] >> (t % 32)) & 1 == 0));
            assert_eq!(
                want.iter().any(|x| x.is_infinite()),
                disallows,
                "{rows}x{vocab} {dtype}: -inf where no mask disallows"
            );
        }
    }
}
