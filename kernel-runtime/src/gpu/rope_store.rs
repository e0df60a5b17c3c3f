//! The fused attention prologue on CUDA (csrc/kernels/rope_store.cu): q/k norm,
//! RoPE and the KV store in one launch.
//!
//! The launch shape is chosen here ([`rope_store_shape`]): a group of threads per
//! (token, head) row, holding its head in registers at most two rotated pairs of
//! 16-byte vectors a thread, widened while the grid has fewer blocks than SMs.

use crate::dtype::DType;
use crate::error::Result;
use crate::op_types::fused::RopeStore;
use crate::sys::kernels::msgl_rope_store_params;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, launch_first, rows_aligned, vec_elems};

/// rope_store.cu's kRopeStoreThreads.
const THREADS: usize = 256;
/// minisgl/rope_row.cuh's kRopeRowUnits: rotated pairs (or lone vectors) per thread.
const UNITS_PER_THREAD: usize = 2;

/// How one launch covers the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RopeStoreShape {
    threads_per_head: usize,
    vectorized: bool,
}

/// The shape for heads of `head_dim` elements of which `rotary_dim` rotate, `vec`
/// elements per 16-byte vector, `aligned` when every row is 16-byte aligned,
/// `rows` (token, head) rows in all, on `sm_count` SMs.
///
/// The rule: the vector path when the rotated half and the rest are whole vectors
/// and the head fits in 32 threads at two units each; then the fewest threads
/// holding the head at two units a thread, doubled (down to one unit a thread)
/// while the 256-thread blocks number fewer than the SMs. Otherwise the scalar
/// path with a full warp per head.
fn rope_store_shape(
    head_dim: usize,
    rotary_dim: usize,
    vec: usize,
    aligned: bool,
    rows: usize,
    sm_count: usize,
) -> RopeStoreShape {
    let half = rotary_dim / 2;
    let units = half / vec + (head_dim - rotary_dim) / vec;
    let vectorized =
        aligned && half.is_multiple_of(vec) && head_dim.is_multiple_of(vec) && units <= 32 * UNITS_PER_THREAD;
    if !vectorized {
        return RopeStoreShape { threads_per_head: 32, vectorized: false };
    }
    let mut g = units.div_ceil(UNITS_PER_THREAD).next_power_of_two().clamp(1, 32);
    while g < 32 && g * 2 <= units.next_power_of_two() && rows.div_ceil(THREADS / g) < sm_count.max(1) {
        g *= 2;
    }
    RopeStoreShape { threads_per_head: g, vectorized: true }
}

/// The kernel parameters of `a` (caches `[num_slots, heads_kv, d]`) on a device of
/// `sm_count` SMs, and the launch's blocks (a group of `threads_per_head` threads
/// per (token, head) row, THREADS a block).
fn params(a: &RopeStore<'_>, sm_count: usize) -> Result<(msgl_rope_store_params, usize)> {
    const OP: &str = "rope_store";
    let [t, hq, d] = a.q.dims::<3>(OP, "q")?;
    let [_, hkv, _] = a.k.dims::<3>(OP, "k")?;
    let [max_positions, rotary_dim] = a.cos_sin.dims::<2>(OP, "cos_sin")?;
    let vec = vec_elems(a.q);
    let mut aligned = [a.q, a.k, a.v, a.k_cache, a.v_cache, a.cos_sin].iter().all(|x| rows_aligned(x, 16));
    if let Some(n) = &a.qk_norm {
        aligned &= rows_aligned(n.q_weight, 16) && rows_aligned(n.k_weight, 16);
    }
    let rows = t * (hq + 2 * hkv);
    let shape = rope_store_shape(d, rotary_dim, vec, aligned, rows, sm_count);
    let blocks = rows.div_ceil(THREADS / shape.threads_per_head);
    let (q_weight, k_weight, eps) = match &a.qk_norm {
        Some(n) => (n.q_weight.device_ptr() as *const _, n.k_weight.device_ptr() as *const _, n.eps),
        None => (std::ptr::null(), std::ptr::null(), 0.0),
    };
    let s = |x: &crate::tensor::Tensor, i: usize| x.strides()[i] as i64;
    let p = msgl_rope_store_params {
        q: a.q.device_ptr() as *mut _,
        k: a.k.device_ptr() as *const _,
        v: a.v.device_ptr() as *const _,
        k_cache: a.k_cache.device_ptr() as *mut _,
        v_cache: a.v_cache.device_ptr() as *mut _,
        positions: a.positions.device_ptr() as *const _,
        out_loc: a.out_loc.device_ptr() as *const _,
        cos_sin: a.cos_sin.device_ptr() as *const f32,
        q_weight,
        k_weight,
        num_tokens: t as i64,
        q_token_stride: s(a.q, 0),
        q_head_stride: s(a.q, 1),
        k_token_stride: s(a.k, 0),
        k_head_stride: s(a.k, 1),
        v_token_stride: s(a.v, 0),
        v_head_stride: s(a.v, 1),
        max_positions: max_positions as i64,
        num_slots: a.k_cache.dim(0) as i64,
        num_q_heads: hq as i32,
        num_kv_heads: hkv as i32,
        head_dim: d as i32,
        rotary_dim: rotary_dim as i32,
        positions_is_64: i32::from(a.positions.dtype() == DType::I64),
        out_loc_is_64: i32::from(a.out_loc.dtype() == DType::I64),
        threads_per_head: shape.threads_per_head as i32,
        vectorized: i32::from(shape.vectorized),
        eps,
        // Decode-sized launches only (one wave): rope_store's successor is the
        // decode attention, whose pre-wait part reads only the block table, the
        // lengths and earlier steps' keys (device.cuh).
        launch_first: i32::from(launch_first(blocks, sm_count)),
    };
    Ok((p, blocks))
}

