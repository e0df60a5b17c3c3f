//! Mixture of experts on CUDA (csrc/kernels/moe_{route,align,gemm,sum,decode}.cu).
//!
//! Batches of at most [`DECODE_MAX_TOKENS`] (8) tokens take two launches after the
//! router instead (moe_decode.cu): per (token, expert) pair weight streams with
//! SiLU-and-mul and the weighted top-k sum fused, no sort.
//!
//! A layer is four to five launches: the router (fused with the sort by expert
//! for decode-sized batches, `moe_route_align`), the sort (`moe_align`), the
//! gate_up GEMM with SiLU-and-mul fused into its epilogue, the down GEMM with the
//! routing weight in its epilogue, and the top-k sum. Nothing is copied to the
//! host: every kernel after the sort sizes its grid from a bound and reads the
//! real counts on the device, so the sequence can be captured in a CUDA graph.
//!
//! The configuration is chosen here ([`plan`]) from the average number of rows
//! each expert gets, `tokens * top_k / experts`, as mini-sglang's
//! `get_default_config` chooses Triton block sizes from the batch size. [`TILES`]
//! mirrors moe_gemm.cu's table (checked by a test against the embedded source);
//! the plan's tiles and the decode fallbacks 0 and 1 are AOT instances (kernels.toml),
//! so none of them is compiled at run time (the table's other tiles, for sweeps, are):
//!
//! | rows per expert | tile | BM x BN x BK | warps | stages | regime |
//! | --- | --- | --- | --- | --- | --- |
//! | < 1 | 1 (k % 128 == 0) or 0 | 16 x 128 x 128, 16 x 64 x 64 | 4, 2 | 4, 8 | decode: stream the chosen experts' weights over every SM |
//! | < 24 | 2 | 32 x 128 x 64 | 4 | 4 | memory-bound: each weight tile read once per expert |
//! | < 96 | 3 | 64 x 128 x 64 | 4 | 4 | mixed |
//! | >= 96 | 4 | 128 x 128 x 64 | 4 (64 x 64 each) | 3 | prefill: tensor-core bound |
//!
//! Tiles 5..12 are candidates for that table, measured by the sweep of
//! benches/moe.rs (`SUMMARY moe-tiles`): one-warp 16 x 32 x 128 (5) and two-warp
//! 16 x 64 x 128 (6) decode tiles that put 4x / 2x the CTAs of tile 1 on the
//! SMs (3-4 resident each) for the few experts a decode step touches; 16 x 128 x 64
//! (7), 32 x 128 x 64 with 3 stages (8, 3 CTAs per SM) and 32 x 64 x 128 (9, twice
//! the CTAs of tile 2) for a few rows per expert; 8-warp 64 x 128 (10), 128 x 128
//! (11) and 128 x 256 (12) tiles for prefill; 13..17 are tiles 0, 7, 2, 8 and 3
//! with a 256-byte L2 prefetch hint on the weight copies. 18..23 are wgmma tiles
//! (sm_90a; an error on other devices, see [`tile_runs_on`]): 64 rows per consumer
//! warpgroup, 128-byte-swizzled cp.async stages, one wgmma group in flight; 64 x 128
//! (18), 128 x 128 (19; 23 with 6 stages), 128 x 256 with 3 and 4 stages (20, 21),
//! 64 x 256 (22), BK 64.
//! `MINISGL_MOE_TILE_GATE_UP` and `MINISGL_MOE_TILE_DOWN` (tile indices, of equal BM)
//! replace the plan's tiles.
//!
//! Launches through the AOT library use programmatic dependent launch (the down
//! GEMM starts streaming its weights while the gate_up GEMM finishes;
//! `MINISGL_MOE_PDL=0` turns it off); launches of AOT cubins or NVRTC instances
//! are plain.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op_types::moe::{moe_sorted_rows, moe_tile_entries, MoeAlignment, MoePlan, MoeRouting, MOE_BLOCK_M};
use crate::sys::kernels::{
    msgl_moe_align_params, msgl_moe_decode_params, msgl_moe_gemm_params, msgl_moe_route_params, msgl_moe_sum_params,
    MSGL_MOE_ALIGN_SMALL, MSGL_MOE_ROUTE_ALIGN_MAX,
};
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, rows_aligned, Switch};

/// One configuration of moe_gemm.cu's `MoeTile` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MoeTile {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub wm: usize,
    pub wn: usize,
    pub stages: usize,
    /// The L2 prefetch size hint of the weight copies, bytes (0: none).
    pub prefetch: usize,
    /// A wgmma tile (sm_90a, moe_gemm.cu's `moe_wgmma_impl`): `wm` consumer
    /// warpgroups of `wn` = 4 warps, 64 rows each, unpadded 128-byte-swizzled rows.
    pub wgmma: bool,
}

impl MoeTile {
    fn threads(self) -> usize {
        self.wm * self.wn * 32
    }

    /// Dynamic shared memory: moe_gemm.cu's `moe_tile_smem`.
    fn smem_bytes(self) -> usize {
        if self.wgmma {
            // Unpadded rows, plus the slack that aligns the ring to 1024 bytes.
            self.stages * (self.bm + self.bn) * self.bk * 2 + 1024
        } else {
            self.stages * (self.bm + self.bn) * (self.bk + 8) * 2
        }
    }

    /// Output columns of one CTA: moe_gemm.cu's `moe_tile_cols`.
    fn cols(self, gate_up: bool) -> usize {
        if gate_up {
            self.bn / 2
        } else {
            self.bn
        }
    }
}

/// A wgmma tile of the table: `wg` consumer warpgroups (64 rows each), BK 64.
const fn wgmma_tile(bm: usize, bn: usize, wg: usize, stages: usize) -> MoeTile {
    MoeTile { bm, bn, bk: 64, wm: wg, wn: 4, stages, prefetch: 0, wgmma: true }
}

/// moe_gemm.cu's tile table, by TILE.
pub(crate) const TILES: [MoeTile; 24] = [
    MoeTile { bm: 16, bn: 64, bk: 64, wm: 1, wn: 2, stages: 8, prefetch: 0, wgmma: false },
    MoeTile { bm: 16, bn: 128, bk: 128, wm: 1, wn: 4, stages: 4, prefetch: 0, wgmma: false },
    MoeTile { bm: 32, bn: 128, bk: 64, wm: 1, wn: 4, stages: 4, prefetch: 0, wgmma: false },
    MoeTile { bm: 64, bn: 128, bk: 64, wm: 2, wn: 2, stages: 4, prefetch: 0, wgmma: false },
    MoeTile { bm: 128, bn: 128, bk: 64, wm: 2, wn: 2, stages: 3, prefetch: 0, wgmma: false },
    MoeTile { bm: 16, bn: 32, bk: 128, wm: 1, wn: 1, stages: 4, prefetch: 0, wgmma: false },
    MoeTile { bm: 16, bn: 64, bk: 128, wm: 1, wn: 2, stages: 3, prefetch: 0, wgmma: false },
    MoeTile { bm: 16, bn: 128, bk: 64, wm: 1, wn: 4, stages: 4, prefetch: 0, wgmma: false },
    MoeTile { bm: 32, bn: 128, bk: 64, wm: 1, wn: 4, stages: 3, prefetch: 0, wgmma: false },
    MoeTile { bm: 32, bn: 64, bk: 128, wm: 1, wn: 2, stages: 4, prefetch: 0, wgmma: false },
    MoeTile { bm: 64, bn: 128, bk: 64, wm: 2, wn: 4, stages: 4, prefetch: 0, wgmma: false },
    MoeTile { bm: 128, bn: 128, bk: 64, wm: 2, wn: 4, stages: 3, prefetch: 0, wgmma: false },
    MoeTile { bm: 128, bn: 256, bk: 64, wm: 2, wn: 4, stages: 3, prefetch: 0, wgmma: false },
    MoeTile { bm: 16, bn: 64, bk: 64, wm: 1, wn: 2, stages: 8, prefetch: 256, wgmma: false },
    MoeTile { bm: 16, bn: 128, bk: 64, wm: 1, wn: 4, stages: 4, prefetch: 256, wgmma: false },
    MoeTile { bm: 32, bn: 128, bk: 64, wm: 1, wn: 4, stages: 4, prefetch: 256, wgmma: false },
    MoeTile { bm: 32, bn: 128, bk: 64, wm: 1, wn: 4, stages: 3, prefetch: 256, wgmma: false },
    MoeTile { bm: 64, bn: 128, bk: 64, wm: 2, wn: 2, stages: 4, prefetch: 256, wgmma: false },
    wgmma_tile(64, 128, 1, 4),
    wgmma_tile(128, 128, 2, 4),
    wgmma_tile(128, 256, 2, 3),
    wgmma_tile(128, 256, 2, 4),
    wgmma_tile(64, 256, 1, 4),
    wgmma_tile(128, 128, 2, 6),
];

