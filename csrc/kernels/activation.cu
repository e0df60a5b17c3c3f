/*
 * activation.cu: SiLU-and-mul of a fused gate/up projection.
 *
 *   out[t, j] = silu(x[t, j]) * x[t, inter + j],  silu(g) = g / (1 + exp(-g))
 *
 * computed in f32 and rounded once. Decomposition: a row of `inter` outputs is cut
 * into blocks of 256 threads (blocks_per_row of them, so the grid is
 * num_tokens * blocks_per_row and no block straddles two rows); in the vector path
 * each thread reads one 16-byte vector of the gate and one of the up half and
 * writes one 16-byte vector, all coalesced across the warp. The scalar path
 * (inter not a multiple of the vector) takes one element per thread.
 */
#include "minisgl/dtype.cuh"

namespace msgl {

constexpr int kSiluThreads = 256;

__device__ __forceinline__ float silu(float g) { return g / (1.f + __expf(-g)); }

template <int DTYPE>
__device__ __forceinline__ void silu_mul_impl(const msgl_silu_mul_params& p) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int E = Vec16<DTYPE>::kElems;
  const long long token = blockIdx.x / p.blocks_per_row;
  const long long chunk = static_cast<long long>(blockIdx.x % p.blocks_per_row) * kSiluThreads + threadIdx.x;
  if (token >= p.num_tokens) return;
  const T* gate = static_cast<const T*>(p.x) + token * 2 * p.inter;
  const T* up = gate + p.inter;
  T* out = static_cast<T*>(p.out) + token * p.inter;
  if (p.vectorized) {
    const long long d = chunk * E;
    if (d >= p.inter) return;
    Vec16<DTYPE> g, u;
    g.load(gate + d);
    u.load(up + d);
#pragma unroll
    for (int e = 0; e < E; ++e) g.v[e] = silu(g.v[e]) * u.v[e];
    g.store(out + d);
  } else {
    if (chunk >= p.inter) return;
    out[chunk] = DType<DTYPE>::from_f32(silu(DType<DTYPE>::to_f32(gate[chunk])) * DType<DTYPE>::to_f32(up[chunk]));
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 256 and grid = num_tokens * blocks_per_row. */
extern "C" __global__ void __launch_bounds__(256) msgl_silu_mul_kernel(const msgl_silu_mul_params p) {
  msgl::silu_mul_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(256) silu_mul_kernel(const msgl_silu_mul_params p) {
  /* Nothing to prefetch: wait, then let the next kernel (a projection) stage its weights. */
  grid_prologue();
  silu_mul_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_silu_mul(const msgl_tensor* out, const msgl_tensor* x, int32_t vectorized, msgl_stream stream) {
  using namespace msgl;
  const char* op = "silu_mul";
  constexpr uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(out, op, "out", 2, floats));
  MSGL_TRY(expect_tensor(x, op, "x", 2, floats));
  MSGL_TRY(expect_same(x, "x", out, "out", op));
  const int64_t num_tokens = x->shape[0];
  const int64_t inter = x->shape[1] / 2;
  if (x->shape[1] % 2 != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `x` has odd width %lld", op, static_cast<long long>(x->shape[1]));
  MSGL_TRY(expect_dim(out, op, "out", 0, num_tokens));
  MSGL_TRY(expect_dim(out, op, "out", 1, inter));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  MSGL_TRY(expect_contiguous(x, op, "x"));
  const int64_t elems = 16 / dtype_size(x->dtype);
  if (vectorized && inter % elems != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the vector path needs a width that is a multiple of %lld", op,
                     static_cast<long long>(elems));
  MSGL_TRY(expect_rows(out, op, "out", vectorized ? 16 : dtype_size(x->dtype)));
  MSGL_TRY(expect_rows(x, op, "x", vectorized ? 16 : dtype_size(x->dtype)));
  if (num_tokens == 0 || inter == 0) return MSGL_OK;

  msgl_silu_mul_params p{};
  p.out = out->data;
  p.x = x->data;
  p.num_tokens = num_tokens;
  p.inter = inter;
  p.vectorized = vectorized;
  const int64_t per_row = vectorized ? inter / elems : inter;
  p.blocks_per_row = static_cast<int32_t>((per_row + kSiluThreads - 1) / kSiluThreads);
  const int64_t blocks = num_tokens * p.blocks_per_row;
  if (blocks > 0x7fffffff) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %lld blocks exceed the grid limit", op, static_cast<long long>(blocks));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (x->dtype) {
#define MSGL_CASE(D) \
  case D: (void)launch_pdl(silu_mul_kernel<D>, dim3(static_cast<unsigned>(blocks)), dim3(kSiluThreads), 0, s, p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d", op, x->dtype);
  }
  return check_launch(op);
}
#endif
