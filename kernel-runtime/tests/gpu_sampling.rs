//! `ops::sample` on CUDA against the CPU reference (the same algorithm): greedy
//! rows agree exactly, filtered and tempered draws agree on (nearly) every row
//! (sums in f32 on the GPU and f64 on the CPU may split a draw that lands within
//! rounding of a CDF boundary), and stratified draws of one row follow the
//! tempered softmax. The shapes cover what the kernel's decomposition cuts
//! (csrc/kernels/sampling.cu): vocabularies that are not a multiple of the 16-byte
//! vector, rows that do not start on a 16-byte boundary (column views, broadcast
//! rows), runs longer than one tile of the draw, a decode batch of 256 rows, and
//! rows with a single finite logit or none.
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

/// The settings of row `r` of a mixed batch: greedy, tempered, top-k, top-p, min-p
/// and all three, each with its own uniform number.
fn mixed_row(rng: &mut rand::rngs::StdRng, r: usize) -> SampleRow {
    let u = rng.gen_range(0.0..1.0);
    match r % 6 {
        0 => SampleRow::greedy(),
        1 => SampleRow { temperature: 0.6, top_k: 0, top_p: 1.0, min_p: 0.0, u },
        2 => SampleRow { temperature: 1.0, top_k: 40, top_p: 1.0, min_p: 0.0, u },
        3 => SampleRow { temperature: 0.8, top_k: 0, top_p: 0.9, min_p: 0.0, u },
        4 => SampleRow { temperature: 1.1, top_k: 0, top_p: 1.0, min_p: 0.1, u },
        _ => SampleRow { temperature: 1.3, top_k: 20, top_p: 0.9, min_p: 0.05, u },
    }
}

/// Samples `host` (a host view) on the CPU and, copied view for view, on the GPU;
/// greedy rows and rows with one candidate must agree exactly, the others on all
/// but `rows / 32` rows (draws within f32 rounding of a CDF boundary).
fn assert_matches_cpu(what: &str, host: &Tensor, gpu: &Tensor, params: &[SampleRow]) {
    let want = sample(host, params).unwrap();
    let got = sample(gpu, params).unwrap();
    let vocab = host.dim(1);
    for (r, p) in params.iter().enumerate() {
        if p.temperature == 0.0 {
            assert_eq!(got[r], want[r], "{what}: greedy row {r}");
        }
        assert!((got[r] as usize) < vocab, "{what}: row {r} drew {}", got[r]);
    }
    let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
    assert!(differ <= params.len() / 32, "{what}: {differ} rows differ: {want:?} vs {got:?}");
}

/// A `[rows, vocab]` view that starts `offset` elements into rows of
/// `vocab + pad`: rows that are not 16-byte aligned when offset or pad is not a
/// multiple of the vector.
fn column_view(t: &Tensor, offset: usize, vocab: usize) -> Tensor {
    t.narrow(1, offset, vocab).unwrap()
}

#[test]
fn gpu_sampling_handles_odd_vocabularies_and_unaligned_rows() {
    if !enabled() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    // (rows, vocab, pad, offset): vocab not a multiple of 8 or 4, smaller than
    // a warp's vectors, and 262_145 (runs longer than a tile of the draw).
    for (rows, vocab, pad, offset) in [
        (6, 7, 0, 0),
        (6, 7, 3, 1),
        (12, 32_001, 0, 0),
        (12, 32_001, 5, 3),
        (6, 151_643, 0, 0),
        (6, 151_643, 2, 1),
        (6, 262_145, 0, 0),
    ] {
        let width = vocab + pad;
        let values: Vec<f32> = (0..rows * width).map(|_| rng.gen_range(-6.0f32..6.0)).collect();
        let params: Vec<SampleRow> = (0..rows).map(|r| mixed_row(&mut rng, r)).collect();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let full = Tensor::from_slice(&values, &[rows, width], Device::Cpu).unwrap().to_dtype(dtype).unwrap();
            let gpu_full = full.to_device(Device::Cuda(0)).unwrap();
            let (host, gpu) = (column_view(&full, offset, vocab), column_view(&gpu_full, offset, vocab));
            assert_matches_cpu(&format!("{rows}x{vocab} (+{pad}, at {offset}) {dtype}"), &host, &gpu, &params);
        }
    }
}

