/*
 * prefill_attention.cu: causal attention over the paged KV cache for batches of
 * long query runs (prefill, and chunked prefill over a cached prefix), bf16/f16,
 * FlashAttention-2 style with large query tiles and a multi-stage K/V pipeline.
 *
 *   out[t, h] = softmax(scale * q[t, h] . K^T + causal mask) V
 *
 * It reads the same msgl_attention_params as attention.cu (the "tile" kernel, which
 * serves short runs and decode and splits keys); this one never splits keys, so
 * the host sends it only batches that fill the GPU with query tiles
 * (kernel-runtime/src/gpu/prefill.rs).
 *
 * Work decomposition. Query rows of one sequence and one kv head are packed as
 * (token, head in the GQA group) pairs, token-major, as in attention.cu: a block
 * owns BM = 16 * WARPS * MT such rows (a q tile) of one kv head, so the K/V tiles
 * it loads serve the whole GQA group. Warp w owns the MT consecutive 16-row
 * m-tiles [w * 16 * MT, (w + 1) * 16 * MT) of the tile: with MT = 2 every K/V
 * fragment loaded from shared memory feeds two mma, halving the shared-memory
 * traffic per FLOP (FA2's 128 x 64 tile with 4 warps).
 *
 * Grid order (load balance): blockIdx.x = item * num_kv_heads + kv_head, and items
 * are ordered by depth d = tiles from the end of the sequence, then by sequence
 * (prefill_find_tile): the last tiles of every sequence, which attend to the most
 * keys, run first, the short first tiles fill the tail.
 *
 * Pipeline (STAGES buffers of K and V, separate commit groups for K and V):
 *   prologue: Q + K[0] | V[0] | K[1] | V[1] | ... up to tile STAGES - 2
 *   iteration i: wait K[i]; __syncthreads (K[i] visible; every warp is done with
 *     tile i - 1, whose buffers are reused); issue K[i + STAGES - 1], V[...];
 *     S = Q K[i]^T; online softmax; wait V[i]; __syncthreads; O += P V[i].
 * So the loads of tile i + 1 (STAGES = 2) overlap both products of tile i. Groups
 * are committed even when empty, so the wait counts are constants.
 *
 * Rows: Q and the K/V rows are gathered with 16-byte cp.async (K/V through the
 * page table, any page size), zero-filled past the tile's last causal key and for
 * page numbers outside the cache; shared rows are padded by 16 bytes so ldmatrix is
 * free of bank conflicts. Fragments: Q and K with ldmatrix, V with ldmatrix.trans,
 * P re-packed from the S accumulators in registers; mma.sync m16n8k16 with f32
 * accumulators; softmax online in the log2 domain (one FFMA and one ex2.approx per
 * score; the host sends only positive scales). Only the tiles
 * that reach past a warp's first row position are masked; tiles past a warp's last
 * row position are skipped by that warp (it still takes part in the loads and the
 * barriers). Padding rows of a short last q tile read zero Q, attend like the
 * tile's last row and are never written.
 *
 * Epilogue: each warp normalises its rows, stages them in its own rows of the Q
 * buffer and writes 16-byte vectors (a token's heads of the group are contiguous
 * in `out`).
 *
 * TILE >= 16 selects the Hopper path further down (wgmma, sm_90a only; same grid,
 * rows and output): 2 or 3 warpgroups of 64 query rows, 128-byte swizzled tiles,
 * and for TILE 19..21 the softmax of one K/V tile overlapping the P V product of
 * the previous one; TILE 22..26 add a producer warpgroup that does all the
 * gathering, with transaction barriers instead of block-wide ones.
 */
#include "minisgl/attention.cuh"
#include "minisgl/bulk.cuh"
#include "minisgl/mma.cuh"

/* Timing probe points of the warp-specialised tiles (prefill_ws_impl), for
 * scripts/gpu/prefill_probe.cu, a development tool that defines it; nothing here. */
#ifndef MSGL_PREFILL_PROBE
#define MSGL_PREFILL_PROBE(point)
#endif

namespace msgl {

/* TILE -> (WARPS, MT, BN, STAGES): WARPS warps of MT 16-row m-tiles each, BN keys
 * per K/V tile, STAGES K/V buffers. TILE 0 is the default: 128 x 64, two stages up
 * to head dim 128; 64 x 32 at head dim 256 (fewer accumulators, two blocks an SM).
 * kernel-runtime/src/gpu/prefill.rs (PREFILL_TILES) mirrors this table. */
template <int TILE, int HEAD_DIM> struct PrefillTile;
#define MSGL_PREFILL_TILE(T, W, M, N, S)                               \
  template <int HEAD_DIM> struct PrefillTile<T, HEAD_DIM> {            \
    static constexpr int WARPS = W, MT = M, BN = N, STAGES = S;        \
  };
MSGL_PREFILL_TILE(1, 4, 2, 32, 2)
MSGL_PREFILL_TILE(2, 4, 2, 64, 3)
MSGL_PREFILL_TILE(3, 8, 1, 64, 2)
MSGL_PREFILL_TILE(4, 8, 1, 64, 3)
MSGL_PREFILL_TILE(5, 4, 1, 64, 2)
MSGL_PREFILL_TILE(6, 4, 1, 128, 2)
MSGL_PREFILL_TILE(7, 4, 2, 32, 3)
MSGL_PREFILL_TILE(8, 8, 1, 32, 2)
#undef MSGL_PREFILL_TILE
template <int HEAD_DIM> struct PrefillTile<0, HEAD_DIM> {
  static constexpr int WARPS = 4, MT = HEAD_DIM <= 128 ? 2 : 1, BN = HEAD_DIM <= 128 ? 64 : 32, STAGES = 2;
};

template <int TILE, int HEAD_DIM> __host__ __device__ constexpr int prefill_threads() {
  return 32 * PrefillTile<TILE, HEAD_DIM>::WARPS;
}

/* Query rows per block. */
template <int TILE, int HEAD_DIM> __host__ __device__ constexpr int prefill_rows() {
  return 16 * PrefillTile<TILE, HEAD_DIM>::WARPS * PrefillTile<TILE, HEAD_DIM>::MT;
}

/* Dynamic shared memory: the Q tile and STAGES K and V tiles, rows of HEAD_DIM
 * 16-bit elements plus 16 bytes. */
template <int TILE, int HEAD_DIM> __host__ __device__ constexpr long long prefill_smem_bytes() {
  using C = PrefillTile<TILE, HEAD_DIM>;
  return static_cast<long long>(prefill_rows<TILE, HEAD_DIM>() + 2 * C::STAGES * C::BN) * (HEAD_DIM + 8) * 2;
}

/* q tiles of sequence s. */
__device__ __forceinline__ int prefill_tiles_of(int q_len, int group, int bm) { return (q_len * group + bm - 1) / bm; }

/* The sequence of a grid item, as prefill_find_tile found it. */
struct PrefillSeq {
  int seq, tile_in_seq, q_start, q_len, kv_len;
};

/* Sequences whose batch-layout words (q_indptr pair, kv_len) each lane keeps in
 * registers while searching: lane, lane + 32, ... up to this many a lane; the rest
 * are read again from memory at each step of the search. */
constexpr int kPrefillSeqChunks = 4;

/* The (sequence, q tile) of grid item `item` (see the header: depth-major order).
 * With n_s the tiles of sequence s, before(d) = sum_s min(n_s, d) items have depth
 * < d; the item's depth is the largest d with before(d) <= item, and it is the
 * (item - before(d))-th sequence, in order, with n_s > d; its tile is n_s - 1 - d.
 * The batch layout is read once, all loads issued together, and the search runs on
 * registers: a chain of dependent reads here took ~5,000 cycles at the start of
 * every block (the H100; scripts/gpu/prefill_probe.cu's timeline). Warp-uniform;
 * false for items past the last. */
__device__ __forceinline__ bool prefill_find_tile(const msgl_attention_params& p, int item, int group, int bm,
                                                  PrefillSeq& out) {
  const int lane = threadIdx.x % kWarpSize, num_seqs = p.num_seqs;
  constexpr int CACHED = kPrefillSeqChunks * kWarpSize;
  int q_start[kPrefillSeqChunks], q_len[kPrefillSeqChunks], kv_len[kPrefillSeqChunks], n[kPrefillSeqChunks];
#pragma unroll
  for (int c = 0; c < kPrefillSeqChunks; ++c) {
    const int s = lane + c * kWarpSize;
    const bool in = s < num_seqs;
    q_start[c] = in ? p.q_indptr[s] : 0;
    q_len[c] = in ? p.q_indptr[s + 1] : 0;
    kv_len[c] = in ? p.kv_lens[s] : 0;
  }
#pragma unroll
  for (int c = 0; c < kPrefillSeqChunks; ++c) {
    q_len[c] -= q_start[c];
    n[c] = prefill_tiles_of(q_len[c], group, bm);
  }
  auto tiles_at = [&](int s) { return prefill_tiles_of(p.q_indptr[s + 1] - p.q_indptr[s], group, bm); };
  /* The largest tile count, and before(d): warp-wide over the sequences. */
  int max_tiles = 0;
#pragma unroll
  for (int c = 0; c < kPrefillSeqChunks; ++c) max_tiles = max(max_tiles, n[c]); /* n = 0 past the batch */
  for (int s = CACHED + lane; s < num_seqs; s += kWarpSize) max_tiles = max(max_tiles, tiles_at(s));
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) max_tiles = max(max_tiles, __shfl_xor_sync(0xffffffffu, max_tiles, o));
  if (max_tiles == 0) return false;
  /* before(d) for each lane's own d: every sequence's tile count is broadcast to the
   * warp, so that 32 depths are tried at once. */
  auto before = [&](int d) {
    int acc = 0;
#pragma unroll
    for (int c = 0; c < kPrefillSeqChunks; ++c) {
      const int in_chunk = min(kWarpSize, num_seqs - c * kWarpSize);
      for (int j = 0; j < in_chunk; ++j) acc += min(__shfl_sync(0xffffffffu, n[c], j), d);
    }
    for (int base = CACHED; base < num_seqs; base += kWarpSize) {
      const int tiles = base + lane < num_seqs ? tiles_at(base + lane) : 0;
      const int in_chunk = min(kWarpSize, num_seqs - base);
      for (int j = 0; j < in_chunk; ++j) acc += min(__shfl_sync(0xffffffffu, tiles, j), d);
    }
    return acc;
  };
  /* The depth: the largest d in [lo, hi] with before(d) <= item (before(0) = 0 <= item,
   * and before grows with d), found 32 candidates a round (lane l tries lo + l step):
   * two rounds up to 1024 tiles a sequence, where a binary search of warp-wide sums
   * took ~3,000 cycles at the start of every block. */
  int lo = 0, hi = max_tiles - 1;
  while (lo < hi) {
    const int step = (hi - lo + kWarpSize) / kWarpSize; /* ceil((hi - lo + 1) / 32) */
    const int d = lo + lane * step;
    const int items_before = before(min(d, hi)); /* every lane: before() shuffles */
    const unsigned ok = __ballot_sync(0xffffffffu, d <= hi && items_before <= item);
    const int best = lo + (kWarpSize - 1 - __clz(ok)) * step; /* lane 0 (d = lo) is always ok */
    hi = min(hi, best + step - 1);
    lo = best;
  }
  const int depth = lo;
  int k = item - before(depth);
  /* The k-th sequence deeper than `depth` among lanes' `tiles` (of sequences base +
   * lane): true once found, with `from` the lane that has it; else k moves past them. */
  auto pick = [&](int tiles, int& from) {
    const unsigned mask = __ballot_sync(0xffffffffu, tiles > depth);
    const int count = __popc(mask);
    if (k >= count) {
      k -= count;
      return false;
    }
    const bool mine = tiles > depth && __popc(mask & ((1u << lane) - 1u)) == k;
    from = __ffs(__ballot_sync(0xffffffffu, mine)) - 1;
    return true;
  };
  int from = 0;
#pragma unroll
  for (int c = 0; c < kPrefillSeqChunks; ++c) {
    if (pick(n[c], from)) {
      out.seq = c * kWarpSize + from;
      out.tile_in_seq = __shfl_sync(0xffffffffu, n[c], from) - 1 - depth;
      out.q_start = __shfl_sync(0xffffffffu, q_start[c], from);
      out.q_len = __shfl_sync(0xffffffffu, q_len[c], from);
      out.kv_len = __shfl_sync(0xffffffffu, kv_len[c], from);
      return true;
    }
  }
  for (int base = CACHED; base < num_seqs; base += kWarpSize) {
    const int s = base + lane;
    const int tiles = s < num_seqs ? tiles_at(s) : 0;
    if (pick(tiles, from)) {
      out.seq = base + from;
      out.tile_in_seq = __shfl_sync(0xffffffffu, tiles, from) - 1 - depth;
      out.q_start = p.q_indptr[out.seq];
      out.q_len = p.q_indptr[out.seq + 1] - out.q_start;
      out.kv_len = p.kv_lens[out.seq];
      return true;
    }
  }
  return false;
}

/* prefill_find_tile's answer from the host's ranking (msgl_prefill_ranks), with no
 * read of the batch layout in memory: the search and its loads took ~3,500 cycles of
 * every block's start, ~2,300 more than finding equal prompts' items by arithmetic
 * (the H100; docs/PERF.md, twenty-fifth session). The items run depth-major as there,
 * the sequences of one depth in rank order: at the depths in [tiles[r + 1], tiles[r])
 * exactly ranks 0..r have a tile, so those depths' items are the segment that starts
 * at before[r], r + 1 items a depth. The item's segment is the lowest r with
 * before[r] <= item (before does not grow with r; before[count - 1] = 0): a binary
 * search on the parameters, the same address in every lane. Uniform; false past the
 * last item. */
