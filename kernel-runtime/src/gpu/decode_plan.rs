//! The decode kernel's launch plan (csrc/kernels/decode_attention.cu): how many
//! blocks, how many keys each, which pipeline depth, who merges the splits. Pure
//! functions of the batch's host lengths, the SM count and a [`DecodeTuning`], so
//! they are unit-tested here without a GPU; gpu/attention.rs launches what they say.
//!
//! The tuning is read from the environment once ([`DecodeTuning::from_env`]) and
//! can be replaced for the process ([`set_tuning`]), so one benchmark run sweeps
//! pipeline depths and plans.
//!
//! Two eager plans ([`DecodePlanKind`]):
//! - `Waves` (the default, as measured so far): one chunk size for the batch so
//!   that the blocks make about `split_waves` waves; no split when the unsplit
//!   blocks already make `unsplit_waves`.
//! - `Keys`: candidate split sizes are priced with a small model (whole waves of
//!   blocks of the mean size, half the spread between the largest block and the
//!   mean for the tail, a fixed cost per block for its pipeline fill and merge,
//!   and the merge of split partials), and every sequence is cut into equal
//!   splits of at most the cheapest size (the kernel's balanced mode), so a
//!   ragged batch has no short tail splits and its short sequences are not split.
//!   At b=64 ctx=2048 on 132 SMs it picks no split (two even waves); at b=1
//!   ctx=4096 splits of 128-256 keys in one wave.
//!
//! With the keys plan an eager step of the tensor-core block at head dim 128 also
//! picks its pipeline depth ([`eager_choice`]): the keys plan of 2 stages (3
//! blocks an SM) and of 3 stages (2 blocks), priced by a fitted model of waves and
//! per-block bandwidth ([`launch_price`]). Graph steps keep the default depth
//! (their lengths are unknown at capture; ragged batches favour 2 stages).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::op_types::attention::{DecodePlanKind, DecodeTuning, SplitMerge};

/// Decode split granule, in keys (a multiple of every instance's keys per
/// iteration; the kernel's balanced chunks and the graph plan round to it too).
pub(super) const CHUNK_GRANULE: usize = 64;
/// The largest dynamic shared memory of a block on sm_90 (227 KiB).
const MAX_SMEM: usize = 232_448;
/// HBM bandwidth the keys plan prices reads at, bytes per microsecond (H200:
/// 4.1-4.25 TB/s measured copies).
const HBM_BYTES_PER_US: f64 = 4.0e6;
/// The most one block reads per microsecond when few blocks share the GPU: about
/// an SM's share of the bandwidth (4 TB/s over 132 SMs; its pipeline's 70 KB in
/// flight over a loaded memory latency of 2 us is not much more), so that a
/// launch of fewer blocks than SMs is priced as the SMs it leaves idle.
const BLOCK_BYTES_PER_US: f64 = 3.2e4;
/// Split counts the keys plan prices (chunks of ceil(max_kv / s), down to the
/// minimum chunk).
const SPLIT_CANDIDATES: [usize; 20] = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256];

static OVERRIDE: Mutex<Option<DecodeTuning>> = Mutex::new(None);
/// `set_split_merge`'s override of the tuning's merge: 0 none, 1 on, 2 off.
static MERGE_OVERRIDE: AtomicU8 = AtomicU8::new(0);

/// The tuning in force: [`set_tuning`]'s, else the environment's.
pub(crate) fn tuning() -> DecodeTuning {
    static ENV: OnceLock<DecodeTuning> = OnceLock::new();
    let base = OVERRIDE.lock().ok().and_then(|g| *g).unwrap_or_else(|| *ENV.get_or_init(DecodeTuning::from_env));
    match MERGE_OVERRIDE.load(Ordering::Relaxed) {
        1 => DecodeTuning { merge: SplitMerge::Always, ..base },
        2 => DecodeTuning { merge: SplitMerge::Never, ..base },
        _ => base,
    }
}

/// Replaces the environment's tuning for this process (`None`: back to it).
pub(crate) fn set_tuning(t: Option<DecodeTuning>) {
    if let Ok(mut g) = OVERRIDE.lock() {
        *g = t;
    }
}

/// Forces the split merge on or off whatever the tuning says (`None`: back to it).
pub(crate) fn set_split_merge(on: Option<bool>) {
    MERGE_OVERRIDE.store(on.map_or(0, |on| if on { 1 } else { 2 }), Ordering::Relaxed);
}

/// The tensor-core block's default stages: decode_attention.cu's
/// `mma_decode_default_stages`.
///
/// At head dim 128 two stages (three blocks an SM) beat three (two blocks) at
/// batch 256 (3.91 against 3.68 TB/s) and on ragged contexts (3.23 against 2.99
/// TB/s with the keys plan), and lost only at batch 64 x 2048 (3.48 against 3.66):
/// docs/PERF.md, fifth session, call 2.
fn default_stages(head_dim: usize) -> usize {
    if head_dim <= 64 {
        4
    } else {
        2
    }
}

/// The tensor-core block's shared memory at `stages`: `MmaDecode::kSmemBytes` (Q
/// and per warp `stages` tiles of 16 keys of K and V, rows padded by 16 bytes;
/// the warps' merge reuses it).
fn mma_smem_bytes(elem_bytes: usize, head_dim: usize, stages: usize) -> usize {
    let row = head_dim * elem_bytes + 16;
    let (warps, stages) = if stages == THREE_WARP_STAGES { (3, 2) } else { (4, stages) };
    (16 * row + warps * stages * 2 * 16 * row).max(warps * 16 * head_dim * 4)
}

