//! The prefill attention kernel (csrc/kernels/prefill_attention.cu): causal
//! attention over the paged caches for batches of long query runs, bf16/f16, with
//! 128-row query tiles (4 warps of two 16-row m-tiles at head dims 64 and 128), a
//! two-stage cp.async K/V pipeline and no key splits.
//!
//! When it runs ([`kernel_for`]): `AttnKernel::Auto` takes it for a batch whose
//! query rows are mostly long runs and that fills the GPU with q tiles
//! ([`auto_takes`]); `AttnKernel::Prefill` forces it (an error for f32 or another
//! head dimension than 64, 128, 256). `MINISGL_PREFILL_KERNEL=tile` keeps `Auto`
//! off it, `=new` sends it every batch it holds that is not the decode kernel's.
//!
//! Tile variants ([`TILES`], the kernel's `PrefillTile` table): `MINISGL_PREFILL_TILE`
//! (default 0, the per-head-dim default; 1..8 are compiled at run time) or
//! [`set_prefill_tile`] (benchmarks) picks one; a variant whose accumulators or
//! shared memory do not fit the head dimension is an error naming it.
//!
//! The Hopper tiles ([`WGMMA_TILES`], TILE 16..43, the kernel's `PrefillWgTile`):
//! wgmma with 2 or 3 warpgroups of 64 query rows, 128-byte swizzled K/V tiles, and
//! from TILE 22 one more warpgroup that only gathers (warp specialisation: the
//! consumers wait on transaction barriers, never on each other), from TILE 27 by
//! TMA (32 and 33: one consumer, two blocks an SM; slower than 27 and 17 on an
//! H100, docs/PERF.md; 34..38: persistent blocks, one an SM) through tensor maps of the
//! caches where the page size is a power of two >= 8
//! ([`tma_rows`]; the tile holding a block's last key still by cp.async, which
//! zero-fills past it); they need an sm_90
//! device (the kernels are built and JIT-compiled for sm_90a there) and are an error
//! elsewhere. On sm_90 GPUs tile 17 is the default up to head dim
//! 128 and tile 16 at 256 (AOT instances, [`default_tile`]), tile 0 elsewhere;
//! batches with a sequence of 64 keys or more at head dim 128 over caches TMA can
//! copy take tile 48 (persistent blocks drawing their items from a counter), or 39
//! from 3072 keys ([`long_tma_tile`], AOT instances at head dim 128);
//! `MINISGL_PREFILL_TILE` picks another.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op_types::attention::{AttnKernel, PagedAttnMeta};
use crate::sys::kernels::{msgl_attention_params, msgl_prefill_params, msgl_prefill_ranks, MSGL_PREFILL_RANKS};
use crate::tensor::Tensor;

use super::launch::{device_of, dispatch, dtype_code, grid_u32, persistent_zeros};
use super::tensor_map::{self, Swizzle};

const OP: &str = "prefill_attention";

/// Query tokens from which a sequence's run counts as long.
pub(super) const LONG_RUN: usize = 64;

/// One entry of the tile table: `warps` warps of `m_tiles` 16-row m-tiles each,
/// `keys` keys per K/V tile, `stages` K/V buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct TileShape {
    pub warps: usize,
    pub m_tiles: usize,
    pub keys: usize,
    pub stages: usize,
    /// The wgmma path (sm_90a): warps come in warpgroups of 4 with one 64-row m-tile
    /// per warpgroup (`m_tiles` 1 keeps `rows` = 16 * warps), unpadded swizzled rows.
    pub wgmma: bool,
    /// A producer warpgroup besides the `warps` that run the products (the
    /// warp-specialised wgmma tiles, 22..).
    pub producer: bool,
    /// The producer copies whole K/V tiles by TMA through tensor maps of the caches
    /// (27..31), where the page size allows ([`tma_rows`]).
    pub tma: bool,
    /// At most one block an SM, each walking the grid's items; a second Q buffer
    /// where it fits, so that the next item's Q and first K/V tiles load while the
    /// consumers finish the current one (34..38, 42, 47, 48).
    pub persistent: bool,
}

const fn shape(warps: usize, m_tiles: usize, keys: usize, stages: usize) -> TileShape {
    TileShape { warps, m_tiles, keys, stages, wgmma: false, producer: false, tma: false, persistent: false }
}

/// A wgmma tile of `warpgroups` warpgroups (64 query rows each).
const fn wg_shape(warpgroups: usize, keys: usize, stages: usize) -> TileShape {
    TileShape {
        warps: 4 * warpgroups,
        m_tiles: 1,
        keys,
        stages,
        wgmma: true,
        producer: false,
        tma: false,
        persistent: false,
    }
}

/// A warp-specialised wgmma tile: `consumers` warpgroups of 64 query rows and a
/// producer warpgroup.
const fn ws_shape(consumers: usize, keys: usize, stages: usize) -> TileShape {
    TileShape { producer: true, ..wg_shape(consumers, keys, stages) }
}

/// A warp-specialised tile whose producer copies K/V by TMA.
const fn tma_shape(consumers: usize, keys: usize, stages: usize) -> TileShape {
    TileShape { tma: true, ..ws_shape(consumers, keys, stages) }
}

/// A TMA tile whose blocks are persistent.
const fn persistent_shape(consumers: usize, keys: usize, stages: usize) -> TileShape {
    TileShape { persistent: true, ..tma_shape(consumers, keys, stages) }
}

/// The first wgmma tile id.
pub(super) const FIRST_WGMMA_TILE: usize = 16;

/// prefill_attention.cu's `PrefillWgTile` for TILE = 16..48 at head dims up to 128
/// (TILEs 16, 22, 27, 28, 34, 35, 39..42 and 46..48 take 64-key tiles at head dim 256: [`tile_shape`]).
/// 19..21, 23, 24, 26, 28, 29, 31, 33, 35 and 39..43 run the softmax of one K/V tile under
/// the P V product of the previous one (28, 35 and 39..42 not at head dim 256); 22..26 have a producer warpgroup, and in 24 and 26
/// the two consumers take turns issuing their products (ping-pong); 27..31 are
/// 22..26 with the K/V tiles copied by TMA; 32 and 33 have one consumer of 64 rows
/// and run two blocks an SM; 34, 35 and 36 are 27, 28 and 30 with persistent blocks,
/// 37 and 38 persistent with three K/V stages (37: one Q buffer); 39 is 28 with
/// three K/V stages (28 itself at head dim 256), 40 is 28 with the tail tile (the one holding a block's last key)
/// copied by TMA too, its rows past the sequence zeroed in shared memory; 41 and 42 are
/// 28 and 35 in FlashAttention-3's order (O rescaled under S's product, K released
/// once S is done), 43 is 29 (ping-pong) in that order; 44, 45 and 46 are 30 (three
/// consumers, 64-key tiles) with three stages, the overlap, and both (46 is 28 at
/// head dim 256); 47 is 46 with persistent blocks (35 at head dim 256), 48 is 47 with
/// its items drawn from a counter as the blocks need them (35 so at head dim 256).
pub(super) const WGMMA_TILES: [TileShape; 33] = [
    wg_shape(2, 128, 2),
    wg_shape(3, 64, 2),
    wg_shape(2, 64, 3),
    wg_shape(2, 64, 4),
    wg_shape(2, 128, 3),
    wg_shape(3, 64, 3),
    ws_shape(2, 128, 2),
    ws_shape(2, 128, 2),
    ws_shape(2, 128, 2),
    ws_shape(3, 64, 2),
    ws_shape(2, 64, 3),
    tma_shape(2, 128, 2),
    tma_shape(2, 128, 2),
    tma_shape(2, 128, 2),
    tma_shape(3, 64, 2),
    tma_shape(2, 64, 3),
    tma_shape(1, 64, 2),
    tma_shape(1, 64, 2),
    persistent_shape(2, 128, 2),
    persistent_shape(2, 128, 2),
    persistent_shape(3, 64, 2),
    persistent_shape(2, 128, 3),
    persistent_shape(3, 64, 3),
    tma_shape(2, 128, 3),
    tma_shape(2, 128, 2),
    tma_shape(2, 128, 2),
    persistent_shape(2, 128, 2),
    tma_shape(2, 128, 2),
    tma_shape(3, 64, 3),
    tma_shape(3, 64, 2),
    tma_shape(3, 64, 3),
    persistent_shape(3, 64, 3),
    persistent_shape(3, 64, 3),
];

