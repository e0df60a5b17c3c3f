//! Paged attention on the GPU: decode (the decode kernel and, for comparison, the
//! tile kernel on the same batch) and causal prefill, bf16, timed with CUDA events
//! behind a backlog (benches/common), one line per case for run scripts:
//!
//! `SUMMARY <case>: median <us> us, <TB/s> TB/s[, <TFLOP/s> TFLOP/s] (<bytes> bytes per launch)`
//!
//! Decode bytes are the K and V rows read (plus q and out); prefill FLOPs count the
//! causal half of both products (4 * heads * head_dim * L^2 / 2 per sequence), as
//! torch's SDPA figures in GPU.md do. Pages of a sequence are a random permutation
//! of the cache, as after a while of serving. The anchors (GPU.md, torch in the
//! same run: scripts/gpu/torch_baselines.py): SDPA decode over contiguous K/V 3.99
//! TB/s at b=64 ctx=2048, 2.13 TB/s at b=256 ctx=1024, 17.1 us at b=1 ctx=4096;
//! SDPA causal prefill 486-527 TFLOP/s at L=4096, 438 at b=8 L=1024.
//!
//! The `decode-var` cases run the decode kernel's variants at the four shapes of
//! issue 12 (b=64 ctx=2048, b=256 ctx=1024, b=1 ctx=4096 with 32/8 heads, and
//! Qwen3-0.6B's 16/8 heads at b=64 with contexts uniform in [100, 2000]) and at
//! the widest decode step of `minisgl bench` (16/8, b=256, U[100, 2048]): the
//! tensor-core block's pipeline stages (2, 3, 4: 3, 2, 1 blocks an SM at head dim
//! 128) under each split plan (`waves`, `keys`), split merge as the tuning says
//! (`auto`: in the decode launch when its busy blocks fit one wave), and at b=1
//! the merge forced each way. The other cases run the environment's tuning
//! (`MINISGL_DECODE_*`, gpu/decode_plan.rs), so a run script can sweep it too.
//! The `prefill-new tile=N` cases run each tile variant of the prefill kernel
//! (prefill_attention.cu; N = 16..48 are the wgmma tiles, 22..48 warp-specialised,
//! 27..48 with K/V by TMA, 34..38, 42, 47 and 48 persistent), `prefill-tile` the tile
//! kernel, `prefill` what `Auto` picks (with `MINISGL_PREFILL_TILE`'s tile), at the
//! same three shapes.
//!
//! First, the cold cases (`[graph, cold xN]`, see `cold_graph_cases`): launches
//! replayed from a CUDA graph, each reading one of N disjoint copies of its
//! cache, so that every byte comes from HBM as in a decode step (the other
//! cases below reread one cache from the L2 at small contexts);
//! `MINISGL_BENCH_ATTENTION=cold` runs only those.
//! `MINISGL_BENCH_ATTENTION_FILTER=<substring>` runs only the cases (cold or not)
//! whose name contains it: the others are not even built.
//!
//! The `decode-graph` cases run the fixed-split plan a CUDA graph captures at
//! batch 1 (Qwen3-0.6B's heads, the split count of a 40960-token context: most
//! blocks return at once), with the splits merged by the decode launch's last
//! blocks (`merge`) or by the combine launch (`combine`): what fusing the merge
//! saves a decode step, per layer.

mod common;

use common::{Case, GPU};
use kernel_runtime::ops::{self, AttnKernel, DecodePlanKind, DecodeTuning, PagedAttnMeta};
use kernel_runtime::{DType, Tensor};

/// A random permutation of 0..n (Fisher-Yates on an LCG).
fn permutation(n: usize, seed: u64) -> Vec<i32> {
    let mut v: Vec<i32> = (0..n as i32).collect();
    let mut s = seed;
    for i in (1..n).rev() {
        s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        v.swap(i, (s >> 33) as usize % (i + 1));
    }
    v
}

