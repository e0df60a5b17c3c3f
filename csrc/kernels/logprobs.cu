/*
 * logprobs.cu: log probabilities of the sampled tokens and the most likely
 * alternatives, on the GPU (tensor.h: msgl_logprobs_params), so that a request
 * asking for them keeps its step on the device. They are the model's raw
 * distribution: log_softmax of the logits row before penalties, temperature and
 * masks (the engine's sampling::logprobs); the sampled id is read from the device.
 *
 * Decomposition: one block of 512 threads per row, two passes over the row.
 * Pass 1: the row maximum, and in every thread a sorted list of its top_n best
 * (value, id) pairs (a thread visits ids in increasing order, so a later equal
 * value never displaces an earlier one: lower id first on ties). Pass 2: the sum
 * of exp(v - max). Then top_n rounds of a block-wide argmax over the threads' list
 * heads, each round's winner advancing its head. Values compare by their total
 * order (-0 below +0, as the CPU reference's total_cmp); NaN counts as -inf.
 */
#include "minisgl/dtype.cuh"

namespace msgl {

constexpr int kLogprobsThreads = 512;
constexpr int kLogprobsWarps = kLogprobsThreads / kWarpSize;
constexpr int kMaxTopLogprobs = 20;

/* Orders floats as unsigned integers: a < b  <=>  key(a) < key(b) (NaN aside). */
__device__ __forceinline__ unsigned int logprob_key(float v) {
  const unsigned int b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float logprob_clean(float v) { return isnan(v) ? -__int_as_float(0x7f800000) : v; }

/* A candidate: the key of its value (0: none) and its id. Better = larger key,
 * then smaller id. */
struct LogprobCandidate {
  unsigned int key;
  int id;
};

__device__ __forceinline__ bool logprob_better(const LogprobCandidate& a, const LogprobCandidate& b) {
  return a.key > b.key || (a.key == b.key && a.id < b.id);
}

template <int DTYPE>
__device__ __forceinline__ void logprobs_impl(const msgl_logprobs_params& p) {
  using T = typename DType<DTYPE>::Storage;
  __shared__ float reduce_f[kLogprobsWarps];
  __shared__ LogprobCandidate reduce_c[kLogprobsWarps];
  const long long i = blockIdx.x;
  if (i >= p.n) return;
  const int row_idx = p.rows[i];
  const T* row = static_cast<const T*>(p.logits) + static_cast<long long>(row_idx) * p.row_stride;
  const int top_n = static_cast<int>(p.top_n);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  // Pass 1: maximum and this thread's top_n list, best first.
  LogprobCandidate best[kMaxTopLogprobs];
  int kept = 0;
  float m = -__int_as_float(0x7f800000);
  for (long long t = threadIdx.x; t < p.vocab; t += kLogprobsThreads) {
    const float v = logprob_clean(DType<DTYPE>::to_f32(row[t]));
    m = fmaxf(m, v);
    if (top_n == 0) continue;
    const LogprobCandidate c{logprob_key(v), static_cast<int>(t)};
    if (kept == top_n && !logprob_better(c, best[kept - 1])) continue;
    int j = kept < top_n ? kept++ : top_n - 1;
    while (j > 0 && logprob_better(c, best[j - 1])) {
      best[j] = best[j - 1];
      --j;
    }
    best[j] = c;
  }
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) reduce_f[warp] = m;
  __syncthreads();
  m = reduce_f[0];
#pragma unroll
  for (int w = 1; w < kLogprobsWarps; ++w) m = fmaxf(m, reduce_f[w]);
  __syncthreads();
  const bool finite_max = isfinite(m);

  // Pass 2: sum of exp(v - max).
  float s = 0.f;
  if (finite_max) {
    for (long long t = threadIdx.x; t < p.vocab; t += kLogprobsThreads) {
      const float v = logprob_clean(DType<DTYPE>::to_f32(row[t]));
      s += expf(v - m);
    }
  }
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) reduce_f[warp] = s;
  __syncthreads();
  s = 0.f;
#pragma unroll
  for (int w = 0; w < kLogprobsWarps; ++w) s += reduce_f[w];
  const float log_sum = logf(s);
  auto logprob_of = [&](float v) {
    return finite_max && isfinite(v) ? (v - m) - log_sum : -__int_as_float(0x7f800000);
  };

  int* out = p.out + i * p.out_stride;
  if (threadIdx.x == 0) {
    const int token = p.sampled[row_idx];
    const float v = token >= 0 && token < p.vocab ? logprob_clean(DType<DTYPE>::to_f32(row[token]))
                                                  : -__int_as_float(0x7f800000);
    out[0] = token;
    out[1] = __float_as_int(logprob_of(v));
  }

