//! Paged attention over the KV cache, for prefill (ragged, causal, with a cached
//! prefix) and decode alike.
//!
//! On CUDA three kernels serve the op ([`AttnKernel`]): the FlashAttention-2 tile
//! kernel (any batch), the decode kernel (batches whose sequences have at most 8
//! query rows per kv head: q_len x GQA group) and the prefill kernel (batches of
//! long query runs, bf16/f16). `Auto` takes the decode kernel wherever it applies,
//! the prefill kernel by its rule (gpu/prefill.rs). The CPU reference serves every
//! choice.

use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

pub use crate::op_types::attention::{AttnKernel, DecodePlanKind, DecodeTuning, PagedAttnMeta, SplitMerge};

use super::check::common_device;
use super::fused::{check_rope_store, rope_store, RopeStore};

/// [`paged_attention_with`] with [`AttnKernel::Auto`].
pub fn paged_attention(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttnMeta<'_>,
    scale: f32,
) -> Result<()> {
    paged_attention_with(out, q, k_cache, v_cache, meta, scale, AttnKernel::Auto)
}

/// `out[t, h] = softmax(q[t, h] . K^T * scale + causal mask) V` for every new token t
/// of every sequence, reading K and V from the paged caches.
///
/// `q`: `[t, heads_q, d]` (unit stride in the last dimension, any other strides);
/// caches: `[num_pages, page_size, heads_kv, d]` contiguous; `out`: `[t, heads_q,
/// d]` contiguous (written). `heads_q` must be a multiple of `heads_kv` (GQA). Token
/// j of a sequence with q_len new tokens and kv_len cached tokens sits at position
/// `kv_len - q_len + j` and attends to cache positions `0..=kv_len - q_len + j`.
/// `kernel` picks the CUDA kernel.
pub fn paged_attention_with(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttnMeta<'_>,
    scale: f32,
    kernel: AttnKernel,
) -> Result<()> {
    let device = check_paged_attention(out, q, k_cache, v_cache, meta)?;
    if q.dim(0) == 0 {
        return Ok(());
    }
    match device {
        Device::Cpu => crate::cpu::attention::paged_attention(out, q, k_cache, v_cache, meta, scale),
        Device::Cuda(_) => crate::gpu::paged_attention(out, q, k_cache, v_cache, meta, scale, kernel, None),
    }
}

/// [`rope_store`] then [`paged_attention_with`] over its q and caches, as
/// one op: `rope.k_cache` and `rope.v_cache` are the paged caches `[num_pages,
/// page_size, heads_kv, d]`. On CUDA, with `MINISGL_DECODE_FUSED_ROPE=1` (or
/// [`set_decode_fused_rope`]), a step the tensor-core decode kernel takes runs the
/// prologue inside the attention launch (decode_attention.cu: one launch instead
/// of two, the same bits); everything else runs the two ops. `rope.q` afterwards
/// holds the rotated queries or, after the fused launch, the given ones: callers
/// read `out`, not q.
pub fn rope_store_attention(
    out: &Tensor,
    rope: &RopeStore<'_>,
    meta: &PagedAttnMeta<'_>,
    scale: f32,
    kernel: AttnKernel,
) -> Result<()> {
    if matches!(rope.q.device(), Device::Cuda(_)) && crate::gpu::fused_rope_enabled() {
        // Everything either op checks, before anything runs.
        check_rope_store(rope)?;
        check_paged_attention(out, rope.q, rope.k_cache, rope.v_cache, meta)?;
        if rope.q.dim(0) > 0 && rope.k.dim(1) > 0 {
            return crate::gpu::paged_attention(
                out,
                rope.q,
                rope.k_cache,
                rope.v_cache,
                meta,
                scale,
                kernel,
                Some(rope),
            );
        }
    }
    rope_store(rope)?;
    paged_attention_with(out, rope.q, rope.k_cache, rope.v_cache, meta, scale, kernel)
}

/// Turns the fused prologue of [`rope_store_attention`] on or off (`None`: back
/// to `MINISGL_DECODE_FUSED_ROPE`, off unless set to 1). For A/B runs and tests.
pub fn set_decode_fused_rope(on: Option<bool>) {
    crate::gpu::set_fused_rope(on);
}