/// A bf16 tensor of `shape` on the GPU, filled by tiling one random 8 MiB block (a
/// large cache filled value by value on the host would take seconds).
fn random_gpu(shape: &[usize], seed: u64) -> kernel_runtime::Result<Tensor> {
    let n: usize = shape.iter().product();
    let block_len = n.min(4 << 20);
    let block = common::random_bf16(&[block_len], seed, GPU)?;
    let flat = Tensor::empty(&[n], DType::BF16, GPU)?;
    let mut at = 0;
    while at < n {
        let len = block_len.min(n - at);
        ops::copy(&flat.narrow(0, at, len)?, &block.narrow(0, 0, len)?)?;
        at += len;
    }
    flat.reshape(shape)
}

/// One attention batch: (new tokens, kv length) per sequence.
struct Shape {
    hq: usize,
    hkv: usize,
    head_dim: usize,
    page_size: usize,
    seqs: Vec<(usize, usize)>,
}

impl Shape {
    /// K and V bytes the batch reads (bf16).
    fn kv_bytes(&self) -> usize {
        2 * self.seqs.iter().map(|s| s.1).sum::<usize>() * self.hkv * self.head_dim * 2
    }
}

/// Copies of a case's cache that its launches rotate through so that, replayed
/// back to back, they read at least [`COLD_BYTES`] (past the H200's 50 MiB L2):
/// as in a decode step, where a layer's cache is read once between every other
/// layer's weights and caches, the reads come from HBM.
fn cold_copies(shape: &Shape) -> usize {
    COLD_BYTES.div_ceil(shape.kv_bytes().max(1)).clamp(1, MAX_COPIES)
}
const COLD_BYTES: usize = 256 << 20;
const MAX_COPIES: usize = 256;

/// A decode batch at 8 kv heads of head dim 128 (`hq` query heads).
fn decode_shape(hq: usize, page_size: usize, seqs: Vec<(usize, usize)>) -> Shape {
    Shape { hq, hkv: 8, head_dim: 128, page_size, seqs }
}

