/*
 * minisgl/moe.cuh: the device halves of the MoE router and of the batching by
 * expert, shared by moe_route.cu (which fuses both for small batches) and
 * moe_align.cu.
 *
 * moe_route_token: the top-k of one token's router logits, by one warp (see
 * moe_route.cu for the math). moe_align_*: the stable counting sort of the
 * (token, slot) pairs by expert (see moe_align.cu for the layout):
 *   moe_align_count   one block: per-expert counts (shared atomics), a warp scan
 *                     of the padded counts and of the tiles per expert, then the
 *                     offsets, the block experts, the tile list and the padding;
 *   moe_align_ranked  the same block: rounds of 1024 pairs ranked within each
 *                     warp (__match_any_sync) and across warps (a scan of per-warp
 *                     16-bit counters in shared memory), so the order is stable;
 *   moe_align_expert  one block per expert (large batches): a block-wide scan of
 *                     hit counts over the whole id array.
 *
 * Device code only, no system headers (NVRTC).
 */
#ifndef MINISGL_MOE_CUH
#define MINISGL_MOE_CUH

#include "minisgl/dtype.cuh"

namespace msgl {

constexpr int kMoeAlignThreads = 1024;
/* The row granule (BLOCK_M) of the sort fused into moe_route_align. */
#define MSGL_MOE_ROUTE_BLOCK_M 16
constexpr int kMoeAlignWarps = kMoeAlignThreads / kWarpSize;
constexpr int kMoeRoutePerLane = MSGL_MOE_MAX_EXPERTS / kWarpSize;

/* Dynamic shared memory of the ranked (single-block) sort: per-warp counters. */
__host__ __device__ constexpr int moe_align_ranked_smem(int num_experts) { return kMoeAlignWarps * num_experts * 2; }

__device__ __forceinline__ float moe_neg_inf() { return -__int_as_float(0x7f800000); }

/* Routes token `token` with the calling warp: writes its top_k ids and weights.
 * PER_LANE: the logits a lane holds, at least ceil(num_experts / 32) (fewer
 * unrolled slots for callers that know the experts are few; the same bits). */
template <int DTYPE, int PER_LANE = kMoeRoutePerLane>
__device__ __forceinline__ void moe_route_token(const void* logits, long long stride, int num_experts, int top_k,
                                                int renormalize, long long token, int32_t* topk_ids, float* topk_weights) {
  using T = typename DType<DTYPE>::Storage;
  const int lane = threadIdx.x % kWarpSize;
  const T* row = static_cast<const T*>(logits) + token * stride;
  float v[PER_LANE];
  float mx = moe_neg_inf();
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int e = i * kWarpSize + lane;
    v[i] = e < num_experts ? DType<DTYPE>::to_f32(row[e]) : moe_neg_inf();
    mx = fmaxf(mx, v[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i)
    if (i * kWarpSize + lane < num_experts) sum += expf(v[i] - mx);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);

  constexpr int kNone = 0x7fffffff;
  unsigned taken = 0;  // bit i: expert i * 32 + lane already chosen
  int my_id = 0;
  float my_prob = 0.f, chosen_sum = 0.f;
  for (int j = 0; j < top_k; ++j) {
    float best = moe_neg_inf();
    int best_id = kNone;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      const int e = i * kWarpSize + lane;
      // Experts come in increasing order per lane: strict `>` keeps the lower index.
      if (e < num_experts && !(taken >> i & 1u) && (best_id == kNone || v[i] > best)) {
        best = v[i];
        best_id = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (oi != kNone && (best_id == kNone || ov > best || (ov == best && oi < best_id))) {
        best = ov;
        best_id = oi;
      }
    }
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i)
      if (i * kWarpSize + lane == best_id) taken |= 1u << i;
    const float prob = expf(best - mx) / sum;
    chosen_sum += prob;
    if (lane == j) {
      my_id = best_id;
      my_prob = prob;
    }
  }
  if (lane < top_k) {
    topk_ids[token * top_k + lane] = my_id;
    topk_weights[token * top_k + lane] = renormalize ? my_prob / chosen_sum : my_prob;
  }
}

/* The outputs of the sort (pointers of msgl_moe_align_params). */
struct MoeAlignOut {
  const int32_t* topk_ids;
  int32_t* sorted_ids;
  int32_t* block_experts;
  int32_t* expert_offsets;
  int32_t* tiles;
  long long num_pairs;
  int num_experts;
  int tile_m;
};

/* One block: counts, scans, writes offsets, block experts, tiles and padding;
 * leaves count[e] and start[e] (padded start, start[num_experts] = total) in
 * shared memory. */
