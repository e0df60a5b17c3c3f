/*
 * store.cu: scatter the new K and V rows of a batch into the paged KV caches.
 *
 *   k_cache[indices[i]] = k[i]; v_cache[indices[i]] = v[i]
 *
 * One warp per token writes both its K and its V row, with 16-byte vector copies
 * (all loads issued before the stores, so each lane keeps 2 * ROW_BYTES / 512
 * requests in flight). The kernel is specialised on ROW_BYTES (kv heads x head dim
 * x element size) so that the copy loop unrolls completely; the reference
 * behaviour is mini-sglang's store kernel. Slot indices outside the cache are
 * skipped rather than written, so a bad index cannot corrupt other memory.
 */
#include "minisgl/device.cuh"

namespace msgl {

constexpr int kStoreWarpsPerBlock = 4;

template <int ROW_BYTES>
__device__ __forceinline__ void store_kv_impl(const msgl_store_params& p) {
  const long long token = static_cast<long long>(blockIdx.x) * kStoreWarpsPerBlock + threadIdx.x / kWarpSize;
  if (token >= p.num_tokens) return;
  const int lane = threadIdx.x % kWarpSize;
  const long long slot = load_index(p.indices, p.index_is_64, token);
  if (slot < 0 || slot >= p.num_slots) return;
  const char* k_src = static_cast<const char*>(p.k) + token * p.k_row_stride;
  const char* v_src = static_cast<const char*>(p.v) + token * p.v_row_stride;
  char* k_dst = static_cast<char*>(p.k_cache) + slot * ROW_BYTES;
  char* v_dst = static_cast<char*>(p.v_cache) + slot * ROW_BYTES;
  copy_row<ROW_BYTES, kWarpSize>(k_dst, k_src, lane);
  copy_row<ROW_BYTES, kWarpSize>(v_dst, v_src, lane);
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * grid = ceil(num_tokens / 4), block = 128. */
extern "C" __global__ void __launch_bounds__(128) msgl_store_kv_kernel(const msgl_store_params p) {
  msgl::store_kv_impl<MSGL_ROW_BYTES>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(ROW_BYTES) for each AOT instance */

namespace msgl {
template <int ROW_BYTES>
__global__ void __launch_bounds__(128) store_kv_kernel(const msgl_store_params p) {
  store_kv_impl<ROW_BYTES>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_store_kv(const msgl_tensor* k_cache, const msgl_tensor* v_cache, const msgl_tensor* indices,
                                 const msgl_tensor* k, const msgl_tensor* v, msgl_stream stream) {
  using namespace msgl;
  const char* op = "store_kv";
  MSGL_TRY(expect_tensor(k_cache, op, "k_cache", 2, kAnyDtype));
  MSGL_TRY(expect_tensor(v_cache, op, "v_cache", 2, kAnyDtype));
  MSGL_TRY(expect_tensor(indices, op, "indices", 1, kIndexDtypes));
  MSGL_TRY(expect_tensor(k, op, "k", 2, kAnyDtype));
  MSGL_TRY(expect_tensor(v, op, "v", 2, kAnyDtype));
  MSGL_TRY(expect_same(k_cache, "k_cache", v_cache, "v_cache", op));
  MSGL_TRY(expect_same(k_cache, "k_cache", k, "k", op));
  MSGL_TRY(expect_same(k_cache, "k_cache", v, "v", op));
  if (indices->device != k_cache->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `indices` is on device %d but `k_cache` is on device %d", op,
                     indices->device, k_cache->device);
  const int64_t num_tokens = k->shape[0];
  const int64_t row = k_cache->shape[1];
  MSGL_TRY(expect_dim(v_cache, op, "v_cache", 0, k_cache->shape[0]));
  MSGL_TRY(expect_dim(v_cache, op, "v_cache", 1, row));
  MSGL_TRY(expect_dim(k, op, "k", 1, row));
  MSGL_TRY(expect_dim(v, op, "v", 0, num_tokens));
  MSGL_TRY(expect_dim(v, op, "v", 1, row));
  MSGL_TRY(expect_dim(indices, op, "indices", 0, num_tokens));
  MSGL_TRY(expect_contiguous(k_cache, op, "k_cache"));
  MSGL_TRY(expect_contiguous(v_cache, op, "v_cache"));
  MSGL_TRY(expect_contiguous(indices, op, "indices"));
  const int64_t row_bytes = row * dtype_size(k->dtype);
  const int64_t align = vec_bytes_for(row_bytes);
  MSGL_TRY(expect_rows(k, op, "k", align));
  MSGL_TRY(expect_rows(v, op, "v", align));
  MSGL_TRY(expect_rows(k_cache, op, "k_cache", align));
  MSGL_TRY(expect_rows(v_cache, op, "v_cache", align));
  if (num_tokens == 0) return MSGL_OK;

  const int64_t elem = dtype_size(k->dtype);
  msgl_store_params p{};
  p.k_cache = k_cache->data;
  p.v_cache = v_cache->data;
  p.indices = indices->data;
  p.k = k->data;
  p.v = v->data;
  p.k_row_stride = k->strides[0] * elem;
  p.v_row_stride = v->strides[0] * elem;
  p.num_tokens = num_tokens;
  p.num_slots = k_cache->shape[0];
  p.index_is_64 = indices->dtype == MSGL_I64;
  const dim3 grid(static_cast<unsigned>((num_tokens + kStoreWarpsPerBlock - 1) / kStoreWarpsPerBlock));
  const dim3 block(kStoreWarpsPerBlock * kWarpSize);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (row_bytes) {
#define MSGL_CASE(RB) \
  case RB: store_kv_kernel<RB><<<grid, block, 0, s>>>(p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "store: no AOT instance ROW_BYTES=%lld", static_cast<long long>(row_bytes));
  }
  return check_launch(op);
}
#endif