/// The checks of [`paged_attention_with`]: the device of the op.
fn check_paged_attention(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttnMeta<'_>,
) -> Result<Device> {
    const OP: &str = "paged_attention";
    let device = common_device(
        OP,
        &[
            ("out", out),
            ("q", q),
            ("k_cache", k_cache),
            ("v_cache", v_cache),
            ("q_indptr", meta.q_indptr),
            ("kv_lens", meta.kv_lens),
            ("block_table", meta.block_table),
        ],
    )?;
    let [t, hq, d] = q.dims::<3>(OP, "q")?;
    let [_pages, _page_size, hkv, dk] = k_cache.dims::<4>(OP, "k_cache")?;
    q.expect_dtype(OP, "q", &[DType::F32, DType::F16, DType::BF16])?;
    for (name, x) in [("k_cache", k_cache), ("v_cache", v_cache), ("out", out)] {
        x.expect_dtype(OP, name, &[q.dtype()])?;
    }
    v_cache.expect_shape(OP, "v_cache", k_cache.shape())?;
    out.expect_shape(OP, "out", &[t, hq, d])?.expect_contiguous(OP, "out")?;
    k_cache.expect_contiguous(OP, "k_cache")?;
    v_cache.expect_contiguous(OP, "v_cache")?;
    if dk != d {
        return Err(Error::arg(OP, format!("argument `k_cache` has head dimension {dk}, `q` has {d}")));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(Error::arg(OP, format!("query heads {hq} are not a multiple of kv heads {hkv}")));
    }
    if q.strides()[2] != 1 {
        return Err(Error::arg(OP, "argument `q` must have unit stride in its last dimension"));
    }
    let b = meta.q_lens_host.len();
    if meta.kv_lens_host.len() != b {
        return Err(Error::arg(OP, format!("{} query lengths but {} kv lengths", b, meta.kv_lens_host.len())));
    }
    meta.q_indptr.expect_dtype(OP, "q_indptr", &[DType::I32])?.expect_shape(OP, "q_indptr", &[b + 1])?;
    meta.kv_lens.expect_dtype(OP, "kv_lens", &[DType::I32])?.expect_shape(OP, "kv_lens", &[b])?;
    let [tb, max_pages] = meta.block_table.dims::<2>(OP, "block_table")?;
    meta.block_table.expect_dtype(OP, "block_table", &[DType::I32])?.expect_contiguous(OP, "block_table")?;
    if tb < b {
        return Err(Error::arg(OP, format!("argument `block_table` has {tb} rows for {b} sequences")));
    }
    let page_size = k_cache.dim(1);
    for (i, (&ql, &kl)) in meta.q_lens_host.iter().zip(meta.kv_lens_host).enumerate() {
        if ql > kl {
            return Err(Error::arg(OP, format!("sequence {i} has {ql} new tokens but only {kl} cached tokens")));
        }
        if kl > max_pages * page_size {
            return Err(Error::arg(
                OP,
                format!("sequence {i} has {kl} tokens but its block table row holds {max_pages} pages of {page_size}"),
            ));
        }
    }
    if meta.q_lens_host.iter().sum::<usize>() != t {
        return Err(Error::arg(
            OP,
            format!("query lengths sum to {}, `q` has {t} rows", meta.q_lens_host.iter().sum::<usize>()),
        ));
    }
    Ok(device)
}

/// Turns off (`Some(false)`) or on the decode kernel's own merge of its splits
/// (the last block of each (sequence, kv head) merges them; off: a second,
/// combine launch does), overriding the tuning's `merge` (`None`: back to it;
/// `MINISGL_DECODE_SPLIT_MERGE`, `auto` unless set). For A/B benchmarks and
/// tests: both give the same bits.
pub fn set_decode_split_merge(on: Option<bool>) {
    crate::gpu::set_split_merge(on);
}

/// Replaces the CUDA decode kernel's tuning (pipeline stages, split plan, merge)
/// for this process (`None`: back to the environment's,
/// [`DecodeTuning::from_env`]): benchmarks sweep variants in one run, tests check
/// each against the reference. [`set_decode_split_merge`] still overrides its merge.
pub fn set_decode_tuning(tuning: Option<DecodeTuning>) {
    crate::gpu::set_decode_tuning(tuning);
}

/// The decode tuning in force (see [`set_decode_tuning`]).
pub fn decode_tuning() -> DecodeTuning {
    crate::gpu::decode_tuning()
}

/// Picks the prefill kernel's tile variant (prefill_attention.cu's tile table),
/// overriding `MINISGL_PREFILL_TILE` (`None`: back to it; 0, the default, when
/// unset). For sweeps in benchmarks and tests; no effect on the CPU.
pub fn set_prefill_tile(tile: Option<usize>) {
    crate::gpu::set_prefill_tile(tile);
}

/// Whether the prefill kernel's warp-specialised tiles find each block's q tile in
/// the batch's ranking sent with the launch (the default) or search the batch
/// layout in memory, as they do for batches of more than 64 prompts. For tests of
/// both paths; no effect on the CPU.
pub fn set_prefill_ranked(on: bool) {
    crate::gpu::set_prefill_ranked(on);
}

/// Caps the blocks of a persistent prefill tile's launch (34..38, 42, 47, 48; `None`:
/// one block an SM), so that tests see a few blocks walk many q tiles (the AOT
/// launcher too, through the plan's `max_blocks`); no effect on the CPU.
pub fn set_prefill_grid_limit(blocks: Option<usize>) {
    crate::gpu::set_prefill_grid_limit(blocks);
}

/// The split count to fix in [`PagedAttnMeta::decode_splits`] for a decode step of
/// `num_seqs` sequences of at most `max_kv_len` keys that a CUDA graph captures on
/// `device` (the launch is then the same for any lengths up to `max_kv_len`); 1
/// on the CPU, which ignores it.
pub fn decode_graph_splits(
    device: Device,
    num_seqs: usize,
    num_kv_heads: usize,
    head_dim: usize,
    dtype: DType,
    max_kv_len: usize,
) -> Result<usize> {
    match device {
        Device::Cpu => Ok(1),
        Device::Cuda(ordinal) => {
            let sms = crate::cuda::device(ordinal)?.sm_count().max(1) as usize;
            Ok(crate::gpu::decode_graph_splits(num_seqs, num_kv_heads, head_dim, dtype, max_kv_len, sms))
        }
    }
}

/// Whether the CUDA decode kernel holds a decode step (one new token per
/// sequence) of a model with these heads in `dtype`, so that the step never falls
/// back to the tile kernel, whose launch depends on the lengths (CUDA graphs need
/// the decode kernel).
pub fn decode_kernel_fits(dtype: DType, num_q_heads: usize, num_kv_heads: usize, head_dim: usize) -> bool {
    num_kv_heads > 0
        && num_q_heads.is_multiple_of(num_kv_heads)
        && crate::gpu::decode_kernel_fits(dtype, num_q_heads / num_kv_heads, head_dim)
}
