//! The fused MoE at Qwen3-30B-A3B's shapes (128 experts, top-8, hidden 2048,
//! expert intermediate 768, bf16): criterion timing of `ops::fused_moe` (router,
//! sort by expert, both grouped GEMMs, SiLU-and-mul, routing weights, top-k sum)
//! at M = 1, 16, 64, 256, 1024, 4096 tokens, timed with CUDA events around
//! back-to-back launches (`iter_custom`), plus plain-text lines for run scripts:
//!
//! `SUMMARY moe M=<m> <median us> us <TFLOP/s> TFLOP/s <TB/s> TB/s`
//! `SUMMARY moe-experts M=<m> ...` (the routing given: sort, GEMMs and sum, as
//! mini-sglang's `fused_experts` and scripts/gpu/moe_triton_baseline.py time it)
//! `SUMMARY moe-decode M=<m> ...` / `moe-grouped` (`moe-experts` through the decode
//! kernels, moe_decode.cu, and through the grouped GEMMs, at M <= 16), and
//! `SUMMARY moe-decode-cols M=<m> cols=<c> ...` (the decode kernels with blocks of
//! 16, 32 and 64 output columns instead of 8)
//! `SUMMARY moe-tiles M=<m> gate_up=<g> down=<d> ...` (`moe-experts` with every
//! pair of tiles of equal rows from the tile table, `*` marking the plan's pair;
//! `MINISGL_MOE_BENCH_TILES=5,6,7` sweeps only pairs of those tiles, `=none`
//! skips the sweep; the wgmma tiles 18..23 are swept on sm_90 only), then
//! `SUMMARY moe-tiles-best M=<m> gate_up=<g> down=<d> ...`
//!
//! The sweep is what the plan's table (kernel-runtime gpu/moe.rs `PLAN`) is set
//! from; `MINISGL_MOE_TILE_GATE_UP` / `MINISGL_MOE_TILE_DOWN` override the plan
//! of the `moe` and `moe-experts` lines too.
//!
//! FLOPs = 2 M top_k (2 I H + H I); TB/s = the bytes of the distinct experts the
//! batch touches (3 H I bf16 each) over the time. Inputs rotate between 4 token
//! and router-logit sets (different experts each launch); the 1.2 GB of expert
//! weights is far above L2. Anchors (GPU.md): mini-sglang's Triton fused MoE takes
//! 108 / 217 / 312 / 435 / 574 / 1457 us at these M; the copy ceiling is 4.25
//! TB/s. On a machine without a GPU the bench prints a skip line and exits 0.

use std::cell::RefCell;
use std::time::Duration;

use criterion::{Criterion, Throughput};
use kernel_runtime::cuda::{self, EventTimer};
use kernel_runtime::ops::{self, MoePlan, MoeRouting};
use kernel_runtime::{Device, Tensor};

const GPU: Device = Device::Cuda(0);
const EXPERTS: usize = 128;
const TOP_K: usize = 8;
const HIDDEN: usize = 2048;
const INTER: usize = 768;
const MS: [usize; 9] = [1, 2, 4, 8, 16, 64, 256, 1024, 4096];
const SETS: usize = 4;

/// Deterministic xorshift64* stream.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// A bf16 tensor with values uniform in [-scale, scale): 16-bit random indices
/// into a table of 65536 values (fast enough for 1.2 GB of weights).
fn random_bf16(shape: &[usize], scale: f32, seed: u64) -> kernel_runtime::Result<Tensor> {
    let mut r = Rng(seed | 1);
    let table: Vec<half::bf16> = (0..65536).map(|_| half::bf16::from_f32(scale * r.unit())).collect();
    let n: usize = shape.iter().product();
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        let x = r.next();
        for i in 0..4 {
            if v.len() < n {
                v.push(table[(x >> (16 * i)) as usize & 0xffff]);
            }
        }
    }
    Tensor::from_slice(&v, shape, GPU)
}

/// One benchmarked size: the inputs of each rotation set and the figures.
struct Case {
    m: usize,
    xs: Vec<Tensor>,
    logits: Vec<Tensor>,
    routings: Vec<MoeRouting>,
    flops: f64,
    weight_bytes: f64,
}