/// The shape of every tile of the table, by TILE: `[bm, bn, bk, wm, wn, stages]`
/// (tests and benchmarks pair the tiles of equal `bm`).
pub(crate) fn tile_shapes() -> Vec<[usize; 6]> {
    TILES.iter().map(|t| [t.bm, t.bn, t.bk, t.wm, t.wn, t.stages]).collect()
}

/// The threads of a moe_route launch: 4 warps per block (phase 0), or one block
/// of 1024 (the fused sort, and moe_align).
const ROUTE_THREADS: usize = 128;
const ALIGN_THREADS: usize = 1024;

/// The heuristic's table: the first row whose bound exceeds the rows per expert
/// gives the tiles `(gate_up, down)`; `None` is the decode tile for that GEMM's k
/// (tile 1 when k % 128 == 0, else tile 0). The last row has no bound. A row names
/// the pair of an sm_90 GPU and the pair of any other (the wgmma tiles run only on
/// sm_90; the others are the mma.sync tiles of equal rows).
///
/// The rows are the best pairs of the H200 sweeps at E=128 top-8 H=2048 I=768
/// (benches/moe.rs `moe-tiles-best`, docs/PERF.md): M=1 7/7 (42.9 us against tile
/// 1's 46.8), M=4-256 16/16 (tile 8 with the L2 prefetch: M=64 327 against 362 us,
/// M=256 352 against 16/8's 364), from 24 rows an expert the 64-row wgmma tile
/// 18/18 (M=256: 361, M=1024: 461 us, against 3/10's 606), and from 40 the 128 x
/// 256 wgmma tile 21/21 (M=1024 439 us, M=4096 1038 against 4/4's 1482; sixth
/// session, call 2). Elsewhere M=1024 keeps 3/10 (fifth session: 629.6 against 635.6).
type PlanRow = (f64, (Option<usize>, Option<usize>), (Option<usize>, Option<usize>));
const PLAN: [PlanRow; 5] = [
    (0.2, (Some(7), Some(7)), (Some(7), Some(7))),
    (24.0, (Some(16), Some(16)), (Some(16), Some(16))),
    (40.0, (Some(18), Some(18)), (Some(3), Some(10))),
    (96.0, (Some(21), Some(21)), (Some(3), Some(10))),
    (f64::INFINITY, (Some(21), Some(21)), (Some(4), Some(4))),
];

/// The tile configuration for a batch of `num_tokens` tokens routed to `top_k` of
/// `num_experts` experts, with hidden size `hidden` and intermediate size `inter`
/// (see the module docs), unless `MINISGL_MOE_TILE_GATE_UP` / `MINISGL_MOE_TILE_DOWN`
/// name the tiles (see [`with_overrides`]).
pub(crate) fn plan(
    num_tokens: usize,
    top_k: usize,
    num_experts: usize,
    hidden: usize,
    inter: usize,
    hopper: bool,
) -> MoePlan {
    let (gate_up_tile, down_tile) = heuristic(num_tokens, top_k, num_experts, hidden, inter, hopper);
    let env = env_overrides();
    let decode = num_tokens <= decode_max_tokens();
    with_overrides(MoePlan { gate_up_tile, down_tile, pdl: pdl_enabled(), decode }, env.0.as_deref(), env.1.as_deref())
}

/// The table's tiles `(gate_up, down)` for a batch (see [`PLAN`]).
fn heuristic(
    num_tokens: usize,
    top_k: usize,
    num_experts: usize,
    hidden: usize,
    inter: usize,
    hopper: bool,
) -> (usize, usize) {
    let rows_per_expert = (num_tokens * top_k) as f64 / num_experts.max(1) as f64;
    let decode = |k: usize| if k.is_multiple_of(128) { 1 } else { 0 };
    let row = PLAN.iter().find(|r| rows_per_expert < r.0).unwrap_or(&PLAN[PLAN.len() - 1]);
    let (g, d) = if hopper { row.1 } else { row.2 };
    (g.unwrap_or_else(|| decode(hidden)), d.unwrap_or_else(|| decode(inter)))
}

/// Whether `capability` runs the plan's sm_90 pairs (see [`PLAN`]).
pub(crate) fn is_hopper(capability: (i32, i32)) -> bool {
    capability == (9, 0)
}

/// `MINISGL_MOE_TILE_GATE_UP` and `MINISGL_MOE_TILE_DOWN`, read once.
fn env_overrides() -> &'static (Option<String>, Option<String>) {
    static ENV: std::sync::OnceLock<(Option<String>, Option<String>)> = std::sync::OnceLock::new();
    ENV.get_or_init(|| (std::env::var("MINISGL_MOE_TILE_GATE_UP").ok(), std::env::var("MINISGL_MOE_TILE_DOWN").ok()))
}

/// A tile index from the environment; one that does not parse becomes an index
/// past the table, so that the launch fails with the error naming the variables
/// rather than silently running another tile.
fn parse_tile(v: &str) -> usize {
    v.trim().parse().unwrap_or(usize::MAX)
}

/// `plan` with the tiles the environment names (for sweeps on the GPU): the
/// gate_up tile from `gate_up`, the down tile from `down`, or, when only
/// `gate_up` is set, the same tile for both (the row counts of the two must agree:
/// one alignment serves both GEMMs). Empty values count as unset.
pub(crate) fn with_overrides(plan: MoePlan, gate_up: Option<&str>, down: Option<&str>) -> MoePlan {
    let set = |v: Option<&str>| v.filter(|v| !v.trim().is_empty()).map(parse_tile);
    let (g, d) = (set(gate_up), set(down));
    MoePlan { gate_up_tile: g.unwrap_or(plan.gate_up_tile), down_tile: d.or(g).unwrap_or(plan.down_tile), ..plan }
}

/// Batches of at most this many tokens take the decode kernels (moe_decode.cu):
/// each (token, expert) pair streams its expert's rows, so tokens that share an
/// expert read it once each, and the gain (no sort, no 16-row tiles 1/16 full, the
/// sum fused) holds while a batch's tokens rarely share one. Measured at
/// Qwen3-30B-A3B's shapes (benches/moe.rs, docs/PERF.md eleventh session, call 1),
/// experts only, decode kernels against the grouped GEMMs: 26.9 / 40.6 us at 1
/// token, 41.1 / 58.4 at 2, 78.4 / 99.6 at 4, 145.5 / 154.9 at 8, and 284.8 / 230.1
/// at 16 (64 pairs over 128 experts touch ~50 of them; 128 pairs, ~80).
/// `MINISGL_MOE_DECODE_MAX_TOKENS` replaces it (0: never).
pub(crate) const DECODE_MAX_TOKENS: usize = 8;

