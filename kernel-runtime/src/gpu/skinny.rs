//! The skinny GEMM on CUDA (csrc/kernels/skinny_gemm.cu): `x @ w^T (+ bias)` for
//! up to 16 rows, at the weight-streaming limit, and the rule that picks it over
//! cuBLASLt inside `linear`; its gated variant (a gate_up projection with
//! SiLU-and-mul in the epilogue) and the rule of `linear_silu_mul`; its pre-norm
//! variant (the decoder layer's residual add and RMSNorm in front of the product,
//! `fused_add_rms_norm_linear`); and the weight prefetch every launch stages in
//! shared memory before its grid dependency wait (the block's whole slice by the
//! copy engine where it fits, else by cp.async from every lane).

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sys::kernels::msgl_skinny_gemm_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, rows_aligned, Switch};

/// skinny_gemm.cu's block size (8 warps).
const THREADS: u32 = 256;
/// Most rows of x the kernel takes (two 8-row tensor-core tiles).
pub(crate) const MAX_ROWS: usize = 16;
/// Smallest weight matrix sent to the skinny kernel: below it both kernels are
/// bound by launch latency rather than by the weight stream.
const MIN_WEIGHT_BYTES: usize = 1 << 20;
/// Largest weight matrix sent to the skinny kernel. Measured on the H200
/// (docs/PERF.md, 2026-12-01): it beats cuBLASLt on Qwen3-0.6B's 4-12 MiB
/// projections (6.5-9 us vs 7.2-13.6 us) and loses on Llama-3-8B's 32-224 MiB ones
/// and on a 297 MiB lm_head (2.2-2.7 vs 2.4-3.5 TB/s), where cuBLASLt's split-K
/// kernels keep more bytes in flight.
const MAX_WEIGHT_BYTES: usize = 16 << 20;
/// Largest weight matrix the pre-norm variant takes ([`fused_add_rms_norm_linear`]):
/// a little past [`MAX_WEIGHT_BYTES`] the kernel is about cuBLASLt's speed launch
/// for launch (Qwen3-30B-A3B's 20 MiB qkv at m = 1: 2.22-2.26 against 2.32 TB/s,
/// docs/PERF.md, eighth session), and the norm launch it saves wins the step: the
/// 30B graphed step at bs=1 went from 3.766 / 3.752 to 3.695 / 3.699 ms (H200, two
/// alternating rounds, docs/PERF.md, fifteenth session).
const MAX_NORM_WEIGHT_BYTES: usize = 24 << 20;

/// Most k-steps x 16-row tiles a block stages before its dependency wait:
/// skinny_gemm.cu's kSkinnyMaxPrefetchTileSteps (96 KiB of shared memory, which
/// still leaves two blocks an SM).
const MAX_PREFETCH_TILE_STEPS: usize = 12;
/// Shared-memory bytes of one prefetched k-step of one 16-row tile in a block
/// (skinny_gemm.cu's kSkinnyStepBytes: 8 warps x 32 lanes x 2 rows x 16 bytes).
const PREFETCH_STEP_BYTES: usize = 8 * 32 * 2 * 16;
/// Shared memory a block gets without opting in (static and dynamic together).
const DEFAULT_SHARED_BYTES: usize = 48 << 10;
/// Static shared memory every instance declares besides the warps' partial tiles
/// (skinny_gemm.cu: the NORM row sums and the bulk prefetch's barrier).
const STATIC_EXTRA_BYTES: usize = 512 + 8;
/// The most static shared memory an instance declares: the partial tiles, 16 KiB
/// at two tiles of each, and [`STATIC_EXTRA_BYTES`].
const STATIC_SHARED_BYTES: usize = 16 * 1024 + STATIC_EXTRA_BYTES;
/// Dynamic and static shared memory together a bulk-prefetching block may take:
/// two blocks an SM still fit sm_90's 228 KiB (with the 1 KiB the hardware keeps
/// a block).
const BULK_BLOCK_BUDGET: usize = 112 << 10;
/// The same for a grid of at most one block an SM: sm_90's 227 KiB a block
/// (Qwen3-30B-A3B's o_proj: 128 blocks of 16 rows x 8 KiB).
const BULK_WIDE_BUDGET: usize = 227 << 10;