/// A named decode batch: name, query heads, (new tokens, kv length) per sequence.
type NamedDecode = (&'static str, usize, Vec<(usize, usize)>);

/// The decode shapes of issue 12 (page 16) and the bench's widest decode step.
fn issue_decode_shapes() -> Vec<NamedDecode> {
    vec![
        ("32/8 page=16 b=64 ctx=2048", 32, vec![(1, 2048); 64]),
        ("32/8 page=16 b=256 ctx=1024", 32, vec![(1, 1024); 256]),
        ("32/8 page=16 b=1 ctx=4096", 32, vec![(1, 4096)]),
        ("16/8 page=16 b=64 ctx=U[100,2000]", 16, uniform_contexts(64, 100, 2000, 7)),
        ("16/8 page=16 b=256 ctx=U[100,2048]", 16, uniform_contexts(256, 100, 2048, 11)),
    ]
}

/// How a decode case plans its splits: the host's plan, or a CUDA graph's fixed
/// count; with the split merge in the decode launch (`merge` true) or in the
/// combine launch (false; `None`: as the tuning says), a decode tuning of its own
/// (`None`: the environment's), and the prefill kernel's tile variant
/// (`ops::set_prefill_tile`; `None`: the default).
#[derive(Clone, Copy)]
struct Splits {
    fixed: Option<usize>,
    merge: Option<bool>,
    tuning: Option<DecodeTuning>,
    prefill_tile: Option<usize>,
}

const HOST_PLAN: Splits = Splits { fixed: None, merge: None, tuning: None, prefill_tile: None };

/// Whether case `name` runs: `MINISGL_BENCH_ATTENTION_FILTER` (a substring) where
/// set, so that a short GPU call or a profiler run builds and times only the cases
/// it asks for (criterion's own filter would still build and warm every case).
fn wanted(name: &str) -> bool {
    static FILTER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    name.contains(FILTER.get_or_init(|| std::env::var("MINISGL_BENCH_ATTENTION_FILTER").unwrap_or_default()).as_str())
}

/// The case, or `None` where [`wanted`] leaves it out.
fn attention_case(
    name: String,
    shape: Shape,
    kernel: AttnKernel,
    splits: Splits,
    seed: u64,
) -> kernel_runtime::Result<Option<Case>> {
    if !wanted(&name) {
        return Ok(None);
    }
    attention_case_rotating(name, shape, kernel, splits, seed, 1).map(Some)
}

/// [`attention_case`] over `copies` disjoint sets of pages of one cache, each
/// launch reading the next set (its own block table).
fn attention_case_rotating(
    name: String,
    shape: Shape,
    kernel: AttnKernel,
    splits: Splits,
    seed: u64,
    copies: usize,
) -> kernel_runtime::Result<Case> {
    let Shape { hq, hkv, head_dim: d, page_size, seqs } = shape;
    let copies = copies.max(1);
    let b = seqs.len();
    let q_lens: Vec<usize> = seqs.iter().map(|s| s.0).collect();
    let kv_lens: Vec<usize> = seqs.iter().map(|s| s.1).collect();
    let t: usize = q_lens.iter().sum();
    let pages_per_seq: Vec<usize> = kv_lens.iter().map(|kv| kv.div_ceil(page_size)).collect();
    let max_pages = pages_per_seq.iter().copied().max().unwrap_or(1).max(1);
    let num_pages = pages_per_seq.iter().sum::<usize>() * copies + 1;
    let order = permutation(num_pages, seed);
    let mut tables = Vec::with_capacity(copies);
    let mut next = 0;
    for _ in 0..copies {
        let mut table = vec![0i32; b * max_pages];
        for (s, &n) in pages_per_seq.iter().enumerate() {
            table[s * max_pages..][..n].copy_from_slice(&order[next..next + n]);
            next += n;
        }
        tables.push(Tensor::from_slice(&table, &[b, max_pages], GPU)?);
    }
    let turn = std::cell::Cell::new(0usize);
    let mut indptr = vec![0i32];
    for &q in &q_lens {
        indptr.push(indptr[indptr.len() - 1] + q as i32);
    }
    let kv_i32: Vec<i32> = kv_lens.iter().map(|&k| k as i32).collect();
    let q_indptr = Tensor::from_slice(&indptr, &[b + 1], GPU)?;
    let kv = Tensor::from_slice(&kv_i32, &[b], GPU)?;
    let k_cache = random_gpu(&[num_pages, page_size, hkv, d], seed + 1)?;
    let v_cache = random_gpu(&[num_pages, page_size, hkv, d], seed + 2)?;
    let q = random_gpu(&[t, hq, d], seed + 3)?;
    let out = Tensor::empty(&[t, hq, d], DType::BF16, GPU)?;
    let kv_total: usize = kv_lens.iter().sum();
    let bytes = (2 * kv_total * hkv * d * 2 + 2 * t * hq * d * 2) as u64;
    // Causal FLOPs of the new rows: each attends to its prefix (half the square for
    // a prefill without cached prefix).
    let flops: u64 =
        seqs.iter().map(|&(ql, kl)| (0..ql).map(|j| (kl - ql + j + 1) as u64).sum::<u64>() * 4 * (hq * d) as u64).sum();
    let scale = 1.0 / (d as f32).sqrt();
    Ok(Case {
        name,
        bytes,
        flops: if q_lens.iter().all(|&q| q == 1) { 0 } else { flops },
        run: Box::new(move || {
            let block_table = &tables[turn.get()];
            turn.set((turn.get() + 1) % copies);
            let meta = PagedAttnMeta {
                q_indptr: &q_indptr,
                kv_lens: &kv,
                block_table,
                q_lens_host: &q_lens,
                kv_lens_host: &kv_lens,
                decode_splits: splits.fixed,
            };
            ops::set_decode_tuning(splits.tuning);
            ops::set_decode_split_merge(splits.merge);
            ops::set_prefill_tile(splits.prefill_tile);
            let r = ops::paged_attention_with(&out, &q, &k_cache, &v_cache, &meta, scale, kernel);
            ops::set_prefill_tile(None);
            ops::set_decode_split_merge(None);
            ops::set_decode_tuning(None);
            r
        }),
    })
}

/// Contexts uniform in [lo, hi] (an LCG, fixed seed).
fn uniform_contexts(n: usize, lo: usize, hi: usize, seed: u64) -> Vec<(usize, usize)> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (1, lo + (s >> 33) as usize % (hi - lo + 1))
        })
        .collect()
}

