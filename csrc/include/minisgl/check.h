/*
 * minisgl/check.h: host-side argument checks for the launchers (the C++ half of
 * the argument validation; kernel-runtime validates the same things in Rust first).
 *
 * Host code only: never included by device sources compiled with NVRTC.
 *
 *   MSGL_TRY(msgl::expect_tensor(t, "store_kv", "k", 2, dtype_bit(MSGL_BF16) | dtype_bit(MSGL_F16)));
 *
 * Each check returns MSGL_OK or records a message naming the op and the argument
 * (retrieved with msgl_last_error()) and returns the status.
 */
#ifndef MINISGL_CHECK_H
#define MINISGL_CHECK_H

#include <cstdarg>
#include <cstdint>
#include <cstdlib>

#include <cuda_runtime.h>

#include "minisgl/tensor.h"

namespace msgl {

/* Records a printf-style message as this thread's last error and returns `status`. */
int32_t set_error(int32_t status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

const char* dtype_name(int32_t dtype);
int64_t dtype_size(int32_t dtype);

#define MSGL_TRY(expr)                         \
  do {                                         \
    const int32_t msgl_status_ = (expr);       \
    if (msgl_status_ != MSGL_OK) return msgl_status_; \
  } while (0)

/* A set of dtypes as a bit mask. */
constexpr uint32_t dtype_bit(int32_t dtype) { return 1u << dtype; }
constexpr uint32_t kAnyDtype = 0x3f;
constexpr uint32_t kIndexDtypes = dtype_bit(MSGL_I32) | dtype_bit(MSGL_I64);

/* `t` is non-null, on a CUDA device, has `ndim` dimensions and a dtype in `dtypes`. */
int32_t expect_tensor(const msgl_tensor* t, const char* op, const char* name, int ndim, uint32_t dtypes);

/* Dimension `dim` of `t` equals `expected`. */
int32_t expect_dim(const msgl_tensor* t, const char* op, const char* name, int dim, int64_t expected);

/* `t` is contiguous (row-major, no gaps). */
int32_t expect_contiguous(const msgl_tensor* t, const char* op, const char* name);

/* The innermost dimension of `t` is contiguous (stride 1) and rows are `align` bytes aligned. */
int32_t expect_rows(const msgl_tensor* t, const char* op, const char* name, int64_t align);

/* `a` and `b` are on the same device and have the same dtype. */
int32_t expect_same(const msgl_tensor* a, const char* a_name, const msgl_tensor* b,
                    const char* b_name, const char* op);

/* Turns the last CUDA error (after a launch) into a status. */
int32_t check_launch(const char* op);

/* Whether launchers use programmatic dependent launch (MINISGL_PDL, default 1;
 * 0 turns it off, e.g. to compare). */
inline bool pdl_enabled() {
  static const bool enabled = [] {
    const char* v = getenv("MINISGL_PDL");
    return v == nullptr || v[0] != '0';
  }();
  return enabled;
}

/* Launches `kernel` on `s` with programmatic stream serialisation (sm_90: it may
 * start while the previous kernel finishes; the kernel must call
 * grid_dependency_wait before touching memory, see device.cuh), or plainly when
 * pdl_enabled() is false, in clusters of `cluster_x` blocks along x when that is
 * more than 1 (grid.x a multiple of it). Stream capture keeps both in a graph. */
template <typename... Params, typename... Args>
cudaError_t launch_pdl_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                               unsigned cluster_x, Args... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* launch_pdl_cluster without clusters. */
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args... args) {
  return launch_pdl_cluster(kernel, grid, block, smem, s, 1u, args...);
}

}  // namespace msgl

#endif /* MINISGL_CHECK_H */