template <int BLOCK_M>
__device__ __forceinline__ void moe_align_count(const MoeAlignOut& p, int* count, int* start) {
  const int tid = threadIdx.x;
  const int num_experts = p.num_experts;
  for (int e = tid; e < num_experts; e += kMoeAlignThreads) count[e] = 0;
  __syncthreads();
  for (long long i = tid; i < p.num_pairs; i += kMoeAlignThreads) {
    const int e = p.topk_ids[i];
    if (e >= 0 && e < num_experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  __shared__ int tile_start[MSGL_MOE_MAX_EXPERTS];
  if (tid < kWarpSize) {
    // Lane l scans experts [l * per, (l + 1) * per): padded rows and tiles.
    const int per = (num_experts + kWarpSize - 1) / kWarpSize;
    const int lo = tid * per < num_experts ? tid * per : num_experts;
    const int hi = lo + per < num_experts ? lo + per : num_experts;
    int rows = 0, tiles = 0;
    for (int e = lo; e < hi; ++e) {
      const int padded = (count[e] + BLOCK_M - 1) / BLOCK_M * BLOCK_M;
      rows += padded;
      tiles += (padded + p.tile_m - 1) / p.tile_m;
    }
    int rows_incl = rows, tiles_incl = tiles;
#pragma unroll
    for (int o = 1; o < kWarpSize; o *= 2) {
      const int a = __shfl_up_sync(0xffffffffu, rows_incl, o);
      const int b = __shfl_up_sync(0xffffffffu, tiles_incl, o);
      if (tid >= o) {
        rows_incl += a;
        tiles_incl += b;
      }
    }
    int r = rows_incl - rows, t = tiles_incl - tiles;
    for (int e = lo; e < hi; ++e) {
      const int padded = (count[e] + BLOCK_M - 1) / BLOCK_M * BLOCK_M;
      start[e] = r;
      tile_start[e] = t;
      r += padded;
      t += (padded + p.tile_m - 1) / p.tile_m;
    }
    if (tid == kWarpSize - 1) {
      start[num_experts] = rows_incl;
      p.tiles[0] = tiles_incl;
      p.tiles[1] = p.tile_m;
    }
  }
  __syncthreads();
  for (int e = tid; e <= num_experts; e += kMoeAlignThreads) p.expert_offsets[e] = start[e];
  const int pad = static_cast<int>(p.num_pairs);
  for (int e = tid; e < num_experts; e += kMoeAlignThreads) {
    const int s = start[e], end = start[e + 1];
    for (int b = s / BLOCK_M; b < end / BLOCK_M; ++b) p.block_experts[b] = e;
    for (int i = s + count[e]; i < end; ++i) p.sorted_ids[i] = pad;
    int t = tile_start[e];
    for (int r = s; r < end; r += p.tile_m) p.tiles[2 + t++] = r;
  }
}

/* One block, after moe_align_count: the stable scatter in ranked rounds.
 * `cursor` = the start[] left by moe_align_count (advanced here);
 * `warp_count` = moe_align_ranked_smem(num_experts) bytes of shared memory. */
__device__ __forceinline__ void moe_align_ranked(const MoeAlignOut& p, int* cursor, unsigned short* warp_count) {
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int num_experts = p.num_experts;
  for (int i = tid; i < kMoeAlignWarps * num_experts; i += kMoeAlignThreads) warp_count[i] = 0;
  __syncthreads();
  for (long long round = 0; round < p.num_pairs; round += kMoeAlignThreads) {
    const long long i = round + tid;
    int e = i < p.num_pairs ? p.topk_ids[i] : -1;
    if (e < 0 || e >= num_experts) e = -1;
    // Rank among the lanes of this warp with the same expert, and the warp's count.
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    if (e >= 0 && rank == 0) warp_count[warp * num_experts + e] = static_cast<unsigned short>(__popc(peers));
    __syncthreads();
    // Expert x: exclusive scan of its per-warp counts, in warp order, in place.
    int round_total = 0;
    if (tid < num_experts) {
      for (int w = 0; w < kMoeAlignWarps; ++w) {
        const int c = warp_count[w * num_experts + tid];
        warp_count[w * num_experts + tid] = static_cast<unsigned short>(round_total);
        round_total += c;
      }
    }
    __syncthreads();
    if (e >= 0) p.sorted_ids[cursor[e] + warp_count[warp * num_experts + e] + rank] = static_cast<int>(i);
    __syncthreads();
    if (tid < num_experts) {
      cursor[tid] += round_total;
      for (int w = 0; w < kMoeAlignWarps; ++w) warp_count[w * num_experts + tid] = 0;
    }
    __syncthreads();
  }
}

/* One block per expert (blockIdx.x = e), after moe_align_count has written the
 * offsets in an earlier launch: the pairs of expert e in order. */
__device__ __forceinline__ void moe_align_expert(const MoeAlignOut& p) {
  __shared__ int warp_sums[kMoeAlignWarps];
  __shared__ int base_s;
  const int e = blockIdx.x;
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int begin = p.expert_offsets[e];
  if (p.expert_offsets[e + 1] == begin) return;
  if (tid == 0) base_s = begin;
  const long long n = p.num_pairs;
  const bool aligned = (reinterpret_cast<unsigned long long>(p.topk_ids) % 16) == 0;
  for (long long round = 0; round < n; round += 4LL * kMoeAlignThreads) {
    const long long i0 = round + 4LL * tid;
    int ids[4];
    if (aligned && i0 + 3 < n) {
      const int4 v = *reinterpret_cast<const int4*>(p.topk_ids + i0);
      ids[0] = v.x, ids[1] = v.y, ids[2] = v.z, ids[3] = v.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) ids[j] = i0 + j < n ? p.topk_ids[i0 + j] : -1;
    }
    int hits = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) hits += ids[j] == e;
    int incl = hits;
#pragma unroll
    for (int o = 1; o < kWarpSize; o *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    __syncthreads();  // base_s of the previous round is final; warp_sums is free
    if (lane == kWarpSize - 1) warp_sums[warp] = incl;
    __syncthreads();
    int before = base_s;
    for (int w = 0; w < warp; ++w) before += warp_sums[w];
    int pos = before + incl - hits;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (ids[j] == e) p.sorted_ids[pos++] = static_cast<int>(i0 + j);
    __syncthreads();
    if (tid == kMoeAlignThreads - 1) base_s = pos;
  }
}

}  // namespace msgl

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"

