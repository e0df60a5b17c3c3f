//! Paged attention on CUDA (csrc/kernels/attention.cu): one FlashAttention-2 style
//! kernel for prefill (ragged, causal, cached prefix) and decode, with split-KV and
//! a combine phase.
//!
//! The plan is made here from the host copies of the lengths:
//! - `num_warps` (16 query rows each): enough for the longest sequence's packed
//!   rows (q_len x GQA group), at most 4, so a decode batch runs 1-warp blocks;
//! - `num_q_tiles`: the q tiles of all sequences (the kernel finds its sequence by a
//!   prefix sum over q_indptr);
//! - `kv_chunk`: when (q tiles x kv heads) would not give every SM four blocks,
//!   the keys are split into chunks of at least 128 so that they do (a batch of
//!   one decoding 4k tokens with 8 kv heads gets 32 splits per kv head), and the
//!   combine phase merges the splits.
//!
//! Products run on the tensor cores for bf16/f16 (instance MMA = 1) and on CUDA
//! cores for f32. `MINISGL_ATTENTION_MMA=0` forces the CUDA-core instance for 16-bit
//! types too (compiled at run time): a fallback and a cross-check of the
//! tensor-core fragments.

use std::sync::OnceLock;

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::PagedAttnMeta;
use crate::sys::kernels::msgl_attention_params;
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, rows_aligned};

const OP: &str = "paged_attention";
/// attention.cu's kAttnMaxWarps.
const MAX_WARPS: usize = 4;
/// Blocks per SM the split heuristic aims for (decode blocks are one warp).
const BLOCKS_PER_SM: usize = 4;
/// The fewest keys a split holds (two 64-key tiles).
const MIN_CHUNK: usize = 128;
/// Warps per block of the combine phase.
const COMBINE_WARPS: usize = 4;

/// Keys per K/V tile: attention.cu's `AttnTile::BN`.
fn key_tile(elem_bytes: usize, head_dim: usize) -> usize {
    if elem_bytes == 2 && head_dim <= 128 {
        64
    } else {
        32
    }
}

/// Dynamic shared memory of a phase-0 block: attention.cu's `attention_smem_bytes`.
fn smem_bytes(elem_bytes: usize, head_dim: usize, num_warps: usize) -> usize {
    (16 * num_warps + 2 * key_tile(elem_bytes, head_dim)) * (head_dim + 16 / elem_bytes) * elem_bytes
}

/// The launch decomposition of one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AttnPlan {
    num_warps: usize,
    num_q_tiles: usize,
    kv_chunk: usize,
    max_splits: usize,
}

fn plan(q_lens: &[usize], kv_lens: &[usize], group: usize, num_kv_heads: usize, key_tile: usize, sms: usize) -> AttnPlan {
    let max_rows = q_lens.iter().map(|&q| q * group).max().unwrap_or(0);
    let num_warps = max_rows.div_ceil(16).clamp(1, MAX_WARPS);
    let rows_per_tile = 16 * num_warps;
    let num_q_tiles: usize = q_lens.iter().map(|&q| (q * group).div_ceil(rows_per_tile)).sum();
    let max_kv = q_lens.iter().zip(kv_lens).filter(|(&q, _)| q > 0).map(|(_, &kv)| kv).max().unwrap_or(0).max(1);
    let blocks = (num_q_tiles * num_kv_heads).max(1);
    let target = BLOCKS_PER_SM * sms.max(1);
    let splits_wanted = if blocks >= target { 1 } else { target.div_ceil(blocks) };
    let kv_chunk = if splits_wanted == 1 {
        max_kv.next_multiple_of(key_tile)
    } else {
        max_kv.div_ceil(splits_wanted).max(MIN_CHUNK).next_multiple_of(key_tile)
    };
    AttnPlan { num_warps, num_q_tiles, kv_chunk, max_splits: max_kv.div_ceil(kv_chunk).max(1) }
}

/// Whether 16-bit attention uses the tensor cores (`MINISGL_ATTENTION_MMA`, default 1).
fn tensor_cores_enabled() -> bool {
    static MMA: OnceLock<bool> = OnceLock::new();
    *MMA.get_or_init(|| std::env::var("MINISGL_ATTENTION_MMA").map(|v| v.trim() != "0").unwrap_or(true))
}

