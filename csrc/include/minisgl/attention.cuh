/*
 * minisgl/attention.cuh: what the attention kernels share: the log2-domain math
 * helpers and the combine phase that merges the splits of split-KV attention.
 *
 * Both attention families (attention.cu: the FlashAttention-2 tile kernel for
 * prefill and mixed steps; decode_attention.cu: the decode kernel) write split
 * partials in one layout, so one combine serves both:
 *   o_partial[(row * max_splits + split) * HEAD_DIM + d]  normalised f32 output
 *   lse_partial[row * max_splits + split]                 log2-sum-exp (-inf: empty)
 * with row = token * num_q_heads + head, and a sequence of kv_len keys having
 * ceil(kv_len / chunk) splits (one when kv_len <= chunk, written to `out`
 * directly), chunk = attention_row_chunk(kv_len, kv_chunk, max_splits).
 *
 * Device code only and no system headers (NVRTC).
 */
#ifndef MINISGL_ATTENTION_CUH
#define MINISGL_ATTENTION_CUH

#include "minisgl/dtype.cuh"

namespace msgl {

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* -infinity (no <cmath> or builtin constant under NVRTC). */
__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

/* Splits of a sequence with kv_len keys. */
__device__ __forceinline__ int attention_num_splits(int kv_len, int kv_chunk) {
  return kv_len > kv_chunk ? (kv_len + kv_chunk - 1) / kv_chunk : 1;
}

/* Keys per split of a sequence of kv_len keys. A plan with kv_chunk > 0 fixes it
 * for the batch (the host planned it from the batch's lengths); kv_chunk = 0 is the
 * fixed-split plan of CUDA graphs, whose lengths change after capture: each
 * sequence is cut into at most max_splits equal chunks, in multiples of 64 keys
 * and no fewer than min_chunk (0: 128; the host passes DecodeTuning::graph_chunk_min,
 * 64 by default). */
__device__ __forceinline__ int attention_row_chunk(int kv_len, int kv_chunk, int max_splits, int min_chunk) {
  if (kv_chunk > 0) return kv_chunk;
  const int even = (kv_len + max_splits - 1) / max_splits;
  const int rounded = (even + 63) / 64 * 64;
  const int least = min_chunk > 0 ? min_chunk : 128;
  return rounded > least ? rounded : least;
}

/* An f32 that other blocks of this grid wrote (split partials): read from L2, so
 * that no stale L1 line of an earlier kernel is used. */
__device__ __forceinline__ float load_f32_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

/* Merges the num_splits (> 1) split partials of one (token, head) row into `out`,
 * with the warp's 32 lanes (lane = this thread's), in split order: what the
 * combine phase does per row, and what the decode kernel's last block of a
 * (sequence, kv head) does in its place (so both give the same bits). */
template <int DTYPE, int HEAD_DIM>
__device__ __forceinline__ void attention_combine_row(const msgl_attention_params& p, long long row, int num_splits,
                                                      int lane) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int PER_LANE = HEAD_DIM / kWarpSize;
  const float* lse = p.lse_partial + row * p.max_splits;
  float max_lse = neg_inf();
  for (int s = 0; s < num_splits; ++s) max_lse = fmaxf(max_lse, load_f32_cg(lse + s));
  float acc[PER_LANE];
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.f;
  float total = 0.f;
  for (int s = 0; s < num_splits; ++s) {
    const float ls = load_f32_cg(lse + s);
    const float w = ls == neg_inf() ? 0.f : fast_exp2(ls - max_lse);
    total += w;
    const float* po = p.o_partial + (row * p.max_splits + s) * HEAD_DIM;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) acc[i] += w * load_f32_cg(po + i * kWarpSize + lane);
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  T* out = static_cast<T*>(p.out) + row * HEAD_DIM;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) out[i * kWarpSize + lane] = DType<DTYPE>::from_f32(acc[i] * inv);
}

/* The combine phase: merges the splits of one (token, head) row per warp (block =
 * 32 * warps threads, grid = ceil(num_tokens * num_q_heads / warps)). Rows of
 * sequences with one split were written by the attention phase and are skipped. */
template <int DTYPE, int HEAD_DIM>
__device__ __forceinline__ void attention_combine(const msgl_attention_params& p) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= p.num_tokens * p.num_q_heads) return;
  const int lane = threadIdx.x % kWarpSize;
  const int token = static_cast<int>(row / p.num_q_heads);
  /* The sequence of `token`: the last s with q_indptr[s] <= token. */
  int lo = 0, hi = p.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.q_indptr[mid] <= token) lo = mid; else hi = mid - 1;
  }
  const int kv_len = p.kv_lens[lo];
  const int num_splits = attention_num_splits(kv_len, attention_row_chunk(kv_len, p.kv_chunk, p.max_splits, p.min_chunk));
  if (num_splits <= 1) return;
  attention_combine_row<DTYPE, HEAD_DIM>(p, row, num_splits, lane);
}

}  // namespace msgl

#endif /* MINISGL_ATTENTION_CUH */