/// `MINISGL_SKINNY_GEMM`: the skinny path of `linear` (and of `linear_silu_mul`).
static ENABLED: Switch = Switch::new("MINISGL_SKINNY_GEMM");
/// `MINISGL_SKINNY_PREFETCH`: the weight prefetch before the dependency wait.
static PREFETCH: Switch = Switch::new("MINISGL_SKINNY_PREFETCH");
/// `MINISGL_SKINNY_GATED=0`: the two ops in `linear_silu_mul` instead of the gated
/// kernel. On by default since the ninth session: the Qwen3-0.6B bs=1 graphed step
/// takes 0.87 ms with it against 0.93 without (docs/PERF.md, ninth session, calls
/// 4-5). It was off from the fifth session, when an overlapped batch of 7 differed
/// from the plain engine's with it (engine-gpu_overlap); that test, the graph
/// replay and the device-path tests pass with it since (calls 4-5).
static GATED: Switch = Switch::new("MINISGL_SKINNY_GATED");
/// `MINISGL_SKINNY_NORM=0`: the pre-norm variant off (the norm kernel, then the
/// product).
static NORM: Switch = Switch::new("MINISGL_SKINNY_NORM");
/// `MINISGL_SKINNY_BULK=0`: the cp.async prefetch everywhere, instead of the prefetch
/// by the copy engine (skinny_gemm.cu's bulk prefetch) wherever the block's whole
/// slice fits [`BULK_BLOCK_BUDGET`] on sm_90. On by default since the seventeenth
/// session: the Qwen3-0.6B bs=1 graphed step's replay took 0.983-0.992 ms with it
/// against 1.051-1.055 without (H100, four alternating rounds over two calls,
/// docs/PERF.md), every projection of that model taking it.
static BULK: Switch = Switch::new("MINISGL_SKINNY_BULK");
/// `MINISGL_SKINNY_BULK_WIDE=0`: the bulk prefetch only where two blocks fit an SM.
/// By default it also takes slices that fit only one block an SM, where the grid is
/// that small ([`bulk_budget`]): Qwen3-30B-A3B's o_proj (16 MiB, whose 128 blocks
/// otherwise stage 96 of their 128 KiB by cp.async). On since the eighteenth
/// session: the 30B's bs=1 graphed step took 4.044-4.046 ms with it against
/// 4.151-4.165 without (H100, two alternating rounds, docs/PERF.md); bs=64 and the
/// smaller models do not reach it.
static BULK_WIDE: Switch = Switch::new("MINISGL_SKINNY_BULK_WIDE");

/// Widest rows the pre-norm variant normalises into shared memory
/// (skinny_gemm.cu's kSkinnyMaxNormK).
const MAX_NORM_K: usize = 2048;
/// Dynamic shared memory of a pre-norm launch (prefetch slots and rows): within
/// it two blocks still fit an SM beside their static partial tiles (16.5 KiB).
const NORM_SHARED_BUDGET: usize = 96 << 10;

/// Turns the skinny path of `ops::linear` on or off for this process, overriding
/// `MINISGL_SKINNY_GEMM` (for A/B benchmarks); `None` goes back to the variable.
pub(crate) fn set_enabled(on: Option<bool>) {
    ENABLED.set(on);
}

/// Whether `linear` may use the skinny kernel: on unless `MINISGL_SKINNY_GEMM=0`
/// (read once) or [`set_enabled`] said otherwise.
pub(crate) fn enabled() -> bool {
    ENABLED.get()
}

/// Turns the weight prefetch on or off (`MINISGL_SKINNY_PREFETCH`, default on;
/// for A/B benchmarks); `None` goes back to the variable. Results do not depend on it.
pub(crate) fn set_prefetch(on: Option<bool>) {
    PREFETCH.set(on);
}

/// The k-steps of w each warp stages in shared memory before the grid dependency
/// wait: its whole share of the block's K (the block's k-steps over 8 warps,
/// rounded up) within the budget of [`MAX_PREFETCH_TILE_STEPS`] tiles, or 0 with
/// the prefetch off. Qwen3-0.6B's projections fit whole: 4 k-steps a warp for
/// k = 1024 (32 KiB a block, 64 KiB gated with two tiles), 8 for o_proj (64
/// KiB), 12 for down (96 KiB).
pub(crate) fn prefetch_steps(k: usize, m_tiles: usize, k_splits: usize) -> usize {
    if !PREFETCH.get() {
        return 0;
    }
    let block_steps = (k / 32).div_ceil(k_splits.max(1));
    block_steps.div_ceil(8).min(MAX_PREFETCH_TILE_STEPS / m_tiles.max(1))
}

/// Turns the bulk prefetch on or off for this process, overriding
/// `MINISGL_SKINNY_BULK`; `None` goes back to the variable.
pub(crate) fn set_bulk(on: Option<bool>) {
    BULK.set(on);
}

/// skinny_gemm.cu's `skinny_bulk_row_bytes`: bytes between two rows of w in shared
/// memory under the bulk prefetch, for a block of `block_steps` k-steps of 32
/// (64 bytes each): rounded up to 128 bytes, plus 64 (conflict-free reads).
fn bulk_row_bytes(block_steps: usize) -> usize {
    (block_steps * 64).div_ceil(128) * 128 + 64
}

/// The shared memory (dynamic and static) a bulk-prefetching block of a launch of
/// `grid_blocks` blocks may take on a device of `capability` and `sm_count` SMs:
/// [`BULK_BLOCK_BUDGET`] (two blocks an SM), or (unless `MINISGL_SKINNY_BULK_WIDE=0`)
/// [`BULK_WIDE_BUDGET`] when the grid is one block an SM at most; `None` with the
/// bulk prefetch off or before sm_90.
fn bulk_budget(capability: (i32, i32), grid_blocks: usize, sm_count: usize) -> Option<usize> {
    if !BULK.get() || !PREFETCH.get() || capability.0 < 9 {
        return None;
    }
    Some(if BULK_WIDE.get() && grid_blocks <= sm_count { BULK_WIDE_BUDGET } else { BULK_BLOCK_BUDGET })
}

/// The dynamic shared memory of the bulk prefetch of a launch: the block's whole
/// slice (its 16 x `m_tiles` rows over its share of K), when it, the pre-norm rows
/// (`norm_rows` bytes) and the instance's static partial tiles fit `budget`
/// ([`bulk_budget`]); `None` for the cp.async prefetch.
fn bulk_prefetch_bytes(
    k: usize,
    m_tiles: usize,
    n_tiles: usize,
    k_splits: usize,
    norm_rows: usize,
    budget: Option<usize>,
) -> Option<usize> {
    let slice = 16 * m_tiles * bulk_row_bytes((k / 32).div_ceil(k_splits.max(1)));
    let partial_tiles = 8 * m_tiles * n_tiles * 4 * 32 * 4;
    (slice + norm_rows + partial_tiles + STATIC_EXTRA_BYTES <= budget?).then_some(slice)
}