/// The contexts of a sweep batch: all equal, or uniform in [lo, hi].
#[derive(Clone, Copy)]
enum DecodeContexts {
    Uniform(usize),
    Ragged(usize, usize),
}

impl std::fmt::Display for DecodeContexts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeContexts::Uniform(c) => write!(f, "{c}"),
            DecodeContexts::Ragged(lo, hi) => write!(f, "U[{lo},{hi}]"),
        }
    }
}

/// The `decode-sweep` batches: sizes from a fraction of a wave of blocks to several
/// waves, at short and long contexts, and two ragged ones.
fn decode_sweep_shapes() -> Vec<(usize, DecodeContexts)> {
    use DecodeContexts::{Ragged, Uniform};
    vec![
        (16, Uniform(4096)),
        (32, Uniform(2048)),
        (32, Uniform(4096)),
        (48, Uniform(2048)),
        (48, Uniform(4096)),
        (64, Uniform(1024)),
        (64, Uniform(4096)),
        (96, Uniform(1024)),
        (96, Uniform(2048)),
        (128, Uniform(1024)),
        (128, Uniform(2048)),
        (192, Uniform(1024)),
        (192, Uniform(2048)),
        (256, Uniform(512)),
        (256, Uniform(2048)),
        (32, Ragged(100, 4096)),
        (128, Ragged(100, 4096)),
    ]
}

/// The prefill kernel's tile variants the bench sweeps: `MINISGL_BENCH_PREFILL_TILES`
/// (comma-separated), else all of 0..=8 and the wgmma tiles 16..=33 (every one fits
/// head dim 128; the wgmma ones need sm_90).
fn prefill_tiles() -> Vec<usize> {
    match std::env::var("MINISGL_BENCH_PREFILL_TILES") {
        Ok(v) => v.split(',').filter_map(|t| t.trim().parse().ok()).collect(),
        Err(_) => (0..=8).chain(16..=33).collect(),
    }
}

