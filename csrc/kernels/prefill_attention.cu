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
 */
#include "minisgl/attention.cuh"
#include "minisgl/mma.cuh"

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
__device__ __forceinline__ int prefill_tiles_of(const msgl_attention_params& p, int s, int group, int bm) {
  const int q_len = p.q_indptr[s + 1] - p.q_indptr[s];
  return (q_len * group + bm - 1) / bm;
}

/* A warp-wide sum over the sequences of f(tiles of the sequence); every lane gets it. */
template <typename F>
__device__ __forceinline__ int prefill_seq_sum(const msgl_attention_params& p, int group, int bm, F f) {
  const int lane = threadIdx.x % kWarpSize;
  int acc = 0;
  for (int s = lane; s < p.num_seqs; s += kWarpSize) acc += f(prefill_tiles_of(p, s, group, bm));
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

/* The (sequence, q tile) of grid item `item` (see the header: depth-major order).
 * With n_s the tiles of sequence s, before(d) = sum_s min(n_s, d) items have depth
 * < d; the item's depth is the largest d with before(d) <= item, and it is the
 * (item - before(d))-th sequence, in order, with n_s > d; its tile is n_s - 1 - d.
 * Warp-uniform; false for items past the last. */
__device__ __forceinline__ bool prefill_find_tile(const msgl_attention_params& p, int item, int group, int bm, int& seq,
                                                  int& tile_in_seq) {
  const int lane = threadIdx.x % kWarpSize;
  int max_tiles = 0;
  for (int s = lane; s < p.num_seqs; s += kWarpSize) max_tiles = max(max_tiles, prefill_tiles_of(p, s, group, bm));
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) max_tiles = max(max_tiles, __shfl_xor_sync(0xffffffffu, max_tiles, o));
  if (max_tiles == 0) return false;
  auto before = [&](int d) { return prefill_seq_sum(p, group, bm, [d](int n) { return min(n, d); }); };
  int lo = 0, hi = max_tiles - 1; /* before(0) = 0 <= item */
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (before(mid) <= item) lo = mid; else hi = mid - 1;
  }
  const int depth = lo;
  int k = item - before(depth);
  for (int base = 0; base < p.num_seqs; base += kWarpSize) {
    const int s = base + lane;
    const int n = s < p.num_seqs ? prefill_tiles_of(p, s, group, bm) : 0;
    const bool deep = n > depth;
    const unsigned mask = __ballot_sync(0xffffffffu, deep);
    const int count = __popc(mask);
    if (k < count) {
      const bool mine = deep && __popc(mask & ((1u << lane) - 1u)) == k;
      const int first = __ffs(__ballot_sync(0xffffffffu, mine)) - 1;
      seq = base + first;
      tile_in_seq = __shfl_sync(0xffffffffu, n, first) - 1 - depth;
      return true;
    }
    k -= count;
  }
  return false;
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
  int seq = 0, tile_in_seq = 0;
  if (!prefill_find_tile(p, item, group, BM, seq, tile_in_seq)) return;
  const int q_start = p.q_indptr[seq];
  const int q_len = p.q_indptr[seq + 1] - q_start;
  const int prefix = p.kv_lens[seq] - q_len; /* cached tokens before the new ones */
  const int row0 = tile_in_seq * BM;         /* first packed row of the tile */
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

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = prefill_threads<TILE, HEAD_DIM>(), grid = num_q_tiles * num_kv_heads and
 * prefill_smem_bytes<TILE, HEAD_DIM>() of dynamic shared memory (gpu/prefill.rs
 * mirrors both). */
extern "C" __global__ void __launch_bounds__(msgl::prefill_threads<MSGL_TILE, MSGL_HEAD_DIM>(), 1)
    msgl_prefill_attention_kernel(const msgl_attention_params p) {
  msgl::prefill_attention_impl<MSGL_DTYPE, MSGL_HEAD_DIM, MSGL_TILE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/attention_host.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE, HEAD_DIM, TILE) for each AOT instance */

namespace msgl {

template <int DTYPE, int HEAD_DIM, int TILE>
__global__ void __launch_bounds__(prefill_threads<TILE, HEAD_DIM>(), 1)
    prefill_attention_kernel(const msgl_attention_params p) {
  prefill_attention_impl<DTYPE, HEAD_DIM, TILE>(p);
}

template <int DTYPE, int HEAD_DIM, int TILE>
static int32_t launch_prefill_attention(const msgl_attention_params& p, cudaStream_t s) {
  constexpr long long smem = prefill_smem_bytes<TILE, HEAD_DIM>();
  cudaError_t err = cudaFuncSetAttribute(prefill_attention_kernel<DTYPE, HEAD_DIM, TILE>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess)
    return set_error(MSGL_ERR_CUDA, "prefill_attention: %lld bytes of shared memory: %s", smem, cudaGetErrorString(err));
  const long long blocks = static_cast<long long>(p.num_q_tiles) * p.num_kv_heads;
  if (blocks > 0)
    prefill_attention_kernel<DTYPE, HEAD_DIM, TILE>
        <<<static_cast<unsigned>(blocks), prefill_threads<TILE, HEAD_DIM>(), smem, s>>>(p);
  return check_launch("prefill_attention");
}
}  // namespace msgl

/* plan: num_q_tiles (the batch's q tiles of prefill_rows<TILE, HEAD_DIM>() rows)
 * and scale_log2 are read; the rest is filled from the tensors. No splits. */
extern "C" int32_t msgl_prefill_attention(const msgl_tensor* out, const msgl_tensor* q, const msgl_tensor* k_cache,
                                          const msgl_tensor* v_cache, const msgl_tensor* q_indptr,
                                          const msgl_tensor* kv_lens, const msgl_tensor* block_table,
                                          const msgl_attention_params* plan, int32_t tile, msgl_stream stream) {
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
  msgl_attention_params p;
  MSGL_TRY(attention_check_and_fill(op, out, q, k_cache, v_cache, q_indptr, kv_lens, block_table, nullptr, nullptr,
                                    plan, &p));
  if (static_cast<long long>(p.num_q_tiles) * p.num_kv_heads > 0x7fffffffLL)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the grid exceeds 2^31 blocks", op);
  const int64_t head_dim = q->shape[2];
  if (p.num_tokens == 0 || p.num_seqs == 0) return MSGL_OK;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#define MSGL_CASE(D, HD, TL) \
  if (q->dtype == D && head_dim == HD && tile == TL) return launch_prefill_attention<D, HD, TL>(p, s);
  MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
  return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d,HEAD_DIM=%lld,TILE=%d", op, q->dtype,
                   static_cast<long long>(head_dim), tile);
}
#endif