/// The `stages` value of the three-warp tensor-core block (decode_attention.cu's
/// `kDecodeThreeWarpStages`): two stages in three warps, a quarter less shared
/// memory than four, so four blocks an SM at head dim 128 where the four-warp
/// block fits three, with the same warps and bytes in flight an SM. A batch of
/// 64 sequences x 8 kv heads is then one wave of 528 blocks.
pub(crate) const THREE_WARP_STAGES: usize = 1;

/// Threads of a decode block: 96 for the three-warp tensor-core block, else 128.
pub(crate) fn block_threads(rows: usize, stages: usize) -> u32 {
    if rows == 16 && stages == THREE_WARP_STAGES {
        96
    } else {
        128
    }
}

/// The pipeline stages the tensor-core block runs with for `requested` (0: the
/// default): 2 to 4, fewer while the shared memory would not fit a block.
pub(crate) fn mma_stages(elem_bytes: usize, head_dim: usize, requested: usize) -> usize {
    if requested == THREE_WARP_STAGES {
        return THREE_WARP_STAGES;
    }
    let mut s = if requested == 0 { default_stages(head_dim) } else { requested.clamp(2, 4) };
    while s > 2 && mma_smem_bytes(elem_bytes, head_dim, s) > MAX_SMEM {
        s -= 1;
    }
    s
}

/// Dynamic shared memory of a decode block: decode_attention.cu's
/// `decode_smem_bytes` (`stages` for the tensor-core block, rows 16; the
/// CUDA-core blocks' `DecodeLayout::kSmemBytes`: their cp.async pipeline, reused
/// by the warps' merge).
pub(crate) fn smem_bytes(elem_bytes: usize, head_dim: usize, rows: usize, stages: usize) -> usize {
    if rows == 16 {
        return mma_smem_bytes(elem_bytes, head_dim, stages);
    }
    let threads = 128;
    let lanes = (head_dim * elem_bytes / 16).min(32);
    let vecs = (head_dim / lanes) * elem_bytes / 16;
    let unroll = if rows <= 4 { 4 } else { 2 };
    let stage = threads * unroll * vecs * 2 * 16;
    let stages = (65536 / stage).clamp(2, 4);
    (stages * stage).max(4 * rows * head_dim * 4)
}

/// Decode blocks resident per SM: the shared memory bounds it (228 KiB an SM, 1
/// KiB of it reserved per block); at most 4 for the tensor-core block (its
/// `__launch_bounds__` minimum, `mma_decode_blocks_per_sm`, keeps the registers
/// within that) and 3 for the CUDA-core blocks.
pub(crate) fn blocks_per_sm(rows: usize, smem_bytes: usize) -> usize {
    (233_472 / (smem_bytes + 1024).max(1)).clamp(1, if rows == 16 { 4 } else { 3 })
}

/// A decode launch's split plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SplitPlan {
    /// Keys per split (the largest split when `balanced`); 0: the graph plan
    /// (each sequence cut on the device into at most `max_splits` chunks).
    pub kv_chunk: usize,
    /// Splits of the longest sequence (the grid's split dimension).
    pub max_splits: usize,
    /// Every sequence cut into equal splits of at most `kv_chunk` keys.
    pub balanced: bool,
    /// Blocks that have keys to read (the rest of the grid returns at once).
    pub busy_blocks: usize,
}

impl SplitPlan {
    fn unsplit(max_kv: usize, busy_blocks: usize) -> SplitPlan {
        SplitPlan { kv_chunk: max_kv, max_splits: 1, balanced: false, busy_blocks }
    }
}

/// The kv lengths of the sequences that have new tokens.
fn active<'a>(q_lens: &'a [usize], kv_lens: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
    q_lens.iter().zip(kv_lens).filter(|(&q, _)| q > 0).map(|(_, &kv)| kv)
}

/// Splits of a sequence of `kv` keys at chunks of `chunk` (the kernel's
/// attention_num_splits).
fn splits_of(kv: usize, chunk: usize) -> usize {
    if kv > chunk {
        kv.div_ceil(chunk)
    } else {
        1
    }
}

/// The `Waves` plan (see the module header): `slots` resident blocks on the GPU.
pub(crate) fn waves_plan(
    q_lens: &[usize],
    kv_lens: &[usize],
    num_kv_heads: usize,
    slots: usize,
    t: &DecodeTuning,
) -> SplitPlan {
    let max_kv = active(q_lens, kv_lens).max().unwrap_or(0).max(1);
    let slots = slots.max(1);
    let unsplit = active(q_lens, kv_lens).count() * num_kv_heads;
    if unsplit >= t.unsplit_waves * slots {
        return SplitPlan::unsplit(max_kv, unsplit);
    }
    let keys: usize = active(q_lens, kv_lens).sum::<usize>() * num_kv_heads;
    let chunk = keys.div_ceil(t.split_waves * slots).next_multiple_of(CHUNK_GRANULE).max(t.chunk_min);
    if chunk >= max_kv {
        return SplitPlan::unsplit(max_kv, unsplit);
    }
    let busy = active(q_lens, kv_lens).map(|kv| splits_of(kv, chunk)).sum::<usize>() * num_kv_heads;
    SplitPlan { kv_chunk: chunk, max_splits: max_kv.div_ceil(chunk), balanced: false, busy_blocks: busy }
}

