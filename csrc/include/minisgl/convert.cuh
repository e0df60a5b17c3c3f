/*
 * minisgl/convert.cuh: the element-wise strided copy behind the cast and copy
 * kernels (cast.cu, copy.cu): dst[i] = convert(src[i]) for every index i of an n-d
 * shape with independent dst and src strides (msgl_convert_params).
 *
 * Decomposition: a grid-stride loop over the flat index, one element per thread
 * per step. Dense views (the host merged the shape into one run of unit strides)
 * index directly, so a warp reads and writes consecutive elements; strided views
 * unravel the flat index over the (merged) shape, outermost dimension first.
 * Device code only; no system headers (NVRTC).
 */
#ifndef MINISGL_CONVERT_CUH
#define MINISGL_CONVERT_CUH

#include "minisgl/tensor.h"

namespace msgl {

constexpr int kConvertThreads = 256;

/* Offsets of flat index i in dst and src (row-major over p.shape). */
__device__ __forceinline__ void convert_offsets(const msgl_convert_params& p, long long i, long long& dst_off,
                                                long long& src_off) {
  dst_off = 0;
  src_off = 0;
  for (int d = p.ndim - 1; d >= 0; --d) {
    const long long n = p.shape[d];
    const long long idx = i % n;
    i /= n;
    dst_off += idx * p.dst_strides[d];
    src_off += idx * p.src_strides[d];
  }
}

/* dst[i] = F::apply(src[i]), with F::Src / F::Dst the element types. */
template <typename F>
__device__ __forceinline__ void convert_impl(const msgl_convert_params& p) {
  const typename F::Src* src = static_cast<const typename F::Src*>(p.src);
  typename F::Dst* dst = static_cast<typename F::Dst*>(p.dst);
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p.contiguous) {
    for (long long i = first; i < p.numel; i += stride) dst[i] = F::apply(src[i]);
    return;
  }
  for (long long i = first; i < p.numel; i += stride) {
    long long d, s;
    convert_offsets(p, i, d, s);
    dst[d] = F::apply(src[s]);
  }
}

}  // namespace msgl

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"

namespace msgl {

/*
 * Fills `p` for dst/src (same shape, any strides): merges adjacent dimensions that
 * are contiguous in both views, drops size-1 dimensions, and marks the dense case.
 * The Rust launchers do the same (kernel-runtime gpu::convert).
 */
inline int32_t convert_prepare(const char* op, const msgl_tensor* dst, const msgl_tensor* src, msgl_convert_params& p) {
  if (dst == nullptr || src == nullptr) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: null tensor", op);
  if (dst->device < 0 || src->device < 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: tensors must be on a CUDA device", op);
  if (dst->device != src->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `src` is on device %d but `dst` is on device %d", op,
                     src->device, dst->device);
  if (dst->ndim != src->ndim || dst->ndim < 0 || dst->ndim > MSGL_MAX_DIMS)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `dst` has %d dimensions, `src` has %d", op, dst->ndim, src->ndim);
  p = msgl_convert_params{};
  p.dst = dst->data;
  p.src = src->data;
  p.numel = 1;
  int nd = 0;
  for (int d = 0; d < dst->ndim; ++d) {
    if (dst->shape[d] != src->shape[d])
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `dst` has size %lld in dimension %d, `src` has %lld", op,
                       static_cast<long long>(dst->shape[d]), d, static_cast<long long>(src->shape[d]));
    if (dst->shape[d] < 0) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: negative size", op);
    p.numel *= dst->shape[d];
    if (dst->shape[d] == 1) continue;
    if (nd > 0 && p.dst_strides[nd - 1] == dst->strides[d] * dst->shape[d] &&
        p.src_strides[nd - 1] == src->strides[d] * dst->shape[d]) {
      p.shape[nd - 1] *= dst->shape[d];
      p.dst_strides[nd - 1] = dst->strides[d];
      p.src_strides[nd - 1] = src->strides[d];
      continue;
    }
    p.shape[nd] = dst->shape[d];
    p.dst_strides[nd] = dst->strides[d];
    p.src_strides[nd] = src->strides[d];
    ++nd;
  }
  p.ndim = nd;
  p.contiguous = nd == 0 || (nd == 1 && p.dst_strides[0] == 1 && p.src_strides[0] == 1);
  if (p.numel > 0 && (dst->data == nullptr || src->data == nullptr))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: null data pointer", op);
  return MSGL_OK;
}

/* Blocks for a grid-stride loop over numel elements (the Rust side uses the same). */
inline unsigned convert_grid(long long numel) {
  const long long blocks = (numel + kConvertThreads - 1) / kConvertThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace msgl
#endif

#endif /* MINISGL_CONVERT_CUH */
