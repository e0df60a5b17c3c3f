//! A measured choice among cuBLASLt's algorithms for decode-sized GEMMs.
//!
//! `cublasLtMatmulAlgoGetHeuristic` ranks algorithms by a model of the GPU, and its
//! first pick is what every shape ran before: at the batch sizes of decode steps
//! (m of 64 to 256 rows, weights of a few to a few hundred MiB) that model is weakest,
//! because the product is neither a weight stream nor compute-bound, and
//! Llama-3-8B's projections at m = 64 read their weights at 2.6-3.9 TB/s with it
//! (docs/PERF.md, tenth session). So the first time a shape of at most
//! [`MAX_ROWS`] rows (a CUDA graph bucket's row count: [`wanted`]) and at least
//! [`MIN_WEIGHT_BYTES`] of weights runs outside a graph capture, `gemm::linear` times the heuristic's first [`CANDIDATES`]
//! algorithms on the real operands and keeps the fastest: each run starts from an
//! L2 cache flushed by a write of twice its size (a decode step streams every
//! other layer's weights through L2 between two uses of one), the candidates
//! take turns over [`REPS`] rounds, and the median decides. An algorithm replaces
//! the heuristic's first only when it is faster by more than [`MARGIN`], so that
//! timing noise does not flip the choice from one process to the next (results
//! differ in rounding between algorithms). The engine's graph capture runs every
//! bucket eagerly first, so the graphs replay the measured choice.
//!
//! `MINISGL_GEMM_TUNE=0` (or [`set_enabled`]) keeps the heuristic's first pick;
//! [`report`] lists what was measured.

use std::sync::{Arc, Mutex};

use crate::cuda::{CudaDevice, EventTimer};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

use super::launch::Switch;

/// Algorithms asked of the heuristic and timed.
pub(super) const CANDIDATES: usize = 8;
/// Rows up to which a shape is tuned: the decode batches (CUDA graph buckets
/// reach 256). Larger m is a prefill chunk, compute-bound, where the heuristic's
/// model holds and whose row counts vary from step to step.
pub(super) const MAX_ROWS: usize = 256;
/// Weights below this are a few microseconds that no algorithm changes, where
/// noise would decide (and the test models' tiny layers stay on the heuristic).
pub(super) const MIN_WEIGHT_BYTES: usize = 1 << 20;
/// Timed runs of each candidate.
const REPS: usize = 5;
/// A candidate must take less than this share of the heuristic first pick's time.
const MARGIN: f64 = 0.97;

/// `MINISGL_GEMM_TUNE`: on unless `0`.
static ENABLED: Switch = Switch::new("MINISGL_GEMM_TUNE");

/// Overrides `MINISGL_GEMM_TUNE` for this process (`None`: back to it). Shapes
/// already planned keep their algorithm.
pub(crate) fn set_enabled(on: Option<bool>) {
    ENABLED.set(on);
}

/// Whether a GEMM of `m` rows over `weight_bytes` of weights is tuned: row counts
/// of the engine's CUDA graph buckets (1, 2, 4, then multiples of 8) up to
/// [`MAX_ROWS`], so that a process measures at most 35 row counts a shape, all of
/// them while it captures its graphs, and a prefill chunk of some other short
/// length never stalls on a measurement. (A shape first met inside a graph
/// capture, where nothing can be timed, keeps the first pick: `gemm::linear`.)
pub(super) fn wanted(m: usize, weight_bytes: usize) -> bool {
    let bucket = matches!(m, 1 | 2 | 4) || (m > 0 && m.is_multiple_of(8));
    ENABLED.get() && bucket && m <= MAX_ROWS && weight_bytes >= MIN_WEIGHT_BYTES
}

/// The candidate to keep, given each one's median time (index 0: the
/// heuristic's first pick; `None`: it failed to run): the fastest, if it beats
/// the first pick by more than [`MARGIN`]; else the first pick.
pub(super) fn pick(medians: &[Option<f64>]) -> usize {
    let fastest = medians.iter().enumerate().filter_map(|(i, t)| t.map(|t| (i, t))).min_by(|a, b| a.1.total_cmp(&b.1));
    match (medians.first().copied().flatten(), fastest) {
        // The first pick did not run: the fastest that did, if any.
        (None, fastest) => fastest.map_or(0, |(i, _)| i),
        (Some(first), Some((best, best_t))) if best_t < first * MARGIN => best,
        (Some(_), _) => 0,
    }
}

/// One tuned shape, for [`report`].
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
    /// Median microseconds of each candidate (`None`: it failed).
    pub medians_us: Vec<Option<f64>>,
    pub chosen: usize,
    /// Wall time the measurement took (its share of start-up or graph capture).
    pub tuning_ms: f64,
}

static RECORDS: Mutex<Vec<Record>> = Mutex::new(Vec::new());

/// One line per shape tuned so far in this process:
/// `gemm tune m=.. n=.. k=.. bf16: heuristic 12.3 us, chosen #2 9.8 us (0.80x) [12.3 11.0 9.8 ..] in 3.1 ms`.
pub(crate) fn report() -> Vec<String> {
    let records = RECORDS.lock().map(|r| r.clone()).unwrap_or_default();
    records.iter().map(line).collect()
}

