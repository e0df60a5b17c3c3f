/*
 * sampling.cu: one next token per row of logits, on the GPU, so that a decode
 * step returns token ids instead of a [batch, vocab] copy of the logits.
 *
 * Per row (params: temperature, top_k, top_p, min_p, u):
 *   - temperature <= 0 or top_k == 1: the argmax (first index on ties);
 *   - else, with p = softmax(logits / temperature), a token is kept when
 *       top-k: at least top_k tokens are >= it (ties at the boundary stay),
 *       top-p: the tokens >= it carry at least top_p of the mass (the smallest
 *              head of the ranking whose mass reaches top_p, ties kept),
 *       min-p: p >= min_p * max(p);
 *     the filters are independent and see the same p (SGLang's
 *     top_k_top_p_min_p sampling), so the most likely token always survives;
 *     then the token is drawn by inverse CDF in index order with the uniform
 *     number u in [0, 1) (the engine derives u from the request's seed and output
 *     index, so sampling is reproducible).
 *
 * Decomposition: one block of 1024 threads per row; every pass streams the row
 * with coalesced loads. The top-k and top-p thresholds are found by bisection over
 * the order-preserving integer image of the (raw) logits, 32 passes each (a
 * count for top-k, an exp-sum for top-p); the draw is a tiled block scan in index
 * order (each thread holding 4 consecutive values of a tile of 4096, the next
 * tile's loads in flight while one is scanned). No sort, no scratch memory;
 * kernel-runtime's CPU reference (cpu::sampling) runs the same algorithm (its
 * sums in another order: rows at a rounding boundary may draw a neighbour).
 */
#include "minisgl/dtype.cuh"

namespace msgl {

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / kWarpSize;
/* Values a thread holds per tile of the draw. */
constexpr int kSamplePer = 4;
constexpr long long kSampleTile = static_cast<long long>(kSampleThreads) * kSamplePer;

/* Orders floats as unsigned integers: a < b  <=>  key(a) < key(b) (NaN aside). */
__device__ __forceinline__ unsigned int sample_key(float v) {
  const unsigned int b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

template <int DTYPE>
__device__ __forceinline__ float sample_load(const typename DType<DTYPE>::Storage* x, long long i) {
  return DType<DTYPE>::to_f32(x[i]);
}

/* Sum over the block; every thread gets the total. */
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  float total = 0.f;
#pragma unroll 8
  for (int w = 0; w < kSampleWarps; ++w) total += scratch[w];
  return total;
}

/* Integer sum over the block; every thread gets the total. */
__device__ __forceinline__ long long block_count(long long v, long long* scratch) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  long long total = 0;
#pragma unroll 8
  for (int w = 0; w < kSampleWarps; ++w) total += scratch[w];
  return total;
}

