/*
 * argmax.cu: the index of the largest value of each row (the first one on ties),
 * as int32: greedy sampling over a vocabulary of up to a few hundred thousand.
 *
 * Decomposition: stage 0 gives each block of 512 threads `split_len` elements of
 * one row (grid = rows * num_splits); a thread scans its strided share with 16-byte
 * loads, keeping a (value, index) pair, and the block reduces the pairs with warp
 * shuffles and one shared-memory step. With one split per row the block writes the
 * answer; otherwise it writes a partial pair and stage 1 (one warp per row) reduces
 * the num_splits partials. The host picks num_splits so that a batch of one still
 * spreads a 256k vocabulary over many SMs. Pairs compare by value, then by lower
 * index, so the result is the first maximum whatever the order of the reduction.
 */
#include "minisgl/dtype.cuh"

namespace msgl {

constexpr int kArgmaxThreads = 512;

/* Whether (v, i) beats (best, best_i): larger value, or equal value and lower index. */
__device__ __forceinline__ bool argmax_better(float v, int i, float best, int best_i) {
  return v > best || (v == best && i < best_i);
}

__device__ __forceinline__ void argmax_warp_reduce(float& best, int& best_i) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (argmax_better(v, i, best, best_i)) best = v, best_i = i;
  }
}

constexpr int kNoIndex = 0x7fffffff;

template <int DTYPE>
__device__ __forceinline__ void argmax_scan(const msgl_argmax_params& p) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int E = Vec16<DTYPE>::kElems;
  __shared__ float s_best[kArgmaxThreads / kWarpSize];
  __shared__ int s_index[kArgmaxThreads / kWarpSize];
  const long long row = blockIdx.x / p.num_splits;
  const int split = blockIdx.x % p.num_splits;
  const T* x = static_cast<const T*>(p.x) + row * p.row_stride;
  const long long begin = static_cast<long long>(split) * p.split_len;
  const long long end = begin + p.split_len < p.vocab ? begin + p.split_len : p.vocab;
  float best = -__int_as_float(0x7f800000);  // -inf
  int best_i = kNoIndex;
  if (p.vectorized) {
    /* begin is a multiple of 8, so vectors start aligned; the tail goes one by one. */
    const long long vec_end = begin + (end - begin) / E * E;
    for (long long c = begin + static_cast<long long>(threadIdx.x) * E; c < vec_end; c += kArgmaxThreads * E) {
      Vec16<DTYPE> v;
      v.load(x + c);
#pragma unroll
      for (int e = 0; e < E; ++e)
        if (argmax_better(v.v[e], static_cast<int>(c + e), best, best_i)) best = v.v[e], best_i = static_cast<int>(c + e);
    }
    for (long long c = vec_end + threadIdx.x; c < end; c += kArgmaxThreads) {
      const float v = DType<DTYPE>::to_f32(x[c]);
      if (argmax_better(v, static_cast<int>(c), best, best_i)) best = v, best_i = static_cast<int>(c);
    }
  } else {
    for (long long c = begin + threadIdx.x; c < end; c += kArgmaxThreads) {
      const float v = DType<DTYPE>::to_f32(x[c]);
      if (argmax_better(v, static_cast<int>(c), best, best_i)) best = v, best_i = static_cast<int>(c);
    }
  }
  argmax_warp_reduce(best, best_i);
  const int warp = threadIdx.x / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) s_best[warp] = best, s_index[warp] = best_i;
  __syncthreads();
  if (warp != 0) return;
  const int lane = threadIdx.x % kWarpSize;
  best = lane < kArgmaxThreads / kWarpSize ? s_best[lane] : -__int_as_float(0x7f800000);
  best_i = lane < kArgmaxThreads / kWarpSize ? s_index[lane] : kNoIndex;
  argmax_warp_reduce(best, best_i);
  if (lane != 0) return;
  if (p.num_splits == 1) {
    /* A row of NaNs has no maximum: answer 0 rather than an invalid index. */
    p.out[row] = best_i == kNoIndex ? 0 : best_i;
  } else {
    p.partial_value[row * p.num_splits + split] = best;
    p.partial_index[row * p.num_splits + split] = best_i;
  }
}