__device__ __forceinline__ bool prefill_ranked_tile(const msgl_prefill_ranks& rk, int item, PrefillSeq& out) {
  int lo = 0, hi = rk.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (rk.before[mid] <= item) hi = mid;
    else lo = mid + 1;
  }
  const int width = lo + 1; /* ranks with a tile at the segment's depths */
  const int first_depth = lo + 1 < rk.count ? rk.tiles[lo + 1] : 0;
  const int offset = item - rk.before[lo];
  const int depth = first_depth + offset / width;
  if (depth >= rk.tiles[lo]) return false;
  const int r = offset - (depth - first_depth) * width;
  out.seq = rk.seq[r];
  out.tile_in_seq = rk.tiles[r] - 1 - depth;
  out.q_start = rk.q_start[r];
  out.q_len = rk.q_len[r];
  out.kv_len = rk.kv_len[r];
  return true;
}

template <int DTYPE, int HEAD_DIM, int TILE>
__device__ __forceinline__ void prefill_attention_impl(const msgl_attention_params& p) {
  static_assert(DTYPE == MSGL_BF16 || DTYPE == MSGL_F16, "tensor cores: bf16 or f16");
  using T = typename DType<DTYPE>::Storage;
  using Cfg = PrefillTile<TILE, HEAD_DIM>;
  constexpr int MT = Cfg::MT, BN = Cfg::BN, STAGES = Cfg::STAGES;
  constexpr int BM = prefill_rows<TILE, HEAD_DIM>();
  constexpr int THREADS = prefill_threads<TILE, HEAD_DIM>();
  constexpr int ROW = HEAD_DIM + 8;     /* shared row, elements (16 bytes of padding) */
  constexpr int CHUNKS = HEAD_DIM / 8;  /* 16-byte chunks per head row */
  constexpr int NT = BN / 8;            /* 8-key column tiles of S */
  constexpr int DT = HEAD_DIM / 8;      /* 8-wide column tiles of O */
  static_assert(HEAD_DIM % 16 == 0 && BN % 16 == 0 && STAGES >= 2, "tile shapes");
  static_assert(THREADS % CHUNKS == 0, "a thread copies the same chunk column of every row it loads");
  static_assert((BM * CHUNKS) % THREADS == 0 && (BN * CHUNKS) % THREADS == 0, "whole copy rounds");
  constexpr int RSTEP = THREADS / CHUNKS; /* rows one copy round covers */

  extern __shared__ __align__(16) unsigned char prefill_smem[];
  T* q_s = reinterpret_cast<T*>(prefill_smem);
  T* k_s = q_s + BM * ROW;           /* STAGES x BN x ROW */
  T* v_s = k_s + STAGES * BN * ROW;  /* STAGES x BN x ROW */

  const int group = p.num_q_heads / p.num_kv_heads;
  const int kv_head = static_cast<int>(blockIdx.x % p.num_kv_heads);
  const int item = static_cast<int>(blockIdx.x / p.num_kv_heads);
  PrefillSeq found{};
  if (!prefill_find_tile(p, item, group, BM, found)) return;
  const int seq = found.seq, q_start = found.q_start, q_len = found.q_len;
  const int prefix = found.kv_len - q_len;  /* cached tokens before the new ones */
  const int row0 = found.tile_in_seq * BM; /* first packed row of the tile */
  const int rows = min(BM, q_len * group - row0);
  const int last_pos = prefix + (row0 + rows - 1) / group;
  const int kv_stop = last_pos + 1; /* keys the tile attends to: [0, kv_stop) */
  const int num_tiles = (kv_stop + BN - 1) / BN;
  const int* pages = p.block_table + static_cast<long long>(seq) * p.max_pages;

  /* Copy geometry: this thread copies chunk column `ccol` of rows crow, crow + RSTEP, ... */
  const int ccol = threadIdx.x % CHUNKS;
  const int crow = threadIdx.x / CHUNKS;

  /* Stage Q: packed row pr is token pr / group, head kv_head * group + pr % group. */
#pragma unroll
  for (int i = 0; i < BM / RSTEP; ++i) {
    const int r = crow + i * RSTEP;
    const bool valid = r < rows;
    const T* src = static_cast<const T*>(p.q);
    if (valid) {
      const int pr = row0 + r;
      src += static_cast<long long>(q_start + pr / group) * p.q_token_stride +
             static_cast<long long>(kv_head * group + pr % group) * p.q_head_stride + ccol * 8;
    }
    cp_async16(q_s + r * ROW + ccol * 8, src, valid ? 16 : 0);
  }
  /* Page sizes are usually powers of two: then shift and mask instead of dividing. */
  const int page_size = p.page_size;
  const int page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  /* Gathers keys [tile * BN, tile * BN + BN) of this kv head from `cache` into stage
   * buffer `buf`: zeros past kv_stop and for page numbers outside the cache. */
  auto load_kv = [&](T* buf, const void* cache, int tile) {
#pragma unroll
    for (int i = 0; i < BN / RSTEP; ++i) {
      const int r = crow + i * RSTEP;
      const int kv = tile * BN + r;
      const T* src = static_cast<const T*>(cache);
      bool valid = kv < kv_stop;
      if (valid) {
        const int page_idx = page_shift >= 0 ? kv >> page_shift : kv / page_size;
        const int in_page = page_shift >= 0 ? kv & (page_size - 1) : kv - page_idx * page_size;
        const int page = __ldg(pages + page_idx);
        valid = page >= 0 && page < p.num_pages;
        if (valid) {
          const long long slot = static_cast<long long>(page) * page_size + in_page;
          src += (slot * p.num_kv_heads + kv_head) * HEAD_DIM + ccol * 8;
        }
      }
      cp_async16(buf + r * ROW + ccol * 8, src, valid ? 16 : 0);
    }
  };
  /* Prologue: Q with K[0], then V[0], then tiles 1..STAGES-2 (groups always committed). */
#pragma unroll
  for (int t = 0; t < STAGES - 1; ++t) {
    if (t < num_tiles) load_kv(k_s + t * BN * ROW, p.k_cache, t);
    cp_async_commit();
    if (t < num_tiles) load_kv(v_s + t * BN * ROW, p.v_cache, t);
    cp_async_commit();
  }

  /* This warp's rows: [wrow0, wrow0 + 16 * MT) of the tile. Lane (g, tid) holds rows
   * g and g + 8 of each m-tile (the accumulator layout), columns 2 tid, 2 tid + 1 of
   * every 8-column tile. */
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, tid = lane % 4;
  const int wrow0 = warp * 16 * MT;
  const bool warp_rows = wrow0 < rows;
  const int wrows = warp_rows ? min(16 * MT, rows - wrow0) : 1;
  /* Positions of the warp's first and last valid rows: keys past the first need the
   * mask, keys past the last are skipped. */
  const int warp_first_pos = prefix + (row0 + wrow0) / group;
  const int warp_last_pos = prefix + (row0 + wrow0 + wrows - 1) / group;
  int pos[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wrow0 + mt * 16 + g + 8 * h;
      pos[mt][h] = r < rows ? prefix + (row0 + r) / group : last_pos; /* padding: like the last row */
    }
  }

  float o[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < DT; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = neg_inf(), l[mt][0] = l[mt][1] = 0.f;
  const float scale_log2 = p.scale_log2;

  for (int it = 0; it < num_tiles; ++it) {
    const int buf = it % STAGES;
    const T* kb = k_s + buf * BN * ROW;
    const T* vb = v_s + buf * BN * ROW;
    cp_async_wait<2 * STAGES - 3>(); /* Q and K[it] of this thread have landed */
    __syncthreads();                 /* ... of every thread; tile it - 1 is done */
    {
      const int next = it + STAGES - 1; /* into the buffers of tile it - 1 */
      const int nbuf = next % STAGES;
      if (next < num_tiles) load_kv(k_s + nbuf * BN * ROW, p.k_cache, next);
      cp_async_commit();
      if (next < num_tiles) load_kv(v_s + nbuf * BN * ROW, p.v_cache, next);
      cp_async_commit();
    }
    const int start = it * BN;
    const bool active = warp_rows && start <= warp_last_pos;
    float s[MT][NT][4];
    if (active) {
      /* S = Q K^T for the warp's MT m-tiles. */
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < NT; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          ldmatrix_x4(a[mt], q_s + (wrow0 + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * ROW + kk * 16 + (lane / 16) * 8);
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
          unsigned b[4];
          ldmatrix_x4(b, kb + ((nt + lane / 16) * 8 + lane % 8) * ROW + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816<DTYPE>(s[mt][nt], a[mt], b[0], b[1]);
            mma16816<DTYPE>(s[mt][nt + 1], a[mt], b[2], b[3]);
          }
        }
      }
      /* Mask: only tiles reaching past the warp's first position (a uniform branch). */
      if (start + BN - 1 > warp_first_pos) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
              if (start + nt * 8 + tid * 2 + (i & 1) > pos[mt][i / 2]) s[mt][nt][i] = neg_inf();
      }
      /* Online softmax in the log2 domain: m is the running max of scale_log2 * s
       * (scale_log2 > 0, checked by the host, so the max of the raw scores scales),
       * and p = exp2(s * scale_log2 - m) is one FFMA and one ex2. */
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float tile_max = neg_inf();
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            tile_max = fmaxf(tile_max, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
          const float m_new = fmaxf(m[mt][h], tile_max * scale_log2);
          /* A row with no key yet keeps m = -inf: subtract 0 so exp2 gives 0, not NaN. */
          const float m_ref = m_new == neg_inf() ? 0.f : m_new;
          const float alpha = fast_exp2(m[mt][h] - m_ref);
          m[mt][h] = m_new;
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float pv = fast_exp2(fmaf(s[mt][nt][2 * h + e], scale_log2, -m_ref));
              s[mt][nt][2 * h + e] = pv;
              sum += pv;
            }
          }
          l[mt][h] = l[mt][h] * alpha + sum;