template <int DTYPE>
__device__ void sample_impl(const msgl_sample_params& p) {
  using T = typename DType<DTYPE>::Storage;
  __shared__ float s_f[kSampleWarps];
  __shared__ long long s_l[kSampleWarps];
  __shared__ int s_i[kSampleWarps];
  const long long row = blockIdx.x;
  const T* x = static_cast<const T*>(p.logits) + row * p.row_stride;
  const float* prm = p.params + row * 5;
  const float temperature = prm[0];
  const long long top_k = static_cast<long long>(prm[1]);
  const float top_p = prm[2];
  const float min_p = prm[3];
  const float u = prm[4];
  const long long vocab = p.vocab;

  /* The argmax: the answer when greedy, the max otherwise. */
  float best = -__int_as_float(0x7f800000);
  int best_i = 0x7fffffff;
#pragma unroll 4
  for (long long i = threadIdx.x; i < vocab; i += kSampleThreads) {
    const float v = sample_load<DTYPE>(x, i);
    if (v > best) best = v, best_i = static_cast<int>(i);
  }
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (v > best || (v == best && i < best_i)) best = v, best_i = i;
  }
  if (threadIdx.x % kWarpSize == 0) s_f[threadIdx.x / kWarpSize] = best, s_i[threadIdx.x / kWarpSize] = best_i;
  __syncthreads();
  best = s_f[0];
  best_i = s_i[0];
  for (int w = 1; w < kSampleWarps; ++w)
    if (s_f[w] > best || (s_f[w] == best && s_i[w] < best_i)) best = s_f[w], best_i = s_i[w];
  if (best_i == 0x7fffffff) best_i = 0; /* an all-NaN row: token 0 */
  if (!(temperature > 0.f) || top_k == 1) {
    if (threadIdx.x == 0) p.out[row] = best_i;
    return;
  }
  const float inv_t = 1.f / temperature;
  const float m = best;

  /* top-k: the largest key t with count(key >= t) >= k. */
  unsigned int t_key = 0;
  if (top_k > 1 && top_k < vocab) {
    for (int bit = 31; bit >= 0; --bit) {
      const unsigned int cand = t_key | (1u << bit);
      long long c = 0;
      for (long long i = threadIdx.x; i < vocab; i += kSampleThreads) c += sample_key(sample_load<DTYPE>(x, i)) >= cand;
      if (block_count(c, s_l) >= top_k) t_key = cand;
    }
  }
  /* top-p over the full distribution: the largest key t whose head mass reaches top_p. */
  if (top_p < 1.f) {
    float z = 0.f;
    for (long long i = threadIdx.x; i < vocab; i += kSampleThreads) z += __expf((sample_load<DTYPE>(x, i) - m) * inv_t);
    const float target = top_p * block_sum(z, s_f);
    unsigned int t_p = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const unsigned int cand = t_p | (1u << bit);
      float s = 0.f;
      for (long long i = threadIdx.x; i < vocab; i += kSampleThreads) {
        const float v = sample_load<DTYPE>(x, i);
        if (sample_key(v) >= cand) s += __expf((v - m) * inv_t);
      }
      if (block_sum(s, s_f) >= target) t_p = cand;
    }
    t_key = t_key > t_p ? t_key : t_p;
  }
  /* min-p, in the scaled log domain: (v - m) / T >= log(min_p). */
  const float min_scaled = min_p > 0.f ? __logf(min_p) : -__int_as_float(0x7f800000);

  /* The kept mass, then the draw by inverse CDF in index order, tile by tile. */
  float z = 0.f;
