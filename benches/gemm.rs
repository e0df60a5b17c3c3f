//! Decode GEMMs (`x @ w^T`, bf16) at the projections of Llama-3-8B, Qwen3-0.6B
//! and Qwen3-30B-A3B's attention, M = 1, 4, 16, 32, 64, 128, 256 rows: the skinny kernel
//! (`ops::skinny_gemm`, m <= 16: both tile widths, and one tile with K split 4
//! ways) and the tiled skinny kernel (`ops::skinny_tiled`, every M: the rule's
//! default plan `tiled`, then one line per plan that changes one of its choices,
//! `tiled-wn<w>` / `-ch<c>` / `-st<s>` / `-sp<s>` / `-nt<t>`, each label ending in
//! the whole plan `[nt wn ch st sp]`) against cuBLASLt (`ops::linear` with the
//! skinny paths switched off), the streaming kernel (`ops::stream_gemm`, m <= 16
//! on sm_90: its default plan `stream` and `stream-ch<chunk>-st<stages>[-2d]`),
//! plus `ops::linear` as the dispatch rule runs it. `cublaslt` is cuBLASLt with
//! its algorithm measured on first use (gpu/gemm_tune.rs, as the engine runs it),
//! `cublaslt-heuristic` the heuristic's first pick; a `SUMMARY gemm tune` line per
//! tuned shape lists every candidate's time.
//! Set `MINISGL_GEMM_BENCH_SHAPES=llama3-8b` (a substring of "model proj") to run
//! some shapes only, `MINISGL_GEMM_BENCH_MS=1,16` some row counts. Each case's launches are captured into a CUDA graph (at
//! least 20 back to back, every weight copy in turn) and timed with CUDA events
//! around replays of it (criterion's `iter_custom`, and the medians): a launch
//! from the host costs more than the GPU work of the small shapes (Qwen3-0.6B's
//! projections ran 8-16 us a launch timed that way, 4-8 us in ncu), and decode
//! steps replay graphs too. One plain-text line per case for run scripts:
//!
//! `SUMMARY gemm <model> <proj> m=<M> <variant>: median <us> us, <TB/s> TB/s`
//!
//! Criterion times the headline cases only (the Llama-3-8B projections at M = 1
//! and 16, cuBLASLt and the rule's skinny variant), so that the bench stays well
//! inside run.sh's 300 s per bench; every case gets its SUMMARY line (30 medians
//! of ~2 ms groups).
//!
//! The skinny kernel stages its weight slice in shared memory before its grid
//! dependency wait (programmatic dependent launch), so back-to-back launches
//! stream the next launch's weights while the previous one finishes:
//! `skinny<t>-noprefetch` is the same kernel with the prefetch off, and, at
//! Qwen3-0.6B's shapes, `norm+skinny` / `norm+skinny-noprefetch` time an RMSNorm
//! followed by the projection (the pair a decoder layer runs), whose prefetch
//! overlaps the norm. At the gate_up shapes `skinny-silu<t>` is the gated kernel
//! (SiLU-and-mul in the epilogue, `t` 8-output tiles), `skinny+silu_mul` the two
//! launches it replaces, and `linear_silu_mul` the op as dispatched.
//!
//! TB/s counts the weight bytes (n k 2) over the time, the figure GPU.md's anchor
//! uses: cuBLAS reaches 2.7-2.8 TB/s of weights at M = 1..64, K = 4096, N = 12288;
//! the copy ceiling is 4.25 TB/s (read + write). Each case rotates over enough
//! copies of its weight (at least 256 MiB in all) that no launch finds its
//! weights in the 50 MB L2. On a machine without a GPU the bench prints a skip
//! line and exits 0.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use kernel_runtime::cuda::{self, EventTimer};
use kernel_runtime::{ops, Device, Tensor};

const GPU: Device = Device::Cuda(0);
const MS: [usize; 7] = [1, 4, 16, 32, 64, 128, 256];
/// Weight bytes a case rotates over, at least.
const ROTATE_BYTES: usize = 256 << 20;