/// The parameters of the decode attention's fused prologue for `a` (caches
/// `[num_slots, heads_kv, d]`, validated by `ops::rope_store`'s checks): rope_store's
/// own, with the group width a rope_store launch of the same rows would take (so
/// the bits match), or `None` when the heads need the scalar path, which the fused
/// prologue does not have.
pub(crate) fn fused_prologue(a: &RopeStore<'_>, sm_count: usize) -> Result<Option<msgl_rope_store_params>> {
    let (p, _) = params(a, sm_count)?;
    Ok((p.vectorized != 0).then_some(p))
}

/// Runs the fused kernel; `a` was validated by `ops::rope_store` (caches already
/// `[num_slots, heads_kv, d]`, at least one token and one kv head).
pub(crate) fn rope_store(a: &RopeStore<'_>) -> crate::error::Result<()> {
    const OP: &str = "rope_store";
    let dev = device_of(OP, a.q)?;
    let (p, blocks) = params(a, dev.sm_count().max(1) as usize)?;
    let shape = RopeStoreShape { threads_per_head: p.threads_per_head as usize, vectorized: p.vectorized != 0 };
    let grid = grid_u32(OP, blocks)?;
    let eps = p.eps;
    let views = [
        a.q.abi(),
        a.k.abi(),
        a.v.abi(),
        a.k_cache.abi(),
        a.v_cache.abi(),
        a.positions.abi(),
        a.out_loc.abi(),
        a.cos_sin.abi(),
    ];
    let weights = a.qk_norm.as_ref().map(|n| (n.q_weight.abi(), n.k_weight.abi()));
    let (qw, kw) = match &weights {
        Some((q, k)) => (q as *const _, k as *const _),
        None => (std::ptr::null(), std::ptr::null()),
    };
    let result: Result<()> = dispatch(
        OP,
        dev,
        "rope_store",
        &[("DTYPE", dtype_code(a.q))],
        |lib, stream| {
            let [q, k, v, kc, vc, pos, loc, cs] = &views;
            // SAFETY: the views describe live device tensors checked by the op (the
            // weight views, when given, live in `weights` until after the call); the
            // launcher validates them again and only enqueues work on `stream`.
            unsafe {
                lib.msgl_rope_store(
                    q,
                    k,
                    v,
                    kc,
                    vc,
                    pos,
                    loc,
                    cs,
                    qw,
                    kw,
                    eps,
                    shape.threads_per_head as i32,
                    i32::from(shape.vectorized),
                    p.launch_first,
                    stream,
                )
            }
        },
        |f| {
            // SAFETY: `p` is the msgl_rope_store_params the entry takes, filled from
            // the tensors checked by the op (alignment checked above for the vector
            // path; the slot bound is the cache's row count).
            unsafe { f.launch(dev, grid, THREADS as u32, 0, &p) }
        },
    );
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_fit_in_registers_and_spread_over_the_sms() {
        // Qwen3-0.6B decode, 64 tokens x (16 + 2 x 8) heads of 128 bf16: 8 units,
        // 4 threads would give 32 blocks; widened to 8 threads, 64 blocks.
        assert_eq!(
            rope_store_shape(128, 128, 8, true, 64 * 32, 132),
            RopeStoreShape { threads_per_head: 8, vectorized: true }
        );
        // Prefill: the fewest threads.
        assert_eq!(
            rope_store_shape(128, 128, 8, true, 1 << 20, 132),
            RopeStoreShape { threads_per_head: 4, vectorized: true }
        );
        // head_dim 256 f32 (4 per vector): 32 units -> 16 threads at two units.
        assert_eq!(
            rope_store_shape(256, 256, 4, true, 1 << 20, 132),
            RopeStoreShape { threads_per_head: 16, vectorized: true }
        );
        // Partial rotary 64 of 128 bf16: 4 pairs + 8 lone vectors = 12 units.
        assert_eq!(rope_store_shape(128, 64, 8, true, 1 << 20, 132).threads_per_head, 8);
        // Halves that are not whole vectors, unaligned views, heads too wide: scalar.
        assert!(!rope_store_shape(128, 24, 8, true, 64, 132).vectorized);
        assert!(!rope_store_shape(128, 128, 8, false, 64, 132).vectorized);
        assert!(!rope_store_shape(2048, 2048, 8, true, 64, 132).vectorized);
        for d in [8, 64, 80, 128, 256, 512] {
            for vec in [4, 8] {
                for rows in [1, 3, 64, 1000, 1 << 20] {
                    let s = rope_store_shape(d, d, vec, true, rows, 132);
                    assert!(s.threads_per_head.is_power_of_two() && s.threads_per_head <= 32);
                    if s.vectorized {
                        assert!(d / vec / 2 <= s.threads_per_head * UNITS_PER_THREAD, "{d} {vec} {s:?}");
                    }
                }
            }
        }
    }
}