  // Merge: top_n rounds of a block argmax over the list heads.
  int head = 0;
  for (int r = 0; r < top_n; ++r) {
    LogprobCandidate c = head < kept ? best[head] : LogprobCandidate{0u, 0x7fffffff};
#pragma unroll
    for (int o = kWarpSize / 2; o >= 1; o /= 2) {
      const LogprobCandidate other{__shfl_xor_sync(0xffffffffu, c.key, o), __shfl_xor_sync(0xffffffffu, c.id, o)};
      if (logprob_better(other, c)) c = other;
    }
    __syncthreads();  // the previous round's readers are done with reduce_c
    if (lane == 0) reduce_c[warp] = c;
    __syncthreads();
    LogprobCandidate win = reduce_c[0];
#pragma unroll
    for (int w = 1; w < kLogprobsWarps; ++w)
      if (logprob_better(reduce_c[w], win)) win = reduce_c[w];
    if (head < kept && best[head].id == win.id && best[head].key == win.key) ++head;
    if (threadIdx.x == 0) {
      // Back from the key to the value: the inverse of logprob_key.
      const unsigned int bits = (win.key & 0x80000000u) ? (win.key & 0x7fffffffu) : ~win.key;
      out[2 + 2 * r] = win.key == 0u ? 0x7fffffff : win.id;
      out[3 + 2 * r] = __float_as_int(win.key == 0u ? -__int_as_float(0x7f800000) : logprob_of(__uint_as_float(bits)));
    }
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance; launched from Rust with grid = n, block = 512. */
extern "C" __global__ void __launch_bounds__(512) msgl_logprobs_kernel(const msgl_logprobs_params p) {
  msgl::logprobs_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(512) logprobs_kernel(const msgl_logprobs_params p) {
  logprobs_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_logprobs(const msgl_tensor* logits, const msgl_tensor* rows, const msgl_tensor* sampled,
                                 const msgl_tensor* out, int64_t top_n, msgl_stream stream) {
  using namespace msgl;
  const char* op = "logprobs";
  const uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(logits, op, "logits", 2, floats));
  MSGL_TRY(expect_tensor(rows, op, "rows", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(sampled, op, "sampled", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(out, op, "out", 2, dtype_bit(MSGL_I32)));
  const int64_t n = rows->shape[0];
  MSGL_TRY(expect_dim(out, op, "out", 0, n));
  MSGL_TRY(expect_dim(sampled, op, "sampled", 0, logits->shape[0]));
  MSGL_TRY(expect_rows(logits, op, "logits", dtype_size(logits->dtype)));
  MSGL_TRY(expect_contiguous(rows, op, "rows"));
  MSGL_TRY(expect_contiguous(sampled, op, "sampled"));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  if (rows->device != logits->device || sampled->device != logits->device || out->device != logits->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: every argument must be on the device of `logits`", op);
  if (top_n < 0 || top_n > kMaxTopLogprobs)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: top_n %lld is outside 0..=%d", op, static_cast<long long>(top_n),
                     kMaxTopLogprobs);
  if (out->shape[1] < 2 + 2 * top_n)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `out` has %lld columns, %lld are needed", op,
                     static_cast<long long>(out->shape[1]), static_cast<long long>(2 + 2 * top_n));
  const int64_t vocab = logits->shape[1];
  if (vocab < 1 || vocab > 0x7ffffffe)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `logits` has %lld columns", op, static_cast<long long>(vocab));
  if (n > 0x7fffffff) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %lld rows exceed the grid limit", op, static_cast<long long>(n));
  /* NOTE: the row indices live on the device; the Rust op checked them on the host. */
  if (n == 0) return MSGL_OK;
  msgl_logprobs_params p{};
  p.logits = logits->data;
  p.rows = static_cast<const int32_t*>(rows->data);
  p.sampled = static_cast<const int32_t*>(sampled->data);
  p.out = static_cast<int32_t*>(out->data);
  p.vocab = vocab;
  p.row_stride = logits->strides[0];
  p.n = n;
  p.top_n = top_n;
  p.out_stride = out->shape[1];
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (logits->dtype) {
#define MSGL_CASE(D) \
  case D: logprobs_kernel<D><<<static_cast<unsigned>(n), kLogprobsThreads, 0, s>>>(p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "logprobs: no AOT instance DTYPE=%d", logits->dtype);
  }
  return check_launch(op);
}
#endif
