//! The streaming decode GEMM on CUDA (csrc/kernels/stream_gemm.cu): `x @ w^T (+
//! bias)` for up to 16 rows of large weights, with the weights brought into shared
//! memory by the copy engine (2-D tensor copies, sm_90) and a persistent grid of
//! one block an SM; the tensor maps it reads through, its plan (stage width,
//! pipeline depth, grid) and the rule that sends `linear` to it.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sys::kernels::{msgl_stream_gemm_params, msgl_tensor_map};
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, Switch};
use super::tensor_map::{self, Swizzle};

/// stream_gemm.cu's block size: 4 consumer warps and the producer warp.
const THREADS: u32 = 160;
/// Most rows of x the kernel takes (two 8-row tensor-core tiles).
pub(crate) const MAX_ROWS: usize = 16;
/// Weight rows of a tile (the mma's A rows, the rows of a weight box).
const TILE_ROWS: usize = 16;
/// k elements of one tensor-copy box (stream_gemm.cu's kStreamBoxK).
const BOX_K: u32 = 256;
/// k elements a stage of the default plan (32 KiB of weights).
const DEFAULT_CHUNK: usize = 1024;
/// The most stages the kernel's barriers cover (kStreamMaxStages).
const MAX_STAGES: usize = 8;
/// Dynamic shared memory a block may take: sm_90's 227 KiB less the static
/// barriers and the consumers' partial tiles (4 KiB and a few barriers) and the
/// 128 bytes of slack for the ring's alignment (stream_gemm.cu's
/// kStreamMaxSharedBytes).
const SHARED_BUDGET: usize = (227 << 10) - (4 << 10) - 256 - 128;
/// Bytes the kernel adds to its ring to align it to 128.
const ALIGN_SLACK: usize = 128;
/// Dynamic shared memory a kernel gets without opting in.
const DEFAULT_SHARED_BYTES: usize = 48 << 10;
/// Weights the rule leaves to the skinny kernel (`skinny::plan` takes 1-16 MiB).
const MIN_WEIGHT_BYTES: usize = (16 << 20) + 1;
/// The least share of the ideal time the persistent grid may lose to uneven tile
/// counts (blocks of ceil(T / G) tiles against T / G on average).
const MIN_BALANCE: f64 = 0.9;

/// `MINISGL_STREAM_GEMM=1`: the streaming path of `linear` for the rule's large
/// weights (`MINISGL_STREAM_GEMM=all`: also every product of 1 MiB and more, ahead
/// of the skinny kernel, whatever the balance). Off by default: on the H200 it
/// matches or beats cuBLASLt launch for launch on Llama-3-8B's projections (3.7-4.2
/// TB/s at m = 1) but a graphed Llama-3-8B decode step got slower with it (4.87
/// against 4.71 ms): in a step each launch pays its pipeline fill and the
/// persistent grid's last tile, 3-5 us more than cuBLASLt's kernels in an ncu
/// profile of the same step (docs/PERF.md, eighth session).
static ENABLED: Switch = Switch::off_by_default("MINISGL_STREAM_GEMM");

/// Whether `MINISGL_STREAM_GEMM=all` (read once).
fn takes_every_size() -> bool {
    static ALL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALL.get_or_init(|| std::env::var("MINISGL_STREAM_GEMM").is_ok_and(|v| v.trim() == "all"))
}

/// `MINISGL_STREAM_CHUNK` / `MINISGL_STREAM_STAGES`: the default plan's stage width
/// and ring depth (for A/B measurements; an invalid pair falls back to the default).
fn env_override(var: &'static str, cell: &'static std::sync::OnceLock<Option<usize>>) -> Option<usize> {
    *cell.get_or_init(|| std::env::var(var).ok().and_then(|v| v.trim().parse::<usize>().ok()))
}

/// Turns the streaming path of `linear` on or off for this process (`None`: back
/// to `MINISGL_STREAM_GEMM`).
pub(crate) fn set_enabled(on: Option<bool>) {
    ENABLED.set(on);
}

/// How the kernel runs one product: `chunk` k elements a stage (256, 512 or
/// 1024), `stages` shared-memory stages in the ring, `blocks` persistent blocks
/// (each owns a contiguous range of 16-row tiles), and `whole_rows`: one 3-D
/// tensor copy a stage for each operand, bringing every row's chunk as one
/// contiguous run (needs k % 256 == 0), else one 2-D copy per 256 k.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamPlan {
    pub chunk: usize,
    pub stages: usize,
    pub blocks: usize,
    pub whole_rows: bool,
}