/// Turns the pre-norm variant on or off for this process, overriding
/// `MINISGL_SKINNY_NORM`; `None` goes back to the variable.
pub(crate) fn set_norm(on: Option<bool>) {
    NORM.set(on);
}

/// Shared-memory bytes of the normalised rows of a pre-norm launch
/// (skinny_gemm.cu's `m * skinny_norm_row_bytes(k)`).
fn norm_rows_bytes(m: usize, k: usize) -> usize {
    m * (2 * k + 64)
}

/// The prefetch of a pre-norm launch: [`prefetch_steps`] trimmed so that the slots
/// and the normalised rows stay within [`NORM_SHARED_BUDGET`]; `None` when the rows
/// alone do not fit (or k is past [`MAX_NORM_K`]), and the caller runs the norm
/// kernel first.
pub(crate) fn norm_prefetch_steps(m: usize, k: usize, m_tiles: usize) -> Option<usize> {
    let rows = norm_rows_bytes(m, k);
    if k > MAX_NORM_K || rows > NORM_SHARED_BUDGET {
        return None;
    }
    let fit = (NORM_SHARED_BUDGET - rows) / (m_tiles.max(1) * PREFETCH_STEP_BYTES);
    Some(prefetch_steps(k, m_tiles, 1).min(fit))
}

/// How the skinny kernel runs one product: `m_tiles` 16-row tiles of w per warp
/// (the M_TILES instance) and `k_splits` blocks of a thread-block cluster sharing
/// each tile's K (their partial sums added through distributed shared memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkinnyPlan {
    pub m_tiles: usize,
    pub k_splits: usize,
}

/// The dispatch rule of `linear` on CUDA: `Some(plan)` to run the skinny kernel
/// for `out[m, n] = x[m, k] @ w[n, k]^T`, `None` for cuBLASLt.
///
/// The rule, in one sentence: a decode-sized batch (m <= 16) of a 16-bit dtype
/// whose weights are 1 to 16 MiB is where the skinny kernel measured faster than
/// cuBLASLt (one launch, no split-K reduction pass); everything else (more rows,
/// f32, k not a multiple of 32, unaligned rows, weights outside that range) stays
/// on cuBLASLt.
/// `m_tiles` (16-row tiles of w per warp) is 2 from n >= 32 x SMs (a grid of at
/// least 132 blocks of 32 outputs on an H200), halving the re-reads of x, else 1
/// so the grid fills the GPU: measured in the graphed Qwen3-0.6B bs=1 step
/// (docs/PERF.md, ninth session, call 4), two tiles at gate_up (n = 6144) took it
/// from 1.02 to 0.93 ms, at qkv (4096) too gave the same, at every projection
/// (o and down, n = 1024) 1.10. K is not split: measured on the H200 (docs/PERF.md, 2026-12-01, third
/// session), a cluster split of Qwen3-0.6B's projections at m = 1 lost more to
/// the cluster launch and the extra waves of small blocks than it gained in SMs
/// (gate_up 7.2 -> 10.8 us split in 2, down 5.6 -> 7.9 us split in 4; o_proj
/// 7.7 -> 6.7 us, within the run-to-run spread of these few-microsecond kernels),
/// and again in the graphed step in the seventeenth session (`MINISGL_SKINNY_SPLIT=2`,
/// o and down on 128 blocks: the Qwen3-0.6B bs=1 replay +3.5%).
pub(crate) fn plan(m: usize, n: usize, k: usize, dtype: DType, aligned: bool, sm_count: usize) -> Option<SkinnyPlan> {
    plan_for(false, m, n, k, dtype, aligned, sm_count)
}

/// [`plan`], or with `pre_norm` the pre-norm variant's rule, whose window reaches
/// [`MAX_NORM_WEIGHT_BYTES`].
fn plan_for(
    pre_norm: bool,
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    aligned: bool,
    sm_count: usize,
) -> Option<SkinnyPlan> {
    let window = weight_window(pre_norm);
    let fits = (1..=MAX_ROWS).contains(&m)
        && matches!(dtype, DType::BF16 | DType::F16)
        && k > 0
        && k.is_multiple_of(32)
        && aligned;
    (fits && window.contains(&(n * k * 2))).then(|| {
        let m_tiles = if n >= two_tile_min_n(sm_count) { 2 } else { 1 };
        // The pre-norm variant runs unsplit (every block normalises whole rows).
        let k_splits =
            if pre_norm { 1 } else { small_grid_splits(n.div_ceil(16 * m_tiles), k, sm_count, max_splits()) };
        SkinnyPlan { m_tiles, k_splits }
    })
}

/// The K split of a grid of `tiles` blocks: the largest of 1..=`max` (at most 8)
/// that keeps one wave (`tiles` x split <= SMs) and at least one k-step of 32 a
/// warp in every block, so that a grid that leaves SMs idle (Qwen3-0.6B's o_proj
/// and down: 64 tiles on 132 SMs) streams its weights from more of them.
fn small_grid_splits(tiles: usize, k: usize, sm_count: usize, max: usize) -> usize {
    (1..=max.min(8)).rev().find(|&s| s == 1 || (tiles * s <= sm_count && k / 32 / s >= 8)).unwrap_or(1)
}