#pragma unroll 4
  for (long long i = threadIdx.x; i < vocab; i += kSampleThreads) {
    const float v = sample_load<DTYPE>(x, i);
    const float s = (v - m) * inv_t;
    if (sample_key(v) >= t_key && s >= min_scaled) z += __expf(s);
  }
  const float target = u * block_sum(z, s_f);
  float running = 0.f;
  int chosen = -1;
  int last_kept = best_i;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  /* Tiles of kSamplePer consecutive values a thread (index order: thread t holds
   * [base + t * kSamplePer, base + (t + 1) * kSamplePer)), the next tile's loads
   * issued before this one is scanned, so the scan's barriers do not wait on
   * memory one value at a time. */
  float vals[kSamplePer], next[kSamplePer];
  auto load_tile = [&](float (&dst)[kSamplePer], long long base) {
#pragma unroll
    for (int e = 0; e < kSamplePer; ++e) {
      const long long i = base + static_cast<long long>(threadIdx.x) * kSamplePer + e;
      dst[e] = i < vocab ? sample_load<DTYPE>(x, i) : 0.f;
    }
  };
  load_tile(vals, 0);
  for (long long base = 0; base < vocab; base += kSampleTile) {
    if (base + kSampleTile < vocab) load_tile(next, base + kSampleTile);
    const long long first_i = base + static_cast<long long>(threadIdx.x) * kSamplePer;
    float w[kSamplePer];
    float local = 0.f;
#pragma unroll
    for (int e = 0; e < kSamplePer; ++e) {
      w[e] = 0.f;
      const long long i = first_i + e;
      if (i < vocab) {
        const float v = vals[e];
        const float sc = (v - m) * inv_t;
        if (sample_key(v) >= t_key && sc >= min_scaled) {
          w[e] = __expf(sc);
          last_kept = static_cast<int>(i); /* per thread; the block max is taken below */
        }
      }
      local += w[e];
    }
    /* Scan of the threads' sums over the block: the exclusive prefix of this
     * thread inside the tile, and the tile's total. */
    float incl = local;
#pragma unroll
    for (int o = 1; o < kWarpSize; o *= 2) {
      const float n = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += n;
    }
    float excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.f;
    __syncthreads();
    if (lane == kWarpSize - 1) s_f[warp] = incl;
    __syncthreads();
    float before = 0.f, tile_total = 0.f;
    for (int k = 0; k < kSampleWarps; ++k) {
      if (k < warp) before += s_f[k];
      tile_total += s_f[k];
    }
    if (running + tile_total > target) {
      /* The draw falls in this tile: the first index whose prefix passes target. */
      float acc = running + (before + excl);
      int mine = 0x7fffffff;
#pragma unroll
      for (int e = 0; e < kSamplePer; ++e) {
        acc += w[e];
        if (mine == 0x7fffffff && w[e] > 0.f && acc > target) mine = static_cast<int>(first_i + e);
      }
      int first = mine;
#pragma unroll
      for (int o = kWarpSize / 2; o >= 1; o /= 2) {
        const int other = __shfl_xor_sync(0xffffffffu, first, o);
        first = other < first ? other : first;
      }
      __syncthreads();
      if (lane == 0) s_i[warp] = first;
      __syncthreads();
      int found = 0x7fffffff;
      for (int k = 0; k < kSampleWarps; ++k) found = s_i[k] < found ? s_i[k] : found;
      if (found != 0x7fffffff) {
        chosen = found;
        break;
      }
    }
    running += tile_total;
#pragma unroll
    for (int e = 0; e < kSamplePer; ++e) vals[e] = next[e];
  }
  if (chosen < 0) {
    /* Rounding left the target past the last kept token: take that token. */
#pragma unroll
    for (int o = kWarpSize / 2; o >= 1; o /= 2) {
      const int other = __shfl_xor_sync(0xffffffffu, last_kept, o);
      last_kept = other > last_kept ? other : last_kept;
    }
    __syncthreads();
    if (lane == 0) s_i[warp] = last_kept;
    __syncthreads();
    chosen = s_i[0];
    for (int k = 1; k < kSampleWarps; ++k) chosen = s_i[k] > chosen ? s_i[k] : chosen;
  }
  if (threadIdx.x == 0) p.out[row] = chosen;
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * grid = rows, block = 1024. */
extern "C" __global__ void __launch_bounds__(1024) msgl_sample_kernel(const msgl_sample_params p) {
  msgl::sample_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(1024) sample_kernel(const msgl_sample_params p) {
  sample_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_sample(const msgl_tensor* logits, const msgl_tensor* params, const msgl_tensor* out,
                               msgl_stream stream) {
  using namespace msgl;
  const char* op = "sample";
  const uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(logits, op, "logits", 2, floats));
  MSGL_TRY(expect_tensor(params, op, "params", 2, dtype_bit(MSGL_F32)));
  MSGL_TRY(expect_tensor(out, op, "out", 1, dtype_bit(MSGL_I32)));
  const int64_t rows = logits->shape[0];
  MSGL_TRY(expect_dim(params, op, "params", 0, rows));
  MSGL_TRY(expect_dim(params, op, "params", 1, 5));
  MSGL_TRY(expect_dim(out, op, "out", 0, rows));
  MSGL_TRY(expect_rows(logits, op, "logits", dtype_size(logits->dtype)));
  MSGL_TRY(expect_contiguous(params, op, "params"));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  if (params->device != logits->device || out->device != logits->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: arguments `logits`, `params` and `out` must be on one device", op);
  if (logits->shape[1] < 1 || logits->shape[1] > 0x7ffffffe)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `logits` has %lld columns", op,
                     static_cast<long long>(logits->shape[1]));
  if (rows == 0) return MSGL_OK;
  msgl_sample_params p{};
  p.logits = logits->data;
  p.params = static_cast<const float*>(params->data);
  p.out = static_cast<int32_t*>(out->data);
  p.vocab = logits->shape[1];
  p.row_stride = logits->strides[0];
  p.num_rows = rows;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (logits->dtype) {
#define MSGL_CASE(D) \
  case D: sample_kernel<D><<<static_cast<unsigned>(rows), kSampleThreads, 0, s>>>(p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "sample: no AOT instance DTYPE=%d", logits->dtype);
  }
  return check_launch(op);
}
#endif