/// prefill_attention.cu's `PrefillTile` for TILE = 1..8 (index 0 is [`tile_shape`]'s
/// per-head-dim default and is not read from here).
pub(super) const TILES: [TileShape; 9] = [
    shape(4, 2, 64, 2),
    shape(4, 2, 32, 2),
    shape(4, 2, 64, 3),
    shape(8, 1, 64, 2),
    shape(8, 1, 64, 3),
    shape(4, 1, 64, 2),
    shape(4, 1, 128, 2),
    shape(4, 2, 32, 3),
    shape(8, 1, 32, 2),
];

/// The most dynamic shared memory a block may take on sm_90 (227 KiB).
const MAX_SMEM: usize = 232_448;
/// The most f32 accumulators (O and S) a thread may hold before the kernel spills.
const MAX_ACCUMULATORS: usize = 192;
/// The same for blocks of more than 256 threads (at most 168 registers a thread).
const MAX_ACCUMULATORS_384: usize = 112;
/// The most f32 accumulators and packed P registers a consumer thread of a
/// warp-specialised tile may hold: 184 registers with one consumer warpgroup (two
/// blocks an SM), 208 with two, 144 with three (prefill_attention.cu's `WsRegs`),
/// less what the loop itself keeps.
const MAX_WS_REGISTERS_1: usize = 152;
const MAX_WS_REGISTERS_2: usize = 176;
const MAX_WS_REGISTERS_3: usize = 112;

impl TileShape {
    /// Query rows a block holds.
    pub(super) fn rows(&self) -> usize {
        16 * self.warps * self.m_tiles
    }

    pub(super) fn threads(&self) -> usize {
        32 * self.warps + if self.producer { 128 } else { 0 }
    }

    /// prefill_attention.cu's `prefill_smem_bytes`: Q and `stages` K and V tiles,
    /// rows of `head_dim` 16-bit elements plus 16 bytes; for the wgmma tiles
    /// (`prefill_wg_smem_bytes`) [`Self::q_buffers`] Q tiles and unpadded rows plus
    /// 1024 bytes to align the base.
    pub(super) fn smem_bytes(&self, head_dim: usize) -> usize {
        if self.wgmma {
            self.wg_smem_bytes(head_dim, self.q_buffers(head_dim))
        } else {
            (self.rows() + 2 * self.stages * self.keys) * (head_dim + 8) * 2
        }
    }

    fn wg_smem_bytes(&self, head_dim: usize, q_buffers: usize) -> usize {
        (q_buffers * self.rows() + 2 * self.stages * self.keys) * head_dim * 2 + 1024
    }

    /// Q buffers of a wgmma tile (`prefill_wg_q_buffers`): two for a persistent tile
    /// where they fit beside its K/V stages, else one.
    pub(super) fn q_buffers(&self, head_dim: usize) -> usize {
        if self.persistent && self.wg_smem_bytes(head_dim, 2) <= MAX_SMEM {
            2
        } else {
            1
        }
    }

    /// Blocks of a launch over `items` (q tile, kv head) pairs on `sms` SMs: one an
    /// item, or for a persistent tile at most one an SM (each walks the items
    /// blockIdx.x, + gridDim.x, ...; `prefill_ws_impl`).
    pub(super) fn grid_blocks(&self, items: usize, sms: usize) -> usize {
        if self.persistent {
            items.min(sms.max(1))
        } else {
            items
        }
    }

    /// Whether the shape fits `head_dim`: its accumulators (O: head_dim / 2 and S:
    /// keys / 2 per m-tile and thread) in registers, its buffers in shared memory.
    /// A warp-specialised tile's consumers also hold P packed (keys / 4 registers).
    pub(super) fn fits(&self, head_dim: usize) -> bool {
        let registers_ok = if self.producer {
            let limit = match self.warps {
                4 => MAX_WS_REGISTERS_1,
                8 => MAX_WS_REGISTERS_2,
                _ => MAX_WS_REGISTERS_3,
            };
            (head_dim + self.keys) / 2 + self.keys / 4 <= limit
        } else {
            let limit = if self.threads() > 256 { MAX_ACCUMULATORS_384 } else { MAX_ACCUMULATORS };
            self.m_tiles * (head_dim + self.keys) / 2 <= limit
        };
        registers_ok && self.smem_bytes(head_dim) <= MAX_SMEM
    }
}

/// The shape of tile `tile` at `head_dim` (TILE 0: 128 x 64 up to head dim 128,
/// 64 x 32 at 256; TILEs 16 and 22: 128 x 128, 128 x 64 at 256), or `None` past the
/// tables.
pub(super) fn tile_shape(tile: usize, head_dim: usize) -> Option<TileShape> {
    match tile {
        0 if head_dim <= 128 => Some(shape(4, 2, 64, 2)),
        0 => Some(shape(4, 1, 32, 2)),
        16 if head_dim > 128 => Some(wg_shape(2, 64, 2)),
        22 if head_dim > 128 => Some(ws_shape(2, 64, 2)),
        27 | 28 | 39 | 40 | 41 | 46 if head_dim > 128 => Some(tma_shape(2, 64, 2)),
        34 | 35 | 42 | 47 | 48 if head_dim > 128 => Some(persistent_shape(2, 64, 2)),
        t if t >= FIRST_WGMMA_TILE => WGMMA_TILES.get(t - FIRST_WGMMA_TILE).copied(),
        _ => TILES.get(tile).copied(),
    }
}

/// Whether the kernel has instances for `dtype` and `head_dim`.
pub(super) fn supports(dtype: DType, head_dim: usize) -> bool {
    matches!(dtype, DType::BF16 | DType::F16) && matches!(head_dim, 64 | 128 | 256)
}

/// Whether the kernel's softmax takes `scale` (it scales the running max of the raw
/// scores, so the scale must be positive).
fn scale_ok(scale: f32) -> bool {
    scale > 0.0 && scale.is_finite()
}