/// The `Keys` plan (see the module header). `key_bytes`: K and V bytes of one
/// key of one kv head; `partial_bytes`: the f32 partial rows (and log2-sum-exps)
/// one split block writes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn keys_plan(
    q_lens: &[usize],
    kv_lens: &[usize],
    num_kv_heads: usize,
    slots: usize,
    key_bytes: usize,
    partial_bytes: usize,
    t: &DecodeTuning,
) -> SplitPlan {
    let lens: Vec<usize> = active(q_lens, kv_lens).collect();
    let max_kv = lens.iter().copied().max().unwrap_or(0).max(1);
    let slots = slots.max(1);
    let hkv = num_kv_heads.max(1);
    let unsplit = lens.len() * hkv;
    if unsplit >= t.unsplit_waves * slots || max_kv <= t.chunk_min || lens.is_empty() {
        return SplitPlan::unsplit(max_kv, unsplit);
    }
    let keys = lens.iter().sum::<usize>().max(1) * hkv;
    // Estimated microseconds of the launch (and the merge) at splits of `chunk`
    // keys, and its busy blocks.
    let price = |chunk: usize| -> (f64, usize) {
        let (mut blocks, mut largest) = (0usize, 0f64);
        for &kv in &lens {
            let n = splits_of(kv, chunk);
            blocks += n;
            largest = largest.max(kv as f64 / n as f64);
        }
        let blocks = blocks * hkv;
        let mean = keys as f64 / blocks as f64;
        let waves = blocks.div_ceil(slots) as f64;
        let rate = (HBM_BYTES_PER_US / blocks.min(slots) as f64).min(BLOCK_BYTES_PER_US);
        let key_us = key_bytes as f64 / rate;
        let mut us = waves * (mean * key_us + t.block_us) + 0.5 * (largest - mean) * key_us;
        if blocks > unsplit {
            us += t.combine_us + 2.0 * (blocks * partial_bytes) as f64 / HBM_BYTES_PER_US;
        }
        (us, blocks)
    };
    let (mut best_us, mut best) = (price(max_kv).0, SplitPlan::unsplit(max_kv, unsplit));
    for s in SPLIT_CANDIDATES.into_iter().skip(1) {
        let chunk = max_kv.div_ceil(s).next_multiple_of(CHUNK_GRANULE).max(t.chunk_min);
        if chunk < max_kv {
            let (us, blocks) = price(chunk);
            // A cheaper plan must win by a margin: fewer splits on a near tie.
            if us < best_us * 0.995 {
                best_us = us;
                best = SplitPlan {
                    kv_chunk: chunk,
                    max_splits: max_kv.div_ceil(chunk),
                    balanced: true,
                    busy_blocks: blocks,
                };
            }
        }
        if chunk <= t.chunk_min {
            break;
        }
    }
    best
}

/// The keys plan of the last batch this thread planned, with its inputs: a
/// decode step plans the same batch once per layer.
type KeysPlanCache = Option<(Vec<usize>, Vec<usize>, [usize; 4], DecodeTuningKey, SplitPlan)>;

/// The tuning's fields the keys plan reads, comparable exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DecodeTuningKey([u64; 4]);

impl DecodeTuningKey {
    fn of(t: &DecodeTuning) -> DecodeTuningKey {
        DecodeTuningKey([t.unsplit_waves as u64, t.chunk_min as u64, t.block_us.to_bits(), t.combine_us.to_bits()])
    }
}

/// [`keys_plan`], remembered for the next call with the same inputs.
pub(crate) fn keys_plan_cached(
    q_lens: &[usize],
    kv_lens: &[usize],
    num_kv_heads: usize,
    slots: usize,
    key_bytes: usize,
    partial_bytes: usize,
    t: &DecodeTuning,
) -> SplitPlan {
    thread_local! {
        static LAST: RefCell<KeysPlanCache> = const { RefCell::new(None) };
    }
    let dims = [num_kv_heads, slots, key_bytes, partial_bytes];
    let key = DecodeTuningKey::of(t);
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((q, kv, d, k, plan)) = last.as_ref() {
            if q.as_slice() == q_lens && kv.as_slice() == kv_lens && *d == dims && *k == key {
                return *plan;
            }
        }
        let plan = keys_plan(q_lens, kv_lens, num_kv_heads, slots, key_bytes, partial_bytes, t);
        *last = Some((q_lens.to_vec(), kv_lens.to_vec(), dims, key, plan));
        plan
    })
}

/// The most splits the cluster merge takes (decode_attention.cu:
/// kDecodeMaxClusterSplits; sm_90's largest, non-portable, cluster).
pub(crate) const MAX_CLUSTER_SPLITS: usize = 16;

/// The split cap of the cluster merge for a launch of `rows`-row blocks: the
/// tuning's `cluster` for the tensor-core block (rows 16) when it is on, else
/// `None` (no cap; the combine launch or the counters merge).
pub(crate) fn cluster_cap(t: &DecodeTuning, rows: usize) -> Option<usize> {
    (rows == 16 && t.cluster >= 2).then_some(t.cluster.min(MAX_CLUSTER_SPLITS))
}

