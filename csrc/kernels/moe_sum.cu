/*
 * moe_sum.cu: the combine step of a mixture-of-experts layer, the sum of each
 * token's top_k expert outputs, weighted by the routing weights when given (the
 * fused path applies them in the down GEMM's epilogue and passes none):
 *
 *   out[t, h] = sum_{s < top_k, 0 <= ids[t, s] < num_experts} w[t, s] part[t * top_k + s, h]
 *
 * in f32, rounded once. Decomposition: one thread per 16-byte vector of a row of
 * out (a grid-stride loop over tokens x vectors), reading the top_k partner
 * vectors of the pair rows; rows of pairs whose expert was dropped (an id outside
 * the experts, never written by the GEMM) are skipped. The scalar path (a row not
 * a whole number of vectors) takes one element per thread. With pdl = 1 the
 * launch overlaps the tail of the down GEMM (the kernel waits for it before
 * reading).
 */
#include "minisgl/mma.cuh"

namespace msgl {

constexpr int kMoeSumThreads = 256;

template <int DTYPE>
__device__ __forceinline__ void moe_sum_impl(const msgl_moe_sum_params& p) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int E = Vec16<DTYPE>::kElems;
  grid_dependency_wait();  // the down GEMM's rows (programmatic dependent launch)
  const long long per_row = p.vectorized ? p.hidden / E : p.hidden;
  const long long col = static_cast<long long>(blockIdx.x % p.blocks_per_row) * kMoeSumThreads + threadIdx.x;
  if (col >= per_row) return;
  const T* part = static_cast<const T*>(p.part);
  T* out = static_cast<T*>(p.out);
  const long long stride = gridDim.x / p.blocks_per_row;
  for (long long token = blockIdx.x / p.blocks_per_row; token < p.num_tokens; token += stride) {
    if (p.vectorized) {
      float acc[E];
#pragma unroll
      for (int j = 0; j < E; ++j) acc[j] = 0.f;
      for (int s = 0; s < p.top_k; ++s) {
        const long long pair = token * p.top_k + s;
        const int e = __ldcg(p.topk_ids + pair);
        if (e >= 0 && e < p.num_experts) {
          const float w = p.topk_weights != nullptr ? __ldcg(p.topk_weights + pair) : 1.f;
          Vec16<DTYPE> x;
          x.from_raw(__ldcg(reinterpret_cast<const uint4*>(part + pair * p.hidden + col * E)));
#pragma unroll
          for (int j = 0; j < E; ++j) acc[j] += w * x.v[j];
        }
      }
      Vec16<DTYPE> y;
#pragma unroll
      for (int j = 0; j < E; ++j) y.v[j] = acc[j];
      y.store(out + token * p.hidden + col * E);
    } else {
      float acc = 0.f;
      for (int s = 0; s < p.top_k; ++s) {
        const long long pair = token * p.top_k + s;
        const int e = __ldcg(p.topk_ids + pair);
        if (e < 0 || e >= p.num_experts) continue;
        const float w = p.topk_weights != nullptr ? __ldcg(p.topk_weights + pair) : 1.f;
        acc += w * DType<DTYPE>::to_f32(__ldcg(part + pair * p.hidden + col));
      }
      out[token * p.hidden + col] = DType<DTYPE>::from_f32(acc);
    }
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 256 and grid = blocks_per_row * min(num_tokens, 65535). */
extern "C" __global__ void __launch_bounds__(256) msgl_moe_sum_kernel(const msgl_moe_sum_params p) {
  msgl::moe_sum_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(256) moe_sum_kernel(const msgl_moe_sum_params p) {
  moe_sum_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_moe_sum(const msgl_tensor* out, const msgl_tensor* part, const msgl_tensor* topk_ids,
                                const msgl_tensor* topk_weights, int32_t num_experts, int32_t pdl, msgl_stream stream) {
  using namespace msgl;
  const char* op = "moe_sum";
  constexpr uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(out, op, "out", 2, floats));
  MSGL_TRY(expect_tensor(part, op, "part", 2, floats));
  MSGL_TRY(expect_tensor(topk_ids, op, "topk_ids", 2, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_same(out, "out", part, "part", op));
  const int64_t num_tokens = out->shape[0], hidden = out->shape[1], top_k = topk_ids->shape[1];
  MSGL_TRY(expect_dim(topk_ids, op, "topk_ids", 0, num_tokens));
  MSGL_TRY(expect_dim(part, op, "part", 0, num_tokens * top_k));
  MSGL_TRY(expect_dim(part, op, "part", 1, hidden));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  MSGL_TRY(expect_contiguous(part, op, "part"));
  MSGL_TRY(expect_contiguous(topk_ids, op, "topk_ids"));
  if (topk_ids->device != out->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `topk_ids` is not on the device of `out`", op);
  if (topk_weights != nullptr) {
    MSGL_TRY(expect_tensor(topk_weights, op, "topk_weights", 2, dtype_bit(MSGL_F32)));
    MSGL_TRY(expect_dim(topk_weights, op, "topk_weights", 0, num_tokens));
    MSGL_TRY(expect_dim(topk_weights, op, "topk_weights", 1, top_k));
    MSGL_TRY(expect_contiguous(topk_weights, op, "topk_weights"));
    if (topk_weights->device != out->device)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `topk_weights` is not on the device of `out`", op);
  }
  if (num_tokens == 0 || hidden == 0) return MSGL_OK;

  const int64_t elems = 16 / dtype_size(out->dtype);
  msgl_moe_sum_params p{};
  p.out = out->data;
  p.part = part->data;
  p.topk_ids = static_cast<const int32_t*>(topk_ids->data);
  p.topk_weights = topk_weights != nullptr ? static_cast<const float*>(topk_weights->data) : nullptr;
  p.num_tokens = num_tokens;
  p.hidden = hidden;
  p.top_k = static_cast<int32_t>(top_k);
  p.num_experts = num_experts;
  p.vectorized = hidden % elems == 0 && reinterpret_cast<uintptr_t>(out->data) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(part->data) % 16 == 0;
  const int64_t per_row = p.vectorized ? hidden / elems : hidden;
  const int64_t blocks_per_row = (per_row + kMoeSumThreads - 1) / kMoeSumThreads;
  if (blocks_per_row > 65535) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: rows of %lld elements are too wide", op,
                                                static_cast<long long>(hidden));
  p.blocks_per_row = static_cast<int32_t>(blocks_per_row);
  const dim3 grid(static_cast<unsigned>(blocks_per_row * (num_tokens < 65535 ? num_tokens : 65535)));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kMoeSumThreads);
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  cudaError_t err = cudaErrorInvalidValue;
  switch (out->dtype) {
#define MSGL_CASE(D) \
  case D: err = cudaLaunchKernelEx(&cfg, moe_sum_kernel<D>, p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d", op, out->dtype);
  }
  if (err != cudaSuccess) return set_error(MSGL_ERR_CUDA, "%s: launch failed: %s", op, cudaGetErrorString(err));
  return check_launch(op);
}
#endif