fn case(m: usize) -> kernel_runtime::Result<Case> {
    let mut xs = Vec::new();
    let mut logits = Vec::new();
    let mut routings = Vec::new();
    for s in 0..SETS {
        let seed = (m * SETS + s) as u64 * 7919 + 13;
        xs.push(random_bf16(&[m, HIDDEN], 1.0, seed)?);
        let l = random_bf16(&[m, EXPERTS], 3.0, seed + 1)?;
        routings.push(ops::moe_route(&l, TOP_K, true)?);
        logits.push(l);
    }
    let mut used = [false; EXPERTS];
    for &e in &routings[0].topk_ids.to_vec::<i32>()? {
        used[e as usize] = true;
    }
    let distinct = used.iter().filter(|&&u| u).count();
    Ok(Case {
        m,
        xs,
        logits,
        routings,
        flops: 2.0 * (m * TOP_K) as f64 * (3 * HIDDEN * INTER) as f64,
        weight_bytes: (distinct * 3 * HIDDEN * INTER * 2) as f64,
    })
}

/// What one timed launch runs.
#[derive(Clone, Copy)]
enum Op {
    /// `ops::fused_moe`: router and experts.
    FusedMoe,
    /// `ops::fused_experts`: the experts of a given routing.
    Experts,
    /// `ops::fused_experts_with` one plan.
    ExpertsWith(MoePlan),
}

struct Weights {
    w13: Tensor,
    w2: Tensor,
}

fn launch(op: Op, w: &Weights, c: &Case, i: usize) -> kernel_runtime::Result<()> {
    let s = i % SETS;
    match op {
        Op::FusedMoe => ops::fused_moe(&c.xs[s], &c.logits[s], &w.w13, &w.w2, TOP_K, true).map(drop),
        Op::Experts => ops::fused_experts(&c.xs[s], &w.w13, &w.w2, &c.routings[s]).map(drop),
        Op::ExpertsWith(plan) => ops::fused_experts_with(&c.xs[s], &w.w13, &w.w2, &c.routings[s], Some(plan)).map(drop),
    }
}

/// Milliseconds of `launches` back-to-back launches, timed with CUDA events.
fn time_launches(timer: &EventTimer, op: Op, w: &Weights, c: &Case, launches: u64) -> kernel_runtime::Result<f64> {
    timer.start()?;
    for i in 0..launches {
        launch(op, w, c, i as usize)?;
    }
    Ok(f64::from(timer.stop_ms()?))
}