/// `plan` with at most `cap` splits for the longest sequence: the chunk grows
/// to ceil(longest / cap) keys (a multiple of [`CHUNK_GRANULE`], at least the
/// tuning's minimum), cut the same way as before (balanced or not); a plan
/// already within the cap is returned as it is.
pub(crate) fn cap_splits(
    plan: SplitPlan,
    q_lens: &[usize],
    kv_lens: &[usize],
    num_kv_heads: usize,
    cap: usize,
    t: &DecodeTuning,
) -> SplitPlan {
    if plan.max_splits <= cap.max(1) {
        return plan;
    }
    let max_kv = active(q_lens, kv_lens).max().unwrap_or(0).max(1);
    let chunk = max_kv.div_ceil(cap.max(1)).next_multiple_of(CHUNK_GRANULE).max(t.chunk_min);
    let pairs = active(q_lens, kv_lens).count() * num_kv_heads;
    if chunk >= max_kv {
        return SplitPlan::unsplit(max_kv, pairs);
    }
    let busy = active(q_lens, kv_lens).map(|kv| splits_of(kv, chunk)).sum::<usize>() * num_kv_heads;
    SplitPlan { kv_chunk: chunk, max_splits: max_kv.div_ceil(chunk), balanced: plan.balanced, busy_blocks: busy }
}

/// The eager plan the tuning asks for.
#[allow(clippy::too_many_arguments)]
pub(crate) fn eager_plan(
    q_lens: &[usize],
    kv_lens: &[usize],
    num_kv_heads: usize,
    slots: usize,
    key_bytes: usize,
    partial_bytes: usize,
    t: &DecodeTuning,
) -> SplitPlan {
    match t.plan {
        DecodePlanKind::Waves => waves_plan(q_lens, kv_lens, num_kv_heads, slots, t),
        DecodePlanKind::Keys => keys_plan_cached(q_lens, kv_lens, num_kv_heads, slots, key_bytes, partial_bytes, t),
    }
}

/// What one tensor-core instance sustains, for [`launch_price`]: fitted to the
/// keys plan's launches at 2 and 3 stages over 17 batches (benches/attention.rs
/// `decode-sweep`, docs/PERF.md, seventh session, call 1; 5% rms error).
#[derive(Debug, Clone, Copy, PartialEq)]
struct InstanceRates {
    /// HBM bytes per microsecond with every slot busy.
    hbm_bytes_per_us: f64,
    /// The most one block reads per microsecond (its pipeline's bytes in flight
    /// over the memory latency): what a launch of few blocks gets.
    block_bytes_per_us: f64,
    /// Microseconds a wave of blocks spends filling its pipelines and merging.
    wave_us: f64,
}

/// Rates of the instances eager steps choose between (head dim 128, 16-bit): two
/// stages (three blocks an SM) stream best with every slot busy; three (two
/// blocks an SM, twice the keys in flight a warp) fill better the grids whose
/// blocks make a fraction of a wave on 396 slots (b = 32 or 64 at 8 kv heads).
fn instance_rates(stages: usize) -> InstanceRates {
    match stages {
        2 => InstanceRates { hbm_bytes_per_us: 3.9e6, block_bytes_per_us: 2.0e4, wave_us: 2.0 },
        _ => InstanceRates { hbm_bytes_per_us: 4.1e6, block_bytes_per_us: 2.0e4, wave_us: 5.0 },
    }
}

/// The split merge's cost in [`launch_price`]: partials written and read, and
/// the combine launch (fitted with [`instance_rates`]).
const PRICE_COMBINE_US: f64 = 6.0;

/// Estimated microseconds of a launch of `plan` on `slots` resident blocks: whole
/// waves at the instance's HBM rate; a launch of at most one wave and its partial
/// last wave at what their blocks can pull (`block_bytes_per_us` each, at most the
/// HBM rate), since they start together (from two waves on, blocks finish at
/// staggered times and the last wave overlaps the others); half the spread between
/// the largest block and the mean at a block's rate (ragged batches); the merge of
/// split partials.
fn launch_price(
    lens: &[usize],
    num_kv_heads: usize,
    slots: usize,
    key_bytes: usize,
    partial_bytes: usize,
    plan: &SplitPlan,
    r: InstanceRates,
) -> f64 {
    let chunk = plan.kv_chunk.max(1);
    let (mut blocks, mut largest) = (0usize, 0f64);
    for &kv in lens {
        let n = splits_of(kv, chunk);
        blocks += n;
        largest = largest.max(kv as f64 / n as f64);
    }
    let blocks = (blocks * num_kv_heads.max(1)).max(1);
    let keys = lens.iter().sum::<usize>() * num_kv_heads.max(1);
    let mean = keys as f64 / blocks as f64;
    let block_bytes = mean * key_bytes as f64;
    let slots = slots.max(1);
    let (full, rest) = (blocks / slots, blocks % slots);
    let rate_of = |n: usize| r.hbm_bytes_per_us.min(n as f64 * r.block_bytes_per_us);
    let mut us = if full >= 2 {
        blocks as f64 * block_bytes / r.hbm_bytes_per_us + (full + usize::from(rest > 0)) as f64 * r.wave_us
    } else {
        let mut us = full as f64 * (slots as f64 * block_bytes / rate_of(slots) + r.wave_us);
        if rest > 0 {
            us += rest as f64 * block_bytes / rate_of(rest) + r.wave_us;
        }
        us
    };
    us += 0.5 * (largest - mean) * key_bytes as f64 / r.block_bytes_per_us;
    if blocks > lens.len() * num_kv_heads.max(1) {
        us += PRICE_COMBINE_US + 2.0 * (blocks * partial_bytes) as f64 / r.hbm_bytes_per_us;
    }
    us
}