/// q tiles of `rows` packed query rows in a batch.
fn q_tiles(q_lens: &[usize], group: usize, rows: usize) -> usize {
    q_lens.iter().map(|&q| (q * group).div_ceil(rows)).sum()
}

/// The rule of `Auto`: the prefill kernel when at least 3/4 of the query tokens
/// belong to runs of [`LONG_RUN`] or more (its 128-row tiles are then mostly full,
/// and the rest, decodes riding along, costs one tile each) and its q tiles times
/// the kv heads make at least one block per SM (it never splits keys: below that
/// the tile kernel's splits fill the GPU better).
pub(super) fn auto_takes(q_lens: &[usize], group: usize, num_kv_heads: usize, rows: usize, sms: usize) -> bool {
    let total: usize = q_lens.iter().sum();
    let long: usize = q_lens.iter().filter(|&&q| q >= LONG_RUN).sum();
    total > 0 && 4 * long >= 3 * total && q_tiles(q_lens, group, rows) * num_kv_heads >= sms
}

/// `MINISGL_PREFILL_KERNEL`: what `Auto` does with prefill batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// [`auto_takes`] decides.
    Rule,
    /// Never the prefill kernel (`tile`).
    Tile,
    /// The prefill kernel for every batch it holds but the decode kernel's (`new`).
    New,
}

fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("MINISGL_PREFILL_KERNEL").as_deref().map(str::trim) {
        Ok("tile") => Mode::Tile,
        Ok("new" | "prefill") => Mode::New,
        _ => Mode::Rule,
    })
}

/// The kernel `kernel` resolves to for a batch: `Auto` becomes `Prefill` where the
/// mode and the rule say so (`decode_fits`: the decode kernel holds the batch, which
/// `Auto` then keeps for it whatever the mode; the kernel's softmax needs a
/// positive `scale`); every other choice is kept.
#[allow(clippy::too_many_arguments)]
pub(super) fn kernel_for(
    kernel: AttnKernel,
    dtype: DType,
    head_dim: usize,
    scale: f32,
    decode_fits: bool,
    q_lens: &[usize],
    group: usize,
    num_kv_heads: usize,
    sms: usize,
    hopper: bool,
) -> AttnKernel {
    if kernel != AttnKernel::Auto || decode_fits || !supports(dtype, head_dim) || !scale_ok(scale) {
        return kernel;
    }
    // The rows of the default tile for short runs (192 on sm_90 at head dims <= 128):
    // a long batch's tile (192 or 128 rows) fills the GPU as well or better.
    let rows = tile_shape(selected_tile(hopper, head_dim, None), head_dim).map_or(128, |s| s.rows());
    let take = match mode() {
        Mode::Tile => false,
        Mode::New => true,
        Mode::Rule => auto_takes(q_lens, group, num_kv_heads, rows, sms),
    };
    if take {
        AttnKernel::Prefill
    } else {
        kernel
    }
}

/// [`set_prefill_grid_limit`]'s cap; `usize::MAX`: none.
static GRID_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Caps the blocks of a persistent tile's launch below the SM count (`None`: one
/// block an SM), so that tests see a few blocks walk many items (the AOT launcher
/// reads the cap from the plan's `max_blocks`).
pub(crate) fn set_prefill_grid_limit(blocks: Option<usize>) {
    GRID_LIMIT.store(blocks.map_or(usize::MAX, |b| b.max(1)), Ordering::Relaxed);
}

/// [`set_prefill_tile`]'s override; `usize::MAX`: none.
static TILE_OVERRIDE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Overrides `MINISGL_PREFILL_TILE` for this process (`None`: back to it).
pub(crate) fn set_prefill_tile(tile: Option<usize>) {
    TILE_OVERRIDE.store(tile.unwrap_or(usize::MAX), Ordering::Relaxed);
}

/// The default tile at `head_dim`: on an sm_90 GPU (`hopper`) the wgmma tile 17
/// (three warpgroups of 64 query rows, 64-key tiles) up to head dim 128, 294 / 226
/// / 266 TFLOP/s against tile 16's 225 / 177 / 219 at 32/8 b=1 L=4096, b=8 L=1024
/// and 16/8 b=1 L=4096 (docs/PERF.md, seventh session, call 2), and tile 16 at
/// head dim 256 (tile 17's three 64 x 256 accumulators do not fit); elsewhere tile 0.
/// The warp-specialised tiles 22..26 ran at 0.62-0.77x of tile 17 (H100, docs/PERF.md,
/// nineteenth session): their K/V gathers, not their products, bound them.
pub(super) fn default_tile(hopper: bool, head_dim: usize) -> usize {
    match (hopper, head_dim <= 128) {
        (true, true) => FIRST_WGMMA_TILE + 1,
        (true, false) => FIRST_WGMMA_TILE,
        (false, _) => 0,
    }
}

/// The keys of one TMA copy of a K/V tile of `keys` keys for pages of `page_size`
/// slots in a cache of `slots` slots (the tensor maps' box, the kernel's
/// `kv_tma_rows`): a copy stays inside one page and covers whole 8-row swizzle
/// groups, so the page size must be a power of two >= 8; the slot coordinates are
/// 32-bit. `None`: the TMA tiles gather by cp.async.
pub(super) fn tma_rows(page_size: usize, keys: usize, slots: usize) -> Option<usize> {
    (page_size.is_power_of_two() && page_size >= 8 && slots <= i32::MAX as usize).then(|| page_size.min(keys))
}

/// The tiles for batches of key runs of [`LONG_TMA_MIN_KEYS`] or more on an sm_90 GPU
/// at head dim 128 when the caches allow TMA copies ([`long_tma_batch`]), both
/// warp-specialised with K/V copied by TMA into three stages and the softmax of one
/// K/V tile under the P V product of the one before: TILE 39 (two consumers, 128 x
/// 128) for runs of [`LONGEST_RUN_KEYS`] or more, TILE 48 (three consumers, 192 x 64,
/// persistent blocks that draw their next item from a counter, so that its start runs
/// under the current one's end and long and short items even out) below. On an H100
/// (docs/PERF.md, twenty-seventh session, call B, probes, us, 32/8 heads unless
/// named; 46 is 48 without persistent blocks, 47 with static rounds): b=8 L=1024 46
/// 228, 47 215, 48 209; b=16 L=512 161 / 140 / 139; b=64 L=128 117 / 90 / 95; b=4
/// L=2048 365 / 376 / 354; b=2 L=2048 189 / 208 / 184; 16/8 b=8 L=1024 122 / 124 /
/// 115; b=1 L=4096 330 / 382 / 332, where 39 took 299 (the bench, same call).
pub(super) const LONG_TMA_TILE: usize = 39;
pub(super) const MID_TMA_TILE: usize = 48;
/// The longest key run from which [`LONG_TMA_TILE`] rather than [`MID_TMA_TILE`]
/// serves a batch: between the measured 2048 (46 ahead of 39, twenty-fifth session)
/// and 4096 (39 ahead of 46 and 48).
const LONGEST_RUN_KEYS: usize = 3072;
/// The longest key run from which a batch takes the TMA tiles rather than tile 17:
/// 48 led 17 at every run of 64 keys or more measured (H100, twenty-seventh session,
/// probes, us, 32/8 heads unless named: b=64 L=64 87 -> 56, 16/8 b=128 L=64 86 -> 64,
/// b=32 L=96 54 -> 41, b=16 L=128 40 -> 29, b=32 L=256 172 -> 111, b=16 L=512 208 ->
/// 140), but at 256 prompts of 64 keys (476 -> 485) and 512 of 32 (519 -> 535), whose
/// items both tiles then found by searching the batch layout (past the 64 sequences
/// `MSGL_PREFILL_RANKS` held; 256 since ABI 12, the engine's default running set).
const LONG_TMA_MIN_KEYS: usize = 64;