#pragma unroll
          for (int dt = 0; dt < DT; ++dt) {
            o[mt][dt][2 * h] *= alpha;
            o[mt][dt][2 * h + 1] *= alpha;
          }
        }
      }
    }

    cp_async_wait<2 * STAGES - 2>(); /* V[it] of this thread has landed */
    __syncthreads();                 /* ... of every thread */

    if (active) {
      /* O += P V: P (16 x 16 per m-tile and key step) from the S accumulators. */
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          a[mt][0] = pack2<DTYPE>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = pack2<DTYPE>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = pack2<DTYPE>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = pack2<DTYPE>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dt = 0; dt < DT; dt += 2) {
          unsigned b[4];
          ldmatrix_x4_trans(b, vb + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * ROW + (dt + lane / 16) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816<DTYPE>(o[mt][dt], a[mt], b[0], b[1]);
            mma16816<DTYPE>(o[mt][dt + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
  }
  cp_async_wait<0>();
  if (!warp_rows) return;

  /* Epilogue: normalise; stage the warp's rows in its own Q rows (only this warp
   * ever read them), then 16-byte stores. */
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float total = l[mt][h];
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      total += __shfl_xor_sync(0xffffffffu, total, 2);
      const float inv = total > 0.f ? 1.f / total : 0.f;
      T* dst = q_s + (wrow0 + mt * 16 + g + 8 * h) * ROW + tid * 2;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<unsigned*>(dst + dt * 8) = pack2<DTYPE>(o[mt][dt][2 * h] * inv, o[mt][dt][2 * h + 1] * inv);
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(p.out);
  for (int c = lane; c < 16 * MT * CHUNKS; c += kWarpSize) {
    const int r = wrow0 + c / CHUNKS, col = c % CHUNKS;
    if (r >= rows) break; /* rows are visited in order */
    const int pr = row0 + r;
    const long long row = static_cast<long long>(q_start + pr / group) * p.num_q_heads + kv_head * group + pr % group;
    *reinterpret_cast<uint4*>(out + row * HEAD_DIM + col * 8) = *reinterpret_cast<const uint4*>(q_s + r * ROW + col * 8);
  }
}


/* ---------------------------------------------------------------------------------
 * The Hopper path (TILE >= 16, sm_90a): wgmma, FlashAttention-3 style but without
 * producer/consumer warp specialisation. A block is WGS warpgroups (128 threads
 * each); warpgroup w owns the 64 packed query rows [64 w, 64 w + 64) of the block's
 * BM = 64 WGS rows (the same (token, head in the GQA group) packing, grid order and
 * tile lookup as above, so the host's q tile count is the same formula).
 *
 * Per K/V tile of BN keys, each warpgroup:
 *   S = Q K^T    wgmma m64nBNk16, A = Q and B = K from shared memory (both K-major)
 *   online softmax on the f32 S accumulators in registers (log2 domain, as above)
 *   O += P V     wgmma m64nHDk16, A = P from registers (bf16/f16), B = V from shared
 *                memory, MN-major (keys are the reduction dimension; transpose bit)
 * All threads gather K/V tiles with 16-byte cp.async (the page table as above);
 * STAGES buffers, one commit group per tile (K and V together), the loads of tile
 * it + STAGES - 1 issued after the barrier of tile it so they overlap its products.
 * cp.async writes through the generic proxy and wgmma reads through the async
 * proxy: every thread runs fence.proxy.async after its copies have landed and before
 * the barrier that publishes them.
 *
 * Shared layout (the 128-byte swizzle, the canonical wgmma layout): a tile of R rows
 * (query or key rows) of HEAD_DIM 16-bit elements is stored as HEAD_DIM / 64 column
 * blocks of R rows x 128 bytes (64 elements), block b at b * R * 128 bytes; in a block
 * row r is at r * 128, and its 16-byte chunk c (elements 8c..8c+7 of the block) at
 * ((c ^ (r % 8)) * 16): Swizzle<3,4,3> on the byte address, so every tile starts at
 * a multiple of 1024 bytes (the dynamic shared base is rounded up to 1024).
 * Descriptors (bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, 62-63 = 1:
 * 128-byte swizzle):
 *   Q, K (K-major): 8-row groups 1024 bytes apart (SBO = 1024); a k-step of 16
 *     elements is 32 bytes inside a 128-byte row, so step kk starts at block kk / 4
 *     plus (kk % 4) * 32 bytes; LBO is unused by K-major swizzled layouts (set to 16).
 *   V (MN-major, for P V): along N (head dim) 64 elements per 128-byte row, the next
 *     64 at the next column block (LBO = R * 128); along K (keys) 8 rows 128 bytes
 *     apart, the next 8 keys 1024 bytes on (SBO = 1024); key step kk (16 keys) starts
 *     at kk * 16 * 128 bytes.
 * K and V tiles share the storage layout; only their descriptors differ.
 *
 * Fragments (PTX ISA, wgmma register fragments): warp q of a warpgroup holds rows
 * 16 q .. 16 q + 15 of the m64 tile; lane 4 g + t holds, of every 8-column block j,
 * d[4j], d[4j+1] = row g, columns 8j + 2t, 8j + 2t + 1 and d[4j+2], d[4j+3] = row
 * g + 8, the same columns. The register A fragment of m64k16 is mma.sync's m16k16 A
 * per warp: {row g, k 2t..2t+1}, {row g+8, k 2t..}, {row g, k 2t+8..}, {row g+8, k
 * 2t+8..}, so P for key step kk packs S blocks 2kk and 2kk+1 exactly as the mma.sync
 * path does.
 *
 * Output: each warp normalises its 16 rows, stages them in its own rows of the Q
 * buffer (after a warpgroup barrier: the warpgroup's last wgmma read them) and
 * writes 16-byte vectors, as above.
 * --------------------------------------------------------------------------------- */

/* TILE -> (WGS, BN, STAGES, OVERLAP, PRODUCER, PINGPONG, TMA) for the wgmma path:
 * WGS warpgroups of 64 query rows that run the products; OVERLAP: the loop that runs
 * the softmax of tile j under the P V product of tile j - 1; PRODUCER: one more
 * warpgroup that only gathers Q, K and V (the warp-specialised tiles 22.., further
 * down); PINGPONG: their two consumers take turns on the tensor cores; TMA: the
 * producer copies whole K/V tiles by TMA through the caches' tensor maps (27..31:
 * 22..26 with TMA; 32, 33: one consumer of 64 rows, two blocks an SM, so that one
 * block's start and epilogue run under the other's products). Mirrored by
 * gpu/prefill.rs. */
template <int TILE, int HEAD_DIM> struct PrefillWgTile;
/* The flags most tiles leave off (PERSISTENT, TMA_TAIL, EARLY: see the tiles that set
 * them); every table entry derives from it and sets only what it turns on. */
struct PrefillWgRareFlags {
  static constexpr bool PERSISTENT = false, TMA_TAIL = false, EARLY = false, DYNAMIC = false;
};
#define MSGL_PREFILL_WG_TILE(T, W, N, S, O, P, PP, TM)                              \
  template <int HEAD_DIM> struct PrefillWgTile<T, HEAD_DIM> : PrefillWgRareFlags { \
    static constexpr int WGS = W, BN = N, STAGES = S;                               \
    static constexpr bool OVERLAP = O, PRODUCER = P, PINGPONG = PP, TMA = TM;        \
  };
MSGL_PREFILL_WG_TILE(17, 3, 64, 2, false, false, false, false)
MSGL_PREFILL_WG_TILE(18, 2, 64, 3, false, false, false, false)
MSGL_PREFILL_WG_TILE(19, 2, 64, 4, true, false, false, false)
MSGL_PREFILL_WG_TILE(20, 2, 128, 3, true, false, false, false)
MSGL_PREFILL_WG_TILE(21, 3, 64, 3, true, false, false, false)
MSGL_PREFILL_WG_TILE(23, 2, 128, 2, true, true, false, false)
MSGL_PREFILL_WG_TILE(24, 2, 128, 2, true, true, true, false)
MSGL_PREFILL_WG_TILE(25, 3, 64, 2, false, true, false, false)
MSGL_PREFILL_WG_TILE(26, 2, 64, 3, true, true, true, false)
MSGL_PREFILL_WG_TILE(29, 2, 128, 2, true, true, true, true)
MSGL_PREFILL_WG_TILE(30, 3, 64, 2, false, true, false, true)
MSGL_PREFILL_WG_TILE(31, 2, 64, 3, true, true, true, true)
MSGL_PREFILL_WG_TILE(32, 1, 64, 2, false, true, false, true)
MSGL_PREFILL_WG_TILE(33, 1, 64, 2, true, true, false, true)
MSGL_PREFILL_WG_TILE(44, 3, 64, 3, false, true, false, true)
MSGL_PREFILL_WG_TILE(45, 3, 64, 2, true, true, false, true)
#undef MSGL_PREFILL_WG_TILE
/* TILE 16: 128 x 128 up to head dim 128, 128 x 64 at 256 (shared memory); TILE 22,
 * its warp-specialised form, and 27 (22 with TMA) the same. */
template <int HEAD_DIM> struct PrefillWgTile<16, HEAD_DIM> : PrefillWgRareFlags {
  static constexpr int WGS = 2, BN = HEAD_DIM <= 128 ? 128 : 64, STAGES = 2;
  static constexpr bool OVERLAP = false, PRODUCER = false, PINGPONG = false, TMA = false;
};
template <int HEAD_DIM> struct PrefillWgTile<22, HEAD_DIM> : PrefillWgRareFlags {
  static constexpr int WGS = 2, BN = HEAD_DIM <= 128 ? 128 : 64, STAGES = 2;
  static constexpr bool OVERLAP = false, PRODUCER = true, PINGPONG = false, TMA = false;
};
template <int HEAD_DIM> struct PrefillWgTile<27, HEAD_DIM> : PrefillWgRareFlags {
  static constexpr int WGS = 2, BN = HEAD_DIM <= 128 ? 128 : 64, STAGES = 2;
  static constexpr bool OVERLAP = false, PRODUCER = true, PINGPONG = false, TMA = true;
};
/* TILE 28: 27 with the softmax of tile j under the P V product of tile j - 1, the
 * default for long runs at head dim 128 (gpu/prefill.rs's LONG_TMA_TILE); at head dim
 * 256 27's 64-key tiles without the overlap, whose two resident tiles spill there. */
template <int HEAD_DIM> struct PrefillWgTile<28, HEAD_DIM> : PrefillWgTile<27, HEAD_DIM> {
  static constexpr bool OVERLAP = HEAD_DIM <= 128;
};
/* TILE 34, 35, 36: 27, 28 and 30 run persistently: one block an SM walks the grid's
 * items (q tile, kv head) in the grid order, its producer loading the next item's Q
 * into a second buffer and its first K/V tiles while the consumers finish the
 * current one (prefill_ws_impl). */
template <int HEAD_DIM> struct PrefillWgTile<34, HEAD_DIM> : PrefillWgTile<27, HEAD_DIM> {
  static constexpr bool PERSISTENT = true;
};
template <int HEAD_DIM> struct PrefillWgTile<35, HEAD_DIM> : PrefillWgTile<28, HEAD_DIM> {
  static constexpr bool PERSISTENT = true;
};
template <int HEAD_DIM> struct PrefillWgTile<36, HEAD_DIM> : PrefillWgTile<30, HEAD_DIM> {
  static constexpr bool PERSISTENT = true;
};
/* TILE 37, 38: persistent with three K/V stages (a deeper ring in place of 37's
 * second Q buffer, which no longer fits): two consumers and 128-key tiles, three
 * and 64-key tiles. */
template <int HEAD_DIM> struct PrefillWgTile<37, HEAD_DIM> : PrefillWgRareFlags {
  static constexpr int WGS = 2, BN = 128, STAGES = 3;
  static constexpr bool OVERLAP = false, PRODUCER = true, PINGPONG = false, TMA = true, PERSISTENT = true;
};
template <int HEAD_DIM> struct PrefillWgTile<38, HEAD_DIM> : PrefillWgRareFlags {
  static constexpr int WGS = 3, BN = 64, STAGES = 3;
  static constexpr bool OVERLAP = false, PRODUCER = true, PINGPONG = false, TMA = true, PERSISTENT = true;
};
/* TILE 40: 28 with the tail tile (the one holding the block's last key) by TMA too:
 * copies of keys past the sequence read zeros, the rest of its last page (rows past
 * the last key, never written or left by another sequence) is zeroed in shared memory
 * by the consumers before its P V (wg_zero_rows), rather than the producer gathering
 * the whole tile by cp.async and the consumers fencing it. */
template <int HEAD_DIM> struct PrefillWgTile<40, HEAD_DIM> : PrefillWgTile<28, HEAD_DIM> {
  static constexpr bool TMA_TAIL = true;
};
/* TILE 39: 28 with three K/V stages up to head dim 128, so that each copy has two
 * steps of the overlapped loop to land in rather than one (the Q tile and three
 * 128-key stages: 225 KiB); 28 (27's 64-key tiles) at head dim 256. The default for
 * runs of 3072 keys and more at head dim 128 (gpu/prefill.rs's long_tma_tile) since
 * its producer issues K/V as fast as the consumers take them (wg_tma_copy). */
template <int HEAD_DIM, bool DEEP = (HEAD_DIM <= 128)> struct PrefillWgTile39 : PrefillWgTile<28, HEAD_DIM> {};
template <int HEAD_DIM> struct PrefillWgTile39<HEAD_DIM, true> : PrefillWgRareFlags {
  static constexpr int WGS = 2, BN = 128, STAGES = 3;
  static constexpr bool OVERLAP = true, PRODUCER = true, PINGPONG = false, TMA = true;
};
template <int HEAD_DIM> struct PrefillWgTile<39, HEAD_DIM> : PrefillWgTile39<HEAD_DIM> {};
/* TILE 44, 45, 46: 30 (three consumers of 64 rows, 64-key tiles, K/V by TMA) with
 * three stages (44), the overlap (45) or both (46; its 192-row blocks are fewer than
 * 39's, so fewer block starts); 28 at head dim 256, where three consumers'
 * accumulators do not fit. */
template <int HEAD_DIM, bool FITS = (HEAD_DIM <= 128)> struct PrefillWgTile46 : PrefillWgTile<28, HEAD_DIM> {};
template <int HEAD_DIM> struct PrefillWgTile46<HEAD_DIM, true> : PrefillWgRareFlags {
  static constexpr int WGS = 3, BN = 64, STAGES = 3;
  static constexpr bool OVERLAP = true, PRODUCER = true, PINGPONG = false, TMA = true;
};
template <int HEAD_DIM> struct PrefillWgTile<46, HEAD_DIM> : PrefillWgTile46<HEAD_DIM> {};
/* TILE 47: 46 persistent (one block an SM walking the items in static rounds, a
 * second Q buffer: the next item's Q and first K/V tiles load under the current
 * one's end). Ahead of 46 where it runs many rounds of short blocks, behind it where
 * few rounds leave the static rounds unequal. At head dim 256, 35 (46 is 28 there). */
template <int HEAD_DIM> struct PrefillWgTile<47, HEAD_DIM> : PrefillWgTile46<HEAD_DIM> {
  static constexpr bool PERSISTENT = true;
};
/* TILE 48: 47 with the items handed out as the blocks need them (DYNAMIC): a block's
 * first item is blockIdx.x, each next one a ticket from a counter in memory, drawn
 * when its producer has issued the current item's last K/V tile. With the items
 * deepest first (the grid order), a block that drew a long item takes fewer, as the
 * hardware's block scheduler gives 46, while the next item's start still runs under
 * the current one's end: ahead of 46 and 47 from 64 to 2048 keys. The default for
 * runs of 64 to 3071 keys at head dim 128 (gpu/prefill.rs's long_tma_tile). */
template <int HEAD_DIM> struct PrefillWgTile<48, HEAD_DIM> : PrefillWgTile<47, HEAD_DIM> {
  static constexpr bool DYNAMIC = true;
};
/* TILE 41, 42: 28 and 35 with FlashAttention-3's order inside the overlapped step
 * (EARLY): O is rescaled by the previous step's factor while S_j is on the tensor
 * cores, between the issue of S_j and that of P_{j-1} V_{j-1} (the rescale leaves the
 * window after the P V wait, where this warpgroup has nothing on the tensor cores),
 * and K_j is released as soon as S_j is done rather than at the step's end. */
template <int HEAD_DIM> struct PrefillWgTile<41, HEAD_DIM> : PrefillWgTile<28, HEAD_DIM> {
  static constexpr bool EARLY = true;
};
template <int HEAD_DIM> struct PrefillWgTile<42, HEAD_DIM> : PrefillWgTile<35, HEAD_DIM> {
  static constexpr bool EARLY = true;
};
/* TILE 43: 29 (28 with the two consumers taking turns to issue their products) in
 * FlashAttention-3's order: its head-dim-128 schedule whole (the scheduler barrier
 * around the issue of S_j and P_{j-1} V_{j-1}, the rescale between them). */
template <int HEAD_DIM> struct PrefillWgTile<43, HEAD_DIM> : PrefillWgTile<29, HEAD_DIM> {
  static constexpr bool EARLY = true;
};

__host__ __device__ constexpr bool prefill_is_wgmma(int tile) { return tile >= 16; }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* wgmma d (m64nN, f32) += a (m64k16, shared, K-major) * b (k16nN, shared, K-major);
 * acc = 0 overwrites d. */
template <int N, int DTYPE>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], unsigned long long da, unsigned long long db, int acc);
/* wgmma d (m64nN, f32) += a (m64k16, registers) * b (k16nN, shared, MN-major). */
template <int N, int DTYPE>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long db);
template <> __device__ __forceinline__ void wgmma_ss<64, MSGL_BF16>(float (&d)[32], unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void wgmma_ss<64, MSGL_F16>(float (&d)[32], unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void wgmma_ss<128, MSGL_BF16>(float (&d)[64], unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void wgmma_ss<128, MSGL_F16>(float (&d)[64], unsigned long long da, unsigned long long db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(acc));
}
template <> __device__ __forceinline__ void wgmma_rs<64, MSGL_BF16>(float (&d)[32], const unsigned (&a)[4], unsigned long long db) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_rs<64, MSGL_F16>(float (&d)[32], const unsigned (&a)[4], unsigned long long db) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_rs<128, MSGL_BF16>(float (&d)[64], const unsigned (&a)[4], unsigned long long db) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_rs<128, MSGL_F16>(float (&d)[64], const unsigned (&a)[4], unsigned long long db) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_rs<256, MSGL_BF16>(float (&d)[128], const unsigned (&a)[4], unsigned long long db) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
template <> __device__ __forceinline__ void wgmma_rs<256, MSGL_F16>(float (&d)[128], const unsigned (&a)[4], unsigned long long db) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving uses of wgmma accumulators across the wait. */
template <int N> __device__ __forceinline__ void wgmma_fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
/* The overlapped loops' anchor, between the softmax of S_j and the wait for
 * P_{j-1} V_{j-1}: ptxas schedules that wait as early as it may (it costs nothing in
 * its model) and with it the packing of P, which must wait for the product; without
 * a memory operation between them the wait went up ahead of the row max and the
 * softmax ran after the product, not under it (SASS of tiles 21, 28, 29, 35). A
 * store of a value the last exponential feeds (the row sums) to this thread's own
 * word of shared memory keeps the wait after it. */
__device__ __forceinline__ void softmax_anchor_store(float* slot, float value) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(smem_u32(slot)), "f"(value) : "memory");
}
/* Makes this thread's completed cp.async writes visible to the async proxy (wgmma). */
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
/* A barrier of the 128 threads of warpgroup `wg` (ids 1.., 0 is __syncthreads). */
__device__ __forceinline__ void warpgroup_sync(int wg) { asm volatile("bar.sync %0, 128;" ::"r"(wg + 1) : "memory"); }

