/*
 * copy.cu: strided copy between views of one shape and dtype (any strides on
 * either side): dst[i] = src[i], elements moved as ELEM_BYTES-wide words. The
 * decomposition (a grid-stride loop, one element per thread per step, the flat
 * index unravelled over the merged shape) is in minisgl/convert.cuh. Dense copies
 * never come here: the runtime uses a device-to-device memcpy for them.
 */
#include "minisgl/convert.cuh"
#include "minisgl/device.cuh"

namespace msgl {

template <int ELEM_BYTES> struct Word;
template <> struct Word<1> { using type = unsigned char; };
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<8> { using type = unsigned long long; };

template <int ELEM_BYTES> struct CopyOp {
  using Src = typename Word<ELEM_BYTES>::type;
  using Dst = Src;
  __device__ __forceinline__ static Dst apply(Src v) { return v; }
};

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 256 and any grid (grid-stride loop). */
extern "C" __global__ void __launch_bounds__(256) msgl_copy_kernel(const msgl_convert_params p) {
  msgl::convert_impl<msgl::CopyOp<MSGL_ELEM_BYTES>>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(ELEM_BYTES) for each AOT instance */

namespace msgl {
template <int ELEM_BYTES>
__global__ void __launch_bounds__(256) copy_kernel(const msgl_convert_params p) {
  convert_impl<CopyOp<ELEM_BYTES>>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_copy(const msgl_tensor* dst, const msgl_tensor* src, msgl_stream stream) {
  using namespace msgl;
  const char* op = "copy";
  msgl_convert_params p;
  MSGL_TRY(convert_prepare(op, dst, src, p));
  MSGL_TRY(expect_tensor(dst, op, "dst", dst->ndim, kAnyDtype));
  MSGL_TRY(expect_same(dst, "dst", src, "src", op));
  if (p.numel == 0) return MSGL_OK;
  const int64_t elem = dtype_size(dst->dtype);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned grid = convert_grid(p.numel);
  switch (elem) {
#define MSGL_CASE(E) \
  case E: copy_kernel<E><<<grid, kConvertThreads, 0, s>>>(p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "copy: no AOT instance ELEM_BYTES=%lld", static_cast<long long>(elem));
  }
  return check_launch(op);
}
#endif