/// Attention of the new tokens of a batch over the paged caches (see
/// `ops::paged_attention` for the contract, checked there).
pub(crate) fn paged_attention(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttnMeta<'_>,
    scale: f32,
) -> Result<()> {
    let dev = device_of(OP, q)?;
    let [t, hq, d] = q.dims::<3>(OP, "q")?;
    let [_, _, hkv, _] = k_cache.dims::<4>(OP, "k_cache")?;
    if d % 32 != 0 || d > 256 {
        return Err(Error::arg(OP, format!("head dimension {d} is not supported on CUDA (multiples of 32 up to 256)")));
    }
    let q = if rows_aligned(q, 16) { q.clone() } else { q.contiguous()? };
    for (name, x) in [("out", out), ("k_cache", k_cache), ("v_cache", v_cache)] {
        if !rows_aligned(x, 16) {
            return Err(Error::arg(OP, format!("argument `{name}` is not 16-byte aligned")));
        }
    }
    let elem = q.dtype().size_in_bytes();
    let sms = dev.sm_count().max(1) as usize;
    let pl = plan(meta.q_lens_host, meta.kv_lens_host, hq / hkv, hkv, key_tile(elem, d), sms);
    if pl.num_q_tiles == 0 {
        return Ok(());
    }
    let mma = q.dtype() != DType::F32 && tensor_cores_enabled();
    let device = Device::Cuda(dev.ordinal());
    let (o_partial, lse_partial) = if pl.max_splits > 1 {
        (
            Some(Tensor::empty(&[t, hq, pl.max_splits, d], DType::F32, device)?),
            Some(Tensor::empty(&[t, hq, pl.max_splits], DType::F32, device)?),
        )
    } else {
        (None, None)
    };
    let shared = smem_bytes(elem, d, pl.num_warps);
    let grid = grid_u32(OP, pl.num_q_tiles * hkv * pl.max_splits)?;
    let combine_grid = grid_u32(OP, (t * hq).div_ceil(COMBINE_WARPS))?;
    let p = msgl_attention_params {
        out: out.device_ptr() as *mut _,
        q: q.device_ptr() as *const _,
        k_cache: k_cache.device_ptr() as *const _,
        v_cache: v_cache.device_ptr() as *const _,
        q_indptr: meta.q_indptr.device_ptr() as *const i32,
        kv_lens: meta.kv_lens.device_ptr() as *const i32,
        block_table: meta.block_table.device_ptr() as *const i32,
        o_partial: o_partial.as_ref().map_or(std::ptr::null_mut(), |x| x.device_ptr() as *mut f32),
        lse_partial: lse_partial.as_ref().map_or(std::ptr::null_mut(), |x| x.device_ptr() as *mut f32),
        q_token_stride: q.strides()[0] as i64,
        q_head_stride: q.strides()[1] as i64,
        num_tokens: t as i64,
        num_pages: k_cache.dim(0) as i64,
        num_seqs: meta.q_lens_host.len() as i32,
        num_q_heads: hq as i32,
        num_kv_heads: hkv as i32,
        page_size: k_cache.dim(1) as i32,
        max_pages: meta.block_table.dim(1) as i32,
        num_warps: pl.num_warps as i32,
        num_q_tiles: pl.num_q_tiles as i32,
        kv_chunk: pl.kv_chunk as i32,
        max_splits: pl.max_splits as i32,
        phase: 0,
        scale_log2: scale * std::f32::consts::LOG2_E,
    };
    let views = [out, &q, k_cache, v_cache, meta.q_indptr, meta.kv_lens, meta.block_table].map(Tensor::abi);
    let scratch = [o_partial.as_ref().map(Tensor::abi), lse_partial.as_ref().map(Tensor::abi)];
    let values = [("DTYPE", dtype_code(&q)), ("HEAD_DIM", d as i64), ("MMA", i64::from(mma))];
    dispatch(
        OP,
        dev,
        "attention",
        &values,
        |lib, stream| {
            let [o, l] = scratch.each_ref().map(|s| s.as_ref().map_or(std::ptr::null(), |x| x as *const _));
            let [a, b, c, e, f, g, h] = &views;
            // SAFETY: the views describe live device tensors checked by the op (shapes,
            // dtypes, lengths against the block table) and above (alignment); the
            // scratch tensors have the shapes the plan asks for and outlive the
            // enqueued work (stream-ordered allocator); the launcher validates again
            // and only enqueues work on `stream`.
            unsafe { lib.msgl_paged_attention(a, b, c, e, f, g, h, o, l, &p, i32::from(mma), stream) }
        },
        |f| {
            f.set_max_dynamic_shared_bytes(dev, shared as u32)?;
            // SAFETY: `p` is the msgl_attention_params the entry takes, filled from the
            // tensors checked by the op and the scratch allocated above; `shared` is
            // the kernel's dynamic shared memory for p.num_warps.
            unsafe { f.launch(dev, grid, (32 * pl.num_warps) as u32, shared as u32, &p) }?;
            if pl.max_splits > 1 {
                let p1 = msgl_attention_params { phase: 1, ..p };
                // SAFETY: as above; phase 1 reads the partials phase 0 wrote, in
                // stream order.
                unsafe { f.launch(dev, combine_grid, (32 * COMBINE_WARPS) as u32, 0, &p1) }?;
            }
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_batches_split_and_prefill_batches_do_not() {
        // One sequence decoding at 4096 tokens, GQA 32/8: 1 warp, 8 blocks without
        // splits -> 66 splits wanted, chunks of 63 raised to the 128 minimum.
        let p = plan(&[1], &[4096], 4, 8, 64, 132);
        assert_eq!((p.num_warps, p.num_q_tiles), (1, 1));
        assert_eq!(p.kv_chunk, 128);
        assert_eq!(p.max_splits, 32);
        // 64 sequences decoding at 2048: 512 blocks, just under 4 per SM -> 2 splits.
        let p = plan(&[1; 64], &[2048; 64], 4, 8, 64, 132);
        assert_eq!((p.kv_chunk, p.max_splits), (1024, 2));
        // A 4096-token prefill: 64-row tiles, plenty of blocks, no split.
        let p = plan(&[4096], &[4096], 4, 8, 64, 132);
        assert_eq!((p.num_warps, p.num_q_tiles, p.max_splits), (4, 256, 1));
        assert!(p.kv_chunk >= 4096);
        // Mixed: a chunk of prefill with a cached prefix, and decodes.
        let p = plan(&[100, 1, 1, 0], &[612, 33, 4000, 5], 1, 8, 64, 132);
        assert_eq!(p.num_warps, 4);
        assert_eq!(p.num_q_tiles, 2 + 1 + 1);
        assert!(p.max_splits >= 1 && p.kv_chunk.is_multiple_of(64) && p.kv_chunk * p.max_splits >= 4000);
        assert_eq!(smem_bytes(2, 128, 4), (64 + 128) * 136 * 2);
        assert_eq!(smem_bytes(4, 256, 4), (64 + 64) * 260 * 4);
    }
}