/* A shared-memory matrix descriptor with the 128-byte swizzle. */
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
  return static_cast<unsigned long long>((addr & 0x3ffffu) >> 4) | (static_cast<unsigned long long>(lbo >> 4) << 16) |
         (static_cast<unsigned long long>(sbo >> 4) << 32) | (1ull << 62);
}
/* The descriptor `bytes` further on (a multiple of 16): the start address is the low
 * field, and shared addresses stay below its 2^18-byte reach, so the sum never carries
 * into LBO; added to the low word alone (one uniform add a k-step, rather than a new
 * descriptor or a 64-bit add's carry chain). */
__device__ __forceinline__ unsigned long long wg_desc_add(unsigned long long desc, unsigned bytes) {
  const unsigned lo = static_cast<unsigned>(desc) + (bytes >> 4);
  return (desc & 0xffffffff00000000ull) | lo;
}
#endif

/* This thread's warpgroup. Warp-uniform by construction; read through a shuffle so that
 * ptxas knows it and keeps what derives from it (the wgmma descriptors above all) in
 * uniform registers, rather than building each descriptor in vector registers and
 * moving it over (R2UR) before its wgmma can issue. */
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
}

/* Byte offset of 16-byte chunk c (elements 8c..8c+7) of row r in a swizzled tile of
 * `rows` rows (see the layout above). */
__device__ __forceinline__ int wg_swz(int rows, int r, int c) {
  return (c / 8) * rows * 128 + r * 128 + (((c % 8) ^ (r % 8)) << 4);
}

template <int TILE, int HEAD_DIM> __host__ __device__ constexpr int prefill_wg_threads() {
  return 128 * (PrefillWgTile<TILE, HEAD_DIM>::WGS + (PrefillWgTile<TILE, HEAD_DIM>::PRODUCER ? 1 : 0));
}
template <int TILE, int HEAD_DIM> __host__ __device__ constexpr int prefill_wg_rows() {
  return 64 * PrefillWgTile<TILE, HEAD_DIM>::WGS;
}
/* Blocks an SM the instance is compiled for (__launch_bounds__): two for the
 * one-consumer warp-specialised tiles (their registers are shared out as WsRegs<1>
 * says), one for the rest. */
template <int TILE, int HEAD_DIM> __host__ __device__ constexpr int prefill_wg_min_blocks() {
  return PrefillWgTile<TILE, HEAD_DIM>::WGS == 1 && PrefillWgTile<TILE, HEAD_DIM>::PRODUCER ? 2 : 1;
}
/* Q buffers: two for a persistent tile where they fit beside its K/V stages in the
 * 227 KiB a block may take (the next item's Q lands while the current one runs),
 * else one. */
template <int TILE, int HEAD_DIM> __host__ __device__ constexpr int prefill_wg_q_buffers() {
  using C = PrefillWgTile<TILE, HEAD_DIM>;
  return C::PERSISTENT &&
                 static_cast<long long>(2 * prefill_wg_rows<TILE, HEAD_DIM>() + 2 * C::STAGES * C::BN) * HEAD_DIM * 2 +
                         1024 <=
                     232448
             ? 2
             : 1;
}
/* The Q buffers and STAGES K and V tiles, unpadded, plus 1024 bytes to align the base. */
template <int TILE, int HEAD_DIM> __host__ __device__ constexpr long long prefill_wg_smem_bytes() {
  using C = PrefillWgTile<TILE, HEAD_DIM>;
  return static_cast<long long>(prefill_wg_q_buffers<TILE, HEAD_DIM>() * prefill_wg_rows<TILE, HEAD_DIM>() +
                                2 * C::STAGES * C::BN) *
             HEAD_DIM * 2 +
         1024;
}

/* What q tile `item` (the grid order's item: blockIdx.x / num_kv_heads for one block
 * a tile) is: its sequence, rows and causal key range (the header's packing; `found`
 * false for items past the last tile). */
