/*
 * index.cu: embedding gather, out[i] = weight[ids[i] - vocab_start], with zero rows
 * for ids outside [vocab_start, vocab_start + num_rows) (the vocab-parallel shard of
 * a tensor-parallel embedding).
 *
 * Specialised on ROW_BYTES. Narrow rows take one warp each; wide rows are split
 * across WARPS_PER_ROW warps (a 4096 x bf16 row is 8 KiB: four warps of 2 KiB, four
 * 16-byte loads in flight per lane), so that small batches still spread over the
 * chip and every lane has several loads in flight.
 */
#include "minisgl/device.cuh"

namespace msgl {

constexpr int kIndexThreads = 256;

/* Warps that share one row: about one per 2 KiB, at most the whole block, and only
 * as many as split the row into equal chunks of whole copy units. */
__host__ __device__ constexpr int index_warps_per_row(int row_bytes) {
  int warps = row_bytes >= 16384 ? 8 : row_bytes >= 8192 ? 4 : row_bytes >= 4096 ? 2 : 1;
  while (warps > 1 && row_bytes % (warps * vec_bytes_for(row_bytes)) != 0) warps /= 2;
  return warps;
}

template <int ROW_BYTES>
__device__ __forceinline__ void index_impl(const msgl_index_params& p) {
  constexpr int WPR = index_warps_per_row(ROW_BYTES);
  constexpr int ROWS_PER_BLOCK = kIndexThreads / kWarpSize / WPR;
  constexpr int CHUNK = ROW_BYTES / WPR;  // bytes one warp copies
  const int warp = threadIdx.x / kWarpSize;
  const long long token = static_cast<long long>(blockIdx.x) * ROWS_PER_BLOCK + warp / WPR;
  if (token >= p.num_tokens) return;
  const int part = warp % WPR;
  const int lane = threadIdx.x % kWarpSize;
  const long long row = load_index(p.ids, p.index_is_64, token) - p.vocab_start;
  char* dst = static_cast<char*>(p.out) + token * ROW_BYTES + part * CHUNK;
  if (row < 0 || row >= p.num_rows) {
    zero_row<CHUNK, kWarpSize>(dst, lane);
    return;
  }
  const char* src = static_cast<const char*>(p.weight) + row * ROW_BYTES + part * CHUNK;
  copy_row<CHUNK, kWarpSize>(dst, src, lane);
}

/* Blocks for num_tokens rows (the Rust launcher computes the same). */
__host__ __device__ constexpr long long index_grid(long long num_tokens, int row_bytes) {
  return (num_tokens + (kIndexThreads / kWarpSize / index_warps_per_row(row_bytes)) - 1) /
         (kIndexThreads / kWarpSize / index_warps_per_row(row_bytes));
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 256 and grid = index_grid(num_tokens, ROW_BYTES). */
extern "C" __global__ void __launch_bounds__(256) msgl_index_kernel(const msgl_index_params p) {
  msgl::index_impl<MSGL_ROW_BYTES>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(ROW_BYTES) for each AOT instance */

namespace msgl {
template <int ROW_BYTES>
__global__ void __launch_bounds__(256) index_kernel(const msgl_index_params p) {
  index_impl<ROW_BYTES>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_index(const msgl_tensor* out, const msgl_tensor* weight, const msgl_tensor* ids,
                              int64_t vocab_start, msgl_stream stream) {
  using namespace msgl;
  const char* op = "index";
  MSGL_TRY(expect_tensor(out, op, "out", 2, kAnyDtype));
  MSGL_TRY(expect_tensor(weight, op, "weight", 2, kAnyDtype));
  MSGL_TRY(expect_tensor(ids, op, "ids", 1, kIndexDtypes));
  MSGL_TRY(expect_same(weight, "weight", out, "out", op));
  if (ids->device != out->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `ids` is on device %d but `out` is on device %d", op,
                     ids->device, out->device);
  const int64_t num_tokens = ids->shape[0];
  MSGL_TRY(expect_dim(out, op, "out", 0, num_tokens));
  MSGL_TRY(expect_dim(out, op, "out", 1, weight->shape[1]));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  MSGL_TRY(expect_contiguous(weight, op, "weight"));
  MSGL_TRY(expect_contiguous(ids, op, "ids"));
  const int64_t row_bytes = weight->shape[1] * dtype_size(weight->dtype);
  const int64_t align = vec_bytes_for(row_bytes);
  MSGL_TRY(expect_rows(out, op, "out", align));
  MSGL_TRY(expect_rows(weight, op, "weight", align));
  if (num_tokens == 0) return MSGL_OK;

  msgl_index_params p{};
  p.out = out->data;
  p.weight = weight->data;
  p.ids = ids->data;
  p.num_tokens = num_tokens;
  p.num_rows = weight->shape[0];
  p.vocab_start = vocab_start;
  p.index_is_64 = ids->dtype == MSGL_I64;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (row_bytes) {
#define MSGL_CASE(RB)                                                                          \
  case RB:                                                                                     \
    index_kernel<RB><<<static_cast<unsigned>(index_grid(num_tokens, RB)), kIndexThreads, 0, s>>>(p); \
    break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "index: no AOT instance ROW_BYTES=%lld", static_cast<long long>(row_bytes));
  }
  return check_launch(op);
}
#endif