/// x tiles of 8 rows the instance holds for `m` rows (the N_TILES parameter).
fn n_tiles(m: usize) -> usize {
    if m <= 8 {
        1
    } else {
        2
    }
}

/// Bytes of one stage of `chunk` k elements for `m` rows: 16 weight rows and 8
/// N_TILES x rows, dense.
fn stage_bytes(m: usize, chunk: usize) -> usize {
    (TILE_ROWS + 8 * n_tiles(m)) * 2 * chunk
}

/// Dynamic shared memory of `stages` stages (stream_gemm.cu's
/// msgl_stream_gemm_smem_bytes, the alignment slack included).
pub(crate) fn shared_bytes(m: usize, chunk: usize, stages: usize) -> usize {
    stages * stage_bytes(m, chunk) + ALIGN_SLACK
}

/// The deepest ring of `chunk`-wide stages that fits: at 1024, 4 stages for m <= 8
/// (192 KiB), 3 for m <= 16; at 512, 8 and 6.
pub(crate) fn max_stages(m: usize, chunk: usize) -> usize {
    ((SHARED_BUDGET - ALIGN_SLACK) / stage_bytes(m, chunk)).min(MAX_STAGES)
}

/// The tensor map of a `[rows, k]` matrix of 16-bit elements at `t`'s first
/// element, rows `row_stride` elements apart, no swizzle, zero fill outside the
/// matrix (what stream_gemm.cu copies): 2-D with boxes of 256 k x `box_rows`
/// rows, or with `whole_rows` (k % 256 == 0) the 3-D view [rows][k / 256][256]
/// with boxes of `chunk` k x `box_rows` rows.
fn tensor_map(
    t: &Tensor,
    rows: usize,
    k: usize,
    row_stride: usize,
    box_rows: u32,
    whole_rows: Option<usize>,
) -> Result<msgl_tensor_map> {
    const OP: &str = "stream_gemm";
    let row_bytes = (row_stride * 2) as u64;
    let box_k = u64::from(BOX_K);
    match whole_rows {
        Some(chunk) => tensor_map::encode(
            OP,
            t,
            [box_k, k as u64 / box_k, rows as u64],
            &[2 * box_k, row_bytes],
            [BOX_K, (chunk as u64 / box_k) as u32, box_rows],
            Swizzle::None,
        ),
        None => tensor_map::encode(OP, t, [k as u64, rows as u64], &[row_bytes], [BOX_K, box_rows], Swizzle::None),
    }
}

/// The plan for `m` rows of `[n, k]` weights on `sms` SMs: 1024-wide stages (2 KiB
/// runs of each row), the deepest ring, one block an SM (fewer when there are
/// fewer tiles), whole rows when k allows.
pub(crate) fn default_plan(m: usize, n: usize, k: usize, sms: usize) -> StreamPlan {
    static CHUNK: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    static STAGES: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let tiles = n.div_ceil(TILE_ROWS).max(1);
    let chunk = env_override("MINISGL_STREAM_CHUNK", &CHUNK).filter(|c| matches!(c, 256 | 512 | 1024));
    let chunk = chunk.unwrap_or(DEFAULT_CHUNK);
    let deepest = max_stages(m, chunk);
    let stages = env_override("MINISGL_STREAM_STAGES", &STAGES).filter(|s| (2..=deepest).contains(s));
    StreamPlan {
        chunk,
        stages: stages.unwrap_or(deepest),
        blocks: tiles.min(sms.max(1)),
        whole_rows: k.is_multiple_of(BOX_K as usize),
    }
}

/// The share of the GPU's streaming time a persistent grid keeps with `tiles` tiles
/// on `sms` SMs: the average tile count an SM over the largest block's (an SM
/// without a block counts as one streaming nothing).
fn balance(tiles: usize, sms: usize) -> f64 {
    let sms = sms.max(1);
    tiles as f64 / (sms * tiles.div_ceil(sms)).max(1) as f64
}

/// The streaming part of `linear`'s rule on CUDA (after `skinny::plan`, which
/// keeps the 1-16 MiB weights): `Some(plan)` for a 16-bit product of 1 to 16 rows
/// on an sm_90 or newer GPU, k a multiple of 32, 16-byte aligned rows, more than
/// 16 MiB of weights, and tiles that spread over the SMs within 10% of evenly
/// (Llama-3-8B: qkv 384 tiles, o and down 256, gate_up 1792 on 132 SMs: 97%);
/// `None` for the next rule. In one sentence: large weight-bound products whose
/// tiles share out evenly, where launch for launch the copy engine's deep ring
/// matches cuBLASLt and beats the register-pipelined kernel (docs/PERF.md, eighth
/// session); `linear` consults it only when the path is switched on.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan(
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    aligned: bool,
    capability: (i32, i32),
    sms: usize,
) -> Option<StreamPlan> {
    let fits = (1..=MAX_ROWS).contains(&m)
        && matches!(dtype, DType::BF16 | DType::F16)
        && capability.0 >= 9
        && k > 0
        && k.is_multiple_of(32)
        && aligned
        && n * k * 2 >= MIN_WEIGHT_BYTES;
    let plan = default_plan(m, n, k, sms);
    (fits && balance(n.div_ceil(TILE_ROWS), sms) >= MIN_BALANCE).then_some(plan)
}