struct WgTile {
  bool found;
  int seq, q_start, q_len, prefix, row0, rows, last_pos, kv_stop;
};
__device__ __forceinline__ WgTile wg_tile_of(bool found_it, const PrefillSeq& found, int group, int bm) {
  WgTile t{};
  t.found = found_it;
  if (!t.found) return t;
  t.seq = found.seq;
  t.q_start = found.q_start;
  t.q_len = found.q_len;
  t.prefix = found.kv_len - t.q_len;
  t.row0 = found.tile_in_seq * bm;
  t.rows = min(bm, t.q_len * group - t.row0);
  t.last_pos = t.prefix + (t.row0 + t.rows - 1) / group;
  t.kv_stop = t.last_pos + 1;
  return t;
}
__device__ __forceinline__ WgTile wg_find_tile(const msgl_attention_params& p, int group, int bm, int item) {
  PrefillSeq found{};
  const bool ok = prefill_find_tile(p, item, group, bm, found);
  return wg_tile_of(ok, found, group, bm);
}
/* The same from the host's ranking where it sent one (the warp-specialised tiles). */
__device__ __forceinline__ WgTile wg_find_tile(const msgl_prefill_params& pp, int group, int bm, int item) {
  PrefillSeq found{};
  const bool ok = pp.ranks.count > 0 ? prefill_ranked_tile(pp.ranks, item, found)
                                     : prefill_find_tile(pp.a, item, group, bm, found);
  return wg_tile_of(ok, found, group, bm);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Gathers query rows [row0, row0 + BM) of the tile (packed (token, head) rows, zeros
 * past `rows`) into the swizzled Q tile at `dst`, 16-byte cp.async from `THREADS`
 * threads (`t` this thread's index among them). */
template <int DTYPE, int HEAD_DIM, int BM, int THREADS>
__device__ __forceinline__ void wg_load_q(unsigned char* dst, const msgl_attention_params& p, int t, int rows, int row0,
                                          int q_start, int group, int kv_head) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int CHUNKS = HEAD_DIM / 8, RSTEP = THREADS / CHUNKS;
  static_assert(THREADS % CHUNKS == 0 && BM % RSTEP == 0, "whole copy rounds for Q");
  const int ccol = t % CHUNKS, crow = t / CHUNKS;
  /* Packed row row0 + r is (token, head in the group) = divmod(row0 + r, group), moved
   * RSTEP rows at a time (one division, not two a row: this is the block's start). */
  const int step_tok = RSTEP / group, step_head = RSTEP % group;
  int tok = (row0 + crow) / group, head = (row0 + crow) % group;
#pragma unroll
  for (int i = 0; i < BM / RSTEP; ++i) {
    const int r = crow + i * RSTEP;
    const bool valid = r < rows;
    const T* src = static_cast<const T*>(p.q);
    if (valid)
      src += static_cast<long long>(q_start + tok) * p.q_token_stride +
             static_cast<long long>(kv_head * group + head) * p.q_head_stride + ccol * 8;
    cp_async16(dst + wg_swz(BM, r, ccol), src, valid ? 16 : 0);
    tok += step_tok;
    head += step_head;
    if (head >= group) head -= group, ++tok;
  }
}

/* Where one sequence's keys of one kv head live: its page table row and the cache's
 * geometry (the K/V gathers of both Hopper paths). */
struct WgKeys {
  const int* pages;
  int page_size, page_shift;
  long long num_pages;
  int num_kv_heads, kv_head, kv_stop;
};
__device__ __forceinline__ WgKeys wg_keys(const msgl_attention_params& p, int seq, int kv_head, int kv_stop) {
  const int page_size = p.page_size;
  return WgKeys{p.block_table + static_cast<long long>(seq) * p.max_pages,
                page_size,
                (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1,
                p.num_pages,
                p.num_kv_heads,
                kv_head,
                kv_stop};
}

/* Gathers keys [tile * BN, tile * BN + BN) of `cache` into the swizzled tile at
 * `dst`: 16-byte cp.async from `THREADS` threads (`t` this thread's index), zeros
 * past kv_stop and for page numbers outside the cache. */
template <int DTYPE, int HEAD_DIM, int BN, int THREADS>
__device__ __forceinline__ void wg_load_kv(unsigned char* dst, const void* cache, int tile, const WgKeys& k, int t) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int CHUNKS = HEAD_DIM / 8, RSTEP = THREADS / CHUNKS;
  constexpr int ROUNDS = (BN + RSTEP - 1) / RSTEP; /* the last one partial with 3 warpgroups */
  const int ccol = t % CHUNKS, crow = t / CHUNKS;
#pragma unroll
  for (int i = 0; i < ROUNDS; ++i) {
    const int r = crow + i * RSTEP;
    if (BN % RSTEP != 0 && r >= BN) break;
    const int kv = tile * BN + r;
    const T* src = static_cast<const T*>(cache);
    bool valid = kv < k.kv_stop;
    if (valid) {
      const int page_idx = k.page_shift >= 0 ? kv >> k.page_shift : kv / k.page_size;
      const int in_page = k.page_shift >= 0 ? kv & (k.page_size - 1) : kv - page_idx * k.page_size;
      const int page = __ldg(k.pages + page_idx);
      valid = page >= 0 && page < k.num_pages;
      if (valid) {
        const long long slot = static_cast<long long>(page) * k.page_size + in_page;
        src += (slot * k.num_kv_heads + k.kv_head) * HEAD_DIM + ccol * 8;
      }
    }
    cp_async16(dst + wg_swz(BN, r, ccol), src, valid ? 16 : 0);
  }
}

/* The copy of a TMA tile producer thread `t` (0..127) issues in wg_tma_kv: copies
 * are dealt to the four producer warps in turn (copy 4 lane + warp). A TMA copy takes
 * its coordinates in uniform registers, so a warp issues its lanes' copies one after
 * another; at page size 16 a 128-key tile of head dim 128 is 16 copies, which one
 * warp issued slower than the consumers used the tiles (the loop ran ~15% slower
 * than at page size 128 on the H100; scripts/gpu/prefill_probe.cu's timeline). */
__device__ __forceinline__ int wg_tma_copy(int t) { return (t % kWarpSize) * 4 + t / kWarpSize; }
/* Copies keys [tile * BN, tile * BN + BN) of the cache behind `map` into the
 * swizzled tile at `dst` by TMA: one copy of `rows` keys (the map's box: a power of
 * two >= 8 dividing the page size and BN, so that a copy stays inside one page and
 * lands on whole 8-row swizzle groups) x 64 elements for each (key chunk, 64-column
 * block), copy `copy` (wg_tma_copy) from each producer thread that has one,
 * completing on `bar`. `page`: the copy's page number, read ahead by wg_tma_page;
 * numbers outside the cache read as zeros (the coordinate is moved outside the map).
 * Every key of the tile must be below kv_stop: the tail goes through wg_load_kv,
 * which zero-fills past it. */
template <int HEAD_DIM, int BN>
__device__ __forceinline__ void wg_tma_kv(unsigned char* dst, const msgl_tensor_map* map, int tile, const WgKeys& k,
                                          int rows, int page, unsigned long long* bar, int copy) {
  static_assert((BN / 8) * (HEAD_DIM / 64) <= 128, "at most one copy a producer thread");
  const int chunks = BN / rows;
  if (copy >= chunks * (HEAD_DIM / 64)) return;
  const int chunk = copy % chunks, block = copy / chunks;
  const int kv = tile * BN + chunk * rows;
  const bool valid = page >= 0 && page < k.num_pages;
  const int slot = valid ? page * k.page_size + (kv & (k.page_size - 1)) : -k.page_size;
  tensor_copy_3d_g2s(dst + block * BN * 128 + chunk * rows * 128, map, block * 64, k.kv_head, slot, bar);
}
/* The page copy `copy` reads from in wg_tma_kv's tile `tile` (-1 for no copy): read
 * ahead, so that the page table's latency hides under the producer's waits. */
template <int HEAD_DIM, int BN, bool TAIL = false>
__device__ __forceinline__ int wg_tma_page(int tile, const WgKeys& k, int rows, int copy) {
  const int chunks = BN / rows;
  if (copy >= chunks * (HEAD_DIM / 64)) return -1;
  const int kv = tile * BN + (copy % chunks) * rows;
  /* A tail tile's copies past the sequence: no page (zeros), and no read past its row. */
  if (TAIL && kv >= k.kv_stop) return -1;
  return __ldg(k.pages + (kv >> k.page_shift));
}
/* Zeroes rows [from, to) of the swizzled K/V tile at `tile` (BN rows of HEAD_DIM) with
 * the 128 threads of one warpgroup (`tid`), and makes the writes visible to wgmma: the
 * rows of a TMA tail tile past the sequence's last key that its last page's copy
 * brought (a P of zero times a V row never written could be NaN). */
template <int HEAD_DIM, int BN>
__device__ __forceinline__ void wg_zero_rows(unsigned char* tile, int from, int to, int tid) {
  constexpr int CHUNKS = HEAD_DIM / 8; /* 16-byte chunks a row */
  for (int c = tid; c < (to - from) * CHUNKS; c += 128)
    *reinterpret_cast<uint4*>(tile + wg_swz(BN, from + c / CHUNKS, c % CHUNKS)) = make_uint4(0u, 0u, 0u, 0u);
  fence_proxy_async_smem();
}

/* One warpgroup's 64 query rows of a wgmma tile (both Hopper paths): the O
 * accumulators, the running max and sum, the S (then P) of the current K/V tile,
 * the products that fill them and the online softmax (the fragment layout above).
 * BM: the block's query rows (the Q tile's height, for its swizzled addresses). */
template <int DTYPE, int HEAD_DIM, int BM, int BN> struct WgRows {
  static constexpr int SN = BN / 2;       /* S accumulators per thread */
  static constexpr int ON = HEAD_DIM / 2; /* O accumulators per thread */
  float o[ON];
  float m[2], l[2];
  float s[SN];             /* S of the current tile, then its probabilities */
  unsigned pa[BN / 16][4]; /* P as the register A operand of O += P V */
  int pos[2];              /* the positions of this thread's rows g and g + 8 */
  int first_pos;           /* the warpgroup's first row's position */
  int last_pos;            /* ... and its last (valid) row's */
  bool has_rows;           /* the tile has rows here (warpgroup-uniform, as every wgmma condition) */
  int tid;                 /* lane % 4 */
  unsigned q_addr;         /* the warpgroup's 64 Q rows, column block 0 */
  float scale_log2;

  /* Warpgroup `wg` (of those running the products) of the tile `tl`, whose Q tile is
   * at shared address s_base: its rows [64 wg, 64 wg + 64), this thread's rows
   * 64 wg + 16 (warp in warpgroup) + g and + 8 (the accumulator layout). */
  __device__ __forceinline__ void init(const WgTile& tl, int group, int wg, unsigned s_base, float scale) {
#pragma unroll
    for (int i = 0; i < ON; ++i) o[i] = 0.f;
    m[0] = m[1] = neg_inf();
    l[0] = l[1] = 0.f;
    const int lane = threadIdx.x % kWarpSize, warp_in_wg = (threadIdx.x / kWarpSize) % 4;
    const int wrow0 = wg * 64;
    has_rows = wrow0 < tl.rows;
    const int wrows = has_rows ? min(64, tl.rows - wrow0) : 1;
    first_pos = tl.prefix + (tl.row0 + wrow0) / group;
    last_pos = tl.prefix + (tl.row0 + wrow0 + wrows - 1) / group;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wrow0 + warp_in_wg * 16 + lane / 4 + 8 * h;
      pos[h] = r < tl.rows ? tl.prefix + (tl.row0 + r) / group : tl.last_pos;
    }
    tid = lane % 4;
    q_addr = s_base + wrow0 * 128;
    scale_log2 = scale;
  }
  /* K/V tiles 0..active_tiles-1 reach this warpgroup's rows (none past its last). */
  __device__ __forceinline__ int active_tiles(int num_tiles) const {
    return has_rows ? min(num_tiles, last_pos / BN + 1) : 0;
  }
  /* Issues S = Q K^T for the K tile at shared address k_addr (one commit group). */
  __device__ __forceinline__ void issue_s(unsigned k_addr) {
#pragma unroll
    for (int i = 0; i < SN; ++i) s[i] = 0.f;
    const unsigned long long da0 = wg_desc(q_addr, 16, 1024), db0 = wg_desc(k_addr, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
      const unsigned long long da = wg_desc_add(da0, (kk / 4) * (BM * 128) + (kk % 4) * 32);
      const unsigned long long db = wg_desc_add(db0, (kk / 4) * (BN * 128) + (kk % 4) * 32);
      wgmma_ss<BN, DTYPE>(s, da, db, kk > 0 ? 1 : 0);
    }
    wgmma_commit();
  }
  /* Issues O += P V for the V tile at shared address v_addr (one commit group). */
  __device__ __forceinline__ void issue_pv(unsigned v_addr) {
    const unsigned long long db0 = wg_desc(v_addr, BN * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs<HEAD_DIM, DTYPE>(o, pa[kk], wg_desc_add(db0, kk * 16 * 128));
    wgmma_commit();
  }
  /* The causal mask and the online softmax of S (keys from `start`; log2 domain, as
   * the mma.sync path): s becomes the probabilities, m and l advance, alpha is the
   * factor O must be scaled by. */
  __device__ __forceinline__ void softmax(int start, float (&alpha)[2]) {
    if (start + BN - 1 > first_pos) { /* only tiles reaching past the first position */
#pragma unroll
      for (int i = 0; i < SN; ++i)
        if (start + (i / 4) * 8 + tid * 2 + (i & 1) > pos[(i / 2) % 2]) s[i] = neg_inf();
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = neg_inf();
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) tile_max = fmaxf(tile_max, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(m[h], tile_max * scale_log2);
      const float m_ref = m_new == neg_inf() ? 0.f : m_new;
      alpha[h] = fast_exp2(m[h] - m_ref);
      m[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = fast_exp2(fmaf(s[4 * j + 2 * h + e], scale_log2, -m_ref));
          s[4 * j + 2 * h + e] = pv;
          sum += pv;
        }
      }
      l[h] = l[h] * alpha[h] + sum;
    }
  }
  __device__ __forceinline__ void rescale(const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) o[4 * j + i] *= alpha[i / 2];
    }
  }
  /* P from the probabilities, packed whole before the next fence: registers written
   * between the wgmma of one group make ptxas insert a warpgroup.arrive before each. */
  __device__ __forceinline__ void pack_p() {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pa[kk][i] = pack2<DTYPE>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
        asm volatile("" : "+r"(pa[kk][i])::"memory");
      }
    }
  }
  /* The epilogue of warpgroup `wg`, after a warpgroup barrier (its wgmma are done
   * with its Q rows): each warp normalises its 16 rows, stages them in its own rows
   * of the Q tile (swizzled, as Q was) and writes 16-byte vectors. */
  __device__ __forceinline__ void store(unsigned char* smem, const msgl_attention_params& p, const WgTile& tl,
                                        int group, int kv_head, int wg) {
    using T = typename DType<DTYPE>::Storage;
    constexpr int CHUNKS = HEAD_DIM / 8;
    const int lane = threadIdx.x % kWarpSize;
    const int g = lane / 4;
    const int r_warp = wg * 64 + ((threadIdx.x / kWarpSize) % 4) * 16;
    const int rows = tl.rows, row0 = tl.row0, q_start = tl.q_start;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float total = l[h];
      total += __shfl_xor_sync(0xffffffffu, total, 1);
      total += __shfl_xor_sync(0xffffffffu, total, 2);
      const float inv = total > 0.f ? 1.f / total : 0.f;
      const int r = r_warp + g + 8 * h;
#pragma unroll
      for (int j = 0; j < HEAD_DIM / 8; ++j)
        *reinterpret_cast<unsigned*>(smem + wg_swz(BM, r, j) + tid * 4) =
            pack2<DTYPE>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    }
    __syncwarp();
    T* out = static_cast<T*>(p.out);
    for (int c = lane; c < 16 * CHUNKS; c += kWarpSize) {
      const int r = r_warp + c / CHUNKS, col = c % CHUNKS;
      if (r >= rows) break;
      const int pr = row0 + r;
      const long long row = static_cast<long long>(q_start + pr / group) * p.num_q_heads + kv_head * group + pr % group;
      *reinterpret_cast<uint4*>(out + row * HEAD_DIM + col * 8) =
          *reinterpret_cast<const uint4*>(smem + wg_swz(BM, r, col));
    }
  }
};

/* Signals `bar` once every cp.async this thread issued so far has landed (counts as
 * one of the barrier's expected arrivals). */
__device__ __forceinline__ void cp_async_mbar_arrive(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}
/* The same without counting as an expected arrival: the barrier's pending count
 * grows by one now and shrinks by one when the copies have landed. */
__device__ __forceinline__ void cp_async_mbar_track(unsigned long long* bar) {
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(smem_u32(bar)) : "memory");
}
/* One arrival for the calling warp, from lane 0 once every lane got here: the
 * consumers' release barriers count warps, not threads (an arrival is a
 * shared-memory atomic on one word, and 256 of them a phase queue up). */
__device__ __forceinline__ void mbar_arrive_warp(unsigned long long* bar) {
  __syncwarp();
  if (threadIdx.x % kWarpSize == 0) mbar_arrive(bar);
}
/* Named barrier `id` of `n` threads: wait for all of them, or only count this one. */
__device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
template <int N> __device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N> __device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
#endif

template <int DTYPE, int HEAD_DIM, int TILE>
__device__ __forceinline__ void prefill_wgmma_impl(const msgl_attention_params& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(DTYPE == MSGL_BF16 || DTYPE == MSGL_F16, "tensor cores: bf16 or f16");
  using Cfg = PrefillWgTile<TILE, HEAD_DIM>;
  static_assert(!Cfg::PRODUCER, "the warp-specialised tiles run prefill_ws_impl");
  constexpr int BN = Cfg::BN, STAGES = Cfg::STAGES;
  constexpr int BM = prefill_wg_rows<TILE, HEAD_DIM>();
  constexpr int THREADS = prefill_wg_threads<TILE, HEAD_DIM>();
  constexpr int Q_BYTES = BM * HEAD_DIM * 2;
  constexpr int KV_BYTES = BN * HEAD_DIM * 2;
  static_assert(HEAD_DIM % 64 == 0 && BN % 64 == 0 && STAGES >= 2, "tile shapes");
  static_assert(THREADS % (HEAD_DIM / 8) == 0, "a thread copies the same chunk column of every row it loads");

  extern __shared__ __align__(1024) unsigned char prefill_wg_smem[];
  /* One word a thread: the overlapped loop's anchor (softmax_anchor_store). */
  __shared__ float softmax_anchor[Cfg::OVERLAP ? 128 * Cfg::WGS : 1];
  const unsigned raw = smem_u32(prefill_wg_smem);
  const unsigned pad = (1024u - (raw & 1023u)) & 1023u;
  unsigned char* smem = prefill_wg_smem + pad;
  const unsigned s_base = raw + pad; /* 1024-aligned */
  auto k_off = [](int stage) { return Q_BYTES + stage * KV_BYTES; };
  auto v_off = [](int stage) { return Q_BYTES + (STAGES + stage) * KV_BYTES; };

  const int group = p.num_q_heads / p.num_kv_heads;
  const int kv_head = static_cast<int>(blockIdx.x % p.num_kv_heads);
  const WgTile tl = wg_find_tile(p, group, BM, static_cast<int>(blockIdx.x / p.num_kv_heads));
  if (!tl.found) return;
  const int num_tiles = (tl.kv_stop + BN - 1) / BN;
  const WgKeys keys = wg_keys(p, tl.seq, kv_head, tl.kv_stop);
  wg_load_q<DTYPE, HEAD_DIM, BM, THREADS>(smem, p, threadIdx.x, tl.rows, tl.row0, tl.q_start, group, kv_head);
  auto load_tile = [&](int stage, int tile) {
    wg_load_kv<DTYPE, HEAD_DIM, BN, THREADS>(smem + k_off(stage), p.k_cache, tile, keys, threadIdx.x);
    wg_load_kv<DTYPE, HEAD_DIM, BN, THREADS>(smem + v_off(stage), p.v_cache, tile, keys, threadIdx.x);
  };
  /* Prologue: Q with tile 0, then tiles 1..PROLOGUE-1, one group each (always
   * committed): STAGES - 1 tiles, STAGES - 2 for the overlapped loop (it keeps the
   * previous tile resident). */
  constexpr int PROLOGUE = Cfg::OVERLAP ? STAGES - 2 : STAGES - 1;
#pragma unroll
  for (int t = 0; t < PROLOGUE; ++t) {
    if (t < num_tiles) load_tile(t, t);
    cp_async_commit();
  }

  const int wg = warpgroup_index();
  WgRows<DTYPE, HEAD_DIM, BM, BN> w;
  w.init(tl, group, wg, s_base, p.scale_log2);
  /* Tiles 0..n_active-1 reach this warpgroup's rows (warpgroup-uniform, as every
   * condition around a wgmma must be). */
  const int n_active = w.active_tiles(num_tiles);

  if constexpr (!Cfg::OVERLAP) {
    /* Tile it: wait for it, publish it, load tile it + STAGES - 1 into the stage of
     * tile it - 1; S, softmax, O += P V, each product waited for. */
    for (int it = 0; it < num_tiles; ++it) {
      const int buf = it % STAGES;
      cp_async_wait<STAGES - 2>(); /* Q and tile it of this thread have landed */
      fence_proxy_async_smem();    /* ... and are visible to wgmma */
      __syncthreads();             /* ... of every thread; tile it - 1 is done */
      {
        const int next = it + STAGES - 1;
        if (next < num_tiles) load_tile(next % STAGES, next);
        cp_async_commit();
      }
      if (it >= n_active) continue;
      w.issue_s(s_base + k_off(buf));
      wgmma_wait<0>();
      wgmma_fence_regs(w.s);
      float alpha[2];
      w.softmax(it * BN, alpha);
      w.rescale(alpha);
      w.pack_p();
      wgmma_fence_regs(w.o);
      w.issue_pv(s_base + v_off(buf));
      wgmma_wait<0>();
      wgmma_fence_regs(w.o);
    }
  } else {
    /* FA3's intra-warpgroup overlap: step j issues S_j = Q K_j and O += P_{j-1} V_{j-1},
     * waits for S_j only and runs its softmax while the P V product is in flight.
     * Tiles j - 1 and j are resident in step j, so step j loads tile j + STAGES - 2
     * into the stage of tile j - 2 (free: every warpgroup finished step j - 1, hence
     * P_{j-2} V_{j-2}, before the barrier). The prologue loaded tiles 0..STAGES-3. */
    static_assert(STAGES >= 3, "the overlapped loop keeps two tiles resident and loads a third");
    for (int j = 0; j <= num_tiles; ++j) {
      cp_async_wait<STAGES - 3>(); /* tile j of this thread has landed (j < num_tiles) */
      fence_proxy_async_smem();
      __syncthreads();
      {
        const int next = j + STAGES - 2;
        if (next < num_tiles) load_tile(next % STAGES, next);
        cp_async_commit();
      }
      /* Each branch waits for all it issued: ptxas serialises wgmma that stay in flight
       * across a branch it cannot prove uniform. */
      float alpha[2];
      if (j < n_active) {
        if (j == 0) {
          w.issue_s(s_base + k_off(0));
          wgmma_wait<0>();
          wgmma_fence_regs(w.s);
          w.softmax(0, alpha); /* O is still zero: no rescale */
          w.pack_p();
        } else {
          w.issue_s(s_base + k_off(j % STAGES));
          w.issue_pv(s_base + v_off((j - 1) % STAGES));
          wgmma_wait<1>(); /* S_j (committed first) is done, P V may not be */
          wgmma_fence_regs(w.s);
          w.softmax(j * BN, alpha);
          softmax_anchor_store(&softmax_anchor[threadIdx.x], w.l[0] + w.l[1]);
          wgmma_wait<0>(); /* P_{j-1} V_{j-1}: O and P are free */
          wgmma_fence_regs(w.o);
          w.rescale(alpha);
          w.pack_p();
        }
      } else if (j == n_active && j > 0) {
        w.issue_pv(s_base + v_off((j - 1) % STAGES)); /* the last active tile's P V */
        wgmma_wait<0>();
        wgmma_fence_regs(w.o);
      }
    }
  }
  cp_async_wait<0>();
  if (!w.has_rows) return;
  warpgroup_sync(wg);
  w.store(smem, p, tl, group, kv_head, wg);
#else
  (void)p;
  __trap(); /* the wgmma tiles need sm_90a; the host offers them only there */
#endif
}

