/*
 * apply_penalties.cu: repetition, frequency and presence penalties applied on the
 * GPU to the logits rows of requests that have them (tensor.h:
 * msgl_apply_penalties_params), from the counters penalty_count.cu keeps per slot.
 * The arithmetic is the engine's (sampling::penalties) operation for operation,
 * each rounded to nearest (__fdiv_rn and friends: no fused multiply-add), so that
 * an f32 row penalised here equals the host path's bit for bit.
 *
 * Decomposition: grid = n * blocks_per_row, 1024 threads, one thread per logit; a
 * token the request never saw (counter 0, most of the vocabulary) is read and left.
 */
#include "minisgl/dtype.cuh"

namespace msgl {

constexpr int kApplyPenaltiesThreads = 1024;
constexpr int kCountMask = (1 << 30) - 1;

template <int DTYPE>
__device__ __forceinline__ void apply_penalties_impl(const msgl_apply_penalties_params& p) {
  using T = typename DType<DTYPE>::Storage;
  const long long i = blockIdx.x / p.blocks_per_row;
  const long long t = (blockIdx.x % p.blocks_per_row) * kApplyPenaltiesThreads + threadIdx.x;
  if (i >= p.n || t >= p.vocab) return;
  const int c = p.counts[static_cast<long long>(p.slots[i]) * p.vocab + t];
  if (c == 0) return;
  const float repetition = p.penalties[i * 3];
  const float frequency = p.penalties[i * 3 + 1];
  const float presence = p.penalties[i * 3 + 2];
  T* row = static_cast<T*>(p.logits) + static_cast<long long>(p.rows[i]) * p.row_stride;
  float v = DType<DTYPE>::to_f32(row[t]);
  if (repetition != 1.f) v = v > 0.f ? __fdiv_rn(v, repetition) : __fmul_rn(v, repetition);
  const int k = c & kCountMask;
  if (k > 0) v = __fsub_rn(v, __fadd_rn(__fmul_rn(frequency, __int2float_rn(k)), presence));
  row[t] = DType<DTYPE>::from_f32(v);
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance; launched from Rust with grid = n * blocks_per_row, block = 1024. */
extern "C" __global__ void __launch_bounds__(1024) msgl_apply_penalties_kernel(const msgl_apply_penalties_params p) {
  msgl::apply_penalties_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(1024) apply_penalties_kernel(const msgl_apply_penalties_params p) {
  apply_penalties_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_apply_penalties(const msgl_tensor* logits, const msgl_tensor* counts, const msgl_tensor* rows,
                                        const msgl_tensor* slots, const msgl_tensor* penalties, msgl_stream stream) {
  using namespace msgl;
  const char* op = "apply_penalties";
  const uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(logits, op, "logits", 2, floats));
  MSGL_TRY(expect_tensor(counts, op, "counts", 2, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(rows, op, "rows", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(slots, op, "slots", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(penalties, op, "penalties", 2, dtype_bit(MSGL_F32)));
  const int64_t n = rows->shape[0];
  MSGL_TRY(expect_dim(slots, op, "slots", 0, n));
  MSGL_TRY(expect_dim(penalties, op, "penalties", 0, n));
  MSGL_TRY(expect_dim(penalties, op, "penalties", 1, 3));
  MSGL_TRY(expect_dim(counts, op, "counts", 1, logits->shape[1]));
  MSGL_TRY(expect_rows(logits, op, "logits", dtype_size(logits->dtype)));
  MSGL_TRY(expect_contiguous(counts, op, "counts"));
  MSGL_TRY(expect_contiguous(rows, op, "rows"));
  MSGL_TRY(expect_contiguous(slots, op, "slots"));
  MSGL_TRY(expect_contiguous(penalties, op, "penalties"));
  if (counts->device != logits->device || rows->device != logits->device || slots->device != logits->device ||
      penalties->device != logits->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: every argument must be on the device of `logits`", op);
  const int64_t vocab = logits->shape[1];
  if (vocab < 1 || vocab > 0x7ffffffe)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `logits` has %lld columns", op, static_cast<long long>(vocab));
  const int64_t blocks_per_row = (vocab + kApplyPenaltiesThreads - 1) / kApplyPenaltiesThreads;
  if (n * blocks_per_row > 0x7fffffff)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %lld rows exceed the grid limit", op, static_cast<long long>(n));
  /* NOTE: the row and slot indices live on the device; the Rust op checked them on the host. */
  if (n == 0) return MSGL_OK;
  msgl_apply_penalties_params p{};
  p.logits = logits->data;
  p.counts = static_cast<const int32_t*>(counts->data);
  p.rows = static_cast<const int32_t*>(rows->data);
  p.slots = static_cast<const int32_t*>(slots->data);
  p.penalties = static_cast<const float*>(penalties->data);
  p.vocab = vocab;
  p.row_stride = logits->strides[0];
  p.n = n;
  p.blocks_per_row = blocks_per_row;
  const unsigned grid = static_cast<unsigned>(n * blocks_per_row);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (logits->dtype) {
#define MSGL_CASE(D) \
  case D: apply_penalties_kernel<D><<<grid, kApplyPenaltiesThreads, 0, s>>>(p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "apply_penalties: no AOT instance DTYPE=%d", logits->dtype);
  }
  return check_launch(op);
}
#endif