/// `MINISGL_SKINNY_SPLIT=N`: the most [`small_grid_splits`] takes (read once; 1,
/// no split, when unset: a loss standalone in the third session and in the graphed
/// step in the seventeenth; kept for measuring other cards and shapes).
fn max_splits() -> usize {
    static OVERRIDE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *OVERRIDE.get_or_init(|| {
        std::env::var("MINISGL_SKINNY_SPLIT").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(1).clamp(1, 8)
    })
}

/// The weight sizes [`plan`] sends to the skinny kernel: [`MIN_WEIGHT_BYTES`] to
/// [`MAX_WEIGHT_BYTES`] (`pre_norm`: to [`MAX_NORM_WEIGHT_BYTES`]), or for both
/// `MINISGL_SKINNY_WEIGHT_MIB=lo,hi` (MiB, read once; for measuring the window).
fn weight_window(pre_norm: bool) -> std::ops::RangeInclusive<usize> {
    static OVERRIDE: std::sync::OnceLock<Option<std::ops::RangeInclusive<usize>>> = std::sync::OnceLock::new();
    let max = if pre_norm { MAX_NORM_WEIGHT_BYTES } else { MAX_WEIGHT_BYTES };
    OVERRIDE
        .get_or_init(|| std::env::var("MINISGL_SKINNY_WEIGHT_MIB").ok().and_then(|v| parse_mib_window(&v)))
        .clone()
        .unwrap_or(MIN_WEIGHT_BYTES..=max)
}

/// `lo,hi` in MiB (decimals allowed) as a byte range; `None` for anything else.
fn parse_mib_window(v: &str) -> Option<std::ops::RangeInclusive<usize>> {
    let (lo, hi) = v.split_once(',')?;
    let mib = |x: &str| x.trim().parse::<f64>().ok().filter(|m| m.is_finite() && *m >= 0.0);
    let (lo, hi) = (mib(lo)?, mib(hi)?);
    (lo <= hi).then_some((lo * 1048576.0) as usize..=(hi * 1048576.0) as usize)
}

/// The fewest outputs at which [`plan`] takes two tiles a warp: 32 x SMs, or
/// `MINISGL_SKINNY_TWO_TILES_MIN_N` (read once; for measuring the rule).
fn two_tile_min_n(sm_count: usize) -> usize {
    static OVERRIDE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let o = OVERRIDE
        .get_or_init(|| std::env::var("MINISGL_SKINNY_TWO_TILES_MIN_N").ok().and_then(|v| v.trim().parse().ok()));
    o.unwrap_or(32 * sm_count.max(1))
}

/// The rule of `linear_silu_mul` on CUDA: `Some(plan)` to run the gated kernel for
/// `out[m, inter] = silu(gate) * up` of `x[m, k] @ w[2 inter, k]^T`, `None` for
/// `linear` then `silu_mul`.
///
/// The same fit as [`plan`] on the whole gate_up weight (m <= 16, 16-bit, 1 to 16
/// MiB). A block makes 8 * m_tiles outputs from 16 * m_tiles weight rows: two
/// tiles (16 outputs, 64 KiB of weights at k = 1024) when that still gives every
/// SM a block, so Qwen3-0.6B's 3072 outputs are 192 blocks, one wave whose every
/// block prefetches its whole slice; else one.
pub(crate) fn plan_gated(
    m: usize,
    inter: usize,
    k: usize,
    dtype: DType,
    aligned: bool,
    sm_count: usize,
) -> Option<SkinnyPlan> {
    plan(m, 2 * inter, k, dtype, aligned, sm_count).map(|_| {
        let m_tiles = if inter.div_ceil(16) >= sm_count.max(1) { 2 } else { 1 };
        SkinnyPlan { m_tiles, k_splits: 1 }
    })
}

/// Whether x, w and bias meet the kernel's alignment: 16-byte aligned rows of x and
/// w (row stride a multiple of 8 elements), unit inner strides.
pub(crate) fn operands_aligned(x: &Tensor, w: &Tensor) -> bool {
    rows_aligned(x, 16) && rows_aligned(w, 16) && w.is_contiguous()
}

/// Runs the kernel: `out` `[m, n]` contiguous, `x` `[m, k]`, `w` `[n, k]`
/// contiguous, `bias` `[n]`, one 16-bit dtype (the caller checked shapes, dtypes,
/// devices and [`operands_aligned`]). A K split runs only through the AOT library
/// (it needs a cluster launch); a JIT-compiled instance runs unsplit.
pub(crate) fn skinny_gemm(out: &Tensor, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, plan: SkinnyPlan) -> Result<()> {
    launch("skinny_gemm", out, x, w, bias, plan, false, None)
}

/// The pre-norm inputs of a launch: `residual` `[m, k]` (rows 16-byte aligned, unit
/// inner stride), `residual_out` `[m, k]` contiguous (another buffer), the norm's
/// `weight` `[k]` and `eps`.
pub(crate) struct PreNorm<'a> {
    pub residual: &'a Tensor,
    pub residual_out: &'a Tensor,
    pub weight: &'a Tensor,
    pub eps: f32,
}