/* ---------------------------------------------------------------------------------
 * The warp-specialised Hopper tiles (PRODUCER in PrefillWgTile, sm_90a): warpgroup
 * 0 is a producer that only gathers, warpgroups 1..WGS consume, each owning 64
 * query rows as above, and no barrier spans the whole block after the setup.
 *
 *   producer  (setmaxnreg down to WsRegs::PRODUCER): Q, then for each K/V tile t in
 *     stage t % STAGES: wait until the K half of the stage is empty (every consumer
 *     warp arrived on empty_k[stage] for tile t - STAGES), gather K with cp.async,
 *     each thread's copies tracked on full_k[stage] (cp.async.mbarrier.arrive: the
 *     pending count drops once they have landed), and once all 128 are tracked,
 *     thread 0 arrives (the barrier's one expected arrival); then the same for V.
 *     The page table is read here only. TMA tiles (27..31, 34..38): a whole K or V
 *     tile is a few tensor copies (one per page chunk and 64-column block, the
 *     128-byte swizzle done by the copy engine) issued by the first warp, lane 0
 *     announcing the tile's bytes with its arrival, the pages read a tile ahead;
 *     only the tile that holds kv_stop is gathered as above.
 *   consumers (setmaxnreg up): wait for full_k of tile t (parity (t / STAGES) & 1),
 *     fence.proxy.async for a gathered tile (the rows came through the generic
 *     proxy, wgmma reads through the async one; TMA tiles need none), S = Q K^T,
 *     release K, softmax, wait for full_v, O += P V, release V (one arrival a warp).
 *     K and V are released apart so that two stages keep a whole step of lead for
 *     each. A warpgroup whose rows the tile does not reach still waits for both
 *     halves and arrives, so that every phase of the empty barriers sees all
 *     consumers and no stage is refilled while copies into it are in flight.
 *   OVERLAP: step j issues S_j and P_{j-1} V_{j-1} together and runs the softmax of
 *     S_j under the P V product; K_j and V_{j-1} are released at the step's end.
 *   PINGPONG (two consumers): the warpgroups take turns issuing their step's
 *     products (named barriers 4 and 5: a warpgroup waits on its own and, once its
 *     products are issued, lets the other go), so that one's softmax runs under the
 *     other's tensor-core work. Both run the same number of steps; the second skips
 *     its last hand-over, which nobody would wait for.
 *   PERSISTENT (34..38): at most one block an SM, each walking the grid's items
 *     blockIdx.x, + gridDim.x, ... (the grid order: deepest tiles first). The
 *     producer finds item n, loads its Q into buffer n % QBUF once the consumers have
 *     released it (q_empty) and publishes the item with it (q_tile; q_full counts
 *     the 128 cp.async arrivals and thread 0's); the K/V ring runs on from item to
 *     item (its position carries over), so the next item's Q and first tiles load
 *     while the consumers finish the current one. The consumers stage O in their Q
 *     rows, then release the buffer. A non-persistent block runs one item so.
 *   DYNAMIC (48): a persistent block's items after its first are tickets from
 *     params.split_counters[0] (the launcher's item counter: two int32 zeros), drawn
 *     by the producer's thread 0 once it has issued an item's last K/V tile, shared
 *     with the producer's warps through named barrier 7 and with the consumers
 *     through q_head (the item's kv head; -1: no more items). The producer that
 *     draws a ticket past the last item ends; the last block to end (a second
 *     counter, split_counters[1]) sets both back to zero for the next launch.
 * --------------------------------------------------------------------------------- */

/* Registers a producer thread keeps after setmaxnreg, and a consumer thread gets:
 * what the block holds at launch (65,536 / threads a thread, rounded down to 8:
 * 168 x 384, 128 x 512) shared out. The producer's unrolled gathers need ~80 with two
 * consumers (ptxas spills them at 72); with three, 64 (its TMA path beside the
 * cp.async tail spills at 56), and the consumers' accumulators and fragments (112 at
 * head dim 128) fit the 144 left. */
/* K/V tiles 0..n-1 of a block whose keys stop at kv_stop come by TMA (the whole
 * tiles below kv_stop, where the host sent tensor maps, and with TMA_TAIL the tail
 * too); the rest, the tail, by cp.async. The one rule the producer and the
 * consumers' proxy fences share. */
template <typename Cfg> __device__ __forceinline__ int ws_tma_tiles(const msgl_prefill_params& pp, int kv_stop) {
  return Cfg::TMA && pp.kv_tma_rows > 0 ? (Cfg::TMA_TAIL ? (kv_stop + Cfg::BN - 1) : kv_stop) / Cfg::BN : 0;
}

template <int CONSUMERS> struct WsRegs;
/* One consumer, two blocks an SM (128 registers a thread at launch). */
template <> struct WsRegs<1> { static constexpr int PRODUCER = 72, CONSUMER = 184; };
template <> struct WsRegs<2> { static constexpr int PRODUCER = 88, CONSUMER = 208; };
template <> struct WsRegs<3> { static constexpr int PRODUCER = 80, CONSUMER = 144; };

template <int DTYPE, int HEAD_DIM, int TILE>
__device__ __forceinline__ void prefill_ws_impl(const msgl_prefill_params& pp) {
  const msgl_attention_params& p = pp.a;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(DTYPE == MSGL_BF16 || DTYPE == MSGL_F16, "tensor cores: bf16 or f16");
  using Cfg = PrefillWgTile<TILE, HEAD_DIM>;
  static_assert(Cfg::PRODUCER, "the tiles without a producer run prefill_wgmma_impl");
  static_assert(!Cfg::PINGPONG || Cfg::WGS == 2, "the ping-pong schedule is for two consumers");
  static_assert(!Cfg::PINGPONG || !Cfg::PERSISTENT, "the ping-pong hand-over runs one item");
  /* gpu/prefill.rs's TileShape::fits refuses the rest before any compile. */
  static_assert(Cfg::WGS <= 2 || HEAD_DIM <= 128, "three consumers' accumulators need head dim <= 128");
  constexpr int BN = Cfg::BN, STAGES = Cfg::STAGES, CONSUMERS = Cfg::WGS;
  constexpr int BM = prefill_wg_rows<TILE, HEAD_DIM>();
  constexpr int QBUF = prefill_wg_q_buffers<TILE, HEAD_DIM>();
  constexpr int Q_BYTES = BM * HEAD_DIM * 2;
  constexpr int KV_BYTES = BN * HEAD_DIM * 2;
  static_assert(HEAD_DIM % 64 == 0 && BN % 64 == 0 && STAGES >= 2, "tile shapes");

  extern __shared__ __align__(1024) unsigned char prefill_wg_smem[];
  __shared__ unsigned long long full_k[STAGES], full_v[STAGES], empty_k[STAGES], empty_v[STAGES];
  __shared__ unsigned long long q_full[QBUF], q_empty[QBUF];
  __shared__ WgTile q_tile[QBUF]; /* the item whose Q the buffer holds (the producer's find) */
  /* DYNAMIC: the kv head of that item (-1: none is left, the consumers stop), and the
   * producer's next item (two slots: thread 0 writes one while the other is read). */
  __shared__ int q_head[Cfg::DYNAMIC ? QBUF : 1], next_item[2];
  /* One word a consumer thread: the overlapped loop's anchor (softmax_anchor_store). */
  __shared__ float softmax_anchor[Cfg::OVERLAP ? 128 * CONSUMERS : 1];
  const unsigned raw = smem_u32(prefill_wg_smem);
  const unsigned pad = (1024u - (raw & 1023u)) & 1023u;
  unsigned char* smem = prefill_wg_smem + pad;
  const unsigned s_base = raw + pad; /* 1024-aligned */
  auto k_off = [](int stage) { return QBUF * Q_BYTES + stage * KV_BYTES; };
  auto v_off = [](int stage) { return QBUF * Q_BYTES + (STAGES + stage) * KV_BYTES; };

  const int group = p.num_q_heads / p.num_kv_heads;
  /* Grid items (q tile, kv head), blockIdx.x, blockIdx.x + gridDim.x, ...: one for a
   * block of a non-persistent tile, whose grid has one block an item. */
  const int items = p.num_q_tiles * p.num_kv_heads;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(&full_k[s], 1); /* the producer's thread 0 (the gathers' copies tracked besides) */
      mbar_init(&full_v[s], 1);
      mbar_init(&empty_k[s], 4 * CONSUMERS); /* a consumer warp's lane 0 */
      mbar_init(&empty_v[s], 4 * CONSUMERS);
    }
