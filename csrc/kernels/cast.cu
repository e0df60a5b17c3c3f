/*
 * cast.cu: float dtype conversion (f32, f16, bf16 to each other) between views of
 * one shape with any strides: dst[i] = DST(float(src[i])), rounding to nearest
 * even. The decomposition (a grid-stride loop, one element per thread per step,
 * dense views indexed directly) is in minisgl/convert.cuh.
 */
#include "minisgl/convert.cuh"
#include "minisgl/dtype.cuh"

namespace msgl {

template <int SRC, int DST> struct CastOp {
  using Src = typename DType<SRC>::Storage;
  using Dst = typename DType<DST>::Storage;
  __device__ __forceinline__ static Dst apply(Src v) { return DType<DST>::from_f32(DType<SRC>::to_f32(v)); }
};

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 256 and any grid (grid-stride loop). */
extern "C" __global__ void __launch_bounds__(256) msgl_cast_kernel(const msgl_convert_params p) {
  msgl::convert_impl<msgl::CastOp<MSGL_SRC, MSGL_DST>>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(SRC, DST) for each AOT instance */

namespace msgl {
template <int SRC, int DST>
__global__ void __launch_bounds__(256) cast_kernel(const msgl_convert_params p) {
  convert_impl<CastOp<SRC, DST>>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_cast(const msgl_tensor* dst, const msgl_tensor* src, msgl_stream stream) {
  using namespace msgl;
  const char* op = "cast";
  constexpr uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  msgl_convert_params p;
  MSGL_TRY(convert_prepare(op, dst, src, p));
  MSGL_TRY(expect_tensor(dst, op, "dst", dst->ndim, floats));
  MSGL_TRY(expect_tensor(src, op, "src", src->ndim, floats));
  if (p.numel == 0) return MSGL_OK;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned grid = convert_grid(p.numel);
  bool launched = false;
#define MSGL_CASE(S, D)                                                       \
  if (!launched && src->dtype == S && dst->dtype == D) {                       \
    cast_kernel<S, D><<<grid, kConvertThreads, 0, s>>>(p);                     \
    launched = true;                                                           \
  }
  MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
  if (!launched)
    return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance SRC=%d,DST=%d", op, src->dtype, dst->dtype);
  return check_launch(op);
}
#endif