/// `plan` as `linear` runs it: only with `MINISGL_STREAM_GEMM=1` (or a
/// [`set_enabled`]); with `MINISGL_STREAM_GEMM=all`, every 16-bit product of 1 to
/// 16 rows and at least 1 MiB of weights on sm_90 (for A/B measurements).
pub(crate) fn linear_plan(
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    aligned: bool,
    capability: (i32, i32),
    sms: usize,
) -> Option<StreamPlan> {
    if takes_every_size() {
        let fits = (1..=MAX_ROWS).contains(&m)
            && matches!(dtype, DType::BF16 | DType::F16)
            && capability.0 >= 9
            && k.is_multiple_of(32)
            && aligned
            && n * k * 2 >= 1 << 20;
        return fits.then(|| default_plan(m, n, k, sms));
    }
    if !ENABLED.get() {
        return None;
    }
    plan(m, n, k, dtype, aligned, capability, sms)
}

/// Runs the kernel: `out` `[m, n]` contiguous, `x` `[m, k]`, `w` `[n, k]`
/// contiguous, `bias` `[n]` contiguous, one 16-bit dtype (the caller checked
/// shapes, dtypes, devices and `skinny::operands_aligned`).
pub(crate) fn stream_gemm(out: &Tensor, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, plan: StreamPlan) -> Result<()> {
    const OP: &str = "stream_gemm";
    let dev = device_of(OP, x)?;
    let [m, xk] = x.dims::<2>(OP, "x")?;
    let [n, k] = w.dims::<2>(OP, "w")?;
    if xk != k {
        return Err(Error::arg(OP, format!("argument `x` has {xk} columns, expected {k} for w {:?}", w.shape())));
    }
    if !(1..=MAX_ROWS).contains(&m) || k == 0 || !k.is_multiple_of(32) {
        return Err(Error::arg(OP, format!("needs 1..=16 rows and k a positive multiple of 32, got m={m} k={k}")));
    }
    if dev.capability().0 < 9 {
        return Err(Error::arg(OP, format!("needs an sm_90 or newer GPU (bulk copies), got {}", dev.arch())));
    }
    let tiles = n.div_ceil(TILE_ROWS);
    let chunk_ok = matches!(plan.chunk, 256 | 512 | 1024);
    if !chunk_ok
        || !(2..=max_stages(m, plan.chunk)).contains(&plan.stages)
        || plan.blocks == 0
        || (n > 0 && plan.blocks > tiles)
    {
        return Err(Error::arg(OP, format!("invalid plan {plan:?} for m = {m}, n = {n} ({tiles} tiles)")));
    }
    if !super::skinny::operands_aligned(x, w) {
        return Err(Error::arg(OP, "arguments `x` and `w` need 16-byte aligned rows with unit inner stride"));
    }
    if n == 0 {
        return Ok(());
    }
    let shared = shared_bytes(m, plan.chunk, plan.stages);
    let blocks = u32::try_from(plan.blocks).map_err(|_| Error::arg(OP, "too many blocks"))?;
    let x_stride = if m > 1 { x.strides()[0] } else { k };
    if plan.whole_rows && !k.is_multiple_of(BOX_K as usize) {
        return Err(Error::arg(OP, format!("whole-row copies need k % 256 == 0, got k = {k}")));
    }
    let whole = plan.whole_rows.then_some(plan.chunk);
    let w_map = tensor_map(w, n, k, k, TILE_ROWS as u32, whole)?;
    let x_map = tensor_map(x, m, k, x_stride, 8 * n_tiles(m) as u32, whole)?;
    let p = msgl_stream_gemm_params {
        w_map,
        x_map,
        out: out.device_ptr() as *mut _,
        bias: bias.map_or(std::ptr::null(), |b| b.device_ptr() as *const _),
        m: m as i64,
        n: n as i64,
        k: k as i64,
        stages: plan.stages as i32,
        chunk: plan.chunk as i32,
        whole_rows: i32::from(plan.whole_rows),
        reserved: 0,
    };
    let (a, b, c) = (out.abi(), x.abi(), w.abi());
    let bias_abi = bias.map(Tensor::abi);
    let bias_ptr = bias_abi.as_ref().map_or(std::ptr::null(), |b| b as *const _);
    dispatch(
        OP,
        dev,
        "stream_gemm",
        &[("DTYPE", dtype_code(x)), ("N_TILES", n_tiles(m) as i64)],
        |lib, stream| {
            // SAFETY: the views describe live device tensors checked by the caller
            // (bias_abi outlives the call); the launcher validates them again and
            // only enqueues work on `stream`.
            unsafe {
                lib.msgl_stream_gemm(
                    &a,
                    &b,
                    &c,
                    bias_ptr,
                    &p.w_map,
                    &p.x_map,
                    i32::from(plan.whole_rows),
                    plan.chunk as i32,
                    plan.stages as i32,
                    blocks as i32,
                    stream,
                )
            }
        },
        |f| {
            if shared > DEFAULT_SHARED_BYTES {
                f.set_max_dynamic_shared_bytes(dev, shared as u32)?;
            }
            // SAFETY: `p` is the msgl_stream_gemm_params the entry takes, filled
            // from tensors and a plan checked above; `shared` is what the plan's
            // ring takes, `blocks` at most the tile count.
            unsafe { f.launch(dev, blocks, THREADS, shared as u32, &p) }
        },
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_chunk_fits_two_stages_at_16_rows() {
        for chunk in [256, 512, 1024] {
            assert!(super::max_stages(16, chunk) >= 2, "chunk {chunk}");
        }
        assert_eq!((super::max_stages(1, 1024), super::max_stages(16, 1024)), (4, 3));
        assert_eq!((super::max_stages(1, 512), super::max_stages(16, 512)), (8, 6));
        assert_eq!(super::max_stages(16, 256), 8);
    }

    use super::*;

    const H200_SMS: usize = 132;
    const HOPPER: (i32, i32) = (9, 0);

    fn plan_h200(m: usize, n: usize, k: usize) -> Option<StreamPlan> {
        plan(m, n, k, DType::BF16, true, HOPPER, H200_SMS)
    }

    #[test]
    fn large_projections_whose_tiles_share_out_evenly_stream() {
        // Llama-3-8B: qkv, o, gate_up, down, and its LM head, at m = 1..16.
        for (n, k) in [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)] {
            for m in [1, 2, 8, 9, 16] {
                let p = plan_h200(m, n, k).unwrap_or_else(|| panic!("m={m} n={n} k={k}"));
                assert_eq!(p.blocks, H200_SMS);
                assert_eq!((p.chunk, p.stages), (DEFAULT_CHUNK, max_stages(m, DEFAULT_CHUNK)));
                assert!(p.whole_rows, "k = {k} is a multiple of 256");
                assert!(shared_bytes(m, p.chunk, p.stages) <= SHARED_BUDGET);
            }
            assert_eq!(plan_h200(17, n, k), None, "more than 16 rows");
            assert_eq!(plan(1, n, k, DType::F32, true, HOPPER, H200_SMS), None);
            assert_eq!(plan(1, n, k, DType::BF16, false, HOPPER, H200_SMS), None);
            assert_eq!(plan(1, n, k, DType::BF16, true, (8, 0), H200_SMS), None, "no bulk copies before sm_90");
        }
        // Qwen3-0.6B's projections (at most 16 MiB) stay with the skinny kernel.
        for (n, k) in [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)] {
            assert_eq!(plan_h200(1, n, k), None);
        }
        assert_eq!(plan_h200(1, 6144, 4104), None, "k not a multiple of 32");
    }

    #[test]
    fn uneven_tile_counts_go_to_the_next_rule() {
        // Qwen3-30B-A3B qkv (5120 x 2048 = 20 MiB): 320 tiles, blocks of 2 or 3: 81%.
        assert!((balance(320, 132) - 320.0 / 396.0).abs() < 1e-12);
        assert_eq!(plan_h200(1, 5120, 2048), None);
        // 37 tiles of a wide K: 95 SMs would stream nothing.
        assert_eq!(plan_h200(1, 592, 14336 * 2), None);
        // Qwen3-30B-A3B o_proj (2048 x 4096, 16 MiB + 0: the skinny kernel's) and a
        // 2048-row product of 8192: 128 tiles, one a block on 128 of 132 SMs.
        assert_eq!(plan_h200(1, 2048, 4096), None);
        assert_eq!(plan_h200(1, 2048, 8192).map(|p| p.blocks), Some(128));
        // 140 tiles on 132 SMs: 8 blocks take two, 53%.
        assert_eq!(plan_h200(1, 140 * 16, 8192), None);
    }
}