fn decode_max_tokens() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("MINISGL_MOE_DECODE_MAX_TOKENS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DECODE_MAX_TOKENS)
    })
}

/// Output columns a moe_decode block computes: 8 (4 warps of 2 columns, one
/// round each), so that one token's pairs already make hundreds of blocks.
/// (At Qwen3-30B-A3B's shapes and one token that is 768 gate_up blocks, about 1.5
/// waves of resident blocks: `MINISGL_MOE_DECODE_COLS` / `set_decode_cols` measure
/// wider blocks, which benches/moe.rs sweeps.)
const DECODE_COLS_PER_BLOCK: usize = 8;

/// `ops::moe::set_moe_decode_cols`'s override (0: none).
static DECODE_COLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// See `ops::moe::set_moe_decode_cols`.
pub(crate) fn set_decode_cols(cols: Option<usize>) {
    DECODE_COLS.store(cols.map_or(0, |c| c.clamp(1, 4096)), std::sync::atomic::Ordering::Relaxed);
}

/// A count of the decode kernels' launch shape: the process-wide override
/// `over` (0: none; tests and benchmarks), else the variable `var`, read once into
/// `env`, when it parses and `accept` takes it, else `default`.
fn decode_count(
    over: &std::sync::atomic::AtomicUsize,
    env: &'static std::sync::OnceLock<usize>,
    var: &str,
    accept: fn(usize) -> bool,
    default: usize,
) -> usize {
    match over.load(std::sync::atomic::Ordering::Relaxed) {
        0 => *env.get_or_init(|| {
            std::env::var(var)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&c| accept(c))
                .unwrap_or(default)
        }),
        c => c,
    }
}

/// Output columns a moe_decode block computes: the override, else
/// `MINISGL_MOE_DECODE_COLS` (1..=4096, read once), else [`DECODE_COLS_PER_BLOCK`].
fn decode_cols() -> usize {
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    decode_count(&DECODE_COLS, &ENV, "MINISGL_MOE_DECODE_COLS", |c| (1..=4096).contains(&c), DECODE_COLS_PER_BLOCK)
}
/// moe_decode.cu's kMoeDecodeThreads.
const DECODE_THREADS: u32 = 128;

/// `ops::moe_router_route` runs the router and the routing in one launch
/// (`MINISGL_MOE_FUSED_ROUTER=0` turns it off): one link less in each sparse
/// layer's chain, measured on the H200 in the Qwen3-30B-A3B graphed step at bs=1,
/// 3.766 / 3.752 -> 3.701 / 3.653 ms in two alternating rounds (docs/PERF.md,
/// fifteenth session).
static FUSED_ROUTER: Switch = Switch::new("MINISGL_MOE_FUSED_ROUTER");

/// See `ops::set_moe_fused_router`.
pub(crate) fn set_fused_router(on: Option<bool>) {
    FUSED_ROUTER.set(on);
}

/// Launches of the fused router in this process (`ops::moe_fused_router_launches`).
pub(crate) static ROUTER_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether [`FUSED_ROUTER`] is on.
pub(crate) fn fused_router_enabled() -> bool {
    FUSED_ROUTER.get()
}

/// `MINISGL_MOE_DECODE_BULK=1`: the down pass of the decode kernels stages its
/// block's weight rows by the copy engine before its dependency wait
/// (moe_decode.cu's bulk path) where [`decode_bulk_smem`] allows. Off: measured
/// slower in the eighteenth session (Qwen3-30B-A3B bs=1 graphed step 3.94-3.98 ms
/// against 3.74, H100): its 108 KiB blocks become resident only as gate_up's
/// leave, so the 25 MB that the register path's L2 hints fetch during gate_up
/// are copied after it (docs/PERF.md).
static DECODE_BULK: Switch = Switch::off_by_default("MINISGL_MOE_DECODE_BULK");

/// See `ops::set_moe_decode_bulk`.
pub(crate) fn set_decode_bulk(on: Option<bool>) {
    DECODE_BULK.set(on);
}