/// (model, projection, k = in features, n = out features).
const SHAPES: &[(&str, &str, usize, usize)] = &[
    ("llama3-8b", "qkv", 4096, 6144),
    ("llama3-8b", "o", 4096, 4096),
    ("llama3-8b", "gate_up", 4096, 28672),
    ("llama3-8b", "down", 14336, 4096),
    ("llama3-8b", "lm_head", 4096, 128256),
    ("qwen3-30b-a3b", "qkv", 2048, 5120),
    ("qwen3-30b-a3b", "o", 4096, 2048),
    ("qwen3-0.6b", "qkv", 1024, 4096),
    ("qwen3-0.6b", "o", 2048, 1024),
    ("qwen3-0.6b", "gate_up", 1024, 6144),
    ("qwen3-0.6b", "down", 3072, 1024),
    ("qwen3-0.6b", "lm_head", 1024, 151936),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// `ops::linear` with the skinny path off (cuBLASLt's algorithm measured on
    /// first use, as the engine runs it).
    Cublaslt,
    /// The same with the measured choice off: the heuristic's first algorithm.
    CublasltHeuristic,
    /// `ops::linear` as dispatched.
    Linear,
    /// `ops::skinny_gemm` with this many 16-row tiles per warp (K whole, as the rule runs it).
    Skinny(usize),
    /// `ops::skinny_gemm`, one tile per warp, K split across a cluster of 4 blocks
    /// (what a split would gain; the rule measured it a loss).
    SkinnySplit4,
    /// `ops::skinny_gemm` with this many tiles and the weight prefetch off.
    SkinnyNoPrefetch(usize),
    /// `ops::rms_norm` of x, then `ops::linear` of its output (prefetch on or off).
    NormSkinny { prefetch: bool },
    /// `ops::skinny_gemm_silu_mul` with this many 8-output tiles (gate_up shapes).
    SkinnySilu(usize),
    /// `ops::skinny_gemm` (the rule's tiles) then `ops::silu_mul`.
    SkinnyThenSilu,
    /// `ops::linear_silu_mul` as dispatched.
    LinearSiluMul,
    /// `ops::stream_gemm` with its default plan (`None`) or this chunk, depth and
    /// copy shape (whole rows: one 3-D copy a stage; else 2-D copies of 256 k).
    Stream(Option<(usize, usize, bool)>),
    /// `ops::skinny_tiled` with this plan; the label's prefix names what it
    /// changes from the rule's default plan ("" for the default itself).
    Tiled(&'static str, ops::TiledPlan),
}

impl Variant {
    fn label(self) -> String {
        match self {
            Variant::Cublaslt => "cublaslt".into(),
            Variant::CublasltHeuristic => "cublaslt-heuristic".into(),
            Variant::Linear => "linear".into(),
            Variant::Skinny(t) => format!("skinny{t}"),
            Variant::SkinnySplit4 => "skinny1-split4".into(),
            Variant::SkinnyNoPrefetch(t) => format!("skinny{t}-noprefetch"),
            Variant::NormSkinny { prefetch: true } => "norm+skinny".into(),
            Variant::NormSkinny { prefetch: false } => "norm+skinny-noprefetch".into(),
            Variant::SkinnySilu(t) => format!("skinny-silu{t}"),
            Variant::SkinnyThenSilu => "skinny+silu_mul".into(),
            Variant::LinearSiluMul => "linear_silu_mul".into(),
            Variant::Stream(None) => "stream".into(),
            Variant::Stream(Some((c, s, whole))) => format!("stream-ch{c}-st{s}{}", if whole { "" } else { "-2d" }),
            Variant::Tiled(what, p) => {
                format!("tiled{what} [nt{} wn{} ch{} st{} sp{}]", p.n_tiles, p.warps_n, p.chunk, p.stages, p.k_splits)
            }
        }
    }
}

struct Case {
    name: String,
    /// Timed by criterion too (else only the SUMMARY median).
    criterion: bool,
    weight_bytes: u64,
    /// Distinct weight copies `run` rotates over.
    copies: usize,
    run: Box<dyn Fn() -> kernel_runtime::Result<()>>,
}

/// The tiled kernel's default plan for m rows of `[n, k]`, then one plan per
/// changed choice (block shape, chunk, depth, split, x tiles), skipping plans the
/// kernel refuses (227 KiB of shared memory, more splits than k-steps) and repeats.
fn tiled_variants(m: usize, n: usize, k: usize, sms: usize) -> Vec<Variant> {
    let d = ops::skinny_tiled_default_plan(m, n, k, sms);
    let mut plans: Vec<(&'static str, ops::TiledPlan)> = vec![("", d)];
    for (what, w) in [("-wn1", 1), ("-wn2", 2), ("-wn4", 4), ("-wn8", 8)] {
        plans.push((what, ops::TiledPlan { warps_n: w, ..d }));
    }
    for (what, c) in [("-ch1", 1), ("-ch4", 4)] {
        plans.push((what, ops::TiledPlan { chunk: c, stages: (d.stages * d.chunk / c).clamp(2, 8), ..d }));
    }
    for (what, s) in [("-st2", 2), ("-st3", 3), ("-st6", 6)] {
        plans.push((what, ops::TiledPlan { stages: s, ..d }));
    }
    for (what, s) in [("-sp1", 1), ("-sp2", 2), ("-sp4", 4), ("-sp8", 8)] {
        plans.push((what, ops::TiledPlan { k_splits: s, ..d }));
    }
    if m > 64 {
        plans.push(("-nt16", ops::TiledPlan { n_tiles: 16, stages: 2, ..d }));
    }
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for (what, p) in plans {
        if p.k_splits > k / 32 || p.shared_bytes() > 227 << 10 || seen.contains(&p) {
            continue;
        }
        seen.push(p);
        out.push(Variant::Tiled(what, p));
    }
    out
}

/// Deterministic pseudo-random bf16 values in about [-scale, scale) (never zeros).
fn random_bf16(n: usize, seed: u64, scale: f32) -> Vec<half::bf16> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let u = (s.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32;
            half::bf16::from_f32((2.0 * u - 1.0) * scale + 1e-3)
        })
        .collect()
}