#[test]
fn gpu_sampling_of_a_decode_batch_matches_the_cpu_reference() {
    if !enabled() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let (rows, vocab) = (256, 151_936);
    let values: Vec<f32> = (0..rows * vocab).map(|_| rng.gen_range(-8.0f32..8.0)).collect();
    // The hot case: tempered rows without filters, a few greedy ones.
    let params: Vec<SampleRow> = (0..rows)
        .map(|r| {
            let u = rng.gen_range(0.0..1.0);
            if r % 16 == 0 {
                SampleRow::greedy()
            } else {
                SampleRow { temperature: 0.6, top_k: 0, top_p: 1.0, min_p: 0.0, u }
            }
        })
        .collect();
    let host = Tensor::from_slice(&values, &[rows, vocab], Device::Cpu).unwrap().to_dtype(DType::BF16).unwrap();
    assert_matches_cpu("256x151936 bf16", &host, &host.to_device(Device::Cuda(0)).unwrap(), &params);
}

#[test]
fn gpu_sampling_rows_with_one_finite_logit_or_none() {
    if !enabled() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    let vocab = 151_936;
    // Where the one finite logit sits: the ends, vector and run boundaries
    // (a bf16 run is 594 vectors here, an f32 run 1187), the middle.
    let spots = [0, 1, 7, 8, vocab - 1, vocab / 2, 594 * 8 - 1, 594 * 8, 1187 * 4, 31 * 594 * 8 + 3];
    let rows = spots.len() + 4;
    let mut values = vec![f32::NEG_INFINITY; rows * vocab];
    for (r, &j) in spots.iter().enumerate() {
        values[r * vocab + j] = rng.gen_range(-3.0f32..3.0);
    }
    // Rows without a finite max, where the CPU's rule decides: all -inf (token
    // 0), all NaN (token 0), NaN but one -inf (that one), and a +inf.
    let base = spots.len() * vocab;
    values[base + vocab..base + 2 * vocab].fill(f32::NAN);
    values[base + 2 * vocab..base + 3 * vocab].fill(f32::NAN);
    values[base + 2 * vocab + 1000] = f32::NEG_INFINITY;
    for (i, v) in values[base + 3 * vocab..base + 4 * vocab].iter_mut().enumerate() {
        *v = if i % 3 == 0 { rng.gen_range(-3.0f32..3.0) } else { f32::NEG_INFINITY };
    }
    values[base + 3 * vocab + 5000] = f32::INFINITY;
    let params: Vec<SampleRow> = (0..rows).map(|r| mixed_row(&mut rng, r)).collect();
    for dtype in [DType::F32, DType::BF16] {
        let host = Tensor::from_slice(&values, &[rows, vocab], Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        let want = sample(&host, &params).unwrap();
        let got = sample(&host.to_device(Device::Cuda(0)).unwrap(), &params).unwrap();
        for (r, &j) in spots.iter().enumerate() {
            assert_eq!(got[r], j as u32, "{dtype}: row {r} ({:?}) has one finite logit, at {j}", params[r]);
        }
        assert_eq!(got[spots.len()..], want[spots.len()..], "{dtype}: rows without a finite max");
        assert_eq!(want[spots.len()..spots.len() + 3], [0, 0, 1000], "{dtype}: the CPU's rule");
    }
}

/// Stratified draws of one row broadcast to 8192 (row stride 0) through views
/// that do not start on a 16-byte boundary, with vocabularies whose runs span
/// two tiles of the draw: the counts follow the tempered softmax of the row.
#[test]
fn gpu_stratified_draws_over_long_unaligned_rows() {
    if !enabled() {
        return;
    }
    let rows = 8192;
    let t = 0.9f32;
    for (vocab, offset, dtype) in [(140_001, 1, DType::F32), (280_003, 3, DType::BF16), (4_099, 5, DType::F16)] {
        // Light logits everywhere, 24 heavy ones spread over the row.
        let mut logits: Vec<f32> = (0..offset + vocab).map(|i| ((i * 7919 % 101) as f32) * 0.01 - 9.0).collect();
        for j in 0..24 {
            logits[offset + (j * 104_729 + 17) % vocab] = 1.0 + 0.125 * (j % 7) as f32;
        }
        let base = Tensor::from_slice(&logits, &[offset + vocab], Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        let row: Vec<f32> = base.to_f32_vec().unwrap()[offset..].to_vec();
        let x = base.to_device(Device::Cuda(0)).unwrap().as_strided(&[rows, vocab], &[0, 1], offset).unwrap();
        let params: Vec<SampleRow> = (0..rows)
            .map(|i| SampleRow { temperature: t, top_k: 0, top_p: 1.0, min_p: 0.0, u: (i as f32 + 0.5) / rows as f32 })
            .collect();
        let mut counts = vec![0usize; vocab];
        for tok in sample(&x, &params).unwrap() {
            counts[tok as usize] += 1;
        }
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let w: Vec<f64> = row.iter().map(|&v| ((v - m) as f64 / t as f64).exp()).collect();
        let z: f64 = w.iter().sum();
        for (i, c) in counts.iter().enumerate() {
            let expected = w[i] / z * rows as f64;
            assert!(
                (*c as f64 - expected).abs() <= 2.0,
                "{vocab} {dtype}: token {i}: {c} draws, expected {expected:.1}"
            );
        }
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

/// Logits with what trips ordering and reductions up: exact ties (bf16 makes
/// many more), +-0, -inf and NaN.
fn awkward_logits(rng: &mut rand::rngs::StdRng, rows: usize, vocab: usize) -> Vec<f32> {
    (0..rows * vocab)
        .map(|_| match rng.gen_range(0..100) {
            0 => f32::NEG_INFINITY,
            1 => f32::NAN,
            2 => 0.0,
            3 => -0.0,
            4..=20 => (rng.gen_range(-8..8) as f32) * 0.5,
            _ => rng.gen_range(-9.0f32..9.0),
        })
        .collect()
}

/// `penalty_count` then `apply_penalties` on the device equal the CPU
/// reference bit for bit (the same f32 operations), for every float dtype,
/// with repeated and out-of-range tokens, skipped slots and rows not penalised.
#[test]
fn gpu_penalties_match_the_cpu_reference() {
    if !common::enabled_or_dry_run() {
        return;
    }
    use kernel_runtime::ops::{apply_penalties, penalty_count, CountKind, PenaltyRow};
    use kernel_runtime::staging::Upload;
    let dev = common::target();
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    for (rows, vocab, slots) in [(1, 7, 1), (5, 1000, 6), (33, 151_936, 40)] {
        let values = awkward_logits(&mut rng, rows, vocab);
        let entries = 4 * vocab.min(5000);
        let slot_ids: Vec<i32> = (0..entries).map(|_| rng.gen_range(-1..slots as i32 + 1)).collect();
        let tokens: Vec<i32> = (0..entries).map(|_| rng.gen_range(-2..vocab as i32 + 2)).collect();
        let prompt_slots: Vec<i32> = slot_ids.iter().rev().copied().collect();
        let penalised: Vec<PenaltyRow> = (0..rows)
            .filter(|r| r % 4 != 3)
            .map(|r| PenaltyRow {
                row: r as u32,
                slot: rng.gen_range(0..slots as u32),
                repetition: [1.0, 1.3, 0.6][r % 3],
                frequency: [0.0, 0.7, -0.25][(r / 3) % 3],
                presence: [0.0, -1.5, 0.4][(r / 2) % 3],
            })
            .collect();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let run = |device: Device| {
                let counts = Tensor::zeros(&[slots, vocab], DType::I32, device).unwrap();
                let up = |v: &[i32]| Tensor::from_slice(v, &[v.len()], device).unwrap();
                penalty_count(&counts, &up(&prompt_slots), &up(&tokens), CountKind::Prompt).unwrap();
                penalty_count(&counts, &up(&slot_ids), &up(&tokens), CountKind::Output).unwrap();
                penalty_count(&counts, &up(&slot_ids[..entries / 2]), &up(&tokens[..entries / 2]), CountKind::Output)
                    .unwrap();
                let logits = Tensor::from_slice(&values, &[rows, vocab], Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
                    .to_device(device)
                    .unwrap();
                let mut upload = Upload::new(device).unwrap();
                upload.begin().unwrap();
                apply_penalties(&logits, &counts, &penalised, &mut upload).unwrap();
                (counts.to_vec::<i32>().unwrap(), logits.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap())
            };
            let (want_counts, want) = run(Device::Cpu);
            let (got_counts, got) = run(dev);
            assert_eq!(got_counts, want_counts, "{rows}x{vocab} {dtype}: counters");
            let bits =
                |v: &[f32]| v.iter().map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() }).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{rows}x{vocab} {dtype}: penalised logits");
            assert!(
                want_counts.iter().any(|&c| c > 1 && c & (1 << 30) != 0),
                "the case has repeats in prompt and output"
            );
        }
    }
}

/// `logprobs` on the device against the CPU reference: the same sampled token
/// and alternatives (ids exactly, ties and -0/+0 included), log probabilities
/// within f32 rounding of the f64 reference, and rows whose logits have no
/// finite value reported as -inf.
#[test]
fn gpu_logprobs_match_the_cpu_reference() {
    if !common::enabled_or_dry_run() {
        return;
    }
    use kernel_runtime::ops::{logprobs, logprobs_cols, RowLogprobs};
    use kernel_runtime::staging::Upload;
    let dev = common::target();
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    for (rows, vocab, top_n) in [(1, 5, 20), (4, 1000, 0), (9, 32_000, 5), (21, 151_936, 20)] {
        let mut values = awkward_logits(&mut rng, rows, vocab);
        // Row 0 has no finite logit at all.
        values[..vocab].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
        let sampled: Vec<i32> =
            (0..rows).map(|r| if r == 1 { vocab as i32 + 3 } else { rng.gen_range(0..vocab as i32) }).collect();
        let report: Vec<u32> = (0..rows as u32).rev().filter(|r| r % 3 != 2).collect();
        let cols = logprobs_cols(top_n) + 1;
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let run = |device: Device| {
                let logits = Tensor::from_slice(&values, &[rows, vocab], Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
                    .to_device(device)
                    .unwrap();
                let ids = Tensor::from_slice(&sampled, &[rows], device).unwrap();
                let out = Tensor::zeros(&[report.len(), cols], DType::I32, device).unwrap();
                let mut upload = Upload::new(device).unwrap();
                upload.begin().unwrap();
                logprobs(&logits, &report, &ids, top_n, &out, &mut upload).unwrap();
                let words = out.to_vec::<i32>().unwrap();
                (0..report.len())
                    .map(|k| RowLogprobs::decode(&words[k * cols..(k + 1) * cols], top_n, vocab))
                    .collect::<Vec<_>>()
            };
            let want = run(Device::Cpu);
            let got = run(dev);
            let close = |a: f32, b: f32| a == b || (a - b).abs() <= 2e-5 * (1.0 + b.abs());
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("{rows}x{vocab} {dtype} top {top_n}: row {}", report[k]);
                assert_eq!(g.token, w.token, "{what}");
                assert!(close(g.logprob, w.logprob), "{what}: {} vs {}", g.logprob, w.logprob);
                let ids = |r: &RowLogprobs| r.top.iter().map(|t| t.0).collect::<Vec<_>>();
                assert_eq!(ids(g), ids(w), "{what}: alternatives");
                for (a, b) in g.top.iter().zip(&w.top) {
                    assert!(close(a.1, b.1), "{what}: {a:?} vs {b:?}");
                }
                assert_eq!(g.top.len(), top_n.min(vocab), "{what}");
                if report[k] == 0 || report[k] == 1 {
                    assert_eq!(g.logprob, f32::NEG_INFINITY, "{what}: no probability");
                }
            }
        }
    }
}
