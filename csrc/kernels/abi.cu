/*
 * abi.cu: the library-wide part of the C ABI: the per-thread last-error message,
 * the ABI version, and the argument checks every launcher uses (minisgl/check.h).
 */
#include <cstdio>

#include "minisgl/check.h"

namespace {
thread_local char g_last_error[1024] = "";
}

extern "C" const char* msgl_last_error(void) { return g_last_error; }

extern "C" int32_t msgl_abi_version(void) { return MSGL_ABI_VERSION; }

namespace msgl {

int32_t set_error(int32_t status, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  vsnprintf(g_last_error, sizeof(g_last_error), fmt, args);
  va_end(args);
  return status;
}

const char* dtype_name(int32_t dtype) {
  switch (dtype) {
    case MSGL_F32: return "f32";
    case MSGL_F16: return "f16";
    case MSGL_BF16: return "bf16";
    case MSGL_I32: return "i32";
    case MSGL_I64: return "i64";
    case MSGL_U8: return "u8";
    default: return "unknown";
  }
}

int64_t dtype_size(int32_t dtype) {
  switch (dtype) {
    case MSGL_F32: case MSGL_I32: return 4;
    case MSGL_F16: case MSGL_BF16: return 2;
    case MSGL_I64: return 8;
    case MSGL_U8: return 1;
    default: return 0;
  }
}

int32_t expect_tensor(const msgl_tensor* t, const char* op, const char* name, int ndim, uint32_t dtypes) {
  if (t == nullptr) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` is null", op, name);
  if (t->device < 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` is in host memory, expected a CUDA device", op, name);
  if (t->ndim != ndim)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` has %d dimensions, expected %d", op, name, t->ndim, ndim);
  if (t->dtype < 0 || t->dtype > MSGL_U8 || (dtypes & dtype_bit(t->dtype)) == 0) {
    char allowed[128] = "";
    size_t used = 0;
    for (int32_t d = 0; d <= MSGL_U8; ++d)
      if (dtypes & dtype_bit(d))
        used += snprintf(allowed + used, sizeof(allowed) - used, used ? "|%s" : "%s", dtype_name(d));
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` has dtype %s, expected %s", op, name,
                     dtype_name(t->dtype), allowed);
  }
  if (t->data == nullptr && t->shape[0] != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` has a null data pointer", op, name);
  return MSGL_OK;
}

int32_t expect_dim(const msgl_tensor* t, const char* op, const char* name, int dim, int64_t expected) {
  if (t->shape[dim] != expected)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` has size %lld in dimension %d, expected %lld", op,
                     name, static_cast<long long>(t->shape[dim]), dim, static_cast<long long>(expected));
  return MSGL_OK;
}

int32_t expect_contiguous(const msgl_tensor* t, const char* op, const char* name) {
  int64_t expected = 1;
  for (int d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` is not contiguous (stride %lld in dimension %d, expected %lld)",
                       op, name, static_cast<long long>(t->strides[d]), d, static_cast<long long>(expected));
    expected *= t->shape[d];
  }
  return MSGL_OK;
}

int32_t expect_rows(const msgl_tensor* t, const char* op, const char* name, int64_t align) {
  const int last = t->ndim - 1;
  if (t->shape[last] != 1 && t->strides[last] != 1)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` has stride %lld in its last dimension, expected 1", op,
                     name, static_cast<long long>(t->strides[last]));
  const int64_t elem = dtype_size(t->dtype);
  if (reinterpret_cast<uintptr_t>(t->data) % align != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` data pointer is not %lld-byte aligned", op, name,
                     static_cast<long long>(align));
  for (int d = 0; d < last; ++d) {
    if (t->shape[d] > 1 && (t->strides[d] * elem) % align != 0)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` stride %lld in dimension %d is not a multiple of %lld bytes",
                       op, name, static_cast<long long>(t->strides[d]), d, static_cast<long long>(align));
  }
  return MSGL_OK;
}

int32_t expect_same(const msgl_tensor* a, const char* a_name, const msgl_tensor* b, const char* b_name,
                    const char* op) {
  if (a->device != b->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` is on device %d but `%s` is on device %d", op, b_name,
                     b->device, a_name, a->device);
  if (a->dtype != b->dtype)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `%s` has dtype %s but `%s` has dtype %s", op, b_name,
                     dtype_name(b->dtype), a_name, dtype_name(a->dtype));
  return MSGL_OK;
}

int32_t check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return set_error(MSGL_ERR_CUDA, "%s: launch failed: %s (%s)", op, cudaGetErrorName(err), cudaGetErrorString(err));
  return MSGL_OK;
}

}  // namespace msgl