/// `copies` distinct device buffers holding one random `[n, k]` matrix, shared by
/// every case of a shape (generated once: lm_head's is 311 MB).
fn weights(n: usize, k: usize) -> kernel_runtime::Result<Rc<Vec<Tensor>>> {
    let copies = ROTATE_BYTES.div_ceil(n * k * 2).clamp(2, 64);
    let host = random_bf16(n * k, 7, 0.05);
    let ws =
        (0..copies).map(|_| Tensor::from_slice(&host, &[n, k], GPU)).collect::<kernel_runtime::Result<Vec<_>>>()?;
    Ok(Rc::new(ws))
}

fn case(
    label: &str,
    ws: &Rc<Vec<Tensor>>,
    m: usize,
    variant: Variant,
    criterion: bool,
    sms: usize,
) -> kernel_runtime::Result<Case> {
    let [n, k] = [ws[0].dim(0), ws[0].dim(1)];
    let x = Tensor::from_slice(&random_bf16(m * k, 11, 1.0), &[m, k], GPU)?;
    let norm_w = Tensor::from_slice(&random_bf16(k, 13, 1.0), &[k], GPU)?;
    let ws = Rc::clone(ws);
    let copies = ws.len();
    let next = std::cell::Cell::new(0usize);
    let run: Box<dyn Fn() -> kernel_runtime::Result<()>> = Box::new(move || {
        let i = next.get();
        next.set((i + 1) % ws.len());
        let w = &ws[i];
        match variant {
            Variant::Cublaslt => {
                ops::set_skinny_gemm(Some(false));
                let r = ops::linear(&x, w, None);
                ops::set_skinny_gemm(None);
                r.map(drop)
            }
            Variant::CublasltHeuristic => {
                ops::set_skinny_gemm(Some(false));
                ops::set_gemm_tuning(Some(false));
                let r = ops::linear(&x, w, None);
                ops::set_gemm_tuning(None);
                ops::set_skinny_gemm(None);
                r.map(drop)
            }
            Variant::Linear => ops::linear(&x, w, None).map(drop),
            Variant::Skinny(t) => ops::skinny_gemm(&x, w, None, Some(t), None).map(drop),
            Variant::SkinnySplit4 => ops::skinny_gemm(&x, w, None, Some(1), Some(4)).map(drop),
            Variant::SkinnyNoPrefetch(t) => {
                ops::set_skinny_prefetch(Some(false));
                let r = ops::skinny_gemm(&x, w, None, Some(t), None);
                ops::set_skinny_prefetch(None);
                r.map(drop)
            }
            Variant::NormSkinny { prefetch } => {
                ops::set_skinny_prefetch(Some(prefetch));
                let r = ops::rms_norm(&x, &norm_w, 1e-6).and_then(|h| ops::linear(&h, w, None));
                ops::set_skinny_prefetch(None);
                r.map(drop)
            }
            Variant::SkinnySilu(t) => ops::skinny_gemm_silu_mul(&x, w, None, Some(t)).map(drop),
            Variant::SkinnyThenSilu => {
                ops::skinny_gemm(&x, w, None, None, None).and_then(|g| ops::silu_mul(&g)).map(drop)
            }
            Variant::LinearSiluMul => ops::linear_silu_mul(&x, w, None).map(drop),
            Variant::Stream(stages) => {
                let plan = stages.map(|(chunk, s, whole_rows)| ops::StreamPlan {
                    chunk,
                    stages: s,
                    blocks: n.div_ceil(16).min(sms),
                    whole_rows,
                });
                ops::stream_gemm(&x, w, None, plan).map(drop)
            }
            Variant::Tiled(_, p) => ops::skinny_tiled(&x, w, None, Some(p)).map(drop),
        }
    });
    Ok(Case {
        name: format!("gemm {label} m={m} {}", variant.label()),
        criterion,
        weight_bytes: (n * k * 2) as u64,
        copies,
        run,
    })
}