/// The residual step and the product in one launch where the skinny rule takes the
/// product and the rows fit shared memory: `residual_out = x + residual`, `out =
/// rms_norm(residual_out) * norm_w @ w^T (+ bias)` (gated: `silu(gate) * up` of it,
/// in the epilogue when the gated kernel is on, else by `silu_mul` after). Returns `Ok(Some((out, residual_out)))`, new
/// tensors; `Ok(None)` when the caller runs the norm kernel and the product apart
/// (the variant or the skinny path off, a shape the rule leaves to cuBLASLt, a
/// strided residual or bias, rows too wide). The op checked shapes, dtypes, devices.
pub(crate) fn fused_add_rms_norm_linear(
    x: &Tensor,
    residual: &Tensor,
    norm_w: &Tensor,
    eps: f32,
    w: &Tensor,
    bias: Option<&Tensor>,
    gated: bool,
) -> Result<Option<(Tensor, Tensor)>> {
    const OP: &str = "fused_add_rms_norm_linear";
    let dev = device_of(OP, x)?;
    let [m, k] = x.dims::<2>(OP, "x")?;
    // SiLU-and-mul in the epilogue with the gated kernel on, else its own launch after.
    let epilogue = gated && GATED.get();
    let usable = enabled() && NORM.get() && bias.is_none_or(Tensor::is_contiguous) && norm_w.is_contiguous();
    if !usable || !rows_aligned(residual, 16) {
        return Ok(None);
    }
    let aligned = operands_aligned(x, w);
    let sms = dev.sm_count().max(1) as usize;
    let plan = if epilogue {
        plan_gated(m, w.dim(0) / 2, k, x.dtype(), aligned, sms)
    } else {
        plan_for(true, m, w.dim(0), k, x.dtype(), aligned, sms)
    };
    let Some(plan) = plan else { return Ok(None) };
    if norm_prefetch_steps(m, k, plan.m_tiles).is_none() {
        return Ok(None);
    }
    let n = if epilogue { w.dim(0) / 2 } else { w.dim(0) };
    let out = Tensor::empty(&[m, n], x.dtype(), x.device())?;
    let residual_out = Tensor::empty(&[m, k], x.dtype(), x.device())?;
    let pre = PreNorm { residual, residual_out: &residual_out, weight: norm_w, eps };
    let op = if epilogue { "skinny_gemm_silu_mul" } else { "skinny_gemm" };
    launch(op, &out, x, w, bias, plan, epilogue, Some(&pre))?;
    if gated && !epilogue {
        let act = Tensor::empty(&[m, n / 2], x.dtype(), x.device())?;
        super::activation::silu_mul(&act, &out)?;
        return Ok(Some((act, residual_out)));
    }
    Ok(Some((out, residual_out)))
}

/// Runs the gated kernel: `out` `[m, inter]` = silu(gate) * up of `x @ w^T (+
/// bias)`, `w` `[2 inter, k]` (gate rows, then up rows), `bias` `[2 inter]`; the
/// rest as [`skinny_gemm`].
pub(crate) fn skinny_gemm_silu_mul(
    out: &Tensor,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    plan: SkinnyPlan,
) -> Result<()> {
    launch("skinny_gemm_silu_mul", out, x, w, bias, plan, true, None)
}

