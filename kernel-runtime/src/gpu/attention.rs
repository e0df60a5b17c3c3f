//! Paged attention on CUDA: the FlashAttention-2 style tile kernel
//! (csrc/kernels/attention.cu) for prefill (ragged, causal, cached prefix) and
//! mixed steps, and the decode kernel (csrc/kernels/decode_attention.cu) for steps
//! of at most 8 query rows per (sequence, kv head); both split the keys when the
//! batch alone would not fill the GPU, and share the combine phase.
//!
//! Batches of long query runs go to a third kernel, csrc/kernels/prefill_attention.cu
//! (gpu/prefill.rs, which holds its rule). Otherwise, which kernel: [`decode_rows`]. The decode kernel has a tensor-core block for
//! bf16/f16 (up to 16 query rows per kv head: the GQA group times the new tokens)
//! and CUDA-core blocks (f32, or `MINISGL_DECODE_MMA=0`; up to 8 rows held in
//! registers); both need a power-of-two head dimension. `AttnKernel::Auto` takes
//! the decode kernel wherever it applies.
//!
//! The decode plan (gpu/decode_plan.rs, tuned at run time by
//! `MINISGL_DECODE_*`: [`DecodeTuning`]): a block per (sequence, kv head, split).
//! When the unsplit blocks already make `unsplit_waves` waves of resident blocks,
//! no split (no partials, no combine). Otherwise the `waves` plan cuts keys into
//! chunks of equal size (a multiple of 64, at least `chunk_min`) so that the whole
//! batch makes about `split_waves` waves, and the `keys` plan prices split sizes
//! and cuts each sequence into equal splits of at most the cheapest. The splits
//! are merged by the decode launch itself: the last block of each (sequence, kv
//! head) to finish merges them, counted in a persistent per-device buffer of
//! zeros ([`split_counters`], which the kernel leaves zero, so graphs replay it as
//! it is) when the tuning's merge says so (`auto`: launches whose busy blocks fit
//! one wave); otherwise, for batches with more (sequence, kv head) pairs than the
//! buffer holds, and for the tile kernel, the combine launch merges them. The
//! tensor-core block's pipeline depth is the tuning's `stages` (instances STAGES
//! 2-4: fewer stages, more resident blocks). With the tuning's `cluster` (off by
//! default: measured slower inside decode steps) the tensor-core block's plans
//! keep at most that many splits, and each (sequence, kv head)'s splits run as one
//! thread-block cluster that merges them through distributed shared memory
//! (decode_attention.cu, MERGE = 2; AOT instances only, the JIT fallback keeps the
//! combine launch, with the same bits).
//!
//! The layer's attention prologue (rope_store: q/k norm, rotary embedding, the
//! store of the new k and v) can run inside a tensor-core decode launch
//! (`ops::rope_store_attention` with `MINISGL_DECODE_FUSED_ROPE=1`, off by default
//! until measured in steps): each block normalises and rotates its own query rows,
//! and the block whose split holds a new key writes that token's k and v rows,
//! with rope_store's row math and group width, so the bits are the two launches'.
//! Steps any other kernel takes run rope_store first.
//!
//! The tile kernel's plan is made here from the host copies of the lengths:
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

use std::sync::{Arc, OnceLock};

use crate::cuda::CudaDevice;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op_types::attention::{AttnKernel, DecodeTuning, PagedAttnMeta};
use crate::op_types::fused::RopeStore;
use crate::sys::kernels::msgl_attention_params;
use crate::tensor::Tensor;

use super::decode_plan;
use super::launch::{device_of, dispatch, dtype_code, grid_u32, persistent_zeros, rows_aligned, Switch};