namespace msgl {

/* Sorted-list rows for n pairs over num_experts experts with granule block_m. */
inline int64_t moe_sorted_rows(int64_t n, int64_t num_experts, int64_t block_m) {
  const int64_t nonempty = n < num_experts ? n : num_experts;
  return (n + nonempty * (block_m - 1) + block_m - 1) / block_m * block_m;
}

/* Entries of the tile list (count, tile_m, starts) for `rows` sorted rows. */
inline int64_t moe_tile_entries(int64_t rows, int64_t n, int64_t num_experts, int64_t tile_m) {
  const int64_t nonempty = n < num_experts ? n : num_experts;
  return 2 + (rows + tile_m - 1) / tile_m + nonempty;
}

/* Checks moe_align's arguments and fills the sort part of `p`. */
inline int32_t moe_align_check(const char* op, const msgl_tensor* sorted_ids, const msgl_tensor* block_experts,
                               const msgl_tensor* expert_offsets, const msgl_tensor* tiles, const msgl_tensor* topk_ids,
                               int32_t block_m, int32_t tile_m, msgl_moe_align_params& p) {
  MSGL_TRY(expect_tensor(sorted_ids, op, "sorted_ids", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(block_experts, op, "block_experts", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(expert_offsets, op, "expert_offsets", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(tiles, op, "tiles", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(topk_ids, op, "topk_ids", 2, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_contiguous(sorted_ids, op, "sorted_ids"));
  MSGL_TRY(expect_contiguous(block_experts, op, "block_experts"));
  MSGL_TRY(expect_contiguous(expert_offsets, op, "expert_offsets"));
  MSGL_TRY(expect_contiguous(tiles, op, "tiles"));
  MSGL_TRY(expect_contiguous(topk_ids, op, "topk_ids"));
  const int64_t num_experts = expert_offsets->shape[0] - 1;
  const int64_t n = topk_ids->shape[0] * topk_ids->shape[1];
  if (num_experts < 1 || num_experts > MSGL_MOE_MAX_EXPERTS)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `expert_offsets` holds %lld experts + 1, expected 1..%d experts", op,
                     static_cast<long long>(num_experts), MSGL_MOE_MAX_EXPERTS);
  if (n >= 0x7fffffff)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %lld pairs exceed the int32 positions", op, static_cast<long long>(n));
  if (block_m < 1 || tile_m < block_m || tile_m % block_m != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: tile_m %d must be a positive multiple of block_m %d", op, tile_m, block_m);
  const int64_t rows = moe_sorted_rows(n, num_experts, block_m);
  if (sorted_ids->shape[0] < rows)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `sorted_ids` has %lld entries, at least %lld needed", op,
                     static_cast<long long>(sorted_ids->shape[0]), static_cast<long long>(rows));
  if (block_experts->shape[0] * block_m < rows)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `block_experts` has %lld entries, at least %lld needed", op,
                     static_cast<long long>(block_experts->shape[0]), static_cast<long long>(rows / block_m));
  const int64_t entries = moe_tile_entries(rows, n, num_experts, tile_m);
  if (tiles->shape[0] < entries)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `tiles` has %lld entries, at least %lld needed", op,
                     static_cast<long long>(tiles->shape[0]), static_cast<long long>(entries));
  for (const msgl_tensor* t : {sorted_ids, block_experts, expert_offsets, tiles})
    if (t->device != topk_ids->device)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the outputs are not on the device of `topk_ids`", op);
  p = msgl_moe_align_params{};
  p.topk_ids = static_cast<const int32_t*>(topk_ids->data);
  p.sorted_ids = static_cast<int32_t*>(sorted_ids->data);
  p.block_experts = static_cast<int32_t*>(block_experts->data);
  p.expert_offsets = static_cast<int32_t*>(expert_offsets->data);
  p.tiles = static_cast<int32_t*>(tiles->data);
  p.num_pairs = n;
  p.num_experts = static_cast<int32_t>(num_experts);
  p.tile_m = tile_m;
  return MSGL_OK;
}

}  // namespace msgl
#endif /* !__CUDACC_RTC__ */

#endif /* MINISGL_MOE_CUH */