/// The TMA tile for a batch of TMA-able runs ([`long_tma_batch`]) whose longest run
/// holds `max_kv` keys.
pub(super) fn long_tma_tile(max_kv: usize) -> usize {
    if max_kv >= LONGEST_RUN_KEYS {
        LONG_TMA_TILE
    } else {
        MID_TMA_TILE
    }
}

/// Whether a batch whose longest sequence holds `max_kv` keys, over caches of
/// `slots` slots in pages of `page_size`, takes a TMA tile ([`long_tma_tile`]) by
/// default at `head_dim` on an sm_90 GPU (`hopper`).
pub(super) fn long_tma_batch(hopper: bool, head_dim: usize, max_kv: usize, page_size: usize, slots: usize) -> bool {
    hopper && head_dim == 128 && max_kv >= LONG_TMA_MIN_KEYS && tma_rows(page_size, 128, slots).is_some()
}

/// The tile table entry launches use: the override, else `MINISGL_PREFILL_TILE`,
/// else `long_tma`, the TMA tile of a long batch ([`long_tma_tile`]), else
/// [`default_tile`].
fn selected_tile(hopper: bool, head_dim: usize, long_tma: Option<usize>) -> usize {
    static ENV: OnceLock<Option<usize>> = OnceLock::new();
    match TILE_OVERRIDE.load(Ordering::Relaxed) {
        usize::MAX => ENV
            .get_or_init(|| std::env::var("MINISGL_PREFILL_TILE").ok().and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| long_tma.unwrap_or_else(|| default_tile(hopper, head_dim))),
        t => t,
    }
}

/// The prefill kernel over the batch (tensors checked by the op and by
/// `gpu::attention::paged_attention`: alignment; `params` as that module fills
/// them, without splits).
pub(super) fn prefill_attention(
    out: &Tensor,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &PagedAttnMeta<'_>,
    params: msgl_attention_params,
) -> Result<()> {
    let dev = device_of(OP, q)?;
    let [_, hq, d] = q.dims::<3>(OP, "q")?;
    let hkv = k_cache.dim(2);
    if !supports(q.dtype(), d) {
        return Err(Error::arg(
            OP,
            format!("the prefill kernel holds bf16/f16 at head dims 64, 128, 256, not {} at {d}", q.dtype()),
        ));
    }
    if !scale_ok(params.scale_log2) {
        return Err(Error::arg(
            OP,
            format!("the prefill kernel needs a positive finite scale, not {}", params.scale_log2),
        ));
    }
    let hopper = dev.capability() == (9, 0);
    let [pages, page_size, ..] = k_cache.dims::<4>(OP, "k_cache")?;
    let max_kv = meta.kv_lens_host.iter().copied().max().unwrap_or(0);
    let sms = usize::try_from(dev.sm_count()).unwrap_or(1);
    let long = long_tma_batch(hopper, d, max_kv, page_size, pages * page_size).then(|| long_tma_tile(max_kv));
    let tile = selected_tile(hopper, d, long);
    let shape = tile_shape(tile, d)
        .filter(|s| s.fits(d))
        .ok_or_else(|| Error::arg(OP, format!("prefill tile {tile} does not exist or does not fit head dim {d}")))?;
    if shape.wgmma && dev.capability().0 != 9 {
        return Err(Error::arg(
            OP,
            format!("prefill tile {tile} uses wgmma, which needs an sm_90 device, not {}", dev.arch()),
        ));
    }
    let tiles = q_tiles(meta.q_lens_host, hq / hkv, shape.rows());
    if tiles == 0 {
        return Ok(());
    }
    let limit = GRID_LIMIT.load(Ordering::Relaxed);
    let p = msgl_attention_params {
        num_q_tiles: i32::try_from(tiles).map_err(|_| Error::arg(OP, format!("{tiles} q tiles exceed 32 bits")))?,
        num_warps: shape.warps as i32,
        kv_chunk: i32::MAX,
        max_splits: 1,
        // The cap the AOT launcher puts on a persistent tile's grid (the grid below is
        // the cubin and NVRTC launches').
        max_blocks: if limit == usize::MAX { 0 } else { i32::try_from(limit).unwrap_or(i32::MAX) },
        ..params
    };
    let grid = grid_u32(OP, shape.grid_blocks(tiles * hkv, sms.min(limit)))?;
    let shared = shape.smem_bytes(d);
    let mut pp = prefill_params(p, shape, q, k_cache, v_cache)?;
    // The persistent tiles' item counter, which the dynamic ones (48) draw their
    // items from and leave zero (none while a capture runs before it exists: the
    // launcher then refuses a dynamic tile).
    let counter = if shape.persistent { persistent_zeros("prefill_attention item counter", dev, 2)? } else { None };
    pp.a.split_counters = counter.as_ref().map_or(std::ptr::null_mut(), |c| c.device_ptr() as *mut i32);
    let counter_view = counter.as_ref().map(Tensor::abi);
    if shape.producer && RANKED.load(Ordering::Relaxed) {
        if let Some(ranks) = item_ranks(meta.q_lens_host, meta.kv_lens_host, hq / hkv, shape.rows()) {
            pp.ranks = ranks;
        }
    }
    let maps = (pp.kv_tma_rows > 0).then_some((&pp.k_map, &pp.v_map));
    let views = [out, q, k_cache, v_cache, meta.q_indptr, meta.kv_lens, meta.block_table].map(Tensor::abi);
    let values = [("DTYPE", dtype_code(q)), ("HEAD_DIM", d as i64), ("TILE", tile as i64)];
    dispatch(
        OP,
        dev,
        "prefill_attention",
        &values,
        |lib, stream| {
            let [a, b, c, e, f, g, h] = &views;
            let (k_map, v_map) =
                maps.map_or((std::ptr::null(), std::ptr::null()), |(k, v)| (k as *const _, v as *const _));
            let q_map = if pp.q_tma != 0 { &pp.q_map as *const _ } else { std::ptr::null() };
            let ranks = if pp.ranks.count > 0 { &pp.ranks as *const _ } else { std::ptr::null() };
            let counter = counter_view.as_ref().map_or(std::ptr::null(), |c| c as *const _);
            let tile = tile as i32;
            // SAFETY: the views describe live device tensors checked by the op (shapes,
            // dtypes, lengths against the block table) and by the caller (alignment);
            // the maps (or nulls) describe those caches, the ranks (or null) the batch,
            // the counter (or null) a kept buffer of zeros; the launcher validates
            // again and only enqueues work on `stream`.
            unsafe {
                lib.msgl_prefill_attention(a, b, c, e, f, g, h, &p, k_map, v_map, q_map, ranks, counter, tile, stream)
            }
        },
        |f| {
            f.set_max_dynamic_shared_bytes(dev, shared as u32)?;
            // SAFETY: `pp` is the msgl_prefill_params the entry takes: the attention
            // params filled from the tensors checked by the op, with num_q_tiles for
            // this tile's rows, the caches' tensor maps when kv_tma_rows > 0, the
            // ranks of the batch's host lengths for these rows (or none), the item
            // counter (a kept buffer of zeros) for a persistent tile; the
            // block and shared memory are the instance's (prefill_threads,
            // prefill_smem_bytes, mirrored by TileShape).
            unsafe { f.launch(dev, grid, shape.threads() as u32, shared as u32, &pp) }
        },
    )
}