/// `ops::moe::set_moe_decode_unroll`'s override (0: none).
static DECODE_UNROLL: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// See `ops::set_moe_decode_unroll`.
pub(crate) fn set_decode_unroll(unroll: Option<usize>) {
    DECODE_UNROLL.store(unroll.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
}

/// The gate_up pass's vectors a row in flight (moe_decode.cu's `gate_up_unroll`):
/// the override, else `MINISGL_MOE_DECODE_UNROLL` (2 or 4, read once), else 4. 2
/// runs the AOT library's lighter kernel (80 registers against 122: six blocks an
/// SM against four); the NVRTC entry holds 4 only. The same bits either way. 4
/// stays: 2 measured the same 30B step (3.707 / 3.785 against 3.714 / 3.783 ms,
/// H100, eighteenth session): the stream, not the wave count, bounds the pass.
fn decode_unroll() -> i32 {
    static ENV: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if decode_count(&DECODE_UNROLL, &ENV, "MINISGL_MOE_DECODE_UNROLL", |_| true, 4) == 2 {
        2
    } else {
        4
    }
}

/// Bulk down launches in this process (`ops::moe_decode_bulk_launches`).
pub(crate) static DECODE_BULK_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Dynamic and static shared memory a bulk down block may take: two blocks an SM
/// on sm_90 (228 KiB, less the 1 KiB the hardware keeps a block).
const DECODE_BULK_BUDGET: usize = 112 << 10;

/// The dynamic shared memory of a bulk down launch (the block's `top_k` x `cols`
/// weight rows of `k` elements, then the token's `top_k` act rows), or `None`
/// where the path does not apply: switched off, before sm_90, or past
/// [`DECODE_BULK_BUDGET`] (with 1 KiB kept for the block's static arrays).
fn decode_bulk_smem(capability: (i32, i32), top_k: usize, cols: usize, k: usize, elem_bytes: usize) -> Option<usize> {
    if !DECODE_BULK.get() || capability.0 < 9 {
        return None;
    }
    let bytes = top_k * (cols + 1) * k * elem_bytes;
    (bytes + 1024 <= DECODE_BULK_BUDGET).then_some(bytes)
}

/// Whether launches use programmatic dependent launch (`MINISGL_MOE_PDL`, default 1).
fn pdl_enabled() -> bool {
    static PDL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PDL.get_or_init(|| std::env::var("MINISGL_MOE_PDL").map(|v| v.trim() != "0").unwrap_or(true))
}

fn tile(op: &'static str, index: usize) -> Result<MoeTile> {
    TILES
        .get(index)
        .copied()
        .ok_or_else(|| {
            Error::arg(
                op,
                format!(
                    "tile {} is not in the table (0..{}; MINISGL_MOE_TILE_GATE_UP / MINISGL_MOE_TILE_DOWN name tiles by index)",
                    if index == usize::MAX { "(not a number)".to_owned() } else { index.to_string() },
                    TILES.len()
                ),
            )
        })
}

/// Whether tile `cfg` runs on a device of compute capability `capability`: the
/// wgmma tiles need sm_90 (the sm_90a build or NVRTC's sm_90a); elsewhere their
/// kernel is a trap.
pub(crate) fn tile_runs_on(cfg: MoeTile, capability: (i32, i32)) -> bool {
    !cfg.wgmma || is_hopper(capability)
}

fn check_arch(op: &'static str, index: usize, cfg: MoeTile, capability: (i32, i32)) -> Result<()> {
    if tile_runs_on(cfg, capability) {
        return Ok(());
    }
    Err(Error::arg(
        op,
        format!(
            "tile {index} is a wgmma tile (sm_90a only), the device is sm_{}{}: pick a tile below {}",
            capability.0,
            capability.1,
            TILES.iter().position(|t| t.wgmma).unwrap_or(TILES.len())
        ),
    ))
}

fn ptr(t: &Tensor) -> *mut std::ffi::c_void {
    t.device_ptr() as *mut std::ffi::c_void
}

/// Top-k routing (see `ops::moe_route`).
pub(crate) fn route(routing: &MoeRouting, logits: &Tensor, renormalize: bool) -> Result<()> {
    const OP: &str = "moe_route";
    let dev = device_of(OP, logits)?;
    let [t, e] = [logits.dim(0), logits.dim(1)];
    let p = msgl_moe_route_params {
        logits: ptr(logits),
        topk_ids: ptr(&routing.topk_ids).cast(),
        topk_weights: ptr(&routing.topk_weights).cast(),
        num_tokens: t as i64,
        logits_stride: if t > 1 { logits.strides()[0] as i64 } else { e as i64 },
        num_experts: e as i32,
        top_k: routing.top_k() as i32,
        renormalize: i32::from(renormalize),
        phase: 0,
        ..Default::default()
    };
    let grid = grid_u32(OP, t.div_ceil(ROUTE_THREADS / 32))?;
    let (a, b, c) = (routing.topk_ids.abi(), routing.topk_weights.abi(), logits.abi());
    dispatch(
        OP,
        dev,
        "moe_route",
        &[("DTYPE", dtype_code(logits))],
        |lib, stream| {
            // SAFETY: the views describe live device tensors checked by the op; the
            // launcher validates them again and only enqueues work on `stream`.
            unsafe { lib.msgl_moe_route(&a, &b, &c, i32::from(renormalize), stream) }
        },
        |f| {
            // SAFETY: `p` is the msgl_moe_route_params the entry takes, filled from
            // the tensors checked by the op.
            unsafe { f.launch(dev, grid, ROUTE_THREADS as u32, 0, &p) }
        },
    )
}

/// The sort part of the kernel parameters, for `align` over `topk_ids`.
fn align_params(align: &MoeAlignment, topk_ids: &Tensor, phase: i32) -> msgl_moe_align_params {
    msgl_moe_align_params {
        topk_ids: topk_ids.device_ptr() as *const i32,
        sorted_ids: ptr(&align.sorted_ids).cast(),
        block_experts: ptr(&align.block_experts).cast(),
        expert_offsets: ptr(&align.expert_offsets).cast(),
        tiles: ptr(&align.tiles).cast(),
        num_pairs: topk_ids.numel() as i64,
        num_experts: (align.expert_offsets.dim(0) - 1) as i32,
        tile_m: align.tile_m as i32,
        phase,
        reserved: 0,
    }
}

/// Shared memory of the single-block sort: moe.cuh's `moe_align_ranked_smem`.
fn ranked_smem(num_experts: usize) -> u32 {
    (ALIGN_THREADS / 32 * num_experts * 2) as u32
}

/// Sorting by expert (see `ops::moe_align`).
pub(crate) fn align(align: &MoeAlignment, topk_ids: &Tensor) -> Result<()> {
    const OP: &str = "moe_align";
    let dev = device_of(OP, topk_ids)?;
    let n = topk_ids.numel();
    let num_experts = align.expert_offsets.dim(0) - 1;
    let small = n <= MSGL_MOE_ALIGN_SMALL as usize;
    let views =
        [&align.sorted_ids, &align.block_experts, &align.expert_offsets, &align.tiles, topk_ids].map(Tensor::abi);
    dispatch(
        OP,
        dev,
        "moe_align",
        &[("BLOCK_M", align.block_m as i64)],
        |lib, stream| {
            let [a, b, c, d, e] = &views;
            // SAFETY: the views describe live device tensors allocated by the op with
            // the sizes the launcher checks; it only enqueues work on `stream`.
            unsafe { lib.msgl_moe_align(a, b, c, d, e, align.block_m as i32, align.tile_m as i32, stream) }
        },
        |f| {
            if small {
                let p = align_params(align, topk_ids, 2);
                // SAFETY: `p` is the msgl_moe_align_params the entry takes, pointing at
                // the tensors the op allocated with the sizes moe_align needs; the
                // dynamic shared memory is the ranked sort's.
                unsafe { f.launch(dev, 1, ALIGN_THREADS as u32, ranked_smem(num_experts), &p) }
            } else {
                let p0 = align_params(align, topk_ids, 0);
                // SAFETY: as above (phase 0: count and offsets, one block).
                unsafe { f.launch(dev, 1, ALIGN_THREADS as u32, 0, &p0) }?;
                let p1 = align_params(align, topk_ids, 1);
                // SAFETY: as above (phase 1: one block per expert, after phase 0 in
                // stream order).
                unsafe { f.launch(dev, num_experts as u32, ALIGN_THREADS as u32, 0, &p1) }
            }
        },
    )
}

/// Routing and sorting in one block (batches of at most
/// `MSGL_MOE_ROUTE_ALIGN_MAX` pairs).
fn route_align(routing: &MoeRouting, align: &MoeAlignment, logits: &Tensor, renormalize: bool) -> Result<()> {
    const OP: &str = "moe_route_align";
    let dev = device_of(OP, logits)?;
    let [t, e] = [logits.dim(0), logits.dim(1)];
    let p = msgl_moe_route_params {
        logits: ptr(logits),
        topk_ids: ptr(&routing.topk_ids).cast(),
        topk_weights: ptr(&routing.topk_weights).cast(),
        align: align_params(align, &routing.topk_ids, 0),
        num_tokens: t as i64,
        logits_stride: if t > 1 { logits.strides()[0] as i64 } else { e as i64 },
        num_experts: e as i32,
        top_k: routing.top_k() as i32,
        renormalize: i32::from(renormalize),
        phase: 1,
        ..Default::default()
    };
    let views = [
        &routing.topk_ids,
        &routing.topk_weights,
        &align.sorted_ids,
        &align.block_experts,
        &align.expert_offsets,
        &align.tiles,
        logits,
    ]
    .map(Tensor::abi);
    dispatch(
        OP,
        dev,
        "moe_route",
        &[("DTYPE", dtype_code(logits))],
        |lib, stream| {
            let [a, b, c, d, f, g, h] = &views;
            // SAFETY: the views describe live device tensors checked by the op and
            // allocated with the sizes the sort needs; the launcher validates them
            // again and only enqueues work on `stream`.
            unsafe {
                lib.msgl_moe_route_align(
                    a,
                    b,
                    c,
                    d,
                    f,
                    g,
                    h,
                    i32::from(renormalize),
                    align.block_m as i32,
                    align.tile_m as i32,
                    stream,
                )
            }
        },
        |f| {
            // SAFETY: `p` is the msgl_moe_route_params the entry takes (phase 1: one
            // block, the ranked sort's dynamic shared memory), filled from the
            // checked tensors.
            unsafe { f.launch(dev, 1, ALIGN_THREADS as u32, ranked_smem(e), &p) }
        },
    )
}

/// The router's logits and the routing in one launch (moe_route.cu, phase 2; see
/// `ops::moe_router_route`): `x` `[t, hidden]` (t <= MSGL_MOE_ROUTER_MAX_TOKENS,
/// 16-byte aligned rows), `router_w` `[E, hidden]`, checked by the op. Returns
/// `false` (and launches nothing) where the kernel does not fit (rows that are not
/// whole, aligned 16-byte vectors, a strided weight) and while a graph capture
/// runs before the device's ticket exists: the caller then takes the GEMM and
/// moe_route.
pub(crate) fn router_route(routing: &MoeRouting, x: &Tensor, router_w: &Tensor, renormalize: bool) -> Result<bool> {
    const OP: &str = "moe_router_route";
    let dev = device_of(OP, x)?;
    let whole = (x.dim(1) * x.dtype().size_in_bytes()).is_multiple_of(16);
    if !(whole && router_w.is_contiguous() && rows_aligned(x, 16) && rows_aligned(router_w, 16)) {
        return Ok(false);
    }
    let Some(ticket) = super::launch::persistent_zeros("moe_router_route ticket", dev, 1)? else {
        return Ok(false);
    };
    let [t, hidden] = [x.dim(0), x.dim(1)];
    let e = router_w.dim(0);
    let logits = Tensor::empty(&[t, e], DType::F32, x.device())?;
    let p = msgl_moe_route_params {
        logits: ptr(&logits),
        topk_ids: ptr(&routing.topk_ids).cast(),
        topk_weights: ptr(&routing.topk_weights).cast(),
        num_tokens: t as i64,
        logits_stride: e as i64,
        num_experts: e as i32,
        top_k: routing.top_k() as i32,
        renormalize: i32::from(renormalize),
        phase: 2,
        x: ptr(x),
        router_w: ptr(router_w),
        logits_f32: ptr(&logits).cast(),
        ticket: ptr(&ticket).cast(),
        x_stride: if t > 1 { x.strides()[0] as i64 } else { hidden as i64 },
        hidden: i32::try_from(hidden).map_err(|_| Error::arg(OP, format!("hidden size {hidden} exceeds 32 bits")))?,
        ..Default::default()
    };
    // A block per expert (moe_route.cu, phase 2).
    let grid = grid_u32(OP, e)?;
    let smem = u32::try_from(t * e * 4).map_err(|_| Error::arg(OP, "the logits exceed shared memory"))?;
    let views = [&routing.topk_ids, &routing.topk_weights, x, router_w, &logits, &ticket].map(Tensor::abi);
    ROUTER_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dispatch(
        OP,
        dev,
        "moe_route",
        &[("DTYPE", dtype_code(x))],
        |lib, stream| {
            let [a, b, c, d, f, g] = &views;
            // SAFETY: the views describe live device tensors checked by the op (the
            // scratch and the ticket allocated here, the ticket a kept buffer of
            // zeros that the kernel leaves zero); the launcher validates them again
            // and only enqueues work on `stream`.
            unsafe { lib.msgl_moe_router_route(a, b, c, d, f, g, i32::from(renormalize), stream) }
        },
        |f| {
            // SAFETY: `p` is the msgl_moe_route_params the entry takes (phase 2: a
            // block per expert, the logits' shared memory), filled from the same
            // tensors.
            unsafe { f.launch(dev, grid, ROUTE_THREADS as u32, smem, &p) }
        },
    )?;
    Ok(true)
}

/// One grouped GEMM (see `ops::moe_gemm`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    out: &Tensor,
    a: &Tensor,
    w: &Tensor,
    align: &MoeAlignment,
    routing: &MoeRouting,
    tile_index: usize,
    gate_up: bool,
    pdl: bool,
) -> Result<()> {
    const OP: &str = "moe_gemm";
    let dev = device_of(OP, a)?;
    let cfg = tile(OP, tile_index)?;
    check_arch(OP, tile_index, cfg, dev.capability())?;
    let [num_experts, n_w, k] = w.dims::<3>(OP, "w")?;
    let n = if gate_up { n_w / 2 } else { n_w };
    let rows = align.sorted_ids.dim(0);
    let num_pairs = if gate_up { a.dim(0) * routing.top_k() } else { out.dim(0) };
    if !matches!(a.dtype(), DType::BF16 | DType::F16) || w.dtype() != a.dtype() || out.dtype() != a.dtype() {
        return Err(Error::arg(
            OP,
            format!("the grouped GEMM takes bf16 or f16 tensors of one dtype, got {} and {}", a.dtype(), w.dtype()),
        ));
    }
    if cfg.bm != align.tile_m || !k.is_multiple_of(8) || !n.is_multiple_of(8) || k == 0 {
        return Err(Error::arg(
            OP,
            format!(
                "tile {tile_index} ({}-row tiles) does not fit tiles of {} rows, k = {k}, n = {n} (multiples of 8)",
                cfg.bm, align.tile_m
            ),
        ));
    }
    let expect_rows = if gate_up { (out, "out") } else { (a, "a") };
    if expect_rows.0.dim(0) != rows || out.dim(1) != n || a.dim(1) != k {
        return Err(Error::arg(
            OP,
            format!("argument `{}` does not have the {rows} sorted rows, or a width differs", expect_rows.1),
        ));
    }
    for (name, t) in [("a", a), ("out", out)] {
        if !super::launch::rows_aligned(t, 16) {
            return Err(Error::arg(OP, format!("argument `{name}` rows are not 16-byte aligned")));
        }
    }
    let max_tiles = align.tiles.dim(0) - 2;
    let grid = grid_u32(OP, max_tiles * n.div_ceil(cfg.cols(gate_up)))?;
    let weights = (!gate_up).then(|| routing.topk_weights.reshape(&[num_pairs])).transpose()?;
    let p = msgl_moe_gemm_params {
        a: ptr(a),
        w: ptr(w),
        out: ptr(out),
        sorted_ids: ptr(&align.sorted_ids).cast(),
        block_experts: ptr(&align.block_experts).cast(),
        expert_offsets: ptr(&align.expert_offsets).cast(),
        tiles: ptr(&align.tiles).cast(),
        topk_weights: weights.as_ref().map_or(std::ptr::null(), |t| t.device_ptr() as *const f32),
        a_stride: if a.dim(0) > 1 { a.strides()[0] as i64 } else { k as i64 },
        out_stride: if out.dim(0) > 1 { out.strides()[0] as i64 } else { n as i64 },
        num_pairs: num_pairs as i64,
        num_experts: num_experts as i32,
        top_k: routing.top_k() as i32,
        n: n as i32,
        k: k as i32,
        max_tiles: max_tiles as i32,
        block_m: align.block_m as i32,
    };
    let views =
        [out, a, w, &align.sorted_ids, &align.block_experts, &align.expert_offsets, &align.tiles].map(Tensor::abi);
    let weights_view = weights.as_ref().map(Tensor::abi);
    let values = [("DTYPE", dtype_code(a)), ("TILE", tile_index as i64), ("GATE_UP", i64::from(gate_up))];
    dispatch(
        OP,
        dev,
        "moe_gemm",
        &values,
        |lib, stream| {
            let [o, a, w, s, b, e, t] = &views;
            let wt = weights_view.as_ref().map_or(std::ptr::null(), |v| v as *const _);
            // SAFETY: the views describe live device tensors checked above (dtypes,
            // row counts, widths, alignment) and the alignment the op built for this
            // tile's row count; the launcher validates them again and only enqueues
            // work on `stream`.
            unsafe {
                lib.msgl_moe_gemm(
                    o,
                    a,
                    w,
                    s,
                    b,
                    e,
                    t,
                    wt,
                    routing.top_k() as i32,
                    tile_index as i32,
                    i32::from(gate_up),
                    i32::from(pdl),
                    stream,
                )
            }
        },
        |f| {
            let smem = cfg.smem_bytes() as u32;
            f.set_max_dynamic_shared_bytes(dev, smem)?;
            // SAFETY: `p` is the msgl_moe_gemm_params the entry takes, filled from the
            // tensors checked above; grid, block and shared memory are the ones
            // moe_gemm.cu's launcher computes for this tile.
            unsafe { f.launch(dev, grid, cfg.threads() as u32, smem, &p) }
        },
    )
}