#pragma unroll
    for (int b = 0; b < QBUF; ++b) {
      mbar_init(&q_full[b], 128 + 1); /* the producer's cp.async, and thread 0 with the item */
      mbar_init(&q_empty[b], 4 * CONSUMERS);
    }
    mbar_init_fence();
  }
  __syncthreads();

  const int wg = warpgroup_index();
  if (wg == 0) {
    regs_dec<WsRegs<CONSUMERS>::PRODUCER>();
    MSGL_PREFILL_PROBE(11); /* the producer's start */
    const int t = threadIdx.x;
    /* TMA tiles: the keys of one copy (0: every tile by cp.async, as the host asks
     * when the page size is not a power of two >= 8). Whole tiles go by TMA from the
     * four warps' lanes (wg_tma_copy), thread 0 announcing the bytes with the full
     * barrier's one arrival; the tile holding kv_stop by cp.async, which zero-fills
     * the keys past it (a P of zero times a V row that was never written could still
     * be NaN): every thread's copies are tracked on the barrier, then (named barrier
     * 6: all tracked) thread 0 arrives. */
    const int tma_rows = Cfg::TMA ? pp.kv_tma_rows : 0;
    if (Cfg::TMA && tma_rows > 0 && t == 0) {
      prefetch_tensor_map(&pp.k_map);
      prefetch_tensor_map(&pp.v_map);
    }
    if (Cfg::TMA && pp.q_tma != 0 && t == 0) prefetch_tensor_map(&pp.q_map);
    int ring = 0; /* K/V tiles loaded so far: the ring position of the next */
    int n = 0;
    for (int item = blockIdx.x;; ++n) {
      const int qb = n % QBUF;
      if (item >= items) {
        if constexpr (Cfg::DYNAMIC) { /* tells the consumers that no item is left */
          if (n >= QBUF) mbar_wait(&q_empty[qb], static_cast<unsigned>(((n / QBUF) - 1) & 1));
          cp_async_mbar_arrive(&q_full[qb]);
          if (t == 0) {
            q_head[qb] = -1;
            mbar_arrive(&q_full[qb]);
          }
        }
        break;
      }
      const int kv_head = item % p.num_kv_heads;
      const WgTile tl = wg_find_tile(pp, group, BM, item / p.num_kv_heads);
      MSGL_PREFILL_PROBE(8); /* the producer found the item */
      const int num_tiles = (tl.kv_stop + BN - 1) / BN;
      const WgKeys keys = wg_keys(p, tl.seq, kv_head, tl.kv_stop);
      const int tma_tiles = ws_tma_tiles<Cfg>(pp, tl.kv_stop); /* 0 for an item past the last */
      auto by_tma = [&](int it) { return it < tma_tiles; };
      /* Each thread reads the page of its copy of each TMA tile two tiles ahead, under
       * the waits; those of the first two before Q is issued, so that the page table's
       * latency runs under Q's. */
      const int copy = wg_tma_copy(t);
      auto tma_page = [&](int it) {
        if constexpr (Cfg::TMA) return by_tma(it) ? wg_tma_page<HEAD_DIM, BN, Cfg::TMA_TAIL>(it, keys, tma_rows, copy) : -1;
        else return -1;
      };
      int page_next = tma_page(0), page_after = tma_page(1);
      if (n >= QBUF) mbar_wait(&q_empty[qb], static_cast<unsigned>(((n / QBUF) - 1) & 1));
      /* Q by TMA where the host built q's map (one box a 64-column block: the tile's
       * packed rows are (rows / group) tokens x group heads), else 16-byte cp.async
       * from the 128 threads, whose issue took ~3,400 cycles of the block's start. A
       * short last tile's box brings the next tokens' rows (zeros past q): padding
       * rows, never written. */
      const bool q_by_tma = Cfg::TMA && pp.q_tma != 0 && tl.found;
      if (tl.found && !q_by_tma)
        wg_load_q<DTYPE, HEAD_DIM, BM, 128>(smem + qb * Q_BYTES, p, t, tl.rows, tl.row0, tl.q_start, group, kv_head);
      cp_async_mbar_arrive(&q_full[qb]);
      MSGL_PREFILL_PROBE(9); /* ... issued its Q */
      if (t == 0) {
        q_tile[qb] = tl;
        if constexpr (Cfg::DYNAMIC) q_head[qb] = kv_head;
        /* release: the consumers read q_tile (and q_head) after their wait */
        if (q_by_tma) {
          mbar_arrive_expect_tx(&q_full[qb], Q_BYTES);
#pragma unroll
          for (int c = 0; c < HEAD_DIM / 64; ++c)
            tensor_copy_3d_g2s(smem + qb * Q_BYTES + c * BM * 128, &pp.q_map, c * 64, kv_head * group,
                               tl.q_start + tl.row0 / group, &q_full[qb]);
        } else {
          mbar_arrive(&q_full[qb]);
        }
      }
      /* The next item: the next static round's, or (DYNAMIC) a ticket drawn once this
       * one's last K/V tile is issued. */
      auto next = [&]() {
        if constexpr (Cfg::DYNAMIC) {
          if (t == 0) next_item[n & 1] = atomicAdd(pp.a.split_counters, 1) + static_cast<int>(gridDim.x);
          named_sync(7, 128);
          item = next_item[n & 1];
        } else {
          item += gridDim.x;
        }
      };
      if (!tl.found) {
        next();
        continue;
      }
      auto load = [&](unsigned char* dst, const void* cache, const msgl_tensor_map* map, int it, int page,
                      unsigned long long* bar) {
        if constexpr (Cfg::TMA) {
          if (by_tma(it)) {
            /* A copy may land before the bytes are announced: the barrier's transaction
             * count goes below zero and its phase waits for thread 0's arrival. */
            if (t == 0) mbar_arrive_expect_tx(bar, KV_BYTES);
            wg_tma_kv<HEAD_DIM, BN>(dst, map, it, keys, tma_rows, page, bar, copy);
            return;
          }
        }
        wg_load_kv<DTYPE, HEAD_DIM, BN, 128>(dst, cache, it, keys, t);
        cp_async_mbar_track(bar);
        named_sync(6, 128);
        if (t == 0) mbar_arrive(bar);
      };
      for (int it = 0; it < num_tiles; ++it, ++ring) {
        const int stage = ring % STAGES;
        const unsigned freed = static_cast<unsigned>(((ring / STAGES) - 1) & 1); /* tile ring - STAGES's release */
        const int page = page_next;
        page_next = page_after;
        page_after = tma_page(it + 2);
        if (ring >= STAGES) mbar_wait(&empty_k[stage], freed);
        load(smem + k_off(stage), p.k_cache, &pp.k_map, it, page, &full_k[stage]);
        if (it == 0) MSGL_PREFILL_PROBE(10); /* ... issued K_0 */
        if (ring >= STAGES) mbar_wait(&empty_v[stage], freed);
        load(smem + v_off(stage), p.v_cache, &pp.v_map, it, page, &full_v[stage]);
      }
      if constexpr (!Cfg::PERSISTENT) break; /* one item (and no loop for ptxas to keep state across) */
      next();
    }
    if constexpr (Cfg::DYNAMIC) {
      /* This block draws no more tickets: the last block to get here (every other
       * block's last draw done before its count, the fence between) resets both. */
      if (t == 0) {
        __threadfence();
        if (atomicAdd(pp.a.split_counters + 1, 1) == static_cast<int>(gridDim.x) - 1) {
          atomicExch(pp.a.split_counters, 0);
          atomicExch(pp.a.split_counters + 1, 0);
        }
      }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
  } else {
    regs_inc<WsRegs<CONSUMERS>::CONSUMER>();
    MSGL_PREFILL_PROBE(0); /* the consumers' start */
    const int cwg = wg - 1;
    auto parity = [](int ring) { return static_cast<unsigned>((ring / STAGES) & 1); };
    int ring = 0; /* the ring position of the item's first K/V tile */
    int n = 0;
    /* The static rounds' items (the item counts only there; DYNAMIC: q_head). */
    for (int item = blockIdx.x; Cfg::DYNAMIC || item < items; item += Cfg::DYNAMIC ? 0 : gridDim.x, ++n) {
      const int qb = n % QBUF;
      mbar_wait(&q_full[qb], static_cast<unsigned>((n / QBUF) & 1));
      MSGL_PREFILL_PROBE(1); /* Q is in */
      const WgTile tl = q_tile[qb];
      const int kv_head = Cfg::DYNAMIC ? q_head[qb] : item % p.num_kv_heads;
      if (Cfg::DYNAMIC && kv_head < 0) break; /* no item is left */
      if (!tl.found) {
        mbar_arrive_warp(&q_empty[qb]);
        continue;
      }
      const int num_tiles = (tl.kv_stop + BN - 1) / BN;
      WgRows<DTYPE, HEAD_DIM, BM, BN> w;
      w.init(tl, group, cwg, s_base + qb * Q_BYTES, p.scale_log2);
      /* Tiles 0..n_active-1 reach this warpgroup's rows. */
      const int n_active = w.active_tiles(num_tiles);
      /* A tile the producer gathered with cp.async (the generic proxy) is made visible
       * to wgmma (the async proxy) by a proxy fence; TMA tiles arrive through the async
       * proxy and their barrier alone (the fence is a full memory barrier: MEMBAR). */
      const int tma_tiles = ws_tma_tiles<Cfg>(pp, tl.kv_stop);
      auto fence_gathered = [&](int it) {
        if (it >= tma_tiles) fence_proxy_async_smem();
      };
      /* TMA_TAIL: the rows of the tail tile's last page past the sequence's last key,
       * zeroed in V before its P V (those of copies past the sequence are zeros). */
      auto zero_tail_v = [&](int it, int stage) {
        if constexpr (Cfg::TMA_TAIL) {
          const int from = tl.kv_stop - it * BN, rows = pp.kv_tma_rows;
          if (it == num_tiles - 1 && from < BN && rows > 0) {
            const int to = (from + rows - 1) / rows * rows;
            wg_zero_rows<HEAD_DIM, BN>(smem + v_off(stage), from, to < BN ? to : BN, threadIdx.x % 128);
            named_sync(1 + cwg, 128);
          }
        }
      };

      if constexpr (!Cfg::OVERLAP) {
        for (int it = 0; it < num_tiles; ++it) {
          const int stage = (ring + it) % STAGES;
          mbar_wait(&full_k[stage], parity(ring + it));
          if (it < n_active) {
            fence_gathered(it);
            w.issue_s(s_base + k_off(stage));
            wgmma_wait<0>();
            wgmma_fence_regs(w.s);
            mbar_arrive_warp(&empty_k[stage]);
            float alpha[2];
            w.softmax(it * BN, alpha);
            w.rescale(alpha);
            w.pack_p();
            wgmma_fence_regs(w.o);
            mbar_wait(&full_v[stage], parity(ring + it));
            fence_gathered(it);
            zero_tail_v(it, stage);
            w.issue_pv(s_base + v_off(stage));
            wgmma_wait<0>();
            wgmma_fence_regs(w.o);
          } else {
            mbar_arrive_warp(&empty_k[stage]);
            mbar_wait(&full_v[stage], parity(ring + it));
          }
          mbar_arrive_warp(&empty_v[stage]);
        }
      } else {
        constexpr int SCHED = 4; /* named barriers SCHED + consumer (0 is __syncthreads, 1..3 the warpgroups') */
        if (Cfg::PINGPONG && cwg == 1) named_arrive(SCHED, 256); /* consumer 0 goes first */
        /* The factor O must be scaled by before the next P V (EARLY: kept from the
         * step whose softmax made it to the next step's issue). */
        float alpha[2] = {1.f, 1.f};
        for (int j = 0; j <= num_tiles; ++j) {
          const bool has_s = j < n_active;
          const bool has_pv = j > 0 && j <= n_active;
          const int stage = (ring + j) % STAGES, prev = (ring + j + STAGES - 1) % STAGES;
          if (j < num_tiles) mbar_wait(&full_k[stage], parity(ring + j));
          if (j == 0) MSGL_PREFILL_PROBE(2); /* K_0 is in */
          if (j > 0) mbar_wait(&full_v[prev], parity(ring + j - 1));
          fence_gathered(j < num_tiles ? j : j - 1); /* K_j, V_{j-1}: only the last tile may be gathered */
          if (has_pv) zero_tail_v(j - 1, prev);
          if constexpr (Cfg::PINGPONG) named_sync(SCHED + cwg, 256);
          /* Lets the other consumer issue its products (ping-pong) once this one's are. */
          auto hand_over = [&]() {
            if constexpr (Cfg::PINGPONG) {
              if (cwg == 0 || j < num_tiles) named_arrive(SCHED + 1 - cwg, 256);
            }
          };
          /* EARLY: O *= the previous step's factor before P_{j-1} V_{j-1} is issued
           * (after S_j's issue, so that it runs under S_j; the fence keeps the
           * multiplies from being hoisted above that issue). */
          auto rescale_early = [&]() {
            if constexpr (Cfg::EARLY) {
              wgmma_fence_regs(w.o);
              w.rescale(alpha);
            }
          };
          /* K_j is free once S_j is done (EARLY), else at the step's end. */
          auto release_k_early = [&]() {
            if constexpr (Cfg::EARLY) mbar_arrive_warp(&empty_k[stage]);
          };
          /* Each branch issues its products and waits for all of them: ptxas
           * serialises wgmma that stay in flight across a branch it cannot prove
           * uniform (C7518), which two `if`s issuing S and P V apart were. */
          if (has_s && has_pv) {
            w.issue_s(s_base + k_off(stage));
            rescale_early();
            w.issue_pv(s_base + v_off(prev));
            hand_over();
            wgmma_wait<1>(); /* S_j (committed first) is done, P V may not be */
            wgmma_fence_regs(w.s);
            release_k_early();
            w.softmax(j * BN, alpha);
            softmax_anchor_store(&softmax_anchor[threadIdx.x - 128], w.l[0] + w.l[1]);
            wgmma_wait<0>(); /* P_{j-1} V_{j-1}: O and P are free */
            wgmma_fence_regs(w.o);
            if constexpr (!Cfg::EARLY) w.rescale(alpha);
            w.pack_p();
          } else if (has_s) {
            w.issue_s(s_base + k_off(stage));
            hand_over();
            wgmma_wait<0>();
            wgmma_fence_regs(w.s);
            release_k_early();
            w.softmax(j * BN, alpha); /* j = 0: O is still zero, no rescale */
            w.pack_p();
          } else if (has_pv) {
            rescale_early();
            w.issue_pv(s_base + v_off(prev));
            hand_over();
            wgmma_wait<0>();
            wgmma_fence_regs(w.o);
          } else {
            hand_over();
          }
          if (j < num_tiles && !(Cfg::EARLY && has_s)) mbar_arrive_warp(&empty_k[stage]); /* S_j is done */
          if (j > 0) mbar_arrive_warp(&empty_v[prev]);                                      /* P_{j-1} V_{j-1} is done */
        }
      }
      MSGL_PREFILL_PROBE(3); /* the last P V is done */
      if (w.has_rows) {
        named_sync(1 + cwg, 128); /* the warpgroup's products are done with its Q rows */
        w.store(smem + qb * Q_BYTES, p, tl, group, kv_head, cwg);
      }
      MSGL_PREFILL_PROBE(4); /* O is stored */
      mbar_arrive_warp(&q_empty[qb]); /* the buffer's rows are read (the staged O included) */
      ring += num_tiles;
      if constexpr (!Cfg::PERSISTENT) break;
    }
  }
#else
  (void)p;
  __trap(); /* the wgmma tiles need sm_90a; the host offers them only there */
#endif
}

