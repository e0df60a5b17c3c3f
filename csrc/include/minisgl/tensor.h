/*
 * minisgl/tensor.h: the C ABI between Rust and every kernel.
 *
 * One header, three readers:
 *   - nvcc, compiling the ahead-of-time shared library (host launchers + kernels);
 *   - NVRTC, compiling one kernel instance at run time (device code only, so this
 *     header must not pull in any system header under __CUDACC_RTC__);
 *   - bindgen (`cargo xtask codegen`), producing kernel-runtime/src/sys/kernels.rs.
 *
 * Every host launcher has the shape
 *     int msgl_<kernel>(const msgl_tensor* ..., <scalars>, msgl_stream stream);
 * validates its arguments before launching, and returns MSGL_OK or a status code;
 * on failure msgl_last_error() returns a message naming the bad argument. The
 * message lives in thread-local storage and stays valid until the next call on the
 * same thread.
 *
 * Parameter structs (msgl_*_params) are what a __global__ entry receives by value:
 * the AOT launchers fill them on the C++ side, the run-time path (NVRTC or AOT
 * cubins) fills the bindgen mirror on the Rust side. Their sizes are pinned below
 * and in the generated Rust (bindgen's layout tests).
 */
#ifndef MINISGL_TENSOR_H
#define MINISGL_TENSOR_H

#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stddef.h>
#include <stdint.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct below or a launcher signature changes. */
#define MSGL_ABI_VERSION 1

/* The most dimensions a tensor view carries. */
#define MSGL_MAX_DIMS 6

/* Element types. The codes are part of the ABI (kernel-runtime's DType mirrors them). */
typedef enum msgl_dtype {
  MSGL_F32 = 0,
  MSGL_F16 = 1,
  MSGL_BF16 = 2,
  MSGL_I32 = 3,
  MSGL_I64 = 4,
  MSGL_U8 = 5
} msgl_dtype;

/* Status codes returned by every launcher. */
typedef enum msgl_status {
  MSGL_OK = 0,
  /* A tensor or scalar argument is wrong (dtype, shape, stride, device, alignment). */
  MSGL_ERR_INVALID_ARGUMENT = 1,
  /* The library has no instance for this specialisation (the runtime then JIT-compiles it). */
  MSGL_ERR_NO_INSTANCE = 2,
  /* A CUDA runtime call or the launch itself failed. */
  MSGL_ERR_CUDA = 3
} msgl_status;

/* Exported launchers; everything else in the library is hidden (-fvisibility=hidden). */
#if defined(__GNUC__)
#define MSGL_API __attribute__((visibility("default")))
#else
#define MSGL_API
#endif

/* The stream a launcher enqueues on: a cudaStream_t / CUstream. */
typedef void* msgl_stream;

/*
 * A strided view of device (or host) memory. Shapes and strides are in elements,
 * outermost dimension first. `device` is the CUDA ordinal, or -1 for host memory.
 */
typedef struct msgl_tensor {
  void* data;
  int32_t dtype;  /* msgl_dtype */
  int32_t ndim;
  int32_t device;
  int32_t reserved;
  int64_t shape[MSGL_MAX_DIMS];
  int64_t strides[MSGL_MAX_DIMS];
} msgl_tensor;

/*
 * store: scatter new K and V rows into the paged KV caches.
 *   k_cache[indices[i]] = k[i], v_cache[indices[i]] = v[i]   (rows of row_bytes bytes)
 * Instance parameter: ROW_BYTES.
 */
typedef struct msgl_store_params {
  void* k_cache;           /* device, [num_slots, ROW_BYTES] contiguous rows */
  void* v_cache;           /* device, [num_slots, ROW_BYTES] contiguous rows */
  const void* indices;     /* device, [num_tokens] int32 or int64 slot indices */
  const void* k;           /* device, [num_tokens] rows, k_row_stride bytes apart */
  const void* v;           /* device, [num_tokens] rows, v_row_stride bytes apart */
  int64_t k_row_stride;    /* bytes */
  int64_t v_row_stride;    /* bytes */
  int64_t num_tokens;
  int64_t num_slots;       /* rows in each cache; out-of-range indices are skipped */
  int32_t index_is_64;     /* 1 when indices are int64 */
  int32_t reserved;
} msgl_store_params;

/*
 * index: embedding gather, out[i] = weight[ids[i] - vocab_start] when
 * vocab_start <= ids[i] < vocab_start + num_rows, else a zero row (the vocab-parallel
 * shard of a tensor-parallel embedding; a full table has vocab_start = 0).
 * Instance parameter: ROW_BYTES.
 */
typedef struct msgl_index_params {
  void* out;               /* device, [num_tokens, ROW_BYTES] contiguous */
  const void* weight;      /* device, [num_rows, ROW_BYTES] contiguous */
  const void* ids;         /* device, [num_tokens] int32 or int64 */
  int64_t num_tokens;
  int64_t num_rows;
  int64_t vocab_start;
  int32_t index_is_64;
  int32_t reserved;
} msgl_index_params;

#if !defined(__CUDACC_RTC__)

/* The message of the last failed launcher call on this thread ("" if none). */
MSGL_API const char* msgl_last_error(void);
/* MSGL_ABI_VERSION of the library, checked by the runtime at load. */
MSGL_API int32_t msgl_abi_version(void);

/* store: k/v [num_tokens, row] (row stride free, unit element stride), caches
 * [num_slots, row] contiguous, same dtype; indices [num_tokens] int32/int64. */
MSGL_API int32_t msgl_store_kv(const msgl_tensor* k_cache, const msgl_tensor* v_cache,
                      const msgl_tensor* indices, const msgl_tensor* k, const msgl_tensor* v,
                      msgl_stream stream);

/* index: out [num_tokens, row] contiguous, weight [num_rows, row] contiguous,
 * same dtype; ids [num_tokens] int32/int64. */
MSGL_API int32_t msgl_index(const msgl_tensor* out, const msgl_tensor* weight, const msgl_tensor* ids,
                   int64_t vocab_start, msgl_stream stream);

#endif /* !__CUDACC_RTC__ */

#ifdef __cplusplus
} /* extern "C" */
#endif

#if defined(__cplusplus) && !defined(__CUDACC_RTC__)
static_assert(sizeof(msgl_tensor) == 120, "msgl_tensor layout changed: bump MSGL_ABI_VERSION, run cargo xtask codegen");
static_assert(sizeof(msgl_store_params) == 80, "msgl_store_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_index_params) == 56, "msgl_index_params layout changed: run cargo xtask codegen");
#endif

#endif /* MINISGL_TENSOR_H */