/// `linear` then `silu_mul` in one gated launch when [`plan_gated`] picks it:
/// `Ok(Some(out))`, `out` a new `[m, w rows / 2]`; `Ok(None)` when the caller
/// runs the two ops (the skinny path off, a shape or alignment the rule leaves
/// to cuBLASLt, a strided bias). The op checked shapes, dtypes and devices.
pub(crate) fn linear_silu_mul(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Option<Tensor>> {
    const OP: &str = "linear_silu_mul";
    let dev = device_of(OP, x)?;
    let [m, k] = x.dims::<2>(OP, "x")?;
    let inter = w.dim(0) / 2;
    if !enabled() || !GATED.get() || !bias.is_none_or(Tensor::is_contiguous) {
        return Ok(None);
    }
    let aligned = operands_aligned(x, w);
    let Some(plan) = plan_gated(m, inter, k, x.dtype(), aligned, dev.sm_count().max(1) as usize) else {
        return Ok(None);
    };
    let out = Tensor::empty(&[m, inter], x.dtype(), x.device())?;
    skinny_gemm_silu_mul(&out, x, w, bias, plan)?;
    Ok(Some(out))
}

/// Every variant: `gated` selects the GATED instance (w holds 2 n rows), `pre`
/// the NORM instance (x is then the previous block's output, normalised with the
/// residual first).
#[allow(clippy::too_many_arguments)]
fn launch(
    op: &'static str,
    out: &Tensor,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    plan: SkinnyPlan,
    gated: bool,
    pre: Option<&PreNorm<'_>>,
) -> Result<()> {
    let dev = device_of(op, x)?;
    let [m, xk] = x.dims::<2>(op, "x")?;
    let [w_rows, k] = w.dims::<2>(op, "w")?;
    let n = if gated { w_rows / 2 } else { w_rows };
    if gated && !w_rows.is_multiple_of(2) {
        return Err(Error::arg(op, format!("argument `w` has {w_rows} rows: not gate rows then as many up rows")));
    }
    let SkinnyPlan { m_tiles, k_splits } = plan;
    if xk != k {
        return Err(Error::arg(op, format!("argument `x` has {xk} columns, expected {k} for w {:?}", w.shape())));
    }
    if !(1..=MAX_ROWS).contains(&m) || !k.is_multiple_of(32) || k == 0 || !matches!(m_tiles, 1 | 2) {
        return Err(Error::arg(op, format!("needs 1..={MAX_ROWS} rows, k a positive multiple of 32 and 1 or 2 m_tiles, got m={m} k={k} m_tiles={m_tiles}")));
    }
    if !(1..=8).contains(&k_splits) || k_splits > k / 32 {
        return Err(Error::arg(op, format!("k_splits {k_splits} must be 1..=8 and at most k / 32 = {}", k / 32)));
    }
    if !operands_aligned(x, w) {
        return Err(Error::arg(op, "arguments `x` and `w` need 16-byte aligned rows with unit inner stride"));
    }
    if n == 0 {
        return Ok(());
    }
    let n_tiles = m.div_ceil(8);
    let cols_per_block = (if gated { 8 } else { 16 }) * m_tiles;
    let grid = grid_u32(op, n.div_ceil(cols_per_block))?;
    let cp_async_steps = match pre {
        Some(_) if k_splits != 1 => return Err(Error::arg(op, "the pre-norm variant runs unsplit")),
        Some(_) => norm_prefetch_steps(m, k, m_tiles)
            .ok_or_else(|| Error::arg(op, format!("pre-norm rows of m={m} k={k} do not fit shared memory")))?,
        None => prefetch_steps(k, m_tiles, k_splits),
    };
    let norm_rows = pre.map_or(0, |_| norm_rows_bytes(m, k));
    let sms = dev.sm_count().max(1) as usize;
    let budget = bulk_budget(dev.capability(), grid as usize * k_splits, sms);
    let bulk = bulk_prefetch_bytes(k, m_tiles, n_tiles, k_splits, norm_rows, budget);
    let prefetch = if bulk.is_some() { 0 } else { cp_async_steps };
    let shared = bulk.unwrap_or(prefetch * m_tiles * PREFETCH_STEP_BYTES) + norm_rows;
    let p = msgl_skinny_gemm_params {
        out: out.device_ptr() as *mut _,
        x: x.device_ptr() as *const _,
        w: w.device_ptr() as *const _,
        bias: bias.map_or(std::ptr::null(), |b| b.device_ptr() as *const _),
        m: m as i64,
        n: n as i64,
        k: k as i64,
        x_stride: if m > 1 { x.strides()[0] as i64 } else { k as i64 },
        prefetch_steps: prefetch as i32,
        bulk_prefetch: i32::from(bulk.is_some()),
        residual: pre.map_or(std::ptr::null(), |p| p.residual.device_ptr() as *const _),
        residual_out: pre.map_or(std::ptr::null_mut(), |p| p.residual_out.device_ptr() as *mut _),
        norm_w: pre.map_or(std::ptr::null(), |p| p.weight.device_ptr() as *const _),
        residual_stride: pre.map_or(0, |p| if m > 1 { p.residual.strides()[0] as i64 } else { k as i64 }),
        eps: pre.map_or(0.0, |p| p.eps),
        reserved2: 0,
    };
    let (a, b, c) = (out.abi(), x.abi(), w.abi());
    let pre_abi = pre.map(|p| (p.residual.abi(), p.residual_out.abi(), p.weight.abi()));
    let null = std::ptr::null();
    let (res_ptr, res_out_ptr, norm_ptr) =
        pre_abi.as_ref().map_or((null, null, null), |(r, o, n)| (r as *const _, o as *const _, n as *const _));
    let eps = pre.map_or(0.0, |p| p.eps);
    let bias_abi = bias.map(Tensor::abi);
    let bias_ptr = bias_abi.as_ref().map_or(std::ptr::null(), |b| b as *const _);
    dispatch(
        op,
        dev,
        "skinny_gemm",
        &[
            ("DTYPE", dtype_code(x)),
            ("N_TILES", n_tiles as i64),
            ("M_TILES", m_tiles as i64),
            ("GATED", i64::from(gated)),
            ("NORM", i64::from(pre.is_some())),
        ],
        |lib, stream| {
            // SAFETY: the views describe live device tensors checked by the caller
            // (bias_abi outlives the call); the launcher validates them again and
            // only enqueues work on `stream`.
            unsafe {
                lib.msgl_skinny_gemm(
                    &a,
                    &b,
                    &c,
                    bias_ptr,
                    res_ptr,
                    res_out_ptr,
                    norm_ptr,
                    eps,
                    m_tiles as i32,
                    k_splits as i32,
                    i32::from(gated),
                    prefetch as i32,
                    i32::from(bulk.is_some()),
                    stream,
                )
            }
        },
        |f| {
            // Launched without a cluster, a block reduces all of K: the bulk rows,
            // sized for a split, would not fit; such a launch takes the cp.async
            // prefetch's first steps instead.
            let (p, shared) = if bulk.is_some() && k_splits > 1 {
                (
                    msgl_skinny_gemm_params { bulk_prefetch: 0, prefetch_steps: cp_async_steps as i32, ..p },
                    cp_async_steps * m_tiles * PREFETCH_STEP_BYTES + norm_rows,
                )
            } else {
                (p, shared)
            };
            if shared + STATIC_SHARED_BYTES > DEFAULT_SHARED_BYTES {
                f.set_max_dynamic_shared_bytes(dev, shared as u32)?;
            }
            // SAFETY: `p` is the msgl_skinny_gemm_params the entry takes, filled from
            // tensors checked above (shapes, alignment, 1..=16 rows, k % 32 == 0);
            // launched without a cluster, the kernel reduces all of K per block;
            // `shared` is the prefetch's (or the bulk rows') dynamic shared memory and
            // the pre-norm rows.
            unsafe { f.launch(dev, grid, THREADS, shared as u32, &p) }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_projections_go_skinny_and_the_rest_to_cublaslt() {
        let bf = DType::BF16;
        // Qwen3-0.6B's projections at m = 1..16 on an H200 (132 SMs): qkv 8 MiB,
        // o 4 MiB, gate_up 12 MiB, down 6 MiB.
        let p = |m_tiles, k_splits| Some(SkinnyPlan { m_tiles, k_splits });
        // qkv, o_proj, down: one 16-row tile a warp, K whole; gate_up (n >= 32 x
        // SMs): two.
        assert_eq!(plan(4, 4096, 1024, DType::F16, true, 132), p(1, 1));
        assert_eq!(plan(1, 1024, 2048, bf, true, 132), p(1, 1));
        assert_eq!(plan(16, 6144, 1024, bf, true, 132), p(2, 1));
        assert_eq!(plan(1, 4223, 1024, bf, true, 132), p(1, 1));
        assert_eq!(plan(1, 4224, 1024, bf, true, 132), p(2, 1));
        assert_eq!(plan(1, 1024, 3072, bf, true, 132), p(1, 1));
        assert_eq!(plan(1, 8192, 1024, bf, true, 132), p(2, 1)); // 16 MiB: the largest taken
        assert_eq!(plan(1, 8193, 1024, bf, true, 132), None);
        // The pre-norm variant to 24 MiB: Qwen3-30B-A3B's qkv (5120 x 2048, 20 MiB).
        assert_eq!(plan(1, 5120, 2048, bf, true, 132), None);
        assert_eq!(plan_for(true, 1, 5120, 2048, bf, true, 132), p(2, 1));
        assert_eq!(plan_for(true, 1, 12288, 1024, bf, true, 132), p(2, 1)); // 24 MiB
        assert_eq!(plan_for(true, 1, 12289, 1024, bf, true, 132), None);
        assert_eq!(plan_for(true, 1, 6144, 4096, bf, true, 132), None); // Llama-3-8B's qkv, 48 MiB
        assert_eq!(plan(1, 16384, 512, bf, true, 132), p(2, 1));
        // Llama-3-8B's (32-224 MiB) and a vocab-wide lm_head: cuBLASLt measured faster.
        assert_eq!(plan(1, 6144, 4096, bf, true, 132), None);
        assert_eq!(plan(16, 4096, 4096, bf, true, 132), None);
        assert_eq!(plan(1, 28672, 4096, bf, true, 132), None);
        assert_eq!(plan(1, 151936, 1024, bf, true, 132), None);
        // The measuring window's parser.
        assert_eq!(parse_mib_window("0.25, 32"), Some(262144..=32 << 20));
        assert_eq!(parse_mib_window("1,16"), Some(1 << 20..=16 << 20));
        for bad in ["", "16", "2,1", "a,b", "-1,4", "1,inf"] {
            assert_eq!(parse_mib_window(bad), None, "{bad}");
        }
        // More rows, f32, odd k, unaligned, small weights: cuBLASLt.
        assert_eq!(plan(17, 4096, 4096, bf, true, 132), None);
        assert_eq!(plan(0, 4096, 4096, bf, true, 132), None);
        assert_eq!(plan(1, 4096, 4096, DType::F32, true, 132), None);
        assert_eq!(plan(1, 4096, 4104, bf, true, 132), None);
        assert_eq!(plan(1, 4096, 4096, bf, false, 132), None);
        assert_eq!(plan(1, 256, 512, bf, true, 132), None);
    }

    #[test]
    fn gate_up_projections_go_gated_with_two_tiles_when_the_grid_still_fills_the_gpu() {
        let bf = DType::BF16;
        let p = |m_tiles| Some(SkinnyPlan { m_tiles, k_splits: 1 });
        // Qwen3-0.6B's gate_up (12 MiB): 3072 outputs, 192 blocks of 16 on 132 SMs.
        assert_eq!(plan_gated(1, 3072, 1024, bf, true, 132), p(2));
        assert_eq!(plan_gated(16, 3072, 1024, DType::F16, true, 132), p(2));
        // Fewer outputs than 16 a block for every SM: 8 a block.
        assert_eq!(plan_gated(1, 1536, 1024, bf, true, 132), p(1));
        // Outside the skinny rule: the two ops.
        assert_eq!(plan_gated(17, 3072, 1024, bf, true, 132), None);
        assert_eq!(plan_gated(1, 14336, 4096, bf, true, 132), None);
        assert_eq!(plan_gated(1, 3072, 1024, DType::F32, true, 132), None);
        assert_eq!(plan_gated(1, 3072, 1024, bf, false, 132), None);
    }

    #[test]
    fn small_grids_split_k_within_one_wave() {
        // Qwen3-0.6B's o_proj and down (64 tiles) on 132 SMs: two blocks a tile.
        assert_eq!(small_grid_splits(64, 2048, 132, 8), 2);
        assert_eq!(small_grid_splits(64, 3072, 132, 2), 2);
        // Off (the default maximum of 1), or a grid that already fills the SMs.
        assert_eq!(small_grid_splits(64, 2048, 132, 1), 1);
        assert_eq!(small_grid_splits(256, 1024, 132, 8), 1);
        // Small grids stop at 8 splits and at one k-step a warp.
        assert_eq!(small_grid_splits(4, 8192, 132, 16), 8);
        assert_eq!(small_grid_splits(4, 512, 132, 8), 2);
        assert_eq!(small_grid_splits(4, 128, 132, 8), 1);
    }

    #[test]
    fn the_bulk_prefetch_takes_whole_slices_that_leave_two_blocks_an_sm() {
        set_prefetch(Some(true));
        set_bulk(Some(true));
        // Conflict-free row strides: an odd multiple of 64 bytes.
        for steps in [1, 2, 3, 32, 64, 96] {
            assert_eq!(bulk_row_bytes(steps) % 128, 64);
            assert!(bulk_row_bytes(steps) >= steps * 64);
        }
        let two = bulk_budget((9, 0), 256, 132);
        assert_eq!(two, Some(BULK_BLOCK_BUDGET));
        // Qwen3-0.6B: qkv (k 1024), o (2048), down (3072, 97 KiB), gate_up with two tiles.
        assert_eq!(bulk_prefetch_bytes(1024, 1, 1, 1, 0, two), Some(16 * 2112));
        assert_eq!(bulk_prefetch_bytes(2048, 1, 1, 1, 0, two), Some(16 * 4160));
        assert_eq!(bulk_prefetch_bytes(3072, 1, 1, 1, 0, two), Some(16 * 6208));
        assert_eq!(bulk_prefetch_bytes(1024, 2, 1, 1, 2112, two), Some(32 * 2112));
        // Split in two, half the rows' bytes; past the budget none.
        assert_eq!(bulk_prefetch_bytes(2048, 1, 1, 2, 0, two), Some(16 * 2112));
        assert_eq!(bulk_prefetch_bytes(4096, 1, 1, 1, 0, two), None);
        assert_eq!(bulk_prefetch_bytes(3072, 2, 2, 1, 0, two), None);
        // The wide budget (on unless switched off) for a grid of one block an SM at
        // most: the 30B's o_proj (128 tiles of k 4096); not for a grid past the SMs.
        BULK_WIDE.set(Some(false));
        assert_eq!(bulk_budget((9, 0), 128, 132), Some(BULK_BLOCK_BUDGET));
        BULK_WIDE.set(Some(true));
        let wide = bulk_budget((9, 0), 128, 132);
        assert_eq!(wide, Some(BULK_WIDE_BUDGET));
        assert_eq!(bulk_prefetch_bytes(4096, 1, 1, 1, 0, wide), Some(16 * 8256));
        assert_eq!(bulk_budget((9, 0), 160, 132), Some(BULK_BLOCK_BUDGET));
        BULK_WIDE.set(None);
        // Before sm_90, or switched off: none.
        assert_eq!(bulk_budget((8, 0), 64, 132), None);
        set_bulk(Some(false));
        assert_eq!(bulk_budget((9, 0), 64, 132), None);
        set_bulk(None);
        set_prefetch(None);
    }

    #[test]
    fn prefetch_takes_a_warps_whole_share_within_96_kib() {
        set_prefetch(Some(true));
        // k = 1024: 32 k-steps, 4 a warp; o_proj 8; down 12 (96 KiB, the budget).
        assert_eq!(prefetch_steps(1024, 1, 1), 4);
        assert_eq!(prefetch_steps(2048, 1, 1), 8);
        assert_eq!(prefetch_steps(3072, 1, 1), 12);
        assert_eq!(prefetch_steps(3072, 2, 1), 6);
        assert_eq!(prefetch_steps(8192, 1, 1), 12);
        // A K split shares the steps first; k / 32 = 3 leaves warps one step or none.
        assert_eq!(prefetch_steps(3072, 1, 4), 3);
        assert_eq!(prefetch_steps(96, 1, 1), 1);
        assert!(prefetch_steps(8192, 2, 1) * 2 * PREFETCH_STEP_BYTES <= 96 << 10);
        set_prefetch(Some(false));
        assert_eq!(prefetch_steps(1024, 1, 1), 0);
        set_prefetch(None);
    }

    #[test]
    fn pre_norm_rows_share_the_prefetch_budget() {
        set_prefetch(Some(true));
        // Qwen3-0.6B's qkv and gate_up (k = 1024): the whole prefetch fits beside
        // one row, and beside 16 rows (33 KiB) too.
        assert_eq!(norm_prefetch_steps(1, 1024, 1), Some(4));
        assert_eq!(norm_prefetch_steps(16, 1024, 2), Some(3));
        assert_eq!(norm_prefetch_steps(16, 1024, 1), Some(4));
        // k = 2048 at 16 rows (65 KiB): the prefetch is trimmed to what is left.
        assert_eq!(norm_prefetch_steps(16, 2048, 1), Some(3));
        assert_eq!(norm_prefetch_steps(16, 2048, 2), Some(1));
        // Wider rows: the norm kernel first.
        assert_eq!(norm_prefetch_steps(1, 4096, 1), None);
        for (m, k, t) in [(1, 1024, 1), (16, 1024, 2), (16, 2048, 1), (16, 2048, 2), (7, 1536, 2)] {
            let steps = norm_prefetch_steps(m, k, t).unwrap();
            assert!(steps * t * PREFETCH_STEP_BYTES + norm_rows_bytes(m, k) <= NORM_SHARED_BUDGET, "{m} {k} {t}");
        }
        set_prefetch(None);
    }

    #[test]
    fn the_switch_overrides_the_environment() {
        set_enabled(Some(false));
        assert!(!enabled());
        set_enabled(Some(true));
        assert!(enabled());
        set_enabled(None);
        let _ = enabled();
    }
}