/// The kernel's params for `shape`: `p`, and for a TMA tile whose caches allow it
/// ([`tma_rows`]) a tensor map of each cache ([num_pages, page_size, heads,
/// head_dim] viewed as [slots][heads][head_dim], boxes of 64 elements x 1 head x
/// kv_tma_rows slots, 128-byte swizzle) and kv_tma_rows, and of q where
/// [`q_box_tokens`] allows ([tokens][heads][head_dim] with q's strides, boxes of 64
/// elements x group heads x rows / group tokens); zeros otherwise (the kernel
/// gathers by cp.async).
fn prefill_params(
    p: msgl_attention_params,
    shape: TileShape,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
) -> Result<msgl_prefill_params> {
    // SAFETY: msgl_prefill_params is plain data (maps of opaque words, integers,
    // pointers): all-zero is its "no maps" value.
    let mut pp: msgl_prefill_params = unsafe { std::mem::zeroed() };
    pp.a = p;
    let [pages, page_size, heads, d] = k_cache.dims::<4>(OP, "k_cache")?;
    let slots = pages * page_size;
    let Some(rows) = tma_rows(page_size, shape.keys, slots).filter(|_| shape.tma) else {
        return Ok(pp);
    };
    let map = |cache: &Tensor| {
        tensor_map::encode(
            OP,
            cache,
            [d as u64, heads as u64, slots as u64],
            &[(d * 2) as u64, (heads * d * 2) as u64],
            [64, 1, rows as u32],
            Swizzle::B128,
        )
    };
    pp.k_map = map(k_cache)?;
    pp.v_map = map(v_cache)?;
    pp.kv_tma_rows = rows as i32;
    let [tokens, hq, _] = q.dims::<3>(OP, "q")?;
    let group = hq / heads.max(1);
    if let Some(box_tokens) = q_box_tokens(shape.rows(), group) {
        let strides = [p.q_head_stride as u64 * 2, p.q_token_stride as u64 * 2];
        // A layout TMA cannot copy (strides or base not 16-byte aligned): cp.async.
        if let Ok(q_map) = tensor_map::encode(
            OP,
            q,
            [d as u64, hq as u64, tokens as u64],
            &strides,
            [64, group as u32, box_tokens as u32],
            Swizzle::B128,
        ) {
            pp.q_map = q_map;
            pp.q_tma = 1;
        }
    }
    Ok(pp)
}

/// [`set_prefill_ranked`]'s switch.
static RANKED: AtomicBool = AtomicBool::new(true);

/// Whether the warp-specialised tiles get the batch's ranking ([`item_ranks`]; on by
/// default) or search the batch layout for each block's item, as batches of more
/// than `MSGL_PREFILL_RANKS` sequences do: tests run both.
pub(crate) fn set_prefill_ranked(on: bool) {
    RANKED.store(on, Ordering::Relaxed);
}

/// The batch's sequences ranked by their q tiles of `rows` packed rows at GQA
/// `group` (tensor.h's `msgl_prefill_ranks`, which the warp-specialised tiles read
/// instead of searching the batch layout at each block's start: the kernel's
/// `prefill_ranked_tile`): the sequences with new tokens, most tiles first, ties in
/// batch order, with their first token (the prefix sum of `q_lens`, as q_indptr),
/// lengths and segment starts. `None` where more than `MSGL_PREFILL_RANKS` sequences
/// have new tokens or a count exceeds 32 bits.
pub(super) fn item_ranks(q_lens: &[usize], kv_lens: &[usize], group: usize, rows: usize) -> Option<msgl_prefill_ranks> {
    let mut q_start = 0usize;
    let mut seqs: Vec<(usize, usize, usize, usize, usize)> = Vec::new(); // (tiles, seq, start, q_len, kv_len)
    for (seq, (&q_len, &kv_len)) in q_lens.iter().zip(kv_lens).enumerate() {
        if q_len > 0 {
            seqs.push(((q_len * group).div_ceil(rows.max(1)), seq, q_start, q_len, kv_len));
        }
        q_start += q_len;
    }
    if seqs.len() > MSGL_PREFILL_RANKS as usize {
        return None;
    }
    seqs.sort_by_key(|&(tiles, seq, ..)| (std::cmp::Reverse(tiles), seq));
    // SAFETY: msgl_prefill_ranks is plain integers: all-zero is "no ranks".
    let mut rk: msgl_prefill_ranks = unsafe { std::mem::zeroed() };
    let int = |v: usize| i32::try_from(v).ok();
    // before[r] = sum_j min(tiles[j], tiles[r + 1]): the tiles do not grow with the
    // rank, so ranks 0..=r + 1 count tiles[r + 1] each and the rest their own, a
    // suffix sum (one pass from the end rather than one sum a rank).
    let mut suffix = vec![0usize; seqs.len() + 1];
    for r in (0..seqs.len()).rev() {
        suffix[r] = suffix[r + 1] + seqs[r].0;
    }
    for (r, &(tiles, seq, start, q_len, kv_len)) in seqs.iter().enumerate() {
        let before = match seqs.get(r + 1) {
            Some(next) => (r + 2) * next.0 + suffix[r + 2],
            None => 0,
        };
        rk.before[r] = int(before)?;
        rk.tiles[r] = int(tiles)?;
        rk.seq[r] = int(seq)?;
        rk.q_start[r] = int(start)?;
        rk.q_len[r] = int(q_len)?;
        rk.kv_len[r] = int(kv_len)?;
    }
    rk.count = int(seqs.len())?;
    Some(rk)
}