/// An eager decode launch: the tensor-core block's pipeline stages, its resident
/// block slots on the GPU, and the split plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EagerChoice {
    pub stages: usize,
    pub slots: usize,
    pub plan: SplitPlan,
}

/// The eager launch of the tensor-core block for a batch: with the keys plan, the
/// default stages (`tuning.stages` 0) and head dim 128 in a 16-bit dtype, the
/// keys plan of 2 and of 3 stages, whichever [`launch_price`] makes cheaper (each
/// instance's own split plan); otherwise the one instance `stages` gives (its
/// slots from `slots_of`).
///
/// Remembered for the next call with the same inputs, as [`keys_plan_cached`]: a
/// decode step asks once per layer.
#[allow(clippy::too_many_arguments)]
pub(crate) fn eager_choice(
    q_lens: &[usize],
    kv_lens: &[usize],
    num_kv_heads: usize,
    elem_bytes: usize,
    head_dim: usize,
    sms: usize,
    partial_bytes: usize,
    t: &DecodeTuning,
) -> EagerChoice {
    type Last = Option<(Vec<usize>, Vec<usize>, [usize; 5], DecodeTuning, EagerChoice)>;
    thread_local! {
        static LAST: RefCell<Last> = const { RefCell::new(None) };
    }
    let dims = [num_kv_heads, elem_bytes, head_dim, sms, partial_bytes];
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((q, kv, d, tuning, choice)) = last.as_ref() {
            if q.as_slice() == q_lens && kv.as_slice() == kv_lens && *d == dims && tuning == t {
                return *choice;
            }
        }
        let choice = eager_choice_uncached(q_lens, kv_lens, num_kv_heads, elem_bytes, head_dim, sms, partial_bytes, t);
        *last = Some((q_lens.to_vec(), kv_lens.to_vec(), dims, *t, choice));
        choice
    })
}

#[allow(clippy::too_many_arguments)]
fn eager_choice_uncached(
    q_lens: &[usize],
    kv_lens: &[usize],
    num_kv_heads: usize,
    elem_bytes: usize,
    head_dim: usize,
    sms: usize,
    partial_bytes: usize,
    t: &DecodeTuning,
) -> EagerChoice {
    let key_bytes = 2 * head_dim * elem_bytes;
    let slots_of = |stages: usize| blocks_per_sm(16, mma_smem_bytes(elem_bytes, head_dim, stages)) * sms.max(1);
    let one = |stages: usize| {
        let slots = slots_of(stages);
        let plan = eager_plan(q_lens, kv_lens, num_kv_heads, slots, key_bytes, partial_bytes, t);
        EagerChoice { stages, slots, plan }
    };
    let choose = t.stages == 0 && t.plan == DecodePlanKind::Keys && head_dim == 128 && elem_bytes == 2;
    if !choose {
        return one(mma_stages(elem_bytes, head_dim, t.stages));
    }
    let lens: Vec<usize> = active(q_lens, kv_lens).collect();
    let price = |c: &EagerChoice| {
        launch_price(&lens, num_kv_heads, c.slots, key_bytes, partial_bytes, &c.plan, instance_rates(c.stages))
    };
    let (two, three) = (one(2), one(3));
    if price(&three) < price(&two) {
        three
    } else {
        two
    }
}

/// The fixed split count of a graph's decode step (see gpu::decode_graph_splits):
/// `pairs` (sequence, kv head) pairs of up to `max_kv_len` keys, `slots` resident
/// blocks; `min_splits` for batches that fill the GPU anyway.
pub(crate) fn graph_splits(
    pairs: usize,
    max_kv_len: usize,
    slots: usize,
    min_splits: usize,
    t: &DecodeTuning,
) -> usize {
    let cap = max_kv_len.div_ceil(t.chunk_min).max(1);
    let pairs = pairs.max(1);
    if pairs >= t.unsplit_waves * slots {
        return min_splits.clamp(1, cap);
    }
    (t.graph_split_waves * slots).div_ceil(pairs).clamp(1, cap)
}