fn line(r: &Record) -> String {
    let fmt = |t: &Option<f64>| t.map_or("-".to_owned(), |t| format!("{t:.1}"));
    let all: Vec<String> = r.medians_us.iter().map(fmt).collect();
    let first = r.medians_us.first().copied().flatten();
    let chosen = r.medians_us.get(r.chosen).copied().flatten();
    let ratio = match (first, chosen) {
        (Some(f), Some(c)) if f > 0.0 => format!(" ({:.2}x)", c / f),
        _ => String::new(),
    };
    format!(
        "gemm tune m={} n={} k={} {}: heuristic {} us, chosen #{} {} us{ratio} [{}] in {:.1} ms",
        r.m,
        r.n,
        r.k,
        r.dtype,
        first.map_or("-".into(), |t| format!("{t:.1}")),
        r.chosen,
        chosen.map_or("-".into(), |t| format!("{t:.1}")),
        all.join(" "),
        r.tuning_ms
    )
}

/// Times `run(i)` for each of `candidates` algorithms on `dev`'s compute stream
/// (see the module header) and returns the one to keep, or `None` when the
/// flush buffer could not be allocated (the caller keeps the first pick: a
/// ranking from a warm L2 would favour the wrong algorithms).
pub(super) fn choose(
    dev: &Arc<CudaDevice>,
    shape: (usize, usize, usize, DType),
    candidates: usize,
    mut run: impl FnMut(usize) -> Result<()>,
) -> Result<Option<usize>> {
    if candidates <= 1 {
        return Ok(None);
    }
    let started = std::time::Instant::now();
    use cudarc::driver::sys::CUdevice_attribute;
    let l2 = dev.context().attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE).unwrap_or(0);
    let flush_bytes = (2 * l2.max(0) as usize).max(8 << 20);
    let Ok(flush) = Tensor::empty(&[flush_bytes], DType::U8, Device::Cuda(dev.ordinal())) else {
        return Ok(None);
    };
    let timer = EventTimer::new(dev)?;
    // A candidate that fails once (unsupported at run time) is out.
    let mut ok = vec![true; candidates];
    for (i, ok) in ok.iter_mut().enumerate() {
        *ok = run(i).is_ok();
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::with_capacity(REPS); candidates];
    for _ in 0..REPS {
        for i in 0..candidates {
            if !ok[i] {
                continue;
            }
            dev.memset(flush.device_ptr(), 0, flush_bytes)?;
            timer.start()?;
            if run(i).is_err() {
                ok[i] = false;
                let _ = timer.stop_ms();
                continue;
            }
            times[i].push(f64::from(timer.stop_ms()?) * 1e3);
        }
    }
    let medians: Vec<Option<f64>> = times
        .iter_mut()
        .zip(&ok)
        .map(|(t, &ok)| {
            if !ok || t.is_empty() {
                return None;
            }
            t.sort_by(f64::total_cmp);
            Some(t[t.len() / 2])
        })
        .collect();
    let chosen = pick(&medians);
    let (m, n, k, dtype) = shape;
    if let Ok(mut records) = RECORDS.lock() {
        let tuning_ms = started.elapsed().as_secs_f64() * 1e3;
        records.push(Record { m, n, k, dtype, medians_us: medians, chosen, tuning_ms });
    }
    Ok(Some(chosen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_pick_stays_unless_another_is_clearly_faster() {
        assert_eq!(pick(&[Some(10.0), Some(9.8), Some(10.5)]), 0, "2% is noise");
        assert_eq!(pick(&[Some(10.0), Some(9.0), Some(8.0)]), 2);
        assert_eq!(pick(&[Some(10.0), None, Some(9.5)]), 2);
        assert_eq!(pick(&[Some(10.0)]), 0);
        assert_eq!(pick(&[None, Some(12.0), Some(11.0)]), 2, "the first pick failed");
        assert_eq!(pick(&[None, None]), 0);
        assert_eq!(pick(&[]), 0);
    }

    #[test]
    fn only_decode_sized_products_of_real_weights_are_tuned() {
        set_enabled(Some(true));
        assert!(wanted(64, 32 << 20));
        assert!(wanted(MAX_ROWS, MIN_WEIGHT_BYTES));
        for m in [1, 2, 4, 8, 16, 24, 136, 248] {
            assert!(wanted(m, 32 << 20), "graph bucket {m}");
        }
        for m in [0, 3, 5, 7, 9, 100, 255] {
            assert!(!wanted(m, 32 << 20), "{m} rows: not a graph bucket");
        }
        assert!(!wanted(MAX_ROWS + 1, 32 << 20), "a prefill chunk");
        assert!(!wanted(64, MIN_WEIGHT_BYTES - 1), "a test model's layer");
        set_enabled(Some(false));
        assert!(!wanted(64, 32 << 20));
        set_enabled(None);
    }

    #[test]
    fn the_report_names_the_shape_and_the_choice() {
        let r = Record {
            m: 64,
            n: 6144,
            k: 4096,
            dtype: DType::BF16,
            medians_us: vec![Some(20.0), None, Some(15.0)],
            chosen: 2,
            tuning_ms: 3.06,
        };
        assert_eq!(
            line(&r),
            "gemm tune m=64 n=6144 k=4096 bf16: heuristic 20.0 us, chosen #2 15.0 us (0.75x) [20.0 - 15.0] in 3.1 ms"
        );
    }
}