/* The block's threads, rows, dynamic shared memory and blocks an SM for any TILE. */
template <int TILE, int HEAD_DIM> __host__ __device__ constexpr int prefill_block_min_blocks() {
  if constexpr (prefill_is_wgmma(TILE)) return prefill_wg_min_blocks<TILE, HEAD_DIM>();
  else return 1;
}
template <int TILE, int HEAD_DIM> __host__ __device__ constexpr int prefill_block_threads() {
  if constexpr (prefill_is_wgmma(TILE)) return prefill_wg_threads<TILE, HEAD_DIM>();
  else return prefill_threads<TILE, HEAD_DIM>();
}
template <int TILE, int HEAD_DIM> __host__ __device__ constexpr long long prefill_block_smem_bytes() {
  if constexpr (prefill_is_wgmma(TILE)) return prefill_wg_smem_bytes<TILE, HEAD_DIM>();
  else return prefill_smem_bytes<TILE, HEAD_DIM>();
}
template <int DTYPE, int HEAD_DIM, int TILE>
__device__ __forceinline__ void prefill_entry(const msgl_prefill_params& pp) {
  if constexpr (!prefill_is_wgmma(TILE)) prefill_attention_impl<DTYPE, HEAD_DIM, TILE>(pp.a);
  else if constexpr (PrefillWgTile<TILE, HEAD_DIM>::PRODUCER) prefill_ws_impl<DTYPE, HEAD_DIM, TILE>(pp);
  else prefill_wgmma_impl<DTYPE, HEAD_DIM, TILE>(pp.a);
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = prefill_block_threads<TILE, HEAD_DIM>(), grid = num_q_tiles * num_kv_heads and
 * prefill_block_smem_bytes<TILE, HEAD_DIM>() of dynamic shared memory (gpu/prefill.rs
 * mirrors both); a persistent tile's grid is at most the SM count, its blocks walking
 * the items. */
extern "C" __global__ void __launch_bounds__(msgl::prefill_block_threads<MSGL_TILE, MSGL_HEAD_DIM>(),
                                             msgl::prefill_block_min_blocks<MSGL_TILE, MSGL_HEAD_DIM>())
    msgl_prefill_attention_kernel(const __grid_constant__ msgl_prefill_params p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  /* A run-time instance is compiled for its device: a wgmma tile must be sm_90a. */
  static_assert(!msgl::prefill_is_wgmma(MSGL_TILE), "the wgmma prefill tiles need sm_90a");
#endif
  msgl::prefill_entry<MSGL_DTYPE, MSGL_HEAD_DIM, MSGL_TILE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include <algorithm>

#include "minisgl/attention_host.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE, HEAD_DIM, TILE) for each AOT instance */

namespace msgl {

template <int DTYPE, int HEAD_DIM, int TILE>
__global__ void __launch_bounds__(prefill_block_threads<TILE, HEAD_DIM>(), prefill_block_min_blocks<TILE, HEAD_DIM>())
    prefill_attention_kernel(const __grid_constant__ msgl_prefill_params p) {
  prefill_entry<DTYPE, HEAD_DIM, TILE>(p);
}

/* Checks the caller's ranking (msgl_prefill_ranks) against the tensors and the
 * instance's `rows`, so that the kernel, which trusts it, stays inside them: each
 * rank's tokens inside q and apart from the others', its keys inside its block-table
 * row, its tiles, the order and the segment starts as defined, every q tile once.
 * Run at every launch (every layer of a prefill step), so nothing in it is quadratic
 * in the ranks (up to MSGL_PREFILL_RANKS): the sequences and token runs are compared
 * as neighbours in sorted order, the segment starts from running sums. */
static int32_t check_prefill_ranks(const msgl_prefill_ranks& rk, const msgl_attention_params& p, int rows) {
  const char* op = "prefill_attention";
  const int group = p.num_q_heads / p.num_kv_heads;
  if (rk.count < 0 || rk.count > MSGL_PREFILL_RANKS || rk.count > p.num_seqs)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %d ranked sequences (at most %d, and the batch's %d)", op, rk.count,
                     MSGL_PREFILL_RANKS, p.num_seqs);
  long long items = 0;
  for (int r = 0; r < rk.count; ++r) {
    const long long start = rk.q_start[r], len = rk.q_len[r], kv = rk.kv_len[r];
    if (rk.seq[r] < 0 || rk.seq[r] >= p.num_seqs || start < 0 || len < 1 || start + len > p.num_tokens || kv < len ||
        kv > static_cast<long long>(p.max_pages) * p.page_size)
      return set_error(MSGL_ERR_INVALID_ARGUMENT,
                       "%s: rank %d (sequence %d, tokens %lld + %lld, %lld keys) is outside the batch's tensors", op, r,
                       rk.seq[r], start, len, kv);
    const long long tiles = (len * group + rows - 1) / rows;
    if (rk.tiles[r] != tiles || (r > 0 && rk.tiles[r] > rk.tiles[r - 1]))
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: rank %d has %d q tiles, not %lld of %d rows in order", op, r,
                       rk.tiles[r], tiles, rows);
    items += tiles;
  }
  /* No two ranks share a sequence or a token: neighbours by sequence, then by first
   * token (runs of at least one token, so overlapping runs are neighbours too). */
  int order[MSGL_PREFILL_RANKS];
  for (int r = 0; r < rk.count; ++r) order[r] = r;
  const auto shared = [&](int a, int b) {
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: ranks %d and %d share a sequence or tokens", op, std::min(a, b),
                     std::max(a, b));
  };
  std::sort(order, order + rk.count, [&](int a, int b) { return rk.seq[a] < rk.seq[b]; });
  for (int i = 1; i < rk.count; ++i)
    if (rk.seq[order[i - 1]] == rk.seq[order[i]]) return shared(order[i - 1], order[i]);
  std::sort(order, order + rk.count, [&](int a, int b) { return rk.q_start[a] < rk.q_start[b]; });
  for (int i = 1; i < rk.count; ++i)
    if (static_cast<long long>(rk.q_start[order[i - 1]]) + rk.q_len[order[i - 1]] > rk.q_start[order[i]])
      return shared(order[i - 1], order[i]);
  /* before[r] = sum_j min(tiles[j], tiles[r + 1]): with the tiles non-increasing
   * (checked above), ranks 0..r + 1 count tiles[r + 1] each and the rest their own. */
  long long through = 0; /* tiles of ranks 0..r */
  for (int r = 0; r < rk.count; ++r) {
    through += rk.tiles[r];
    const long long below = r + 1 < rk.count ? rk.tiles[r + 1] : 0;
    const long long before = r + 1 < rk.count ? (r + 2) * below + (items - through - below) : 0;
    if (rk.before[r] != before)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: rank %d's segment starts at item %d, not %lld", op, r,
                       rk.before[r], before);
  }
  if (rk.count > 0 && items != p.num_q_tiles)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the ranks hold %lld q tiles, the plan %d", op, items,
                     p.num_q_tiles);
  return MSGL_OK;
}

template <int DTYPE, int HEAD_DIM, int TILE>
static int32_t launch_prefill_attention(msgl_prefill_params pp, cudaStream_t s) {
  const msgl_attention_params& p = pp.a;
  if constexpr (prefill_is_wgmma(TILE)) {
    if (PrefillWgTile<TILE, HEAD_DIM>::DYNAMIC && p.split_counters == nullptr)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "prefill_attention: tile %d draws its items from `item_counter`, which is null",
                       TILE);
    if (PrefillWgTile<TILE, HEAD_DIM>::PRODUCER) MSGL_TRY(check_prefill_ranks(pp.ranks, p, prefill_wg_rows<TILE, HEAD_DIM>()));
    else pp.ranks.count = 0; /* read by the warp-specialised tiles only */
    if (pp.kv_tma_rows != 0 || pp.q_tma != 0) {
      if (!PrefillWgTile<TILE, HEAD_DIM>::TMA)
        return set_error(MSGL_ERR_INVALID_ARGUMENT, "prefill_attention: tile %d does not copy by TMA", TILE);
      if (pp.kv_tma_rows != 0)
        pp.kv_tma_rows = p.page_size < PrefillWgTile<TILE, HEAD_DIM>::BN ? p.page_size : PrefillWgTile<TILE, HEAD_DIM>::BN;
      const int group = p.num_q_heads / p.num_kv_heads;
      if (pp.q_tma != 0 && prefill_wg_rows<TILE, HEAD_DIM>() % group != 0)
        return set_error(MSGL_ERR_INVALID_ARGUMENT, "prefill_attention: q_map needs a group (%d) dividing tile %d's rows",
                         group, TILE);
    }
  } else {
    pp.ranks.count = 0;
    if (pp.kv_tma_rows != 0 || pp.q_tma != 0)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "prefill_attention: tile %d does not copy by TMA", TILE);
  }
  constexpr long long smem = prefill_block_smem_bytes<TILE, HEAD_DIM>();
  cudaError_t err = cudaFuncSetAttribute(prefill_attention_kernel<DTYPE, HEAD_DIM, TILE>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess)
    return set_error(MSGL_ERR_CUDA, "prefill_attention: %lld bytes of shared memory: %s", smem, cudaGetErrorString(err));
  long long blocks = static_cast<long long>(p.num_q_tiles) * p.num_kv_heads;
  if constexpr (prefill_is_wgmma(TILE)) {
    if (PrefillWgTile<TILE, HEAD_DIM>::PERSISTENT) { /* one block an SM walks the items */
      int device = 0, sms = 0;
      err = cudaGetDevice(&device);
      if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      if (err != cudaSuccess)
        return set_error(MSGL_ERR_CUDA, "prefill_attention: the multiprocessor count: %s", cudaGetErrorString(err));
      long long resident = static_cast<long long>(sms) * prefill_block_min_blocks<TILE, HEAD_DIM>();
      if (p.max_blocks > 0 && p.max_blocks < resident) resident = p.max_blocks;
      if (resident > 0 && blocks > resident) blocks = resident;
    }
  }
  if (blocks > 0)
    prefill_attention_kernel<DTYPE, HEAD_DIM, TILE>
        <<<static_cast<unsigned>(blocks), prefill_block_threads<TILE, HEAD_DIM>(), smem, s>>>(pp);
  return check_launch("prefill_attention");
}
}  // namespace msgl

/* plan: num_q_tiles (the batch's q tiles of prefill_rows<TILE, HEAD_DIM>() rows)
 * and scale_log2 are read; the rest is filled from the tensors. No splits. */
extern "C" int32_t msgl_prefill_attention(const msgl_tensor* out, const msgl_tensor* q, const msgl_tensor* k_cache,
                                          const msgl_tensor* v_cache, const msgl_tensor* q_indptr,
                                          const msgl_tensor* kv_lens, const msgl_tensor* block_table,
                                          const msgl_attention_params* plan, const msgl_tensor_map* k_map,
                                          const msgl_tensor_map* v_map, const msgl_tensor_map* q_map,
                                          const msgl_prefill_ranks* ranks, const msgl_tensor* item_counter,
                                          int32_t tile, msgl_stream stream) {
  using namespace msgl;
  const char* op = "prefill_attention";
  if (plan == nullptr) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `plan` is null", op);
  if (plan->max_splits != 1 || plan->num_q_tiles < 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: bad plan (max_splits %d, num_q_tiles %d)", op, plan->max_splits,
                     plan->num_q_tiles);
  if (q != nullptr && q->dtype != MSGL_BF16 && q->dtype != MSGL_F16)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: bf16 or f16 only", op);
  if (!(plan->scale_log2 > 0.f) || plan->scale_log2 > 3.4e38f)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the softmax scale must be positive and finite", op);
  msgl_prefill_params pp{};
  msgl_attention_params& p = pp.a;
  MSGL_TRY(attention_check_and_fill(op, out, q, k_cache, v_cache, q_indptr, kv_lens, block_table, nullptr, nullptr,
                                    plan, &p));
  /* The maps are the caller's (built for these caches); none: cp.async gathers. */
  if ((k_map == nullptr) != (v_map == nullptr))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: k_map and v_map go together", op);
  if (k_map != nullptr) {
    const long long ps = p.page_size;
    if (ps < 8 || (ps & (ps - 1)) != 0 || p.num_pages * ps > 0x7fffffffLL)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: TMA needs a power-of-two page size >= 8 and < 2^31 slots", op);
    pp.k_map = *k_map;
    pp.v_map = *v_map;
    pp.kv_tma_rows = -1; /* set per instance: min(page_size, its keys) */
  }
  if (q_map != nullptr) { /* checked per instance: the group must divide its rows */
    pp.q_map = *q_map;
    pp.q_tma = 1;
  }
  if (ranks != nullptr) pp.ranks = *ranks; /* checked per instance, against its rows */
  if (item_counter != nullptr) { /* the dynamic tiles' (checked per instance: they need it) */
    MSGL_TRY(expect_tensor(item_counter, op, "item_counter", 1, dtype_bit(MSGL_I32)));
    MSGL_TRY(expect_contiguous(item_counter, op, "item_counter"));
    if (item_counter->device != q->device || item_counter->shape[0] < 2)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `item_counter` must be two or more int32 on the device of `q`", op);
    p.split_counters = static_cast<int32_t*>(item_counter->data);
  }
  if (p.fused_rope != 0) /* the decode kernel's prologue: this kernel would leave q unrotated and the rows unstored */
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the fused prologue (fused_rope) is the decode kernel's", op);
  if (static_cast<long long>(p.num_q_tiles) * p.num_kv_heads > 0x7fffffffLL)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the grid exceeds 2^31 blocks", op);
  const int64_t head_dim = q->shape[2];
  if (p.num_tokens == 0 || p.num_seqs == 0) return MSGL_OK;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#define MSGL_CASE(D, HD, TL) \
  if (q->dtype == D && head_dim == HD && tile == TL) return launch_prefill_attention<D, HD, TL>(pp, s);
  MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
  return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d,HEAD_DIM=%lld,TILE=%d", op, q->dtype,
                   static_cast<long long>(head_dim), tile);
}
#endif
