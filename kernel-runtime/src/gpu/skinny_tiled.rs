//! The tiled skinny GEMM on CUDA (csrc/kernels/skinny_tiled.cu): `x @ w^T (+
//! bias)` for mid-sized decode batches and large weights, with the weights
//! streamed through a cp.async pipeline in shared memory; its plan (block shape,
//! pipeline depth, K split), the run-time overrides of every choice, and the rule
//! that sends `linear` to it.

use std::sync::OnceLock;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sys::kernels::msgl_skinny_tiled_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, Switch};

/// skinny_tiled.cu's block size (8 warps).
const THREADS: u32 = 256;
/// Weights below this stay on cuBLASLt (launch-latency bound either way).
const MIN_WEIGHT_BYTES: usize = 1 << 20;
/// The default of `MINISGL_SKINNY_MAX_ROWS`: the most rows `linear` sends to the
/// kernel. 64 is the target batch of issue 12 (the lead sets it from the bench
/// sweep's `linear` vs `cublaslt` lines at m = 64, 128, 256).
const DEFAULT_MAX_ROWS: usize = 64;
/// Shared memory a plan may take when the rule picks its depth: two blocks an SM
/// (228 KiB an SM, 1 KiB reserved a block).
const TWO_BLOCK_SHARED_BYTES: usize = 113 << 10;
/// The most dynamic shared memory a block may take on sm_90.
const MAX_SHARED_BYTES: usize = 227 << 10;
/// Dynamic shared memory a kernel gets without opting in.
const DEFAULT_SHARED_BYTES: usize = 48 << 10;

/// `MINISGL_SKINNY_TILED=1`: the tiled path of `linear`. Off by default: measured
/// on the H200 it lost to cuBLASLt at almost every shape past 16 rows (Llama-3-8B
/// o_proj at m = 64: 67.7 against 13.2 us; docs/PERF.md, fifth session, call 2).
static ENABLED: Switch = Switch::off_by_default("MINISGL_SKINNY_TILED");

/// Turns the tiled path of `linear` on or off for this process (`None`: back
/// to `MINISGL_SKINNY_TILED`).
pub(crate) fn set_enabled(on: Option<bool>) {
    ENABLED.set(on);
}

/// A positive integer from the environment, read once per variable.
fn env_usize(var: &'static str, cell: &'static OnceLock<Option<usize>>) -> Option<usize> {
    *cell.get_or_init(|| std::env::var(var).ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|&v| v > 0))
}

macro_rules! env_knob {
    ($name:ident, $var:literal) => {
        fn $name() -> Option<usize> {
            static CELL: OnceLock<Option<usize>> = OnceLock::new();
            env_usize($var, &CELL)
        }
    };
}
env_knob!(env_max_rows, "MINISGL_SKINNY_MAX_ROWS");
env_knob!(env_n_tiles, "MINISGL_SKINNY_TILED_N_TILES");
env_knob!(env_warps_n, "MINISGL_SKINNY_TILED_WARPS_N");
env_knob!(env_chunk, "MINISGL_SKINNY_TILED_CHUNK");
env_knob!(env_stages, "MINISGL_SKINNY_TILED_STAGES");
env_knob!(env_splits, "MINISGL_SKINNY_TILED_SPLITS");

/// How the tiled kernel runs one product (skinny_tiled.cu): `n_tiles` 8-row tiles
/// of x a block (the N_TILES instance; more rows run as row groups), `warps_n`
/// warps on different weight rows (16 each; the other 8 / warps_n split the
/// stage's k-steps), `chunk` k-steps of 32 a warp per stage, `stages` stages in
/// flight, `k_splits` blocks of a cluster sharing a tile's K.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TiledPlan {
    pub n_tiles: usize,
    pub warps_n: usize,
    pub chunk: usize,
    pub stages: usize,
    pub k_splits: usize,
}

impl TiledPlan {
    /// Dynamic shared memory of one block: the larger of the pipeline (stages x
    /// (weights chunk x 8 KiB + x rows 8 n_tiles x chunk (8 / warps_n) k-steps x 64
    /// bytes)) and the 8 warps' f32 partial tiles; skinny_tiled.cu's
    /// msgl_skinny_tiled_smem_bytes.
    pub fn shared_bytes(&self) -> usize {
        let warps_k = 8 / self.warps_n.max(1);
        let stage = self.chunk * 8 * 1024 + self.chunk * warps_k * 8 * self.n_tiles * 64;
        (stage * self.stages).max(8 * self.n_tiles * 4 * 32 * 4)
    }