/// The graph-timed cases, every launch from HBM ([`cold_copies`]): the decode
/// shapes of issue 12 at the default depth, at three stages and in the three-warp
/// block (stages=1), one of them again
/// with one kv head (the cache layout's share), a batch-64 graph step at short
/// contexts, and batch 1 over a range of contexts at both head
/// layouts (Qwen3-0.6B 16/8 with its 40960-token graph plan, Llama-3-8B 32/8
/// with 8192): the eager plan, and the graph plan (one wave of splits, most of
/// whose blocks return at once at short contexts, merged by the combine launch;
/// both in clusters with `MINISGL_DECODE_CLUSTER`).
/// `SUMMARY <case> [graph, cold]` lines; no criterion run.
fn cold_graph_cases() -> kernel_runtime::Result<()> {
    let decode = |hq: usize, seqs: Vec<(usize, usize)>| decode_shape(hq, 16, seqs);
    let mut cases: Vec<(Case, usize)> = Vec::new();
    let mut push = |name: String, shape: Shape, splits: Splits, seed: u64| -> kernel_runtime::Result<()> {
        if !wanted(&name) {
            return Ok(());
        }
        let copies = cold_copies(&shape);
        cases.push((attention_case_rotating(name, shape, AttnKernel::Decode, splits, seed, copies)?, copies));
        Ok(())
    };
    // Issue 12's shapes under the default plan, with three stages (two blocks an
    // SM at head dim 128, against three at two stages) and with the three-warp
    // block (stages=1: two stages, four blocks an SM).
    for (i, (name, hq, seqs)) in issue_decode_shapes().into_iter().enumerate() {
        push(format!("decode {name}"), decode(hq, seqs.clone()), HOST_PLAN, 700 + i as u64)?;
        for stages in [3, 1] {
            let splits = Splits { tuning: Some(DecodeTuning { stages, ..ops::decode_tuning() }), ..HOST_PLAN };
            push(format!("decode stages={stages} {name}"), decode(hq, seqs.clone()), splits, 700 + i as u64)?;
        }
    }
    // The cache layout's share of the streaming rate: with one kv head a page holds
    // each head's 16 keys as one 4 KiB run, with 8 heads a head's key rows lie 2 KiB
    // apart (page-major, then token, then head); the same bytes, group and blocks
    // as issue 12's b=64 ctx=2048 case (512 sequences x 1 head against 64 x 8).
    let one_head = Shape { hq: 4, hkv: 1, head_dim: 128, page_size: 16, seqs: vec![(1, 2048); 512] };
    push("decode 4/1 page=16 b=512 ctx=2048".into(), one_head, HOST_PLAN, 709)?;
    // A batch-64 graph step at short contexts (the dummy-weight step tests' 128-250
    // keys): the graph plan at 64 sequences leaves them unsplit.
    for (hq, seed) in [(32, 760), (16, 761)] {
        let seqs = uniform_contexts(64, 128, 256, seed);
        for stages in [2, 3, 1] {
            // An unsplit graph launch runs `stages` (graph_stages is the split plans').
            let tuning = DecodeTuning { stages, ..ops::decode_tuning() };
            let splits = Splits { fixed: Some(1), merge: Some(false), tuning: Some(tuning), prefill_tile: None };
            let name = format!("decode-b64 graph stages={stages} {hq}/8 page=16 ctx=U[128,256]");
            push(name, decode(hq, seqs.clone()), splits, seed)?;
        }
    }
    // The order of a ragged batch (`minisgl bench`'s decode steps as its graphs run
    // them: the graph plan of that batch size): the grid's blocks start in batch
    // order, so the last wave's length depends on where the longest sequences sit.
    // The same contexts as drawn, longest first (the scheduler's order for decode
    // steps: engine/src/core/scheduler/prepare.rs) and shortest first.
    for (b, seed) in [(256, 770), (192, 771), (128, 772), (96, 773), (64, 774)] {
        let drawn = uniform_contexts(b, 100, 2048, seed);
        let mut longest_first = drawn.clone();
        longest_first.sort_by_key(|c| std::cmp::Reverse(c.1));
        let shortest_first: Vec<_> = longest_first.iter().rev().copied().collect();
        let fixed = ops::decode_graph_splits(GPU, b, 8, 128, DType::BF16, 40960)?;
        let plan = Splits { fixed: Some(fixed), merge: None, tuning: None, prefill_tile: None };
        for (order, seqs) in [("drawn", drawn), ("longest-first", longest_first), ("shortest-first", shortest_first)] {
            let name = format!("decode-order graph splits={fixed} 16/8 page=16 b={b} ctx=U[100,2048] {order}");
            push(name, decode(16, seqs), plan, seed)?;
        }
    }
    // Batch 1 over contexts: the eager plan, and the fixed split plan the engine
    // captures (one wave of splits, merged by the combine launch, or in clusters
    // with MINISGL_DECODE_CLUSTER set: the twelfth session's variants).
    for (hq, max_context) in [(16, 40960), (32, 8192)] {
        for ctx in [128, 512, 1024, 2048, 4096, 8192, 16384] {
            let seed = 800 + ctx as u64 + hq as u64;
            push(format!("decode-b1 eager {hq}/8 ctx={ctx}"), decode(hq, vec![(1, ctx)]), HOST_PLAN, seed)?;
            let tuning = DecodeTuning { graph_split_waves: 1, ..ops::decode_tuning() };
            ops::set_decode_tuning(Some(tuning));
            let fixed = ops::decode_graph_splits(GPU, 1, 8, 128, DType::BF16, max_context.max(ctx));
            ops::set_decode_tuning(None);
            let fixed = fixed?;
            push(
                format!("decode-b1 graph splits={fixed} {hq}/8 ctx={ctx}"),
                decode(hq, vec![(1, ctx)]),
                Splits { fixed: Some(fixed), merge: Some(false), tuning: Some(tuning), prefill_tile: None },
                seed,
            )?;
        }
    }
    let dev = kernel_runtime::cuda::device(0)?;
    let timer = kernel_runtime::cuda::EventTimer::new(&dev)?;
    let backlog = common::Backlog::new()?;
    for (case, copies) in &cases {
        let launches = (*copies as u64).max(32).next_multiple_of(*copies as u64);
        let us = common::graph_median_us_of(&timer, &backlog, case, 30, launches)?;
        common::print_summary(case, &format!(" [graph, cold x{copies}]"), us);
    }
    Ok(())
}

