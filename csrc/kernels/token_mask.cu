/*
 * token_mask.cu: constrained decoding's token masks applied to logits. For each
 * masked row i, logits[rows[i], t] = -inf where bit t % 32 of mask word
 * mask[i, t / 32] is clear (tokens past the mask's words are disallowed too);
 * allowed logits are left as they are. Rows not named in `rows` are not touched,
 * so a batch pays only for its rows that have a grammar.
 *
 * Decomposition: grid = num_masked * blocks_per_row (blocks_per_row = ceil(vocab /
 * 1024)), 1024 threads, one thread per logit: the 32 threads of a warp read one mask
 * word (one broadcast load) and write 32 consecutive logits (coalesced).
 */
#include "minisgl/dtype.cuh"

namespace msgl {

constexpr int kTokenMaskThreads = 1024;

template <int DTYPE>
__device__ __forceinline__ void token_mask_impl(const msgl_token_mask_params& p) {
  using T = typename DType<DTYPE>::Storage;
  const long long i = blockIdx.x / p.blocks_per_row;
  const long long t = (blockIdx.x % p.blocks_per_row) * kTokenMaskThreads + threadIdx.x;
  if (i >= p.num_masked || t >= p.vocab) return;
  const long long w = t / 32;
  const unsigned word = w < p.words_per_row ? p.mask[i * p.words_per_row + w] : 0u;
  if ((word >> (t % 32)) & 1u) return;
  T* row = static_cast<T*>(p.logits) + static_cast<long long>(p.rows[i]) * p.row_stride;
  row[t] = DType<DTYPE>::from_f32(-__int_as_float(0x7f800000));  // -inf
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * grid = num_masked * blocks_per_row, block = 1024. */
extern "C" __global__ void __launch_bounds__(1024) msgl_token_mask_kernel(const msgl_token_mask_params p) {
  msgl::token_mask_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(1024) token_mask_kernel(const msgl_token_mask_params p) {
  token_mask_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_token_mask(const msgl_tensor* logits, const msgl_tensor* mask, const msgl_tensor* rows,
                                   msgl_stream stream) {
  using namespace msgl;
  const char* op = "token_mask";
  const uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(logits, op, "logits", 2, floats));
  MSGL_TRY(expect_tensor(mask, op, "mask", 2, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(rows, op, "rows", 1, dtype_bit(MSGL_I32)));
  const int64_t num_masked = mask->shape[0];
  MSGL_TRY(expect_dim(rows, op, "rows", 0, num_masked));
  MSGL_TRY(expect_rows(logits, op, "logits", dtype_size(logits->dtype)));
  MSGL_TRY(expect_contiguous(mask, op, "mask"));
  MSGL_TRY(expect_contiguous(rows, op, "rows"));
  if (mask->device != logits->device || rows->device != logits->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: arguments `logits`, `mask` and `rows` must be on one device", op);
  const int64_t vocab = logits->shape[1];
  const int64_t blocks_per_row = (vocab + kTokenMaskThreads - 1) / kTokenMaskThreads;
  if (vocab < 1 || vocab > 0x7ffffffe)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `logits` has %lld columns", op, static_cast<long long>(vocab));
  if (num_masked * blocks_per_row > 0x7fffffff)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %lld masked rows exceed the grid limit", op,
                     static_cast<long long>(num_masked));
  /* NOTE: the row indices live on the device; the Rust op checked them on the host. */
  if (num_masked == 0) return MSGL_OK;
  msgl_token_mask_params p{};
  p.logits = logits->data;
  p.mask = static_cast<const uint32_t*>(mask->data);
  p.rows = static_cast<const int32_t*>(rows->data);
  p.vocab = vocab;
  p.row_stride = logits->strides[0];
  p.words_per_row = mask->shape[1];
  p.num_masked = num_masked;
  p.blocks_per_row = blocks_per_row;
  const unsigned grid = static_cast<unsigned>(num_masked * blocks_per_row);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (logits->dtype) {
#define MSGL_CASE(D) \
  case D: token_mask_kernel<D><<<grid, kTokenMaskThreads, 0, s>>>(p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "token_mask: no AOT instance DTYPE=%d", logits->dtype);
  }
  return check_launch(op);
}
#endif