    /// Whether the kernel takes the plan for `k` (the launcher's checks).
    fn valid(&self, k: usize) -> bool {
        matches!(self.n_tiles, 1 | 2 | 4 | 8 | 16)
            && matches!(self.warps_n, 1 | 2 | 4 | 8)
            && (1..=4).contains(&self.chunk)
            && (2..=8).contains(&self.stages)
            && (1..=8).contains(&self.k_splits)
            && self.k_splits <= k / 32
            && self.shared_bytes() <= MAX_SHARED_BYTES
    }
}

/// The most rows `linear` sends to the tiled kernel: `MINISGL_SKINNY_MAX_ROWS`, else 64.
pub(crate) fn max_rows() -> usize {
    env_max_rows().unwrap_or(DEFAULT_MAX_ROWS)
}

/// The plan the rule picks for `m` rows of `[n, k]` weights on `sms` SMs, before
/// the environment's overrides. Every choice is a starting point for the bench
/// sweep (benches/gemm.rs prints one line per plan it tries):
/// - `n_tiles`: the smallest tile count that holds m (8 n_tiles >= m), at most 8
///   (64 rows: 32 f32 accumulators a lane; more rows run as row groups that read
///   their weights from L2 right after the first);
/// - `warps_n`: 2 up to 16 rows, 4 up to 32, else 8, so that a block's weight rows
///   (16 warps_n) are at least its x rows (x's L2 traffic at most the weights'),
///   halved while even an 8-way K split would leave a quarter of the two-blocks-
///   an-SM slots empty (Qwen3-0.6B's 1024-wide o_proj and down);
/// - `chunk` 2 (16 KiB of weights a block per stage) and `stages` up to 4, as many
///   as fit two blocks an SM (3 stages in flight: 96 KiB an SM, about 2x what
///   HBM's latency x bandwidth needs);
/// - `k_splits`: 1 when the tiles alone fill three quarters of the slots (every SM
///   streams; Llama-3-8B's gate_up: 224 tiles), else the split in 1, 2, 4, 8 whose
///   last wave is fullest (within 5% to the smaller split), keeping at least two
///   stages a block.
pub(crate) fn default_plan(m: usize, n: usize, k: usize, sms: usize) -> TiledPlan {
    let slots = 2 * sms.max(1);
    let n_tiles = m.div_ceil(8).clamp(1, 8).next_power_of_two();
    let y_chunks = m.div_ceil(8 * n_tiles).max(1);
    let mut warps_n = match m {
        0..=16 => 2,
        17..=32 => 4,
        _ => 8,
    };
    let cells = |warps_n: usize| n.div_ceil(16 * warps_n) * y_chunks;
    while warps_n > 1 && cells(warps_n) * 8 < slots * 3 / 4 {
        warps_n /= 2;
    }
    let chunk = 2;
    let mut plan = TiledPlan { n_tiles, warps_n, chunk, stages: 4, k_splits: 1 };
    while plan.stages > 2 && plan.shared_bytes() > TWO_BLOCK_SHARED_BYTES {
        plan.stages -= 1;
    }
    let steps = k / 32;
    let stage_steps = chunk * (8 / warps_n);
    let c = cells(warps_n);
    if c < slots * 3 / 4 {
        let fill = |s: usize| {
            let blocks = c * s;
            blocks as f64 / (blocks.div_ceil(slots) * slots) as f64
        };
        let mut best = 1;
        for s in [2, 4, 8] {
            if steps / s >= 2 * stage_steps && fill(s) > fill(best) + 0.05 {
                best = s;
            }
        }
        plan.k_splits = best;
    }
    plan
}

/// [`default_plan`] with `MINISGL_SKINNY_TILED_{N_TILES,WARPS_N,CHUNK,STAGES,SPLITS}`
/// applied (each read once), or the default plan when the overrides make an
/// invalid one.
fn tuned_plan(m: usize, n: usize, k: usize, sms: usize) -> TiledPlan {
    let d = default_plan(m, n, k, sms);
    let p = TiledPlan {
        n_tiles: env_n_tiles().unwrap_or(d.n_tiles),
        warps_n: env_warps_n().unwrap_or(d.warps_n),
        chunk: env_chunk().unwrap_or(d.chunk),
        stages: env_stages().unwrap_or(d.stages),
        k_splits: env_splits().unwrap_or(d.k_splits),
    };
    if p.valid(k) {
        p
    } else {
        d
    }
}