const OP: &str = "paged_attention";
/// attention.cu's kAttnMaxWarps.
const MAX_WARPS: usize = 4;
/// Blocks per SM the split heuristic aims for (decode blocks are one warp).
const BLOCKS_PER_SM: usize = 4;
/// The fewest keys a split holds (two 64-key tiles).
const MIN_CHUNK: usize = 128;
/// Warps per block of the combine phase.
const COMBINE_WARPS: usize = 4;
/// Query rows the decode kernel's instances hold (decode_attention.cu's ROWS).
const DECODE_ROWS: [usize; 4] = [1, 2, 4, 8];
/// (Sequence, kv head) pairs the split counters of a device cover (256 KiB of
/// int32): a decode launch with more pairs merges its splits in the combine launch.
const SPLIT_COUNTERS: usize = 1 << 16;

/// The split counters of `dev`: [`SPLIT_COUNTERS`] int32 zeros (see
/// `launch::persistent_zeros`; `None` during a capture before they exist: that
/// graph then keeps the combine launch).
fn split_counters(dev: &Arc<CudaDevice>) -> Result<Option<Tensor>> {
    persistent_zeros("decode_attention split counters", dev, SPLIT_COUNTERS)
}

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

fn plan(
    q_lens: &[usize],
    kv_lens: &[usize],
    group: usize,
    num_kv_heads: usize,
    key_tile: usize,
    sms: usize,
) -> AttnPlan {
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

/// The decode kernel instance (query rows per block) for a batch, or `None` when
/// the batch needs the tile kernel. With `tensor_cores` (bf16/f16, unless
/// `MINISGL_DECODE_MMA=0`) the tensor-core block (16 rows) holds up to 16 query
/// rows per kv head (q_len x GQA group); the CUDA-core blocks (1, 2, 4 or 8 rows,
/// the smallest that fits) hold up to 8. Both need a power-of-two head dimension.
pub(crate) fn decode_rows(q_lens: &[usize], group: usize, head_dim: usize, tensor_cores: bool) -> Option<usize> {
    if !(32..=256).contains(&head_dim) || !head_dim.is_power_of_two() {
        return None;
    }
    let rows = q_lens.iter().map(|&q| q * group).max().unwrap_or(0).max(group);
    if tensor_cores {
        return (rows <= 16 && head_dim >= 64).then_some(16);
    }
    DECODE_ROWS.into_iter().find(|&r| r >= rows)
}

/// Whether a decode step (one new token per sequence) of a GQA group of `group`
/// heads fits a decode kernel instance in `dtype`.
pub(crate) fn decode_kernel_fits(dtype: DType, group: usize, head_dim: usize) -> bool {
    let tensor_cores = dtype != DType::F32 && decode_tensor_cores_enabled();
    decode_rows(&[1], group, head_dim, tensor_cores).is_some()
}

/// Whether 16-bit decode uses the tensor-core block (`MINISGL_DECODE_MMA`, default 1).
fn decode_tensor_cores_enabled() -> bool {
    static MMA: OnceLock<bool> = OnceLock::new();
    *MMA.get_or_init(|| std::env::var("MINISGL_DECODE_MMA").map(|v| v.trim() != "0").unwrap_or(true))
}

/// The fixed split count of a decode step that a CUDA graph captures
/// ([`PagedAttnMeta::decode_splits`]): `num_seqs` sequences of up to
/// `max_kv_len` keys. It aims for the tuning's `graph_split_waves` waves (1:
/// the graph launches every split's block whatever the lengths turn out to be,
/// and a block past its sequence's splits, though it returns at once, still
/// costs a block launch; a second wave of longer splits lost to one wave of
/// splits twice as long) as if every sequence were long, and is capped so that a
/// split of the longest sequence still holds `chunk_min` keys; shorter sequences
/// use fewer splits (the rest of their blocks return at once).
pub(crate) fn decode_graph_splits(
    num_seqs: usize,
    num_kv_heads: usize,
    head_dim: usize,
    dtype: DType,
    max_kv_len: usize,
    sms: usize,
) -> usize {
    let tensor_cores = dtype != DType::F32 && decode_tensor_cores_enabled();
    let rows = if tensor_cores { 16 } else { DECODE_ROWS[DECODE_ROWS.len() - 1] };
    let tuning = decode_plan::tuning();
    let elem = dtype.size_in_bytes();
    let pairs = num_seqs * num_kv_heads;
    let (_, slots) = decode_instance(elem, head_dim, rows, &tuning, sms);
    let splits = decode_plan::graph_splits(pairs, max_kv_len, slots, graph_min_splits(), &tuning);
    if splits <= 1 || rows != 16 {
        return splits;
    }
    // A split graph runs the split instance (graph_instance): its slots.
    let (_, slots) = graph_instance(elem, head_dim, rows, splits, &tuning, sms);
    let splits = decode_plan::graph_splits(pairs, max_kv_len, slots, graph_min_splits(), &tuning).max(2);
    // With the cluster merge on, at most a cluster's worth (each sequence then cut
    // in longer chunks): a cluster holds no more.
    decode_plan::cluster_cap(&tuning, rows).map_or(splits, |cap| splits.min(cap))
}

/// The instance (stages, slots) a graph's decode launch of `splits` fixed
/// splits runs: a split tensor-core launch takes the tuning's `graph_stages`
/// (0: as eager launches without a plan choice), the rest `decode_instance`.
fn graph_instance(
    elem_bytes: usize,
    head_dim: usize,
    rows: usize,
    splits: usize,
    tuning: &DecodeTuning,
    sms: usize,
) -> (usize, usize) {
    if splits > 1 && rows == 16 && tuning.graph_stages > 0 {
        let tuning = DecodeTuning { stages: tuning.graph_stages, ..*tuning };
        return decode_instance(elem_bytes, head_dim, rows, &tuning, sms);
    }
    decode_instance(elem_bytes, head_dim, rows, tuning, sms)
}

/// The pipeline stages (0 for the CUDA-core blocks) and resident block slots of
/// the GPU (blocks an SM times `sms`) of the decode instance for `rows` rows.
fn decode_instance(
    elem_bytes: usize,
    head_dim: usize,
    rows: usize,
    tuning: &DecodeTuning,
    sms: usize,
) -> (usize, usize) {
    let stages = if rows == 16 { decode_plan::mma_stages(elem_bytes, head_dim, tuning.stages) } else { 0 };
    let shared = decode_plan::smem_bytes(elem_bytes, head_dim, rows, stages);
    (stages, decode_plan::blocks_per_sm(rows, shared) * sms.max(1))
}

/// The splits a graph's plan gives every sequence of a batch that fills the GPU
/// anyway (`MINISGL_DECODE_GRAPH_SPLITS`, default 1): cutting each sequence in
/// equal parts shortens the tail of a ragged batch (the last wave waits on the
/// longest sequences) at the cost of the partials and the combine pass.
fn graph_min_splits() -> usize {
    static SPLITS: OnceLock<usize> = OnceLock::new();
    *SPLITS.get_or_init(|| {
        std::env::var("MINISGL_DECODE_GRAPH_SPLITS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(1).clamp(1, 8)
    })
}

/// Whether 16-bit attention uses the tensor cores (`MINISGL_ATTENTION_MMA`, default 1).
fn tensor_cores_enabled() -> bool {
    static MMA: OnceLock<bool> = OnceLock::new();
    *MMA.get_or_init(|| std::env::var("MINISGL_ATTENTION_MMA").map(|v| v.trim() != "0").unwrap_or(true))
}

/// Attention of the new tokens of a batch over the paged caches (see
/// `ops::paged_attention` for the contract, checked there), with the kernel
/// `kernel` asks for.
///
/// With `rope` (the layer's prologue, whose q and caches these are: see
/// `ops::rope_store_attention`), a step the tensor-core decode block takes runs the
/// prologue in its launch when the heads suit rope_store's vector path; any other
/// step runs rope_store first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttnMeta<'_>,
    scale: f32,
    kernel: AttnKernel,
    rope: Option<&RopeStore<'_>>,
) -> Result<()> {
    let [_, hq, d] = q.dims::<3>(OP, "q")?;
    let hkv = k_cache.dim(2);
    if d % 32 != 0 || d > 256 {
        return Err(Error::arg(OP, format!("head dimension {d} is not supported on CUDA (multiples of 32 up to 256)")));
    }
    let tensor_cores = q.dtype() != DType::F32 && decode_tensor_cores_enabled();
    let rows = decode_rows(meta.q_lens_host, hq / hkv, d, tensor_cores);
    // Batches of long query runs: the prefill kernel (prefill::kernel_for's rule).
    let dev = device_of(OP, q)?;
    let (sms, hopper) = (dev.sm_count().max(1) as usize, dev.capability() == (9, 0));
    let kernel = super::prefill::kernel_for(
        kernel,
        q.dtype(),
        d,
        scale,
        rows.is_some(),
        meta.q_lens_host,
        hq / hkv,
        hkv,
        sms,
        hopper,
    );
    // The prologue: fused into a tensor-core decode launch, or rope_store first
    // (before q is copied below: it rotates q in place).
    let decode_mma = matches!((kernel, rows), (AttnKernel::Auto | AttnKernel::Decode, Some(16)));
    let fused = match rope {
        Some(r) if decode_mma && rows_aligned(q, 16) => fused_prologue_params(r, k_cache, sms)?,
        _ => None,
    };
    // Checked before the prologue runs, which writes q and the caches.
    for (name, x) in [("out", out), ("k_cache", k_cache), ("v_cache", v_cache)] {
        if !rows_aligned(x, 16) {
            return Err(Error::arg(OP, format!("argument `{name}` is not 16-byte aligned")));
        }
    }
    if let (Some(r), None) = (rope, &fused) {
        let slots = k_cache.dim(0) * k_cache.dim(1);
        let (kc, vc) = (k_cache.reshape(&[slots, hkv, d])?, v_cache.reshape(&[slots, hkv, d])?);
        super::rope_store(&RopeStore { k_cache: &kc, v_cache: &vc, ..*r })?;
    }
    let q = if rows_aligned(q, 16) { q.clone() } else { q.contiguous()? };
    if let Some(prologue) = fused {
        let rows = rows.unwrap_or(16);
        return decode_attention(out, &q, k_cache, v_cache, meta, scale, rows, Some(prologue));
    }
    match (kernel, rows) {
        (AttnKernel::Prefill, _) => {
            let p = attention_params(out, &q, k_cache, v_cache, meta, scale, 0, 1)?;
            super::prefill::prefill_attention(out, &q, k_cache, v_cache, meta, p)
        }
        (AttnKernel::Tile, _) | (AttnKernel::Auto, None) => tile_attention(out, &q, k_cache, v_cache, meta, scale),
        (AttnKernel::Auto | AttnKernel::Decode, Some(rows)) => {
            decode_attention(out, &q, k_cache, v_cache, meta, scale, rows, None)
        }
        (AttnKernel::Decode, None) => Err(Error::arg(
            "decode_attention",
            format!(
                "the batch has {} query rows per kv head (q_len x GQA group {}) or head dimension {d}: the decode kernel holds at most 8 rows (16 on tensor cores) and power-of-two head dimensions 32..256 (64..256 on tensor cores)",
                meta.q_lens_host.iter().max().copied().unwrap_or(0) * (hq / hkv),
                hq / hkv
            ),
        )),
    }
}

/// The fused prologue's parameters for `r` over the paged caches `k_cache`
/// (`[num_pages, page_size, heads_kv, d]`), or `None` where it cannot run (see
/// rope_store::fused_prologue).
fn fused_prologue_params(
    r: &RopeStore<'_>,
    k_cache: &Tensor,
    sms: usize,
) -> Result<Option<crate::sys::kernels::msgl_rope_store_params>> {
    let [pages, page_size, hkv, d] = k_cache.dims::<4>(OP, "k_cache")?;
    let slots = pages * page_size;
    let (kc, vc) = (r.k_cache.reshape(&[slots, hkv, d])?, r.v_cache.reshape(&[slots, hkv, d])?);
    super::rope_store::fused_prologue(&RopeStore { k_cache: &kc, v_cache: &vc, ..*r }, sms)
}

/// `MINISGL_DECODE_FUSED_ROPE=1`: `ops::rope_store_attention` fuses the prologue
/// into the decode launch (off by default until measured in decode steps,
/// docs/PERF.md).
static FUSED_ROPE: Switch = Switch::off_by_default("MINISGL_DECODE_FUSED_ROPE");

/// See `ops::set_decode_fused_rope`.
pub(crate) fn set_fused_rope(on: Option<bool>) {
    FUSED_ROPE.set(on);
}

/// Whether [`FUSED_ROPE`] is on.
pub(crate) fn fused_rope_enabled() -> bool {
    FUSED_ROPE.get()
}

/// The decode kernel over the batch, with `rows` query rows per block; with
/// `prologue` (the tensor-core block only) the layer's rope_store in the launch.
#[allow(clippy::too_many_arguments)]
fn decode_attention(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttnMeta<'_>,
    scale: f32,
    rows: usize,
    prologue: Option<crate::sys::kernels::msgl_rope_store_params>,
) -> Result<()> {
    const OP: &str = "decode_attention";
    let dev = device_of(OP, q)?;
    let [t, hq, d] = q.dims::<3>(OP, "q")?;
    let hkv = k_cache.dim(2);
    let b = meta.q_lens_host.len();
    let elem = q.dtype().size_in_bytes();
    let sms = dev.sm_count().max(1) as usize;
    let tuning = decode_plan::tuning();
    let rows_per_block = meta.q_lens_host.iter().map(|&q| q * (hq / hkv)).max().unwrap_or(1);
    let partial_bytes = rows_per_block * (d * 4 + 4);
    let (q_lens, kv_lens) = (meta.q_lens_host, meta.kv_lens_host);
    let (stages, slots, plan) = match meta.decode_splits {
        // kv_chunk 0: the kernel cuts each sequence itself (attention_row_chunk).
        Some(splits) => {
            let (stages, slots) = graph_instance(elem, d, rows, splits, &tuning, sms);
            let plan = decode_plan::SplitPlan {
                kv_chunk: 0,
                max_splits: splits.max(1),
                balanced: false,
                busy_blocks: b * hkv * splits.max(1),
            };
            (stages, slots, plan)
        }
        // The tensor-core block: its pipeline depth chosen with the plan, and its
        // splits within the cluster merge's cap.
        None if rows == 16 => {
            let c = decode_plan::eager_choice(q_lens, kv_lens, hkv, elem, d, sms, partial_bytes, &tuning);
            let plan = match decode_plan::cluster_cap(&tuning, rows) {
                Some(cap) => decode_plan::cap_splits(c.plan, q_lens, kv_lens, hkv, cap, &tuning),
                None => c.plan,
            };
            (c.stages, c.slots, plan)
        }
        None => {
            let (stages, slots) = decode_instance(elem, d, rows, &tuning, sms);
            let plan = decode_plan::eager_plan(q_lens, kv_lens, hkv, slots, 2 * d * elem, partial_bytes, &tuning);
            (stages, slots, plan)
        }
    };
    let shared = decode_plan::smem_bytes(elem, d, rows, stages);
    let max_splits = plan.max_splits;
    let grid = grid_u32(OP, b * hkv * max_splits)?;
    let p = attention_params(out, q, k_cache, v_cache, meta, scale, plan.kv_chunk, max_splits)?;
    let scratch = SplitScratch::new(t, hq, max_splits, d, dev.ordinal())?;
    // The cluster merge where the splits fit a cluster (AOT instances only: the
    // JIT fallback below launches the combine phase, whose bits are the same).
    let cluster_merge = prologue.is_none()
        && max_splits > 1
        && decode_plan::cluster_cap(&tuning, rows).is_some_and(|cap| max_splits <= cap);
    let merge =
        decode_plan::merge_in_kernel(tuning.merge, &plan, meta.decode_splits.is_some(), b * hkv, slots, &tuning);
    let counters = if max_splits > 1 && b * hkv <= SPLIT_COUNTERS && merge && !cluster_merge {
        split_counters(dev)?
    } else {
        None
    };
    let p = msgl_attention_params {
        o_partial: scratch.o_ptr(),
        lse_partial: scratch.lse_ptr(),
        split_counters: counters.as_ref().map_or(std::ptr::null_mut(), |c| c.device_ptr() as *mut i32),
        // The tile kernel's fields carry the decode kernel's instance choice:
        // num_warps the tensor-core block's stages, num_q_tiles 1 for the balanced
        // plan (decode_attention.cu: msgl_decode_attention, decode_row_chunk).
        num_warps: stages as i32,
        num_q_tiles: i32::from(plan.balanced),
        rope: prologue.unwrap_or_default(),
        fused_rope: i32::from(prologue.is_some()),
        // The graph plan's equal chunks (kv_chunk 0) hold at least this many keys.
        // (clamped to 1 << 20 by the tuning: fits i32).
        min_chunk: if plan.kv_chunk == 0 { tuning.graph_chunk_min as i32 } else { 0 },
        ..p
    };
    let combine_grid = grid_u32(OP, (t * hq).div_ceil(COMBINE_WARPS))?;
    // The combine launch's successor is the o projection, whose pre-wait part
    // reads only weights (device.cuh: grid_prologue_launch_first).
    let p = msgl_attention_params {
        combine_launch_first: i32::from(super::launch::launch_first(combine_grid as usize, sms)),
        ..p
    };
    let views = [out, q, k_cache, v_cache, meta.q_indptr, meta.kv_lens, meta.block_table].map(Tensor::abi);
    let scratch_views = scratch.views();
    let counters_view = counters.as_ref().map(Tensor::abi);
    let values = [("DTYPE", dtype_code(q)), ("HEAD_DIM", d as i64), ("ROWS", rows as i64), ("STAGES", stages as i64)];
    dispatch(
        OP,
        dev,
        "decode_attention",
        &values,
        |lib, stream| {
            let [o, l] = scratch_views.each_ref().map(|s| s.as_ref().map_or(std::ptr::null(), |x| x as *const _));
            let n = counters_view.as_ref().map_or(std::ptr::null(), |x| x as *const _);
            let [a, b, c, e, f, g, h] = &views;
            // Phase 2 asks the AOT launcher for the cluster merge.
            let p = msgl_attention_params { phase: if cluster_merge { 2 } else { 0 }, ..p };
            // SAFETY: the views describe live device tensors checked by the op (shapes,
            // dtypes, lengths against the block table) and by `paged_attention`
            // (alignment, rows fit the instance); the scratch has the shapes the plan
            // asks for and outlives the enqueued work (stream-ordered allocator); the
            // split counters are this device's zeros, kept for the process, with at
            // least b * hkv entries; the launcher validates again and only enqueues
            // work on `stream`.
            unsafe { lib.msgl_decode_attention(a, b, c, e, f, g, h, o, l, n, &p, rows as i32, stream) }
        },
        |f| {
            let shared = shared as u32;
            f.set_max_dynamic_shared_bytes(dev, shared)?;
            // SAFETY: `p` is the msgl_attention_params the entry takes, filled from the
            // tensors checked by the op, the scratch allocated above and the split
            // counters (zeros of at least b * hkv entries, or null); `shared` is the
            // instance's dynamic shared memory.
            unsafe { f.launch(dev, grid, decode_plan::block_threads(rows, stages), shared, &p) }?;
            // The JIT instance never merges in the attention launch (the merge is
            // an AOT instance of its own: decode_attention.cu, MERGE).
            if max_splits > 1 {
                let p1 = msgl_attention_params { phase: 1, ..p };
                // SAFETY: as above; phase 1 reads the partials phase 0 wrote, in
                // stream order.
                unsafe { f.launch(dev, combine_grid, (32 * COMBINE_WARPS) as u32, 0, &p1) }?;
            }
            Ok(())
        },
    )
}

/// The f32 partial outputs and log2-sum-exps of a split launch (none for one split).
struct SplitScratch {
    o: Option<Tensor>,
    lse: Option<Tensor>,
}

impl SplitScratch {
    fn new(t: usize, hq: usize, max_splits: usize, d: usize, ordinal: usize) -> Result<SplitScratch> {
        if max_splits <= 1 {
            return Ok(SplitScratch { o: None, lse: None });
        }
        let device = Device::Cuda(ordinal);
        Ok(SplitScratch {
            o: Some(Tensor::empty(&[t, hq, max_splits, d], DType::F32, device)?),
            lse: Some(Tensor::empty(&[t, hq, max_splits], DType::F32, device)?),
        })
    }

    fn o_ptr(&self) -> *mut f32 {
        self.o.as_ref().map_or(std::ptr::null_mut(), |x| x.device_ptr() as *mut f32)
    }

    fn lse_ptr(&self) -> *mut f32 {
        self.lse.as_ref().map_or(std::ptr::null_mut(), |x| x.device_ptr() as *mut f32)
    }

    fn views(&self) -> [Option<crate::sys::kernels::msgl_tensor>; 2] {
        [self.o.as_ref().map(Tensor::abi), self.lse.as_ref().map(Tensor::abi)]
    }
}

/// The params both attention kernels take, filled from the checked tensors, with
/// the tile fields (num_warps, num_q_tiles) zero and no scratch pointers.
#[allow(clippy::too_many_arguments)]
fn attention_params(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttnMeta<'_>,
    scale: f32,
    kv_chunk: usize,
    max_splits: usize,
) -> Result<msgl_attention_params> {
    let [t, hq, _] = q.dims::<3>(OP, "q")?;
    let int = |what: &str, v: usize| {
        i32::try_from(v).map_err(|_| Error::arg(OP, format!("{what} {v} exceeds the kernel's 32-bit range")))
    };
    Ok(msgl_attention_params {
        out: out.device_ptr() as *mut _,
        q: q.device_ptr() as *const _,
        k_cache: k_cache.device_ptr() as *const _,
        v_cache: v_cache.device_ptr() as *const _,
        q_indptr: meta.q_indptr.device_ptr() as *const i32,
        kv_lens: meta.kv_lens.device_ptr() as *const i32,
        block_table: meta.block_table.device_ptr() as *const i32,
        o_partial: std::ptr::null_mut(),
        lse_partial: std::ptr::null_mut(),
        split_counters: std::ptr::null_mut(),
        q_token_stride: q.strides()[0] as i64,
        q_head_stride: q.strides()[1] as i64,
        num_tokens: t as i64,
        num_pages: k_cache.dim(0) as i64,
        num_seqs: int("sequence count", meta.q_lens_host.len())?,
        num_q_heads: int("query heads", hq)?,
        num_kv_heads: int("kv heads", k_cache.dim(2))?,
        page_size: int("page size", k_cache.dim(1))?,
        max_pages: int("block table width", meta.block_table.dim(1))?,
        num_warps: 0,
        num_q_tiles: 0,
        kv_chunk: int("kv chunk", kv_chunk)?,
        max_splits: int("split count", max_splits)?,
        phase: 0,
        scale_log2: scale * std::f32::consts::LOG2_E,
        rope: Default::default(),
        fused_rope: 0,
        combine_launch_first: 0,
        min_chunk: 0,
        max_blocks: 0,
    })
}

/// The tile kernel over the batch.
fn tile_attention(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttnMeta<'_>,
    scale: f32,
) -> Result<()> {
    let dev = device_of(OP, q)?;
    let [t, hq, d] = q.dims::<3>(OP, "q")?;
    let hkv = k_cache.dim(2);
    let elem = q.dtype().size_in_bytes();
    let sms = dev.sm_count().max(1) as usize;
    let pl = plan(meta.q_lens_host, meta.kv_lens_host, hq / hkv, hkv, key_tile(elem, d), sms);
    if pl.num_q_tiles == 0 {
        return Ok(());
    }
    let mma = q.dtype() != DType::F32 && tensor_cores_enabled();
    let scratch = SplitScratch::new(t, hq, pl.max_splits, d, dev.ordinal())?;
    let shared = smem_bytes(elem, d, pl.num_warps);
    let grid = grid_u32(OP, pl.num_q_tiles * hkv * pl.max_splits)?;
    let combine_grid = grid_u32(OP, (t * hq).div_ceil(COMBINE_WARPS))?;
    let p = msgl_attention_params {
        o_partial: scratch.o_ptr(),
        lse_partial: scratch.lse_ptr(),
        num_warps: pl.num_warps as i32,
        num_q_tiles: pl.num_q_tiles as i32,
        ..attention_params(out, q, k_cache, v_cache, meta, scale, pl.kv_chunk, pl.max_splits)?
    };
    let views = [out, q, k_cache, v_cache, meta.q_indptr, meta.kv_lens, meta.block_table].map(Tensor::abi);
    let scratch = scratch.views();
    let values = [("DTYPE", dtype_code(q)), ("HEAD_DIM", d as i64), ("MMA", i64::from(mma))];
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

    #[test]
    fn decode_rows_hold_the_gqa_group_times_the_new_tokens() {
        assert_eq!(decode_rows(&[1, 1, 1], 4, 128, false), Some(4));
        assert_eq!(decode_rows(&[1], 1, 64, false), Some(1));
        assert_eq!(decode_rows(&[1, 1], 3, 128, false), Some(4));
        assert_eq!(decode_rows(&[2, 1], 4, 128, false), Some(8));
        assert_eq!(decode_rows(&[1], 8, 256, false), Some(8));
        assert_eq!(decode_rows(&[1, 0], 2, 32, false), Some(2));
        // Too many rows for a block, or a head dimension the kernel does not lay out.
        assert_eq!(decode_rows(&[3, 1], 4, 128, false), None);
        assert_eq!(decode_rows(&[1], 16, 128, false), None);
        assert_eq!(decode_rows(&[1], 4, 96, false), None);
        assert_eq!(decode_rows(&[1], 4, 512, false), None);
        // The tensor-core block: up to 16 rows, head dims 64..256.
        assert_eq!(decode_rows(&[1, 1], 4, 128, true), Some(16));
        assert_eq!(decode_rows(&[4, 1], 4, 128, true), Some(16));
        assert_eq!(decode_rows(&[1], 16, 256, true), Some(16));
        assert_eq!(decode_rows(&[5], 4, 128, true), None);
        assert_eq!(decode_rows(&[1], 4, 32, true), None);
    }

    #[test]
    fn graph_splits_aim_for_one_wave_and_long_batches_do_not_split() {
        let bf = DType::BF16;
        let (_, slots) = decode_instance(2, 128, 16, &DecodeTuning::default(), 132);
        // One sequence, 8 kv heads, up to 40960 keys: one wave of blocks in all.
        let s = decode_graph_splits(1, 8, 128, bf, 40960, 132);
        assert_eq!(s, slots.div_ceil(8));
        // A short model context caps the splits at 128 keys each.
        assert_eq!(decode_graph_splits(1, 8, 128, bf, 1024, 132), 8);
        // 256 sequences x 8 heads already make 4 waves: no split; nor do 64, whose
        // 512 pairs make more than the one wave the plan aims for.
        assert_eq!(decode_graph_splits(256, 8, 128, bf, 40960, 132), 1);
        assert_eq!(decode_graph_splits(64, 8, 128, bf, 40960, 132), 1);
        assert_eq!(decode_graph_splits(16, 8, 128, bf, 40960, 132), slots.div_ceil(128));
        // The split instance's own depth sets the slots it aims for.
        let t = DecodeTuning { graph_stages: 3, ..DecodeTuning::default() };
        let (_, slots3) = graph_instance(2, 128, 16, 2, &t, 132);
        assert!(slots3 < slots);
        assert_eq!(decode_plan::graph_splits(8, 40960, slots3, 1, &t), slots3.div_ceil(8));
    }
}