fn run() -> kernel_runtime::Result<()> {
    // `MINISGL_BENCH_ATTENTION=cold`: only the graph-timed cold cases.
    let only_cold = std::env::var("MINISGL_BENCH_ATTENTION").is_ok_and(|v| v.trim() == "cold");
    cold_graph_cases()?;
    if only_cold {
        return Ok(());
    }
    let mut cases = Vec::new();
    let decode_shapes: Vec<(String, Shape)> = vec![
        ("32/8 page=16 b=64 ctx=2048".into(), decode_shape(32, 16, vec![(1, 2048); 64])),
        ("32/8 page=1 b=64 ctx=2048".into(), decode_shape(32, 1, vec![(1, 2048); 64])),
        ("32/8 page=64 b=64 ctx=2048".into(), decode_shape(32, 64, vec![(1, 2048); 64])),
        ("32/8 page=16 b=256 ctx=1024".into(), decode_shape(32, 16, vec![(1, 1024); 256])),
        ("32/8 page=16 b=1 ctx=4096".into(), decode_shape(32, 16, vec![(1, 4096)])),
        ("16/8 page=16 b=64 ctx=U[100,2000]".into(), decode_shape(16, 16, uniform_contexts(64, 100, 2000, 7))),
        // The decode steps of `minisgl bench` (Qwen3-0.6B): up to 256 rows, contexts
        // from the shortest prompt to the longest prompt plus its output.
        ("16/8 page=16 b=256 ctx=U[100,2048]".into(), decode_shape(16, 16, uniform_contexts(256, 100, 2048, 11))),
        ("16/8 page=16 b=128 ctx=U[300,2048]".into(), decode_shape(16, 16, uniform_contexts(128, 300, 2048, 13))),
    ];
    for (i, (name, shape)) in decode_shapes.into_iter().enumerate() {
        let Shape { hq, hkv, head_dim, page_size, ref seqs } = shape;
        let twin = Shape { hq, hkv, head_dim, page_size, seqs: seqs.clone() };
        cases.extend(attention_case(format!("decode {name}"), shape, AttnKernel::Decode, HOST_PLAN, 100 + i as u64)?);
        cases.extend(attention_case(format!("decode-tile {name}"), twin, AttnKernel::Tile, HOST_PLAN, 200 + i as u64)?);
    }
    // The variants at the four shapes of issue 12.
    for (i, (name, hq, seqs)) in issue_decode_shapes().into_iter().enumerate() {
        let b1 = seqs.len() == 1;
        for stages in [2, 3, 4] {
            for plan in [DecodePlanKind::Waves, DecodePlanKind::Keys] {
                let label = if plan == DecodePlanKind::Keys { "keys" } else { "waves" };
                let merges: &[Option<bool>] = if b1 { &[None, Some(true), Some(false)] } else { &[None] };
                for &merge in merges {
                    let m = match merge {
                        None => "",
                        Some(true) => " merge",
                        Some(false) => " combine",
                    };
                    let tuning = DecodeTuning { stages, plan, ..ops::decode_tuning() };
                    cases.extend(attention_case(
                        format!("decode-var stages={stages} plan={label}{m} {name}"),
                        decode_shape(hq, 16, seqs.clone()),
                        AttnKernel::Decode,
                        Splits { fixed: None, merge, tuning: Some(tuning), prefill_tile: None },
                        500 + i as u64,
                    )?);
                }
            }
        }
    }
    // `MINISGL_BENCH_DECODE_SWEEP=1`: the keys plan at 2 and 3 stages (and each
    // with unsplit_waves 1) over a grid of batch sizes and contexts (32/8 heads),
    // the data the plan's instance choice is priced from (gpu/decode_plan.rs).
    if std::env::var("MINISGL_BENCH_DECODE_SWEEP").is_ok_and(|v| v.trim() == "1") {
        for (i, (b, ctx)) in decode_sweep_shapes().into_iter().enumerate() {
            let seqs = match ctx {
                DecodeContexts::Uniform(c) => vec![(1, c); b],
                DecodeContexts::Ragged(lo, hi) => uniform_contexts(b, lo, hi, 17 + i as u64),
            };
            // `u1`: no split once the unsplit blocks fill a wave (unsplit_waves 1).
            for (stages, unsplit_waves, tag) in [(2, 4, ""), (3, 4, ""), (2, 1, " u1"), (3, 1, " u1")] {
                let tuning = DecodeTuning { stages, unsplit_waves, plan: DecodePlanKind::Keys, ..ops::decode_tuning() };
                cases.extend(attention_case(
                    format!("decode-sweep stages={stages}{tag} 32/8 page=16 b={b} ctx={ctx}"),
                    decode_shape(32, 16, seqs.clone()),
                    AttnKernel::Decode,
                    Splits { fixed: None, merge: None, tuning: Some(tuning), prefill_tile: None },
                    600 + i as u64,
                )?);
            }
        }
    }
    // Batch 1 as a CUDA graph runs it (engine: decode_graph_splits for a 40960-token
    // model context), split merge fused or in the combine launch.
    let graph_splits = ops::decode_graph_splits(GPU, 1, 8, 128, DType::BF16, 40960)?;
    for ctx in [300, 1000, 4096] {
        for merge in [true, false] {
            let label = if merge { "merge" } else { "combine" };
            cases.extend(attention_case(
                format!("decode-graph 16/8 page=16 b=1 ctx={ctx} splits={graph_splits} {label}"),
                decode_shape(16, 16, vec![(1, ctx)]),
                AttnKernel::Decode,
                Splits { fixed: Some(graph_splits), merge: Some(merge), tuning: None, prefill_tile: None },
                400 + ctx as u64,
            )?);
        }
    }
    let prefill =
        |hq: usize, b: usize, l: usize| Shape { hq, hkv: 8, head_dim: 128, page_size: 16, seqs: vec![(l, l); b] };
    // Issue 12's three, and a burst of short prompts (a serving start: 256 clients'
    // prompts in one step), where finding each block's item, not the products, costs.
    let prefill_shapes = [
        (32, 1, 4096, "32/8 b=1 L=4096"),
        (32, 8, 1024, "32/8 b=8 L=1024"),
        (16, 1, 4096, "16/8 b=1 L=4096"),
        (32, 256, 64, "32/8 b=256 L=64"),
    ];
    for (i, &(hq, b, l, name)) in prefill_shapes.iter().enumerate() {
        let seed = 300 + i as u64;
        // `prefill`: what Auto picks (the prefill kernel by its rule); `prefill-tile`:
        // the tile kernel; `prefill-new tile=N`: each variant of the prefill kernel's
        // tile table (MINISGL_PREFILL_TILE=N), all at head dim 128.
        cases.extend(attention_case(format!("prefill {name}"), prefill(hq, b, l), AttnKernel::Auto, HOST_PLAN, seed)?);
        cases.extend(attention_case(
            format!("prefill-tile {name}"),
            prefill(hq, b, l),
            AttnKernel::Tile,
            HOST_PLAN,
            seed,
        )?);
        for tile in prefill_tiles() {
            let splits = Splits { prefill_tile: Some(tile), ..HOST_PLAN };
            let case_name = format!("prefill-new tile={tile} {name}");
            cases.extend(attention_case(case_name, prefill(hq, b, l), AttnKernel::Prefill, splits, seed)?);
        }
    }
    common::bench_cases("attention", &cases)
}

fn main() {
    if !common::gpu_present() {
        return;
    }
    if let Err(e) = run() {
        eprintln!("attention bench failed: {e}");
        std::process::exit(1);
    }
}
