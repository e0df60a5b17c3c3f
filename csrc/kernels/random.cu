/*
 * random.cu: deterministic uniform random fills, for dummy weights made on the
 * device (a 30B-parameter model's in a fraction of a second instead of minutes of
 * host generation and upload).
 *
 *   out[i] = center + half_width * (2 u(seed, i) - 1),  u in [0, 1)
 *
 * u(seed, i) is the top 24 bits of splitmix64(seed + (i + 1) * golden) over 2^24:
 * a counter-based generator, so every element is independent of the launch shape
 * and kernel-runtime's CPU reference (cpu::random) computes the same values bit
 * for bit (the arithmetic is spelled with round-to-nearest intrinsics so that nvcc
 * does not contract it into an fma the CPU would not do; the store rounds to the
 * dtype to nearest even, as the CPU's conversion does).
 *
 * Decomposition: a grid-stride loop, one element per thread per iteration.
 * Instance parameter: DTYPE.
 */
#include "minisgl/dtype.cuh"

namespace msgl {

constexpr int kRandomThreads = 256;

__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

template <int DTYPE>
__device__ __forceinline__ void fill_uniform_impl(const msgl_fill_uniform_params& p) {
  using T = typename DType<DTYPE>::Storage;
  T* out = static_cast<T*>(p.out);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.numel; i += stride) {
    const unsigned long long z =
        splitmix64(p.seed + static_cast<unsigned long long>(i + 1) * 0x9e3779b97f4a7c15ull);
    const float u = static_cast<float>(z >> 40) * (1.f / 16777216.f);
    const float signed_u = __fsub_rn(__fmul_rn(2.f, u), 1.f);
    out[i] = DType<DTYPE>::from_f32(__fadd_rn(p.center, __fmul_rn(p.half_width, signed_u)));
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 256 and any grid (grid-stride loop). */
extern "C" __global__ void __launch_bounds__(256) msgl_fill_uniform_kernel(const msgl_fill_uniform_params p) {
  msgl::fill_uniform_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(256) fill_uniform_kernel(const msgl_fill_uniform_params p) {
  fill_uniform_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_fill_uniform(const msgl_tensor* out, uint64_t seed, float center, float half_width,
                                     int32_t grid, msgl_stream stream) {
  using namespace msgl;
  const char* op = "fill_uniform";
  constexpr uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(out, op, "out", 1, floats));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  if (grid < 1) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: grid %d must be positive", op, grid);
  const int64_t numel = out->shape[0];
  if (numel == 0) return MSGL_OK;
  msgl_fill_uniform_params p{};
  p.out = out->data;
  p.numel = numel;
  p.seed = seed;
  p.center = center;
  p.half_width = half_width;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (out->dtype) {
#define MSGL_CASE(D) \
  case D: fill_uniform_kernel<D><<<static_cast<unsigned>(grid), kRandomThreads, 0, s>>>(p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d", op, out->dtype);
  }
  return check_launch(op);
}
#endif