/// A case's launches captured into one graph: at least 20, a whole number of
/// rounds over its weight copies.
struct Captured {
    graph: cuda::graph::Graph,
    launches: u64,
}

fn capture(dev: &std::sync::Arc<cuda::CudaDevice>, case: &Case) -> kernel_runtime::Result<Captured> {
    let launches = case.copies * 20usize.div_ceil(case.copies);
    let (graph, ()) = dev.capture(|| -> kernel_runtime::Result<()> {
        for _ in 0..launches {
            (case.run)()?;
        }
        Ok(())
    })?;
    Ok(Captured { graph, launches: launches as u64 })
}

/// Milliseconds of `replays` replays of `g`.
fn time_replays(timer: &EventTimer, g: &mut Captured, replays: u64) -> kernel_runtime::Result<f64> {
    timer.start()?;
    for _ in 0..replays {
        g.graph.replay()?;
    }
    Ok(f64::from(timer.stop_ms()?))
}

/// The median over `samples` groups of ~2 ms of replays, in us a launch.
fn median_us(timer: &EventTimer, g: &mut Captured, samples: usize) -> kernel_runtime::Result<f64> {
    let one = time_replays(timer, g, 3)? / 3.0;
    let per_group = ((2.0 / one.max(1e-4)) as u64).clamp(2, 1_000);
    let mut us: Vec<f64> = (0..samples)
        .map(|_| time_replays(timer, g, per_group).map(|ms| ms * 1e3 / (per_group * g.launches) as f64))
        .collect::<kernel_runtime::Result<_>>()?;
    us.sort_by(f64::total_cmp);
    Ok(us[us.len() / 2])
}