/// The tiled part of `linear`'s rule on CUDA (after `skinny::plan`, which keeps
/// m <= 16 of 1-16 MiB weights): `Some(plan)` for a 16-bit product of 1 to
/// [`max_rows`] rows, k a multiple of 32, 16-byte aligned rows and at least 1 MiB of
/// weights; `None` for cuBLASLt.
pub(crate) fn plan(
    m: usize,
    n: usize,
    k: usize,
    dtype: DType,
    aligned: bool,
    sms: usize,
    max_rows: usize,
) -> Option<TiledPlan> {
    let fits = (1..=max_rows).contains(&m)
        && matches!(dtype, DType::BF16 | DType::F16)
        && k > 0
        && k.is_multiple_of(32)
        && aligned
        && n * k * 2 >= MIN_WEIGHT_BYTES;
    fits.then(|| tuned_plan(m, n, k, sms))
}

/// `plan` as `linear` runs it: off with `MINISGL_SKINNY_TILED=0`, the row limit
/// from `MINISGL_SKINNY_MAX_ROWS`.
pub(crate) fn linear_plan(m: usize, n: usize, k: usize, dtype: DType, aligned: bool, sms: usize) -> Option<TiledPlan> {
    if !ENABLED.get() {
        return None;
    }
    plan(m, n, k, dtype, aligned, sms, max_rows())
}

/// The rule's plan whatever the row limit (for `ops::skinny_tiled` without a plan).
pub(crate) fn rule_plan(m: usize, n: usize, k: usize, sms: usize) -> TiledPlan {
    tuned_plan(m, n, k, sms)
}