/// The tokens of a q tile of `rows` packed (token, head) rows at GQA `group`, as one
/// TMA box (group heads x rows / group tokens): where the group divides the rows and
/// both fit a box's 256.
fn q_box_tokens(rows: usize, group: usize) -> Option<usize> {
    (group > 0 && rows.is_multiple_of(group) && group <= 256 && rows / group <= 256).then(|| rows / group)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_tile_fits_every_head_dim() {
        for d in [64, 128, 256] {
            let hopper = default_tile(true, d);
            assert!(tile_shape(hopper, d).is_some_and(|s| s.wgmma && s.fits(d)), "tile {hopper} at {d}");
            assert!(tile_shape(default_tile(false, d), d).is_some_and(|s| !s.wgmma && s.fits(d)));
        }
        assert_eq!((default_tile(true, 128), default_tile(true, 256), default_tile(false, 128)), (17, 16, 0));
        // Tile 17's accumulators (three warpgroups) do not fit head dim 256.
        assert!(tile_shape(17, 256).is_some_and(|s| !s.fits(256)));
    }

    #[test]
    fn long_batches_over_tma_able_caches_take_the_tma_tile_on_sm90_at_head_dim_128() {
        let slots = 1 << 20;
        for tile in [LONG_TMA_TILE, MID_TMA_TILE] {
            assert!(tile_shape(tile, 128).is_some_and(|s| s.tma && s.fits(128)), "tile {tile}");
            // Asked for at head dim 256 (MINISGL_PREFILL_TILE), they take 28's or 35's
            // 64-key shape.
            assert!(tile_shape(tile, 256).is_some_and(|s| s.fits(256)), "tile {tile}");
        }
        // 48 (persistent, three consumers of 64 rows) up to 3071 keys, 39 from 3072.
        assert_eq!((long_tma_tile(64), long_tma_tile(3071), long_tma_tile(3072)), (48, 48, 39));
        assert_eq!(long_tma_tile(100_000), 39);
        assert!(tile_shape(MID_TMA_TILE, 128).is_some_and(|s| s.persistent && s.rows() == 192));
        assert!(long_tma_batch(true, 128, 64, 16, slots));
        assert!(long_tma_batch(true, 128, 8192, 64, slots));
        // Short runs, other head dims, other GPUs, pages TMA cannot copy, caches past
        // 32-bit slots: the default tile.
        assert!(!long_tma_batch(true, 128, 63, 16, slots));
        assert!(!long_tma_batch(true, 64, 4096, 16, slots));
        assert!(!long_tma_batch(true, 256, 4096, 16, slots));
        assert!(!long_tma_batch(false, 128, 4096, 16, slots));
        assert!(!long_tma_batch(true, 128, 4096, 1, slots));
        assert!(!long_tma_batch(true, 128, 4096, 24, slots));
        assert!(!long_tma_batch(true, 128, 4096, 16, 1 << 31));
    }

    #[test]
    fn long_prefills_take_the_prefill_kernel_and_decodes_do_not() {
        // One 4096-token prompt, GQA 32/8: 128 tiles x 8 kv heads.
        assert!(auto_takes(&[4096], 4, 8, 128, 132));
        // b=8 at 1024, and 16/8 heads at 4096.
        assert!(auto_takes(&[1024; 8], 4, 8, 128, 132));
        assert!(auto_takes(&[4096], 2, 8, 128, 132));
        // Decode, and a speculative step of 4 tokens: never.
        assert!(!auto_takes(&[1; 256], 4, 8, 128, 132));
        assert!(!auto_takes(&[4; 64], 4, 8, 128, 132));
        // A prefill chunk with decodes riding along: 2048 of 2048 + 100 rows long.
        let mut mixed = vec![2048];
        mixed.extend([1; 100]);
        assert!(auto_takes(&mixed, 4, 8, 128, 132));
        // Mostly decodes with one short prefill: the tile kernel.
        let mut mostly = vec![64];
        mostly.extend([1; 200]);
        assert!(!auto_takes(&mostly, 4, 8, 128, 132));
        // Short prompts of 32 tokens are not long runs.
        assert!(!auto_takes(&[32; 512], 4, 8, 128, 132));
        // One 512-token prompt at 32/8: 16 tiles x 8 = 128 blocks < 132 SMs.
        assert!(!auto_takes(&[512], 4, 8, 128, 132));
        assert!(auto_takes(&[544], 4, 8, 128, 132));
        assert!(!auto_takes(&[], 4, 8, 128, 132));
        assert!(!auto_takes(&[0, 0], 4, 8, 128, 132));
    }

    #[test]
    fn explicit_choices_and_unsupported_batches_keep_their_kernel() {
        let long = [4096];
        for k in [AttnKernel::Tile, AttnKernel::Decode, AttnKernel::Prefill] {
            assert_eq!(kernel_for(k, DType::BF16, 128, 0.1, false, &long, 4, 8, 132, true), k);
        }
        assert_eq!(kernel_for(AttnKernel::Auto, DType::F32, 128, 0.1, false, &long, 4, 8, 132, true), AttnKernel::Auto);
        assert_eq!(kernel_for(AttnKernel::Auto, DType::BF16, 96, 0.1, false, &long, 4, 8, 132, true), AttnKernel::Auto);
        // A non-positive scale, and a batch the decode kernel holds, stay off it.
        assert_eq!(
            kernel_for(AttnKernel::Auto, DType::BF16, 128, 0.0, false, &long, 4, 8, 132, true),
            AttnKernel::Auto
        );
        assert_eq!(
            kernel_for(AttnKernel::Auto, DType::BF16, 128, 0.1, true, &[1; 512], 4, 8, 132, true),
            AttnKernel::Auto
        );
        // Without MINISGL_PREFILL_KERNEL (the test environment), the rule decides.
        if std::env::var_os("MINISGL_PREFILL_KERNEL").is_none() {
            assert_eq!(
                kernel_for(AttnKernel::Auto, DType::F16, 64, 0.1, false, &long, 4, 8, 132, true),
                AttnKernel::Prefill
            );
            assert_eq!(
                kernel_for(AttnKernel::Auto, DType::BF16, 128, 0.1, false, &[9; 64], 4, 8, 132, true),
                AttnKernel::Auto
            );
        }
    }

    #[test]
    fn tile_shapes_mirror_the_kernel_table() {
        let t0 = tile_shape(0, 128).unwrap();
        assert_eq!((t0.rows(), t0.threads(), t0.keys, t0.stages), (128, 128, 64, 2));
        // Q 128 rows + 2 stages of 64 K and 64 V rows, 272 bytes each: two blocks an SM.
        assert_eq!(t0.smem_bytes(128), (128 + 256) * 272);
        let t256 = tile_shape(0, 256).unwrap();
        assert_eq!((t256.rows(), t256.keys), (64, 32));
        assert_eq!(t256.smem_bytes(256), (64 + 128) * 528);
        assert_eq!(tile_shape(0, 64), tile_shape(0, 128));
        assert_eq!(tile_shape(9, 128), None);
        // Every variant fits head dims 64 and 128; at 256 the ones with two m-tiles
        // (too many accumulators) or too much shared memory do not.
        for t in 0..TILES.len() {
            let s = tile_shape(t, 128).unwrap();
            assert!(s.fits(64) && s.fits(128), "tile {t}");
        }
        let fit_256: Vec<usize> = (0..TILES.len()).filter(|&t| tile_shape(t, 256).unwrap().fits(256)).collect();
        assert_eq!(fit_256, vec![0, 3, 5, 8]);
    }

    #[test]
    fn wgmma_tile_shapes_mirror_the_kernel_table() {
        // TILE 16: 2 warpgroups (128 rows, 256 threads), 128-key tiles, 2 stages:
        // Q 32 KiB + 4 x 32 KiB + the alignment slack.
        let t16 = tile_shape(16, 128).unwrap();
        assert!(t16.wgmma);
        assert_eq!((t16.rows(), t16.threads(), t16.keys, t16.stages), (128, 256, 128, 2));
        assert_eq!(t16.smem_bytes(128), (128 + 512) * 256 + 1024);
        // At head dim 256 it takes 64-key tiles.
        let t16_256 = tile_shape(16, 256).unwrap();
        assert_eq!((t16_256.rows(), t16_256.keys), (128, 64));
        assert!(t16_256.fits(256));
        // TILE 17: 3 warpgroups, 64 keys; TILE 18: 2 warpgroups, 64 keys, 3 stages.
        let t17 = tile_shape(17, 128).unwrap();
        assert_eq!((t17.rows(), t17.threads(), t17.keys, t17.stages), (192, 384, 64, 2));
        let t18 = tile_shape(18, 128).unwrap();
        assert_eq!((t18.rows(), t18.threads(), t18.keys, t18.stages), (128, 256, 64, 3));
        // The overlapped loops: 19 (64 keys, 4 stages), 20 (128 keys, 3 stages: just
        // under the 227 KiB), 21 (3 warpgroups, 64 keys, 3 stages).
        let t20 = tile_shape(20, 128).unwrap();
        assert_eq!((t20.rows(), t20.keys, t20.stages), (128, 128, 3));
        assert_eq!(t20.smem_bytes(128), (128 + 768) * 256 + 1024);
        assert_eq!(tile_shape(21, 128).unwrap().rows(), 192);
        for t in 16..=21 {
            let s = tile_shape(t, 64).unwrap();
            assert!(s.fits(64) && tile_shape(t, 128).unwrap().fits(128), "tile {t}");
        }
        assert!(!t17.fits(256) && !t18.fits(256));
        // The warp-specialised tiles: a producer warpgroup more. 22..24: two consumers,
        // 128 keys, 2 stages (22 at 256: 64 keys); 25: three consumers, 64 keys; 26: two,
        // 64 keys, 3 stages.
        let t22 = tile_shape(22, 128).unwrap();
        assert!(t22.wgmma && t22.producer);
        assert_eq!((t22.rows(), t22.threads(), t22.keys, t22.stages), (128, 384, 128, 2));
        assert_eq!(t22.smem_bytes(128), (128 + 512) * 256 + 1024);
        let t25 = tile_shape(25, 128).unwrap();
        assert_eq!((t25.rows(), t25.threads(), t25.keys), (192, 512, 64));
        assert_eq!(tile_shape(26, 128).unwrap().smem_bytes(128), (128 + 384) * 256 + 1024);
        assert_eq!(tile_shape(22, 256).unwrap().keys, 64);
        for t in 22..=26 {
            let s = tile_shape(t, 64).unwrap();
            assert!(s.fits(64) && tile_shape(t, 128).unwrap().fits(128), "tile {t}");
        }
        // 27..31: 22..26 with the K/V tiles copied by TMA, the same shapes.
        for t in 27..=31 {
            let (s, ws) = (tile_shape(t, 128).unwrap(), tile_shape(t - 5, 128).unwrap());
            assert!(s.tma && !ws.tma, "tile {t}");
            assert_eq!(TileShape { tma: false, ..s }, ws, "tile {t}");
            assert!(s.fits(64) && s.fits(128), "tile {t}");
        }
        assert_eq!((tile_shape(27, 256).unwrap().keys, tile_shape(28, 256).unwrap().keys), (64, 64));
        // 32, 33: one consumer of 64 rows, 64 keys, 2 stages: 81 KiB, two blocks an SM.
        let t32 = tile_shape(32, 128).unwrap();
        assert!(t32.tma && t32.producer);
        assert_eq!((t32.rows(), t32.threads(), t32.keys, t32.stages), (64, 256, 64, 2));
        assert_eq!(t32.smem_bytes(128), (64 + 256) * 256 + 1024);
        assert!(2 * t32.smem_bytes(128) <= MAX_SMEM);
        assert!(t32.fits(64) && tile_shape(33, 128).unwrap().fits(128));
        // 34, 35, 36: 27, 28, 30 with persistent blocks, two Q buffers where they fit.
        for (t, of) in [(34, 27), (35, 28), (36, 30)] {
            let (s, base) = (tile_shape(t, 128).unwrap(), tile_shape(of, 128).unwrap());
            assert!(s.persistent && !base.persistent, "tile {t}");
            assert_eq!(TileShape { persistent: false, ..s }, base, "tile {t}");
            assert_eq!((s.q_buffers(64), s.q_buffers(128), base.q_buffers(128)), (2, 2, 1), "tile {t}");
            assert_eq!(s.smem_bytes(128), base.smem_bytes(128) + s.rows() * 256, "tile {t}");
            assert!(s.fits(64) && s.fits(128), "tile {t}");
            assert_eq!((s.grid_blocks(1024, 132), s.grid_blocks(100, 132)), (132, 100), "tile {t}");
            assert_eq!(base.grid_blocks(1024, 132), 1024, "tile {t}");
        }
        assert_eq!(tile_shape(34, 128).unwrap().smem_bytes(128), (2 * 128 + 512) * 256 + 1024);
        // At head dim 256 two Q buffers of 34 do not fit beside its 64-key stages: one.
        let t34_256 = tile_shape(34, 256).unwrap();
        assert_eq!((t34_256.keys, t34_256.q_buffers(256)), (64, 1));
        // 37, 38: persistent, three stages; 37's 128-key stages leave room for one Q.
        let (t37, t38) = (tile_shape(37, 128).unwrap(), tile_shape(38, 128).unwrap());
        assert_eq!((t37.rows(), t37.keys, t37.stages, t37.q_buffers(128)), (128, 128, 3, 1));
        assert_eq!(t37.smem_bytes(128), (128 + 768) * 256 + 1024);
        assert_eq!((t38.rows(), t38.keys, t38.stages, t38.q_buffers(128)), (192, 64, 3, 2));
        assert!(t37.persistent && t38.persistent && t37.fits(128) && t38.fits(128) && t38.fits(64));
        // 39: 28 with three stages, 225 KiB at head dim 128.
        let t39 = tile_shape(39, 128).unwrap();
        assert_eq!((t39.rows(), t39.keys, t39.stages, t39.tma, t39.persistent), (128, 128, 3, true, false));
        assert_eq!(t39.smem_bytes(128), (128 + 768) * 256 + 1024);
        assert!(t39.fits(64) && t39.fits(128));
        assert_eq!(tile_shape(39, 256), tile_shape(28, 256));
        // 40: 28 with the tail by TMA, the same shape.
        assert_eq!(tile_shape(40, 128), tile_shape(28, 128));
        assert_eq!(tile_shape(40, 256), tile_shape(28, 256));
        // 41 and 42: 28 and 35 in FlashAttention-3's order, the same shapes.
        for hd in [64, 128, 256] {
            assert_eq!(tile_shape(41, hd), tile_shape(28, hd));
            assert_eq!(tile_shape(42, hd), tile_shape(35, hd));
            assert_eq!(tile_shape(43, hd), tile_shape(29, hd));
        }
        // 47: 46 persistent, two Q buffers; 35's shape at head dim 256.
        let (t46, t47) = (tile_shape(46, 128).unwrap(), tile_shape(47, 128).unwrap());
        assert_eq!(TileShape { persistent: false, ..t47 }, t46);
        assert_eq!((t47.q_buffers(128), t47.smem_bytes(128)), (2, (2 * 192 + 384) * 256 + 1024));
        assert!(t47.fits(64) && t47.fits(128));
        assert_eq!(tile_shape(47, 256), tile_shape(35, 256));
        // 48: 47 with its items drawn as the blocks need them, the same shapes.
        for hd in [64, 128, 256] {
            assert_eq!(tile_shape(48, hd), tile_shape(47, hd));
        }
        let fit_256: Vec<usize> = (16..=48).filter(|&t| tile_shape(t, 256).unwrap().fits(256)).collect();
        assert_eq!(fit_256, vec![16, 22, 27, 28, 34, 35, 39, 40, 41, 42, 46, 47, 48]);
        assert_eq!(tile_shape(15, 128), None);
        assert_eq!(tile_shape(49, 128), None);
    }

    #[test]
    fn q_tiles_go_by_tma_where_the_group_divides_their_rows() {
        assert_eq!(q_box_tokens(128, 4), Some(32));
        assert_eq!(q_box_tokens(192, 4), Some(48));
        assert_eq!(q_box_tokens(192, 3), Some(64));
        assert_eq!(q_box_tokens(128, 1), Some(128));
        assert_eq!(q_box_tokens(128, 3), None);
        assert_eq!(q_box_tokens(128, 512), None);
        assert_eq!(q_box_tokens(128, 0), None);
    }

    #[test]
    fn tma_copies_stay_inside_a_page_and_cover_whole_swizzle_groups() {
        // A copy is one page, or the whole K/V tile where pages are longer.
        assert_eq!(tma_rows(16, 64, 1 << 20), Some(16));
        assert_eq!(tma_rows(8, 128, 1 << 20), Some(8));
        assert_eq!(tma_rows(64, 64, 1 << 20), Some(64));
        assert_eq!(tma_rows(256, 128, 1 << 20), Some(128));
        // Pages shorter than a swizzle group or of another size than a power of
        // two gather by cp.async; so do caches past 32-bit slot coordinates.
        assert_eq!(tma_rows(1, 64, 1 << 20), None);
        assert_eq!(tma_rows(4, 64, 1 << 20), None);
        assert_eq!(tma_rows(24, 64, 1 << 20), None);
        assert_eq!(tma_rows(16, 64, 1 << 31), None);
        assert_eq!(tma_rows(16, 64, (1 << 31) - 1), Some(16));
    }

    /// The kernel's `prefill_ranked_tile`, step for step: the (sequence, tile in the
    /// sequence) of grid item `item`, `None` past the last.
    fn ranked_item(rk: &msgl_prefill_ranks, item: i32) -> Option<(i32, i32)> {
        let (mut lo, mut hi) = (0usize, rk.count as usize - 1);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if rk.before[mid] <= item {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let width = lo as i32 + 1;
        let first_depth = if lo + 1 < rk.count as usize { rk.tiles[lo + 1] } else { 0 };
        let offset = item - rk.before[lo];
        let depth = first_depth + offset / width;
        if depth >= rk.tiles[lo] {
            return None;
        }
        let r = (offset - (depth - first_depth) * width) as usize;
        Some((rk.seq[r], rk.tiles[r] - 1 - depth))
    }

    /// Every q tile of the batch is exactly one grid item, the items run depth-major
    /// (a sequence's last tiles first), and nothing lies past the last: on ragged,
    /// equal, single and random batches, with sequences of no new tokens between.
    #[test]
    fn ranked_items_cover_every_q_tile_once_depth_major() {
        use rand::{Rng, SeedableRng};
        let mut r = rand::rngs::StdRng::seed_from_u64(7);
        let mut batches: Vec<Vec<usize>> = vec![
            vec![1024; 8],
            vec![4096],
            vec![37, 100, 1, 129, 64, 0, 1, 255, 300],
            vec![0, 0, 5],
            (1..=64).collect(),
        ];
        let most = MSGL_PREFILL_RANKS as usize;
        batches.push((0..most).map(|i| 1 + i % 7).collect());
        for _ in 0..200 {
            let n = r.gen_range(1..=most);
            batches.push((0..n).map(|_| if r.gen_bool(0.2) { 0 } else { r.gen_range(1..3000) }).collect());
        }
        for q_lens in &batches {
            for (group, rows) in [(4, 192), (4, 128), (1, 128), (8, 128), (3, 192), (2, 64)] {
                let kv_lens: Vec<usize> = q_lens.iter().map(|q| q + 7).collect();
                let tiles: Vec<usize> = q_lens.iter().map(|q| (q * group).div_ceil(rows)).collect();
                let total: usize = tiles.iter().sum();
                let Some(rk) = item_ranks(q_lens, &kv_lens, group, rows) else {
                    assert!(q_lens.iter().filter(|&&q| q > 0).count() > most || total == 0);
                    continue;
                };
                // The segment starts, summed the long way (tensor.h's definition).
                for r in 0..rk.count as usize {
                    let below = if r + 1 < rk.count as usize { rk.tiles[r + 1] } else { 0 };
                    let want: i32 = (0..rk.count as usize).map(|j| rk.tiles[j].min(below)).sum();
                    assert_eq!(rk.before[r], want, "{q_lens:?}: before[{r}]");
                }
                assert_eq!(rk.count as usize, q_lens.iter().filter(|&&q| q > 0).count());
                if rk.count == 0 {
                    continue;
                }
                let mut seen = vec![vec![false; tiles.iter().copied().max().unwrap_or(0)]; q_lens.len()];
                let mut last_depth = 0;
                for item in 0..total {
                    let (seq, tile) = ranked_item(&rk, item as i32).expect("an item before the last");
                    let (seq, tile) = (seq as usize, tile as usize);
                    assert!(tile < tiles[seq], "{q_lens:?} item {item}: tile {tile} of {}", tiles[seq]);
                    assert!(!std::mem::replace(&mut seen[seq][tile], true), "{q_lens:?}: ({seq}, {tile}) twice");
                    let depth = tiles[seq] - 1 - tile;
                    assert!(depth >= last_depth, "{q_lens:?}: item {item} at depth {depth} after {last_depth}");
                    last_depth = depth;
                    let r = (0..rk.count as usize).find(|&r| rk.seq[r] as usize == seq).expect("ranked");
                    let start: usize = q_lens[..seq].iter().sum();
                    assert_eq!(
                        (rk.q_start[r], rk.q_len[r], rk.kv_len[r]),
                        (start as i32, q_lens[seq] as i32, kv_lens[seq] as i32)
                    );
                }
                assert_eq!(ranked_item(&rk, total as i32), None);
            }
        }
        // More prompts than the ranking holds: the kernel searches. Sequences without
        // new tokens take no rank.
        assert!(item_ranks(&vec![10; most + 1], &vec![10; most + 1], 4, 128).is_none());
        assert!(item_ranks(&vec![10; most], &vec![10; most], 4, 128).is_some());
        let mut with_idle = vec![10; most];
        with_idle.extend([0; 9]);
        assert!(item_ranks(&with_idle, &vec![10; most + 9], 4, 128).is_some());
    }
}
