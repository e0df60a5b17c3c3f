//! The skinny GEMM on CUDA (csrc/kernels/skinny_gemm.cu): `x @ w^T (+ bias)` for
//! up to 16 rows, at the weight-streaming limit, and the rule that picks it over
//! cuBLASLt inside `linear`.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::sys::kernels::msgl_skinny_gemm_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, rows_aligned};

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

/// `MINISGL_SKINNY_GEMM` as read once: 0 unread, 1 on, 2 off (plus the override).
static ENABLED: AtomicU8 = AtomicU8::new(0);

/// Turns the skinny path of `ops::linear` on or off for this process, overriding
/// `MINISGL_SKINNY_GEMM` (for A/B benchmarks); `None` goes back to the variable.
pub(crate) fn set_enabled(on: Option<bool>) {
    ENABLED.store(on.map_or(0, |on| if on { 1 } else { 2 }), Ordering::Relaxed);
}

/// Whether `linear` may use the skinny kernel: on unless `MINISGL_SKINNY_GEMM=0`
/// (read once) or [`set_enabled`] said otherwise.
pub(crate) fn enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let off = std::env::var("MINISGL_SKINNY_GEMM").is_ok_and(|v| v.trim() == "0");
            // A racing set_enabled wins: only replace "unread".
            let _ = ENABLED.compare_exchange(0, if off { 2 } else { 1 }, Ordering::Relaxed, Ordering::Relaxed);
            !off
        }
    }
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
/// `m_tiles` (16-row tiles of w per warp) is 2 when that still leaves two blocks
/// per SM (n >= 64 x SMs), halving the re-reads of x, else 1 so the grid fills the
/// GPU. K is not split: measured on the H200 (docs/PERF.md, 2026-12-01, third
/// session), a cluster split of Qwen3-0.6B's projections at m = 1 lost more to
/// the cluster launch and the extra waves of small blocks than it gained in SMs
/// (gate_up 7.2 -> 10.8 us split in 2, down 5.6 -> 7.9 us split in 4; o_proj
/// 7.7 -> 6.7 us, within the run-to-run spread of these few-microsecond kernels).
pub(crate) fn plan(m: usize, n: usize, k: usize, dtype: DType, aligned: bool, sm_count: usize) -> Option<SkinnyPlan> {
    let fits = (1..=MAX_ROWS).contains(&m)
        && matches!(dtype, DType::BF16 | DType::F16)
        && k > 0
        && k.is_multiple_of(32)
        && aligned;
    (fits && (MIN_WEIGHT_BYTES..=MAX_WEIGHT_BYTES).contains(&(n * k * 2))).then(|| {
        let m_tiles = if n >= 64 * sm_count.max(1) { 2 } else { 1 };
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
    const OP: &str = "skinny_gemm";
    let dev = device_of(OP, x)?;
    let [m, xk] = x.dims::<2>(OP, "x")?;
    let [n, k] = w.dims::<2>(OP, "w")?;
    let SkinnyPlan { m_tiles, k_splits } = plan;
    if xk != k {
        return Err(Error::arg(OP, format!("argument `x` has {xk} columns, expected {k} for w {:?}", w.shape())));
    }
    if !(1..=MAX_ROWS).contains(&m) || !k.is_multiple_of(32) || k == 0 || !matches!(m_tiles, 1 | 2) {
        return Err(Error::arg(OP, format!("needs 1..={MAX_ROWS} rows, k a positive multiple of 32 and 1 or 2 m_tiles, got m={m} k={k} m_tiles={m_tiles}")));
    }
    if !(1..=8).contains(&k_splits) || k_splits > k / 32 {
        return Err(Error::arg(OP, format!("k_splits {k_splits} must be 1..=8 and at most k / 32 = {}", k / 32)));
    }
    if !operands_aligned(x, w) {
        return Err(Error::arg(OP, "arguments `x` and `w` need 16-byte aligned rows with unit inner stride"));
    }
    if n == 0 {
        return Ok(());
    }
    let n_tiles = m.div_ceil(8);
    let grid = grid_u32(OP, n.div_ceil(16 * m_tiles))?;
    let p = msgl_skinny_gemm_params {
        out: out.device_ptr() as *mut _,
        x: x.device_ptr() as *const _,
        w: w.device_ptr() as *const _,
        bias: bias.map_or(std::ptr::null(), |b| b.device_ptr() as *const _),
        m: m as i64,
        n: n as i64,
        k: k as i64,
        x_stride: if m > 1 { x.strides()[0] as i64 } else { k as i64 },
    };
    let (a, b, c) = (out.abi(), x.abi(), w.abi());
    let bias_abi = bias.map(Tensor::abi);
    let bias_ptr = bias_abi.as_ref().map_or(std::ptr::null(), |b| b as *const _);
    dispatch(
        OP,
        dev,
        "skinny_gemm",
        &[("DTYPE", dtype_code(x)), ("N_TILES", n_tiles as i64), ("M_TILES", m_tiles as i64)],
        |lib, stream| {
            // SAFETY: the views describe live device tensors checked by the caller
            // (bias_abi outlives the call); the launcher validates them again and
            // only enqueues work on `stream`.
            unsafe { lib.msgl_skinny_gemm(&a, &b, &c, bias_ptr, m_tiles as i32, k_splits as i32, stream) }
        },
        |f| {
            // SAFETY: `p` is the msgl_skinny_gemm_params the entry takes, filled from
            // tensors checked above (shapes, alignment, 1..=16 rows, k % 32 == 0);
            // launched without a cluster, the kernel reduces all of K per block.
            unsafe { f.launch(dev, grid, THREADS, 0, &p) }
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
        // qkv, o_proj, gate_up, down: one 16-row tile a warp, K whole.
        assert_eq!(plan(4, 4096, 1024, DType::F16, true, 132), p(1, 1));
        assert_eq!(plan(1, 1024, 2048, bf, true, 132), p(1, 1));
        assert_eq!(plan(16, 6144, 1024, bf, true, 132), p(1, 1));
        assert_eq!(plan(1, 1024, 3072, bf, true, 132), p(1, 1));
        assert_eq!(plan(1, 8192, 1024, bf, true, 132), p(1, 1)); // 16 MiB: the largest taken
        assert_eq!(plan(1, 16384, 512, bf, true, 132), p(2, 1));
        // Llama-3-8B's (32-224 MiB) and a vocab-wide lm_head: cuBLASLt measured faster.
        assert_eq!(plan(1, 6144, 4096, bf, true, 132), None);
        assert_eq!(plan(16, 4096, 4096, bf, true, 132), None);
        assert_eq!(plan(1, 28672, 4096, bf, true, 132), None);
        assert_eq!(plan(1, 151936, 1024, bf, true, 132), None);
        // More rows, f32, odd k, unaligned, small weights: cuBLASLt.
        assert_eq!(plan(17, 4096, 4096, bf, true, 132), None);
        assert_eq!(plan(0, 4096, 4096, bf, true, 132), None);
        assert_eq!(plan(1, 4096, 4096, DType::F32, true, 132), None);
        assert_eq!(plan(1, 4096, 4104, bf, true, 132), None);
        assert_eq!(plan(1, 4096, 4096, bf, false, 132), None);
        assert_eq!(plan(1, 256, 512, bf, true, 132), None);
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