/// The weighted top-k sum (see `ops::moe_sum`).
pub(crate) fn sum(
    out: &Tensor,
    part: &Tensor,
    routing: &MoeRouting,
    num_experts: usize,
    weighted: bool,
    pdl: bool,
) -> Result<()> {
    const OP: &str = "moe_sum";
    let dev = device_of(OP, out)?;
    let [t, h] = out.dims::<2>(OP, "out")?;
    let vec = 16 / out.dtype().size_in_bytes();
    let vectorized = h % vec == 0 && super::launch::rows_aligned(out, 16) && super::launch::rows_aligned(part, 16);
    let per_row = if vectorized { h / vec } else { h };
    let p = msgl_moe_sum_params {
        out: ptr(out),
        part: ptr(part),
        topk_ids: routing.topk_ids.device_ptr() as *const i32,
        topk_weights: if weighted { routing.topk_weights.device_ptr() as *const f32 } else { std::ptr::null() },
        num_tokens: t as i64,
        hidden: h as i64,
        top_k: routing.top_k() as i32,
        num_experts: num_experts as i32,
        vectorized: i32::from(vectorized),
        blocks_per_row: per_row.div_ceil(256) as i32,
    };
    let views = [out, part, &routing.topk_ids, &routing.topk_weights].map(Tensor::abi);
    dispatch(
        OP,
        dev,
        "moe_sum",
        &[("DTYPE", dtype_code(out))],
        |lib, stream| {
            let [o, pa, ids, w] = &views;
            let w = if weighted { w as *const _ } else { std::ptr::null() };
            // SAFETY: the views describe live device tensors checked by the op; the
            // launcher validates them again and only enqueues work on `stream`.
            unsafe { lib.msgl_moe_sum(o, pa, ids, w, num_experts as i32, i32::from(pdl), stream) }
        },
        |f| {
            let grid = grid_u32(OP, per_row.div_ceil(256) * t.min(65535))?;
            // SAFETY: `p` is the msgl_moe_sum_params the entry takes, filled from the
            // tensors checked by the op (alignment checked above for the vector path).
            unsafe { f.launch(dev, grid, 256, 0, &p) }
        },
    )
}