/// Runs the kernel: `out` `[m, n]` contiguous, `x` `[m, k]`, `w` `[n, k]`
/// contiguous, `bias` `[n]` contiguous, one 16-bit dtype (the caller checked
/// shapes, dtypes, devices and `skinny::operands_aligned`). A K split runs only
/// through the AOT library (a cluster launch); a JIT-compiled instance runs unsplit.
pub(crate) fn skinny_tiled(out: &Tensor, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, plan: TiledPlan) -> Result<()> {
    const OP: &str = "skinny_tiled";
    let dev = device_of(OP, x)?;
    let [m, xk] = x.dims::<2>(OP, "x")?;
    let [n, k] = w.dims::<2>(OP, "w")?;
    if xk != k {
        return Err(Error::arg(OP, format!("argument `x` has {xk} columns, expected {k} for w {:?}", w.shape())));
    }
    if m == 0 || k == 0 || !k.is_multiple_of(32) {
        return Err(Error::arg(OP, format!("needs m >= 1 and k a positive multiple of 32, got m={m} k={k}")));
    }
    if !plan.valid(k) {
        return Err(Error::arg(OP, format!("invalid plan {plan:?} for k = {k}")));
    }
    if !super::skinny::operands_aligned(x, w) {
        return Err(Error::arg(OP, "arguments `x` and `w` need 16-byte aligned rows with unit inner stride"));
    }
    if n == 0 {
        return Ok(());
    }
    let y_chunks = m.div_ceil(8 * plan.n_tiles);
    let cells = n.div_ceil(16 * plan.warps_n) * y_chunks;
    let grid = grid_u32(OP, cells)?;
    let shared = plan.shared_bytes();
    let p = msgl_skinny_tiled_params {
        out: out.device_ptr() as *mut _,
        x: x.device_ptr() as *const _,
        w: w.device_ptr() as *const _,
        bias: bias.map_or(std::ptr::null(), |b| b.device_ptr() as *const _),
        m: m as i64,
        n: n as i64,
        k: k as i64,
        x_stride: if m > 1 { x.strides()[0] as i64 } else { k as i64 },
        warps_n: plan.warps_n as i32,
        chunk: plan.chunk as i32,
        stages: plan.stages as i32,
        y_chunks: i32::try_from(y_chunks).map_err(|_| Error::arg(OP, "too many rows"))?,
    };
    let (a, b, c) = (out.abi(), x.abi(), w.abi());
    let bias_abi = bias.map(Tensor::abi);
    let bias_ptr = bias_abi.as_ref().map_or(std::ptr::null(), |b| b as *const _);
    dispatch(
        OP,
        dev,
        "skinny_tiled",
        &[("DTYPE", dtype_code(x)), ("N_TILES", plan.n_tiles as i64)],
        |lib, stream| {
            // SAFETY: the views describe live device tensors checked by the caller
            // (bias_abi outlives the call); the launcher validates them again and
            // only enqueues work on `stream`.
            unsafe {
                lib.msgl_skinny_tiled(
                    &a,
                    &b,
                    &c,
                    bias_ptr,
                    plan.n_tiles as i32,
                    plan.warps_n as i32,
                    plan.chunk as i32,
                    plan.stages as i32,
                    plan.k_splits as i32,
                    stream,
                )
            }
        },
        |f| {
            if shared > DEFAULT_SHARED_BYTES {
                f.set_max_dynamic_shared_bytes(dev, shared as u32)?;
            }
            // SAFETY: `p` is the msgl_skinny_tiled_params the entry takes, filled
            // from tensors and a plan checked above; launched without a cluster,
            // each block reduces all of K; `shared` is what the plan's pipeline
            // and partial tiles take.
            unsafe { f.launch(dev, grid, THREADS, shared as u32, &p) }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200_SMS: usize = 132;

    fn plan64(m: usize, n: usize, k: usize) -> Option<TiledPlan> {
        plan(m, n, k, DType::BF16, true, H200_SMS, 64)
    }

    #[test]
    fn the_rule_takes_16_bit_aligned_products_up_to_the_row_limit() {
        // Llama-3-8B and Qwen3-0.6B projections at m = 1..64.
        for (k, n) in [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (1024, 4096), (2048, 1024)] {
            for m in [1, 16, 17, 32, 33, 64] {
                assert!(plan64(m, n, k).is_some(), "m={m} n={n} k={k}");
                assert!(plan(m, n, k, DType::F16, true, H200_SMS, 64).is_some());
            }
            assert_eq!(plan64(65, n, k), None);
            assert!(plan(256, n, k, DType::BF16, true, H200_SMS, 256).is_some());
        }
        // f32, k not a multiple of 32, unaligned rows, small weights, no rows: cuBLASLt.
        assert_eq!(plan(32, 4096, 4096, DType::F32, true, H200_SMS, 64), None);
        assert_eq!(plan64(32, 4096, 4104), None);
        assert_eq!(plan(32, 4096, 4096, DType::BF16, false, H200_SMS, 64), None);
        assert_eq!(plan64(32, 256, 512), None);
        assert_eq!(plan64(0, 4096, 4096), None);
    }

    #[test]
    fn default_plans_fill_the_gpu_and_fit_two_blocks_an_sm() {
        let p = |n_tiles, warps_n, stages, k_splits| TiledPlan { n_tiles, warps_n, chunk: 2, stages, k_splits };
        // Llama-3-8B o_proj at m = 64: 32 tiles of 128 rows, split 8 ways (256 blocks).
        assert_eq!(default_plan(64, 4096, 4096, H200_SMS), p(8, 8, 4, 8));
        // gate_up: 224 tiles, no split.
        assert_eq!(default_plan(64, 28672, 4096, H200_SMS), p(8, 8, 4, 1));
        // m = 1: 32-row tiles; qkv's 192 tiles split 4 ways (768 blocks: 2.9 waves of 264).
        assert_eq!(default_plan(1, 6144, 4096, H200_SMS), p(1, 2, 4, 4));
        // m = 32: 64-row tiles.
        assert_eq!(default_plan(32, 4096, 4096, H200_SMS).warps_n, 4);
        // Qwen3-0.6B o_proj (1024 rows) at m = 64: 2 warps on rows, 32 tiles.
        let o = default_plan(64, 1024, 2048, H200_SMS);
        assert_eq!((o.warps_n, o.n_tiles), (2, 8));
        // More than 64 rows: row groups of 64.
        assert_eq!(default_plan(256, 4096, 4096, H200_SMS).n_tiles, 8);
        for (k, n) in
            [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (1024, 4096), (2048, 1024), (3072, 1024)]
        {
            for m in [1, 8, 16, 17, 32, 48, 64, 128, 256] {
                let d = default_plan(m, n, k, H200_SMS);
                assert!(d.valid(k), "{d:?} m={m} n={n} k={k}");
                assert!(d.shared_bytes() <= TWO_BLOCK_SHARED_BYTES, "{d:?} takes {} bytes", d.shared_bytes());
                assert!(8 * d.n_tiles >= m.min(64));
                assert!(k / 32 / d.k_splits >= 1);
            }
        }
    }

    #[test]
    fn shared_bytes_match_the_kernel_layout() {
        // 4 stages of (16 KiB of weights + 64 rows x 2 k-steps x 64 bytes of x).
        let p = TiledPlan { n_tiles: 8, warps_n: 8, chunk: 2, stages: 4, k_splits: 1 };
        assert_eq!(p.shared_bytes(), 4 * (16384 + 8192));
        // The partial tiles win for a shallow pipeline of few k-steps: 8 warps x 64 x 4 x 32 f32.
        let q = TiledPlan { n_tiles: 16, warps_n: 8, chunk: 1, stages: 2, k_splits: 1 };
        assert_eq!(q.shared_bytes(), 8 * 16 * 4 * 32 * 4);
        assert!(!TiledPlan { stages: 8, chunk: 4, ..p }.valid(4096));
        assert!(!TiledPlan { k_splits: 4, ..p }.valid(96));
    }
}