/// Median microseconds per launch over `samples` timed groups of about 2 ms.
fn median_us(timer: &EventTimer, op: Op, w: &Weights, c: &Case, samples: usize) -> kernel_runtime::Result<f64> {
    let one = time_launches(timer, op, w, c, 8)? / 8.0;
    let per_group = ((2.0 / one.max(1e-4)) as u64).clamp(8, 2000);
    let mut us: Vec<f64> = (0..samples)
        .map(|_| time_launches(timer, op, w, c, per_group).map(|ms| ms * 1e3 / per_group as f64))
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
        eprintln!("moe bench failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> kernel_runtime::Result<()> {
    let dev = cuda::device(0)?;
    let timer = EventTimer::new(&dev)?;
    let w = Weights {
        w13: random_bf16(&[EXPERTS, 2 * INTER, HIDDEN], (3.0 / HIDDEN as f32).sqrt(), 1)?,
        w2: random_bf16(&[EXPERTS, HIDDEN, INTER], (3.0 / INTER as f32).sqrt(), 2)?,
    };
    let cases: Vec<Case> = MS.iter().map(|&m| case(m)).collect::<kernel_runtime::Result<_>>()?;
    // Warm up: module loading (and any NVRTC compile) stays out of the timings.
    for c in &cases {
        for i in 0..SETS {
            launch(Op::FusedMoe, &w, c, i)?;
            launch(Op::Experts, &w, c, i)?;
        }
    }
    dev.synchronize()?;

    let mut crit = Criterion::default().configure_from_args();
    let failure: RefCell<Option<kernel_runtime::Error>> = RefCell::new(None);
    {
        let mut group = crit.benchmark_group("moe");
        for c in &cases {
            group.throughput(Throughput::Bytes(c.weight_bytes as u64));
            group.bench_function(format!("fused_moe E={EXPERTS} top{TOP_K} H={HIDDEN} I={INTER} M={}", c.m), |b| {
                b.iter_custom(|iters| {
                    if failure.borrow().is_some() {
                        return Duration::from_nanos(1);
                    }
                    match time_launches(&timer, Op::FusedMoe, &w, c, iters) {
                        Ok(ms) => Duration::from_secs_f64(ms / 1e3),
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
    crit.final_summary();
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }

    let figures = |c: &Case, us: f64| {
        format!(
            "{us:.1} us {:.1} TFLOP/s {:.2} TB/s",
            c.flops / (us * 1e-6) / 1e12,
            c.weight_bytes / (us * 1e-6) / 1e12
        )
    };
    for (op, label) in [(Op::FusedMoe, "moe"), (Op::Experts, "moe-experts")] {
        for c in &cases {
            let us = median_us(&timer, op, &w, c, 25)?;
            let p = ops::moe::moe_plan(c.m, TOP_K, EXPERTS, HIDDEN, INTER, GPU)?;
            let how = if p.decode {
                "decode kernels".to_owned()
            } else {
                format!("tiles {} {}", p.gate_up_tile, p.down_tile)
            };
            println!("SUMMARY {label} M={} {} ({how})", c.m, figures(c, us));
        }
    }
    // The decode kernels against the plan's tiles, experts only, where either could run.
    for c in cases.iter().filter(|c| c.m <= 16) {
        let p = ops::moe::moe_plan(c.m, TOP_K, EXPERTS, HIDDEN, INTER, GPU)?;
        for (decode, label) in [(true, "moe-decode"), (false, "moe-grouped")] {
            let us = median_us(&timer, Op::ExpertsWith(MoePlan { decode, ..p }), &w, c, 25)?;
            println!("SUMMARY {label} M={} {}", c.m, figures(c, us));
        }
        // The decode kernels' block width (8 columns by default: 1.5 waves of
        // gate_up blocks at M = 1).
        for cols in [16, 32, 64] {
            ops::moe::set_moe_decode_cols(Some(cols));
            let us = median_us(&timer, Op::ExpertsWith(MoePlan { decode: true, ..p }), &w, c, 25);
            ops::moe::set_moe_decode_cols(None);
            println!("SUMMARY moe-decode-cols M={} cols={cols} {}", c.m, figures(c, us?));
        }
    }

    let pairs = tile_pairs();
    if pairs.is_empty() {
        return Ok(());
    }
    for c in &cases {
        let p = ops::moe::moe_plan(c.m, TOP_K, EXPERTS, HIDDEN, INTER, GPU)?;
        let mut best: Option<(f64, usize, usize)> = None;
        for &(g, d) in &pairs {
            let plan = MoePlan { gate_up_tile: g, down_tile: d, pdl: p.pdl, decode: false };
            let us = median_us(&timer, Op::ExpertsWith(plan), &w, c, 15)?;
            let mark = if (g, d) == (p.gate_up_tile, p.down_tile) { " *" } else { "" };
            println!("SUMMARY moe-tiles M={} gate_up={g} down={d} {}{mark}", c.m, figures(c, us));
            if best.is_none_or(|b| us < b.0) {
                best = Some((us, g, d));
            }
        }
        if let Some((us, g, d)) = best {
            println!("SUMMARY moe-tiles-best M={} gate_up={g} down={d} {}", c.m, figures(c, us));
        }
    }
    Ok(())
}

/// The (gate_up, down) tile pairs of the sweep: every pair of equal rows among
/// the tiles `MINISGL_MOE_BENCH_TILES` lists (default: the whole table).
fn tile_pairs() -> Vec<(usize, usize)> {
    let shapes = ops::moe::moe_tile_shapes();
    let chosen: Vec<usize> = match std::env::var("MINISGL_MOE_BENCH_TILES") {
        Ok(v) if v.trim() == "none" => Vec::new(),
        Ok(v) => v.split(',').filter_map(|t| t.trim().parse().ok()).filter(|&t| t < shapes.len()).collect(),
        Err(_) => (0..shapes.len()).collect(),
    };
    // The wgmma tiles (18..) run on sm_90 only: elsewhere they drop out of the sweep.
    let chosen: Vec<usize> =
        chosen.into_iter().filter(|&t| ops::moe::moe_tile_supported(t, GPU).unwrap_or(false)).collect();
    let mut pairs = Vec::new();
    for &g in &chosen {
        for &d in &chosen {
            if shapes[g][0] == shapes[d][0] {
                pairs.push((g, d));
            }
        }
    }
    pairs
}