__device__ __forceinline__ void argmax_reduce_partials(const msgl_argmax_params& p) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  if (row >= p.rows) return;
  const int lane = threadIdx.x % kWarpSize;
  float best = -__int_as_float(0x7f800000);
  int best_i = kNoIndex;
  for (int s = lane; s < p.num_splits; s += kWarpSize) {
    const float v = p.partial_value[row * p.num_splits + s];
    const int i = p.partial_index[row * p.num_splits + s];
    if (argmax_better(v, i, best, best_i)) best = v, best_i = i;
  }
  argmax_warp_reduce(best, best_i);
  if (lane == 0) p.out[row] = best_i == kNoIndex ? 0 : best_i;
}

template <int DTYPE>
__device__ __forceinline__ void argmax_impl(const msgl_argmax_params& p) {
  if (p.stage == 0) {
    argmax_scan<DTYPE>(p);
  } else {
    argmax_reduce_partials(p);
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 512: stage 0 with grid = rows * num_splits, stage 1 with grid = ceil(rows / 16). */
extern "C" __global__ void __launch_bounds__(512) msgl_argmax_kernel(const msgl_argmax_params p) {
  msgl::argmax_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(512) argmax_kernel(const msgl_argmax_params p) {
  argmax_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_argmax(const msgl_tensor* out, const msgl_tensor* x, const msgl_tensor* partial_value,
                               const msgl_tensor* partial_index, int32_t num_splits, int64_t split_len,
                               int32_t vectorized, msgl_stream stream) {
  using namespace msgl;
  const char* op = "argmax";
  constexpr uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(out, op, "out", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(x, op, "x", 2, floats));
  if (out->device != x->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `out` is on device %d but `x` is on device %d", op,
                     out->device, x->device);
  const int64_t rows = x->shape[0];
  const int64_t vocab = x->shape[1];
  MSGL_TRY(expect_dim(out, op, "out", 0, rows));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  MSGL_TRY(expect_rows(x, op, "x", vectorized ? 16 : dtype_size(x->dtype)));
  if (vocab <= 0 || vocab > 0x7fffffff)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: rows of %lld elements are not supported", op, static_cast<long long>(vocab));
  if (num_splits < 1 || split_len < 1 || split_len % 8 != 0 || (num_splits - 1) * split_len >= vocab ||
      num_splits * split_len < vocab)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %d splits of %lld elements do not cover rows of %lld", op, num_splits,
                     static_cast<long long>(split_len), static_cast<long long>(vocab));
  if (num_splits > 1) {
    MSGL_TRY(expect_tensor(partial_value, op, "partial_value", 2, dtype_bit(MSGL_F32)));
    MSGL_TRY(expect_tensor(partial_index, op, "partial_index", 2, dtype_bit(MSGL_I32)));
    MSGL_TRY(expect_dim(partial_value, op, "partial_value", 0, rows));
    MSGL_TRY(expect_dim(partial_value, op, "partial_value", 1, num_splits));
    MSGL_TRY(expect_dim(partial_index, op, "partial_index", 0, rows));
    MSGL_TRY(expect_dim(partial_index, op, "partial_index", 1, num_splits));
    MSGL_TRY(expect_contiguous(partial_value, op, "partial_value"));
    MSGL_TRY(expect_contiguous(partial_index, op, "partial_index"));
  }
  if (rows == 0) return MSGL_OK;
  if (rows * num_splits > 0x7fffffff)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %lld blocks exceed the grid limit", op, static_cast<long long>(rows * num_splits));

  msgl_argmax_params p{};
  p.x = x->data;
  p.out = static_cast<int32_t*>(out->data);
  p.partial_value = num_splits > 1 ? static_cast<float*>(partial_value->data) : nullptr;
  p.partial_index = num_splits > 1 ? static_cast<int32_t*>(partial_index->data) : nullptr;
  p.rows = rows;
  p.vocab = vocab;
  p.row_stride = x->strides[0];
  p.split_len = split_len;
  p.num_splits = num_splits;
  p.vectorized = vectorized;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned reduce_grid = static_cast<unsigned>((rows + kArgmaxThreads / kWarpSize - 1) / (kArgmaxThreads / kWarpSize));
  msgl_argmax_params p1 = p;
  p1.stage = 1;
  switch (x->dtype) {
#define MSGL_CASE(D)                                                                              \
  case D:                                                                                         \
    argmax_kernel<D><<<static_cast<unsigned>(rows * num_splits), kArgmaxThreads, 0, s>>>(p);       \
    if (num_splits > 1) argmax_kernel<D><<<reduce_grid, kArgmaxThreads, 0, s>>>(p1);              \
    break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d", op, x->dtype);
  }
  return check_launch(op);
}
#endif