/// Whether a split launch merges its splits itself (see [`SplitMerge`]):
/// `fixed_splits` for a graph's plan (`pairs` (sequence, kv head) pairs), else
/// the plan's busy blocks against `slots`.
pub(crate) fn merge_in_kernel(
    merge: SplitMerge,
    plan: &SplitPlan,
    fixed_splits: bool,
    pairs: usize,
    slots: usize,
    t: &DecodeTuning,
) -> bool {
    match merge {
        SplitMerge::Never => false,
        SplitMerge::Always => true,
        // A graph's plan launches every split's block whatever the lengths; the
        // small-batch plans (up to graph_split_waves of blocks) are the ones
        // whose step the combine launch lengthens.
        SplitMerge::Auto if fixed_splits => pairs * plan.max_splits <= t.graph_split_waves * slots,
        SplitMerge::Auto => plan.busy_blocks <= slots,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waves(q: &[usize], kv: &[usize], hkv: usize, sms: usize, bps: usize) -> (usize, usize) {
        let p = waves_plan(q, kv, hkv, sms * bps, &DecodeTuning::default());
        (p.kv_chunk, p.max_splits)
    }

    #[test]
    fn waves_plans_split_small_batches_into_equal_chunks() {
        // b=1 at 4096 keys, 8 kv heads: 32768 keys of work over 8 waves of 396
        // blocks -> the 128-key minimum: 32 splits, 256 blocks in one wave.
        assert_eq!(waves(&[1], &[4096], 8, 132, 3), (128, 32));
        // b=64 at 2048: 1M keys / 3168 -> 331 -> 384-key chunks, 6 splits.
        assert_eq!(waves(&[1; 64], &[2048; 64], 8, 132, 3), (384, 6));
        // b=256 at 1024 with 8 kv heads: 2048 blocks >= 4 waves of 396: no split.
        assert_eq!(waves(&[1; 256], &[1024; 256], 8, 132, 3), (1024, 1));
        // Ragged contexts: chunks cover the longest; sequences without new tokens
        // do not count.
        let (chunk, splits) = waves(&[1, 1, 0, 1], &[100, 2000, 50_000, 700], 8, 132, 3);
        assert!(chunk.is_multiple_of(64) && chunk * splits >= 2000 && chunk * (splits - 1) < 2000);
        // A context shorter than one chunk is never split.
        assert_eq!(waves(&[1], &[40], 8, 132, 3), (40, 1));
        // A 4-stage plan at 2 blocks an SM splits b=64 ctx=2048 into 512-key chunks.
        assert_eq!(waves(&[1; 64], &[2048; 64], 8, 132, 2), (512, 4));
        // Busy blocks: 4 splits x 512 pairs.
        assert_eq!(waves_plan(&[1; 64], &[2048; 64], 8, 264, &DecodeTuning::default()).busy_blocks, 2048);
    }

    #[test]
    fn waves_plan_constants_are_tunable() {
        let t = DecodeTuning { split_waves: 2, ..DecodeTuning::default() };
        // 1M keys over 2 waves of 264 -> 1986 -> 2048: no split.
        let p = waves_plan(&[1; 64], &[2048; 64], 8, 264, &t);
        assert_eq!((p.kv_chunk, p.max_splits), (2048, 1));
        let t = DecodeTuning { unsplit_waves: 1, ..DecodeTuning::default() };
        assert_eq!(waves_plan(&[1; 64], &[2048; 64], 8, 264, &t).max_splits, 1);
        let t = DecodeTuning { chunk_min: 512, ..DecodeTuning::default() };
        let p = waves_plan(&[1], &[4096], 8, 264, &t);
        assert_eq!((p.kv_chunk, p.max_splits), (512, 8));
    }

    fn keys(q: &[usize], kv: &[usize], hkv: usize, slots: usize) -> SplitPlan {
        // bf16 head dim 128: 512 bytes of K and V a key; 4 rows of partials.
        keys_plan(q, kv, hkv, slots, 512, 4 * 516, &DecodeTuning::default())
    }

    #[test]
    fn keys_plan_prefers_even_waves_and_splits_only_what_pays() {
        // b=64 ctx=2048, 2 blocks an SM: 512 blocks are two even waves: no split.
        let p = keys(&[1; 64], &[2048; 64], 8, 264);
        assert_eq!((p.max_splits, p.kv_chunk), (1, 2048));
        // b=1 ctx=4096: one wave of short splits.
        let p = keys(&[1], &[4096], 8, 264);
        assert!(p.balanced && p.kv_chunk <= 256 && p.busy_blocks <= 264, "{p:?}");
        assert!(p.kv_chunk * p.max_splits >= 4096);
        // b=256 ctx=1024: 2048 blocks, already 4 waves: no split.
        assert_eq!(keys(&[1; 256], &[1024; 256], 8, 264).max_splits, 1);
        // A short context is never split.
        assert_eq!(keys(&[1], &[100], 8, 264).max_splits, 1);
        // Nothing to do.
        assert_eq!(keys(&[0, 0], &[5, 7], 8, 264).max_splits, 1);
    }

    #[test]
    fn keys_plan_cuts_ragged_batches_by_keys() {
        let mut s = 7u64;
        let lens: Vec<usize> = (0..64)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                100 + (s >> 33) as usize % 1901
            })
            .collect();
        let q = vec![1; 64];
        let p = keys(&q, &lens, 8, 264);
        let max = lens.iter().copied().max().unwrap_or(0);
        assert!(p.kv_chunk.is_multiple_of(64) && p.kv_chunk * p.max_splits >= max, "{p:?}");
        if p.max_splits > 1 {
            assert!(p.balanced);
            // Busy blocks: each sequence's own split count, at most max_splits.
            let busy: usize = lens.iter().map(|&kv| splits_of(kv, p.kv_chunk)).sum::<usize>() * 8;
            assert_eq!(p.busy_blocks, busy);
        }
        // The cache returns the same plan, and sees a changed batch.
        let t = DecodeTuning::default();
        let a = keys_plan_cached(&q, &lens, 8, 264, 512, 4 * 516, &t);
        assert_eq!(a, p);
        assert_eq!(keys_plan_cached(&q, &lens, 8, 264, 512, 4 * 516, &t), p);
        assert_eq!(keys_plan_cached(&[1], &[4096], 8, 264, 512, 4 * 516, &t), keys(&[1], &[4096], 8, 264));
    }

    #[test]
    fn stages_and_shared_memory_mirror_the_kernel() {
        assert_eq!(mma_stages(2, 128, 0), 2);
        assert_eq!(mma_stages(2, 64, 0), 4);
        assert_eq!(mma_stages(2, 256, 0), 2);
        assert_eq!(mma_stages(2, 128, 2), 2);
        assert_eq!(mma_stages(2, 128, 9), 4);
        // Head dim 256 at 4 stages would need 272 KiB: 3.
        assert_eq!(mma_stages(2, 256, 4), 3);
        // The three-warp block: 2 stages of 3 warps, 56.6 KiB, four blocks an SM at
        // head dim 128 (three of the four-warp block's 74 KiB), 96 threads.
        assert_eq!(mma_stages(2, 128, THREE_WARP_STAGES), THREE_WARP_STAGES);
        assert_eq!(smem_bytes(2, 128, 16, THREE_WARP_STAGES), 16 * 272 + 3 * 2 * 2 * 16 * 272);
        assert_eq!(blocks_per_sm(16, smem_bytes(2, 128, 16, THREE_WARP_STAGES)), 4);
        assert_eq!(blocks_per_sm(16, smem_bytes(2, 64, 16, THREE_WARP_STAGES)), 4);
        assert_eq!((block_threads(16, THREE_WARP_STAGES), block_threads(16, 2), block_threads(4, 0)), (96, 128, 128));
        // bf16 head dim 128: Q + 4 warps x stages x (K + V) of 16 rows of 272 bytes.
        assert_eq!(smem_bytes(2, 128, 16, 3), 16 * 272 + 4 * 3 * 2 * 16 * 272);
        assert_eq!(blocks_per_sm(16, smem_bytes(2, 128, 16, 3)), 2);
        assert_eq!(blocks_per_sm(16, smem_bytes(2, 128, 16, 2)), 3);
        assert_eq!(blocks_per_sm(16, smem_bytes(2, 128, 16, 4)), 1);
        assert_eq!(blocks_per_sm(16, smem_bytes(2, 64, 16, 2)), 4);
        assert_eq!(blocks_per_sm(16, smem_bytes(2, 64, 16, 4)), 3);
        // The CUDA-core blocks.
        assert_eq!(smem_bytes(2, 128, 4, 0), 65536);
        assert_eq!(smem_bytes(2, 128, 8, 0), 32768);
        assert_eq!(smem_bytes(2, 256, 8, 0), 32768);
        assert_eq!(smem_bytes(4, 256, 4, 0), 65536);
        assert_eq!(smem_bytes(2, 64, 1, 0), 65536);
        assert_eq!(blocks_per_sm(4, smem_bytes(2, 128, 4, 0)), 3);
        assert_eq!(blocks_per_sm(8, 32768), 3);
    }

    #[test]
    fn the_cluster_cap_bounds_every_sequence_s_splits() {
        let t = DecodeTuning { cluster: 16, ..DecodeTuning::default() };
        assert_eq!(cluster_cap(&t, 16), Some(16));
        assert_eq!(cluster_cap(&t, 8), None);
        assert_eq!(cluster_cap(&DecodeTuning::default(), 16), None);
        assert_eq!(cluster_cap(&DecodeTuning { cluster: 40, ..t }, 16), Some(MAX_CLUSTER_SPLITS));
        // Batch 1 at 4096 keys: the keys plan's splits of 128-256 keys, capped at 16 and 8.
        let p = keys(&[1], &[4096], 8, 396);
        for cap in [16, 8, 3] {
            let c = cap_splits(p, &[1], &[4096], 8, cap, &t);
            assert!(c.max_splits <= cap && c.max_splits >= 2, "{c:?}");
            assert!(c.kv_chunk.is_multiple_of(CHUNK_GRANULE) && c.kv_chunk * c.max_splits >= 4096, "{c:?}");
            assert_eq!((c.balanced, c.busy_blocks), (p.balanced, c.max_splits * 8));
        }
        // Every sequence of a ragged batch, as the kernel cuts it (balanced or not).
        let lens = [1, 17, 300, 4096, 40_000, 2500, 63, 65];
        let q = [1, 1, 1, 1, 1, 1, 1, 0];
        for balanced in [false, true] {
            let plan = SplitPlan { kv_chunk: 128, max_splits: 313, balanced, busy_blocks: 0 };
            let c = cap_splits(plan, &q, &lens, 4, 16, &t);
            assert!(c.max_splits <= 16 && c.balanced == balanced, "{c:?}");
            let busy: usize = lens[..7].iter().map(|&kv| splits_of(kv, c.kv_chunk)).sum::<usize>() * 4;
            assert_eq!(c.busy_blocks, busy);
            assert!(lens[..7].iter().all(|&kv| splits_of(kv, c.kv_chunk) <= 16));
        }
        // Within the cap, or short enough for one chunk: as it was, or unsplit.
        let small = SplitPlan { kv_chunk: 256, max_splits: 4, balanced: true, busy_blocks: 32 };
        assert_eq!(cap_splits(small, &[1], &[1000], 8, 16, &t), small);
        let c = cap_splits(
            SplitPlan { kv_chunk: 64, max_splits: 2, balanced: false, busy_blocks: 16 },
            &[1],
            &[100],
            8,
            1,
            &t,
        );
        assert_eq!((c.max_splits, c.busy_blocks), (1, 8));
    }

    #[test]
    fn graph_splits_and_the_merge_choice() {
        let t = DecodeTuning::default();
        assert_eq!(graph_splits(8, 40960, 264, 1, &t), 33);
        assert_eq!(graph_splits(8, 1024, 264, 1, &t), 8);
        let t2 = DecodeTuning { graph_split_waves: 2, ..t };
        assert_eq!(graph_splits(8, 40960, 264, 1, &t2), 66);
        assert_eq!(graph_splits(2048, 40960, 264, 1, &t), 1);
        assert_eq!(graph_splits(2048, 40960, 264, 3, &t), 3);
        let t3 = DecodeTuning { graph_split_waves: 3, ..t };
        assert_eq!(graph_splits(8, 40960, 264, 1, &t3), 99);
        let one = waves_plan(&[1], &[4096], 8, 264, &t);
        let many = waves_plan(&[1; 64], &[2048; 64], 8, 264, &t);
        assert!(merge_in_kernel(SplitMerge::Auto, &one, false, 8, 264, &t));
        assert!(!merge_in_kernel(SplitMerge::Auto, &many, false, 512, 264, &t));
        assert!(merge_in_kernel(SplitMerge::Always, &many, false, 512, 264, &t));
        assert!(!merge_in_kernel(SplitMerge::Never, &one, false, 8, 264, &t));
        let graph = SplitPlan { kv_chunk: 0, max_splits: 33, balanced: false, busy_blocks: 264 };
        assert!(merge_in_kernel(SplitMerge::Auto, &graph, true, 8, 264, &t));
        let graph = SplitPlan { kv_chunk: 0, max_splits: 66, balanced: false, busy_blocks: 528 };
        assert!(!merge_in_kernel(SplitMerge::Auto, &graph, true, 8, 264, &t));
        let graph = SplitPlan { kv_chunk: 0, max_splits: 2, balanced: false, busy_blocks: 1024 };
        assert!(!merge_in_kernel(SplitMerge::Auto, &graph, true, 512, 264, &t));
    }

    /// Contexts uniform in [lo, hi] from a fixed LCG (as benches/attention.rs).
    fn uniform(n: usize, lo: usize, hi: usize, seed: u64) -> Vec<usize> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                lo + (s >> 33) as usize % (hi - lo + 1)
            })
            .collect()
    }

    #[test]
    fn eager_choice_takes_three_stages_where_two_leave_a_wave_half_empty() {
        let t = DecodeTuning::default();
        // 32/8 heads at head dim 128 in bf16 (partials of 4 rows) on 132 SMs: 396
        // slots at 2 stages, 264 at 3 (docs/PERF.md, seventh session, call 1).
        let stages = |kv: &[usize]| {
            let q = vec![1; kv.len()];
            let c = eager_choice(&q, kv, 8, 2, 128, 132, 4 * 516, &t);
            assert_eq!(c.slots, if c.stages == 2 { 396 } else { 264 });
            c.stages
        };
        // 512 blocks are 1.3 waves of 396 and 1.9 of 264: 141 against 152 us measured.
        assert_eq!(stages(&[2048; 64]), 3);
        assert_eq!(stages(&[1024; 64]), 3);
        assert_eq!(stages(&[4096; 32]), 3);
        // 384 blocks fill 396 slots; many waves stream best at 2 stages.
        assert_eq!(stages(&[2048; 48]), 2);
        assert_eq!(stages(&[1024; 96]), 2);
        assert_eq!(stages(&[1024; 256]), 2);
        assert_eq!(stages(&[512; 256]), 2);
        // Ragged batches, batch 1.
        assert_eq!(stages(&uniform(64, 100, 2000, 7)), 2);
        assert_eq!(stages(&uniform(256, 100, 2048, 11)), 2);
        assert_eq!(stages(&uniform(32, 100, 4096, 17)), 2);
        assert_eq!(stages(&[4096]), 2);
        assert_eq!(stages(&[300]), 2);
        // A forced depth, another head dimension or the waves plan: no choice.
        let q = [1; 64];
        let forced = DecodeTuning { stages: 2, ..t };
        assert_eq!(eager_choice(&q, &[2048; 64], 8, 2, 128, 132, 4 * 516, &forced).stages, 2);
        assert_eq!(eager_choice(&q, &[2048; 64], 8, 2, 64, 132, 4 * 260, &t).stages, 4);
        let waves = DecodeTuning { plan: DecodePlanKind::Waves, ..t };
        assert_eq!(eager_choice(&q, &[2048; 64], 8, 2, 128, 132, 4 * 516, &waves).stages, 2);
        // The choice's plan is that instance's keys plan.
        let c = eager_choice(&q, &[2048; 64], 8, 2, 128, 132, 4 * 516, &t);
        assert_eq!(c.plan, keys_plan(&q, &[2048; 64], 8, 264, 512, 4 * 516, &t));
    }
}