/// One pass of the decode kernels (see moe_decode.cu): `gate_up` writes the
/// activation `out` `[pairs, inter]` from `a` = x `[tokens, hidden]`; else `out`
/// `[tokens, hidden]` is the weighted top-k sum over `a` = the activation.
fn decode_gemm(out: &Tensor, a: &Tensor, w: &Tensor, routing: &MoeRouting, gate_up: bool, pdl: bool) -> Result<()> {
    const OP: &str = "moe_decode";
    let dev = device_of(OP, a)?;
    let [num_experts, n_w, k] = w.dims::<3>(OP, "w")?;
    let n = if gate_up { n_w / 2 } else { n_w };
    let (tokens, top_k) = (routing.topk_ids.dim(0), routing.top_k());
    if !super::launch::rows_aligned(a, 16) {
        return Err(Error::arg(OP, "argument `a` rows are not 16-byte aligned"));
    }
    let cols = decode_cols();
    let bulk_smem =
        if gate_up { None } else { decode_bulk_smem(dev.capability(), top_k, cols, k, a.dtype().size_in_bytes()) };
    let p = msgl_moe_decode_params {
        a: ptr(a),
        w: ptr(w),
        out: ptr(out),
        topk_ids: routing.topk_ids.device_ptr() as *const i32,
        topk_weights: routing.topk_weights.device_ptr() as *const f32,
        a_stride: if a.dim(0) > 1 { a.strides()[0] as i64 } else { k as i64 },
        out_stride: if out.dim(0) > 1 { out.strides()[0] as i64 } else { n as i64 },
        num_tokens: tokens as i64,
        num_experts: num_experts as i32,
        top_k: top_k as i32,
        n: n as i32,
        k: k as i32,
        cols_per_block: cols as i32,
        bulk: i32::from(bulk_smem.is_some()),
        gate_up_unroll: if gate_up { decode_unroll() } else { 0 },
        reserved: 0,
    };
    let smem = u32::try_from(bulk_smem.unwrap_or(0)).map_err(|_| Error::arg(OP, "shared memory past 32 bits"))?;
    if smem > 0 {
        DECODE_BULK_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let rows = if gate_up { tokens * top_k } else { tokens };
    let grid = grid_u32(OP, rows * n.div_ceil(cols))?;
    let views = [out, a, w, &routing.topk_ids, &routing.topk_weights].map(Tensor::abi);
    dispatch(
        OP,
        dev,
        "moe_decode",
        &[("DTYPE", dtype_code(a)), ("GATE_UP", i64::from(gate_up))],
        |lib, stream| {
            let [o, a, w, ids, wt] = &views;
            // SAFETY: the views describe live device tensors of the shapes the op
            // checked (the routing's, the experts'); the launcher validates them
            // again and only enqueues work on `stream`.
            unsafe {
                lib.msgl_moe_decode(
                    o,
                    a,
                    w,
                    ids,
                    wt,
                    i32::from(gate_up),
                    cols as i32,
                    p.bulk,
                    p.gate_up_unroll,
                    i32::from(pdl),
                    stream,
                )
            }
        },
        |f| {
            if smem > 0 {
                f.set_max_dynamic_shared_bytes(dev, smem)?;
            }
            // SAFETY: `p` is the msgl_moe_decode_params the entry takes, filled from
            // the same tensors; grid, block and shared memory are the launcher's.
            unsafe { f.launch(dev, grid, DECODE_THREADS, smem, &p) }
        },
    )
}

/// The experts of a routed batch through the decode kernels: two launches.
fn decode_experts(out: &Tensor, x: &Tensor, w13: &Tensor, w2: &Tensor, routing: &MoeRouting, pdl: bool) -> Result<()> {
    let inter = w13.dim(1) / 2;
    let act = Tensor::empty(&[routing.topk_ids.numel(), inter], x.dtype(), x.device())?;
    decode_gemm(&act, x, w13, routing, true, pdl)?;
    decode_gemm(out, &act, w2, routing, false, pdl)
}

/// The sort for a plan's gate_up tile, routed already or routing in the same
/// kernel.
fn plan_align(
    device: crate::device::Device,
    num_pairs: usize,
    num_experts: usize,
    tile_m: usize,
) -> Result<MoeAlignment> {
    let rows = moe_sorted_rows(num_pairs, num_experts, MOE_BLOCK_M);
    Ok(MoeAlignment {
        sorted_ids: Tensor::empty(&[rows], DType::I32, device)?,
        block_experts: Tensor::empty(&[rows / MOE_BLOCK_M], DType::I32, device)?,
        expert_offsets: Tensor::empty(&[num_experts + 1], DType::I32, device)?,
        tiles: Tensor::empty(&[moe_tile_entries(rows, num_pairs, num_experts, tile_m)], DType::I32, device)?,
        block_m: MOE_BLOCK_M,
        tile_m,
    })
}

/// The GEMMs and the sum, after routing and sorting.
fn experts(
    out: &Tensor,
    x: &Tensor,
    w13: &Tensor,
    w2: &Tensor,
    routing: &MoeRouting,
    align: &MoeAlignment,
    plan: MoePlan,
) -> Result<()> {
    let device = x.device();
    let (num_experts, inter) = (w13.dim(0), w13.dim(1) / 2);
    let rows = align.sorted_ids.dim(0);
    let act = Tensor::empty(&[rows, inter], x.dtype(), device)?;
    gemm(&act, x, w13, align, routing, plan.gate_up_tile, true, plan.pdl)?;
    let part = Tensor::empty(&[routing.topk_ids.numel(), x.dim(1)], x.dtype(), device)?;
    gemm(&part, &act, w2, align, routing, plan.down_tile, false, plan.pdl)?;
    sum(out, &part, routing, num_experts, false, plan.pdl)
}

fn check_plan(plan: MoePlan) -> Result<usize> {
    let (a, b) = (tile("fused_experts", plan.gate_up_tile)?, tile("fused_experts", plan.down_tile)?);
    if a.bm != b.bm {
        return Err(Error::arg(
            "fused_experts",
            format!(
                "tiles {} ({} rows) and {} ({} rows) have different row counts (MINISGL_MOE_TILE_GATE_UP / MINISGL_MOE_TILE_DOWN must name tiles of equal rows)",
                plan.gate_up_tile, a.bm, plan.down_tile, b.bm
            ),
        ));
    }
    Ok(a.bm)
}

/// The experts of a routed batch (see `ops::fused_experts`).
pub(crate) fn fused_experts(
    out: &Tensor,
    x: &Tensor,
    w13: &Tensor,
    w2: &Tensor,
    routing: &MoeRouting,
    plan: MoePlan,
) -> Result<()> {
    if plan.decode {
        return decode_experts(out, x, w13, w2, routing, plan.pdl);
    }
    let tile_m = check_plan(plan)?;
    let align = plan_align(x.device(), routing.topk_ids.numel(), w13.dim(0), tile_m)?;
    self::align(&align, &routing.topk_ids)?;
    experts(out, x, w13, w2, routing, &align, plan)
}

/// The router and the experts (see `ops::fused_moe`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn fused_moe(
    out: &Tensor,
    x: &Tensor,
    logits: &Tensor,
    w13: &Tensor,
    w2: &Tensor,
    top_k: usize,
    renormalize: bool,
    plan: MoePlan,
) -> Result<()> {
    let (t, num_experts) = (x.dim(0), w13.dim(0));
    let device = x.device();
    let routing = MoeRouting {
        topk_ids: Tensor::empty(&[t, top_k], DType::I32, device)?,
        topk_weights: Tensor::empty(&[t, top_k], DType::F32, device)?,
    };
    if plan.decode {
        route(&routing, logits, renormalize)?;
        return decode_experts(out, x, w13, w2, &routing, plan.pdl);
    }
    let tile_m = check_plan(plan)?;
    let align = plan_align(device, t * top_k, num_experts, tile_m)?;
    if t * top_k <= MSGL_MOE_ROUTE_ALIGN_MAX as usize {
        route_align(&routing, &align, logits, renormalize)?;
    } else {
        route(&routing, logits, renormalize)?;
        self::align(&align, &routing.topk_ids)?;
    }
    experts(out, x, w13, w2, &routing, &align, plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// TILES is moe_gemm.cu's table, entry for entry.
    #[test]
    fn tiles_mirror_the_kernel_table() {
        let (_, sources) = crate::kernels::embedded().unwrap();
        let text = sources.get("kernels/moe_gemm.cu").unwrap();
        let rows: Vec<Vec<usize>> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("MSGL_MOE_TILE("))
            .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
            .map(|l| l.split(')').next().unwrap().split(',').map(|v| v.trim().parse().unwrap()).collect())
            .collect();
        // The wgmma tiles: (T, BM, BN, BK, WG, STAGES, MINB), after the mma.sync tiles.
        let wgmma: Vec<Vec<usize>> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("MSGL_MOE_WGMMA_TILE("))
            .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
            .map(|l| l.split(')').next().unwrap().split(',').map(|v| v.trim().parse().unwrap()).collect())
            .collect();
        assert_eq!(rows.len() + wgmma.len(), TILES.len());
        for (i, r) in rows.iter().enumerate() {
            let t = TILES[i];
            assert_eq!(r[..7], [i, t.bm, t.bn, t.bk, t.wm, t.wn, t.stages], "tile {i}");
            assert_eq!(r[8], t.prefetch, "tile {i}");
            assert!(!t.wgmma, "tile {i}");
        }
        for (j, r) in wgmma.iter().enumerate() {
            let (i, t) = (rows.len() + j, TILES[rows.len() + j]);
            assert_eq!(r[..6], [i, t.bm, t.bn, t.bk, t.wm, t.stages], "tile {i}");
            assert!(t.wgmma && t.wn == 4 && t.prefetch == 0, "tile {i}");
        }
        assert!(text.contains(&format!("constexpr int kMoeTiles = {};", TILES.len())));
    }

    #[test]
    fn the_plan_follows_rows_per_expert() {
        // Qwen3-30B-A3B: 128 experts, top-8, hidden 2048, intermediate 768.
        let p = |t, hopper| plan(t, 8, 128, 2048, 768, hopper);
        let tiles = |t, hopper| (p(t, hopper).gate_up_tile, p(t, hopper).down_tile);
        assert_eq!(tiles(1, true), (7, 7));
        assert_eq!(tiles(16, true), (16, 16));
        assert_eq!(tiles(64, true), (16, 16));
        assert_eq!(tiles(256, true), (16, 16));
        assert_eq!(tiles(512, true), (18, 18));
        assert_eq!(tiles(1024, true), (21, 21));
        assert_eq!(tiles(4096, true), (21, 21));
        // Off sm_90 the wgmma rows fall back to mma.sync tiles.
        assert_eq!(tiles(512, false), (3, 10));
        assert_eq!(tiles(1024, false), (3, 10));
        assert_eq!(tiles(4096, false), (4, 4));
        for t in [1, 16, 256, 512, 1024, 4096] {
            let pl = p(t, false);
            assert!(!TILES[pl.gate_up_tile].wgmma && !TILES[pl.down_tile].wgmma, "{t}");
        }
        // Up to DECODE_MAX_TOKENS tokens the decode kernels run (unless the
        // environment says otherwise), past it the tiles.
        if std::env::var_os("MINISGL_MOE_DECODE_MAX_TOKENS").is_none() {
            for t in 1..=DECODE_MAX_TOKENS {
                assert!(p(t, true).decode && p(t, false).decode, "{t}");
            }
            assert!(!p(DECODE_MAX_TOKENS + 1, true).decode && !p(64, false).decode);
        }
        // The decode tile (BK 64) serves any k, 2880 included.
        let q = plan(1, 4, 64, 2048, 2880, true);
        assert_eq!((q.gate_up_tile, q.down_tile), (7, 7));
        for t in [1, 7, 64, 300, 5000] {
            for hopper in [true, false] {
                let pl = plan(t, 2, 8, 4096, 14336, hopper);
                assert_eq!(TILES[pl.gate_up_tile].bm, TILES[pl.down_tile].bm);
            }
        }
        for tile in TILES {
            assert!(tile.smem_bytes() <= 227 * 1024, "{tile:?}");
            assert!((tile.bm * tile.bk / 8) % tile.threads() == 0 && (tile.bn * tile.bk / 8) % tile.threads() == 0);
            // moe_gemm.cu's static asserts: a thread per tile row, warp tiles in
            // groups of four n8 tiles (gate and up pairs), row steps that tile
            // the gate and up halves, at most 32 weight copies per thread.
            assert!(tile.threads() >= tile.bm, "{tile:?}");
            assert!((tile.bn / tile.wn / 8).is_multiple_of(4) && tile.bm.is_multiple_of(16 * tile.wm), "{tile:?}");
            let rstep = tile.threads() / (tile.bk / 8);
            assert!((tile.bn / 2).is_multiple_of(rstep) && tile.bn * tile.bk / 8 / tile.threads() <= 32, "{tile:?}");
        }
        // Every row of the heuristic's table names tiles of equal rows.
        for r in PLAN {
            for (g, d) in [r.1, r.2] {
                for k in [64, 128] {
                    let (g, d) = (g.unwrap_or(k / 128), d.unwrap_or(k / 128));
                    assert_eq!(TILES[g].bm, TILES[d].bm, "{r:?}");
                }
            }
        }
    }

    #[test]
    fn environment_overrides_replace_the_plan_tiles() {
        let base = MoePlan { gate_up_tile: 2, down_tile: 2, pdl: true, decode: false };
        assert_eq!(with_overrides(base, None, None), base);
        assert_eq!(with_overrides(base, Some(""), Some(" ")), base);
        // Only gate_up: both GEMMs take it (one alignment serves both).
        assert_eq!(
            with_overrides(base, Some("8"), None),
            MoePlan { gate_up_tile: 8, down_tile: 8, pdl: true, decode: false }
        );
        assert_eq!(
            with_overrides(base, Some(" 5 "), Some("6")),
            MoePlan { gate_up_tile: 5, down_tile: 6, pdl: true, decode: false }
        );
        assert_eq!(
            with_overrides(base, None, Some("9")),
            MoePlan { gate_up_tile: 2, down_tile: 9, pdl: true, decode: false }
        );
        // What does not parse is no tile: the launch reports it instead of running another.
        let bad = with_overrides(base, Some("big"), None);
        assert_eq!(bad.gate_up_tile, usize::MAX);
        let err = check_plan(bad).unwrap_err().to_string();
        assert!(err.contains("not a number") && err.contains("MINISGL_MOE_TILE_GATE_UP"), "{err}");
        let err =
            check_plan(MoePlan { gate_up_tile: 5, down_tile: 2, pdl: false, decode: false }).unwrap_err().to_string();
        assert!(err.contains("different row counts"), "{err}");
        assert_eq!(check_plan(MoePlan { gate_up_tile: 5, down_tile: 7, pdl: false, decode: false }).unwrap(), 16);
    }

    /// Every tile the plan names, on either kind of GPU and for either dtype and
    /// GEMM, is an AOT instance of moe_gemm (kernels.toml), so that no batch waits on
    /// a run-time compile; the table's other tiles are for sweeps.
    #[test]
    fn the_plan_tiles_are_aot_instances() {
        let (spec, _) = crate::kernels::embedded().unwrap();
        let family = spec.family("moe_gemm").unwrap();
        let aot: Vec<Vec<(String, i64)>> = family.instances().iter().map(|i| i.values().to_vec()).collect();
        // A `None` of the plan is a decode fallback, 0 or 1, which the chain covers.
        let plan_tiles = PLAN.iter().flat_map(|r| [r.1 .0, r.1 .1, r.2 .0, r.2 .1]).flatten();
        for tile in plan_tiles.chain([0, 1]) {
            for dtype in [1, 2] {
                for gate_up in [0, 1] {
                    let want = vec![
                        ("DTYPE".to_string(), dtype),
                        ("TILE".to_string(), tile as i64),
                        ("GATE_UP".to_string(), gate_up),
                    ];
                    assert!(
                        aot.contains(&want),
                        "moe_gemm tile {tile} (DTYPE {dtype}, GATE_UP {gate_up}) is not an AOT instance"
                    );
                }
            }
        }
    }

    #[test]
    fn tile_shapes_list_the_table() {
        let shapes = tile_shapes();
        assert_eq!(shapes.len(), TILES.len());
        assert_eq!(shapes[12], [128, 256, 64, 2, 4, 3]);
        assert_eq!(shapes[19], [128, 128, 64, 2, 4, 4]);
    }

    /// The wgmma tiles: what moe_wgmma_impl's static asserts and the launch need.
    #[test]
    fn wgmma_tiles_fit_their_kernel() {
        let wgmma: Vec<(usize, MoeTile)> = TILES.iter().copied().enumerate().filter(|(_, t)| t.wgmma).collect();
        assert_eq!(wgmma.iter().map(|w| w.0).collect::<Vec<_>>(), [18, 19, 20, 21, 22, 23]);
        for (i, t) in wgmma {
            assert_eq!(t.bk, 64, "tile {i}: one 128-byte swizzled row per stage row");
            assert_eq!(t.bm, 64 * t.wm, "tile {i}: 64 rows per consumer warpgroup");
            assert!(matches!(t.bn, 128 | 256) && t.stages >= 3, "tile {i}");
            assert_eq!(t.threads(), 128 * t.wm, "tile {i}");
            let rstep = t.threads() / 8;
            assert!(rstep.is_multiple_of(8) && (t.bn / 2).is_multiple_of(rstep), "tile {i}");
            assert_eq!(t.smem_bytes(), t.stages * (t.bm + t.bn) * 128 + 1024, "tile {i}");
            assert!(t.smem_bytes() <= 227 * 1024, "tile {i}");
            // The columns of one CTA: gate_up pairs BN / 2 gate and BN / 2 up rows.
            assert_eq!((t.cols(true), t.cols(false)), (t.bn / 2, t.bn), "tile {i}");
        }
        // The plan's pairs for other GPUs never name a wgmma tile.
        for r in PLAN {
            assert!(r.2 .0.is_none_or(|g| !TILES[g].wgmma) && r.2 .1.is_none_or(|d| !TILES[d].wgmma), "{r:?}");
        }
    }

    #[test]
    fn the_bulk_down_pass_takes_slices_that_leave_two_blocks_an_sm() {
        set_decode_bulk(Some(true));
        // Qwen3-30B-A3B's down pass (top-8, k = 768, bf16): 8 columns a block take
        // 108 KiB (the rows, then the act rows); 16 do not fit; 3 do.
        assert_eq!(decode_bulk_smem((9, 0), 8, 8, 768, 2), Some(8 * 9 * 768 * 2));
        assert_eq!(decode_bulk_smem((9, 0), 8, 16, 768, 2), None);
        assert_eq!(decode_bulk_smem((9, 0), 8, 3, 768, 2), Some(8 * 4 * 768 * 2));
        // Before sm_90, or switched off: none.
        assert_eq!(decode_bulk_smem((8, 0), 8, 8, 768, 2), None);
        set_decode_bulk(Some(false));
        assert_eq!(decode_bulk_smem((9, 0), 8, 8, 768, 2), None);
        set_decode_bulk(None);
    }

    #[test]
    fn wgmma_tiles_run_on_sm90_only() {
        for (i, &t) in TILES.iter().enumerate() {
            assert!(tile_runs_on(t, (9, 0)), "tile {i}");
            assert_eq!(tile_runs_on(t, (8, 0)), !t.wgmma, "tile {i}");
            assert_eq!(tile_runs_on(t, (10, 0)), !t.wgmma, "tile {i}");
        }
        let err = check_arch("moe_gemm", 19, TILES[19], (8, 9)).unwrap_err().to_string();
        assert!(err.contains("wgmma") && err.contains("sm_89") && err.contains("below 18"), "{err}");
        assert!(check_arch("moe_gemm", 4, TILES[4], (8, 0)).is_ok());
        // Overrides name wgmma tiles like any other; their row counts must agree.
        let p =
            with_overrides(MoePlan { gate_up_tile: 4, down_tile: 4, pdl: true, decode: false }, Some("19"), Some("20"));
        assert_eq!((p.gate_up_tile, p.down_tile), (19, 20));
        assert_eq!(check_plan(p).unwrap(), 128);
        assert_eq!(check_plan(MoePlan { gate_up_tile: 18, down_tile: 3, pdl: true, decode: false }).unwrap(), 64);
        assert!(check_plan(MoePlan { gate_up_tile: 18, down_tile: 19, pdl: true, decode: false }).is_err());
    }
}