fn main() {
    match cuda::device_count() {
        Ok(n) if n > 0 => {}
        Ok(_) => {
            println!("skipped: no CUDA device");
            return;
        }
        Err(e) => {
            println!("skipped: {e}");
            return;
        }
    }
    if let Err(e) = run() {
        eprintln!("gemm bench failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> kernel_runtime::Result<()> {
    let dev = cuda::device(0)?;
    let timer = EventTimer::new(&dev)?;
    let mut c = Criterion::default().configure_from_args();
    let failure: RefCell<Option<kernel_runtime::Error>> = RefCell::new(None);
    let mut summary = Vec::new();
    let only = std::env::var("MINISGL_GEMM_BENCH_SHAPES").unwrap_or_default();
    let sms = dev.sm_count().max(1) as usize;
    // MINISGL_GEMM_BENCH_MS=1,16: these row counts only.
    let ms: Vec<usize> = match std::env::var("MINISGL_GEMM_BENCH_MS") {
        Ok(v) => v.split(',').filter_map(|m| m.trim().parse().ok()).collect(),
        Err(_) => MS.to_vec(),
    };
    // One shape at a time, so that only its weight copies are allocated.
    for &(model, proj, k, n) in SHAPES {
        if !format!("{model} {proj}").contains(only.as_str()) {
            continue;
        }
        let mut cases = Vec::new();
        let ws = weights(n, k)?;
        let label = format!("{model} {proj}");
        for &m in &ms {
            let mut variants = vec![Variant::Cublaslt, Variant::CublasltHeuristic, Variant::Linear];
            if m <= 16 {
                variants.extend([Variant::Skinny(1), Variant::Skinny(2), Variant::SkinnySplit4]);
                variants.extend([Variant::SkinnyNoPrefetch(1), Variant::SkinnyNoPrefetch(2)]);
                if dev.capability().0 >= 9 {
                    let (d1024, d512) = if m <= 8 { (4, 8) } else { (3, 6) };
                    variants.extend([
                        Variant::Stream(None),
                        Variant::Stream(Some((1024, 2, true))),
                        Variant::Stream(Some((512, d512, true))),
                        Variant::Stream(Some((1024, d1024, false))),
                    ]);
                }
                if model == "qwen3-0.6b" && proj != "lm_head" {
                    variants.extend([Variant::NormSkinny { prefetch: true }, Variant::NormSkinny { prefetch: false }]);
                }
            }
            if proj != "lm_head" {
                variants.extend(tiled_variants(m, n, k, sms));
            }
            if proj == "gate_up" {
                variants.push(Variant::LinearSiluMul);
                if m <= 16 {
                    variants.extend([Variant::SkinnySilu(1), Variant::SkinnySilu(2), Variant::SkinnyThenSilu]);
                }
            }
            // The tile width the dispatch rule picks (gpu::skinny::plan: 2 from n >= 32 x SMs).
            let rule_tiles = if n >= 32 * dev.sm_count().max(1) as usize { 2 } else { 1 };
            for v in variants {
                let headline = model == "llama3-8b"
                    && matches!(m, 1 | 16)
                    && (v == Variant::Cublaslt || v == Variant::Skinny(rule_tiles));
                cases.push(case(&label, &ws, m, v, headline, sms)?);
            }
        }
        // Warm up: module loading, plan creation and any NVRTC compile stay out
        // of the captures (which they would break).
        for case in &cases {
            (case.run)()?;
        }
        dev.synchronize()?;
        let mut graphs = cases.iter().map(|case| capture(&dev, case)).collect::<kernel_runtime::Result<Vec<_>>>()?;
        {
            let mut group = c.benchmark_group(format!("gemm {model} {proj}"));
            for (case, g) in cases.iter().zip(graphs.iter_mut()).filter(|(c, _)| c.criterion) {
                group.throughput(Throughput::Bytes(case.weight_bytes));
                group.bench_function(&case.name, |b| {
                    b.iter_custom(|iters| {
                        if failure.borrow().is_some() {
                            return Duration::from_nanos(1);
                        }
                        // Whole replays covering `iters` launches, scaled back to `iters`.
                        let replays = iters.div_ceil(g.launches).max(1);
                        match time_replays(&timer, g, replays) {
                            Ok(ms) => Duration::from_secs_f64(ms / 1e3 * iters as f64 / (replays * g.launches) as f64),
                            Err(e) => {
                                failure.borrow_mut().get_or_insert(e);
                                Duration::from_nanos(1)
                            }
                        }
                    })
                });
            }
            group.finish();
        }
        if let Some(e) = failure.borrow_mut().take() {
            return Err(e);
        }
        for (case, g) in cases.iter().zip(graphs.iter_mut()) {
            let us = median_us(&timer, g, 30)?;
            let tbs = case.weight_bytes as f64 / (us * 1e-6) / 1e12;
            summary.push(format!(
                "SUMMARY {}: median {us:.2} us, {tbs:.3} TB/s ({} weight bytes)",
                case.name, case.weight_bytes
            ));
        }
        drop(graphs);
        drop(cases);
        drop(ws);
        dev.synchronize()?;
        dev.release_cached_memory()?;
    }
    c.final_summary();
    for line in summary {
        println!("{line}");
    }
    for line in ops::gemm_tuning_report() {
        println!("SUMMARY {line}");
    }
    Ok(())
}
