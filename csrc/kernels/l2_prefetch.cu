/*
 * l2_prefetch.cu: fetches device ranges into the L2 cache ahead of the kernels
 * that read them.
 *
 * A decode step at small batch runs stretches of kernels that leave HBM mostly
 * idle (RoPE + KV store, decode attention over a short cache, the norms), then
 * a projection that is bound by reading its weights. Launched before such a
 * stretch, this kernel asks the L2 to fetch the projection's weights, so the
 * projection reads them at L2 rather than HBM latency and bandwidth. It is a
 * hint: the cache may drop any piece, and nothing the program computes depends
 * on it.
 *
 * Decomposition: the ranges are concatenated and cut into `chunk_bytes` pieces;
 * thread i of the grid takes pieces i, i + threads, ... (one warp a block, so
 * that a small grid still spreads the pieces over many SMs' copy engines). BULK
 * issues one cp.async.bulk.prefetch.L2 a piece (sm_90: the SM's copy engine
 * walks the lines; the thread does not wait), else one prefetch.global.L2 per
 * 128-byte line.
 *
 * The runtime launches it on a side stream forked from the compute stream, so
 * that no kernel of the step waits for it: a grid ends only once its bulk
 * prefetches have landed, which in the compute stream would put the whole fetch
 * on the step's critical path (measured: Qwen3-0.6B bs=1 1.00 -> 1.32 ms). So no
 * programmatic dependent launch either.
 */
#include "minisgl/device.cuh"

namespace msgl {

constexpr int kPrefetchThreads = 32;
constexpr int64_t kLineBytes = 128;

template <int BULK>
__device__ __forceinline__ void prefetch_piece(const char* ptr, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (BULK) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ptr), "r"(static_cast<unsigned>(bytes)) : "memory");
    return;
  }
#endif
  for (int64_t off = 0; off < bytes; off += kLineBytes) asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr + off));
}

template <int BULK>
__device__ __forceinline__ void l2_prefetch_impl(const msgl_l2_prefetch_params& p) {
  const int64_t threads = static_cast<int64_t>(gridDim.x) * kPrefetchThreads;
  const int64_t me = static_cast<int64_t>(blockIdx.x) * kPrefetchThreads + threadIdx.x;
  // Piece `me` of the concatenation: walk the ranges, each cut on its own (a piece
  // never straddles two ranges), with a running piece index.
  int64_t first = 0; /* index of the first piece of range r */
  for (int r = 0; r < p.count && r < MSGL_L2_PREFETCH_REGIONS; ++r) {
    const int64_t pieces = (p.bytes[r] + p.chunk_bytes - 1) / p.chunk_bytes;
    int64_t i = me - first;
    if (i < 0) i += ((first - me + threads - 1) / threads) * threads; /* next of mine in this range */
    for (; i < pieces; i += threads) {
      const int64_t off = i * p.chunk_bytes;
      const int64_t len = p.bytes[r] - off < p.chunk_bytes ? p.bytes[r] - off : p.chunk_bytes;
      prefetch_piece<BULK>(static_cast<const char*>(p.ptr[r]) + off, len);
    }
    first += pieces;
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 32 and any grid. */
extern "C" __global__ void __launch_bounds__(32) msgl_l2_prefetch_kernel(const msgl_l2_prefetch_params p) {
  msgl::l2_prefetch_impl<MSGL_BULK>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(BULK) for each AOT instance */

namespace msgl {
template <int BULK>
__global__ void __launch_bounds__(32) l2_prefetch_kernel(const msgl_l2_prefetch_params p) {
  l2_prefetch_impl<BULK>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_l2_prefetch(const msgl_l2_prefetch_params* p, int32_t grid, int32_t bulk, msgl_stream stream) {
  using namespace msgl;
  const char* op = "l2_prefetch";
  if (p == nullptr) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: null params", op);
  if (p->count < 0 || p->count > MSGL_L2_PREFETCH_REGIONS)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %d ranges (at most %d)", op, p->count, MSGL_L2_PREFETCH_REGIONS);
  if (p->chunk_bytes <= 0 || p->chunk_bytes % kLineBytes != 0 || p->chunk_bytes > 0x7fffffff)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: piece size %lld is not a positive multiple of 128 below 2^31", op,
                     static_cast<long long>(p->chunk_bytes));
  for (int r = 0; r < p->count; ++r) {
    if (p->bytes[r] < 0 || p->bytes[r] % 16 != 0 || reinterpret_cast<uintptr_t>(p->ptr[r]) % 16 != 0 ||
        (p->bytes[r] > 0 && p->ptr[r] == nullptr))
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: range %d (%p, %lld bytes) is not 16-byte aligned", op, r, p->ptr[r],
                       static_cast<long long>(p->bytes[r]));
  }
  if (grid <= 0) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: grid %d", op, grid);
  if (bulk != 0 && bulk != 1) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: bulk %d", op, bulk);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const msgl_l2_prefetch_params params = *p;
  switch (bulk) {
#define MSGL_CASE(B) \
  case B: l2_prefetch_kernel<B><<<static_cast<unsigned>(grid), kPrefetchThreads, 0, s>>>(params); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance BULK=%d", op, bulk);
  }
  return check_launch(op);
}
#endif
