/*
 * norm.cu: RMSNorm, the fused residual-add RMSNorm, and per-head RMSNorm.
 *
 *   rms_norm:            out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w
 *   fused_add_rms_norm:  s = x[r] + residual[r] in f32; residual[r] = s rounded to
 *                        the dtype; x[r] = norm(s) * w
 *   head_rms_norm:       x[t, h] = norm(x[t, h]) * w, in place on a strided view
 *
 * Decomposition: a row (one token, or one (token, head) pair) is owned by a group of
 * `threads_per_row` threads (a power of two, chosen by the host so that each thread
 * holds at most 4 16-byte vectors of the row in registers). Groups of up to 32
 * threads reduce the sum of squares with warp shuffles and share a block of 256
 * threads with other rows (so head_dim 128 rows take 4 threads each, 64 rows per
 * block); wider groups own a whole block and reduce through shared memory. Every
 * row is read once from memory (twice for the residual in the unaligned fallback)
 * and written once; accumulation is in f32.
 *
 * Rows that are not 16-byte aligned (odd hidden sizes, odd strides) take a scalar
 * fallback that loops over the row twice.
 *
 * Programmatic dependent launch: the weight does not depend on the previous
 * kernel, so the vector path loads a thread's weight vectors first, then waits for
 * the previous kernel and lets the next one launch (device.cuh: grid_prologue)
 * before touching x and the residual (nothing is written before the wait). The weight's latency then
 * overlaps the previous kernel instead of following the reduction.
 */
#include "minisgl/dtype.cuh"

namespace msgl {

constexpr int kNormMaxThreads = 512;
constexpr int kNormVecsPerThread = 4;

/* Sums `v` over the group of `width` threads (a power of two) that owns a row. */
__device__ __forceinline__ float norm_group_sum(float v, int width, float* scratch) {
  const int lanes = width < kWarpSize ? width : kWarpSize;
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2)
    if (o < lanes) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (width <= kWarpSize) return v;
  /* The group is the whole block: combine the warp sums. */
  const int warp = threadIdx.x / kWarpSize;
  const int num_warps = width / kWarpSize;
  __syncthreads(); /* scratch may still be read from a previous call */
  if (threadIdx.x % kWarpSize == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < num_warps; ++i) total += scratch[i];
  return total;
}

template <int DTYPE>
__device__ __forceinline__ void norm_impl(const msgl_norm_params& p) {
  using T = typename DType<DTYPE>::Storage;
  __shared__ float scratch[kNormMaxThreads / kWarpSize];
  const int tpr = p.threads_per_row;
  const long long row = static_cast<long long>(blockIdx.x) * p.rows_per_block + threadIdx.x / tpr;
  const int t = threadIdx.x % tpr;
  /* Threads of rows past the end stay to the end: the shuffles need the whole warp. */
  const bool valid = row < p.num_rows;
  const long long token = valid ? row / p.heads : 0;
  const long long head = valid ? row % p.heads : 0;
  T* x = static_cast<T*>(p.x) + token * p.x_token_stride + head * p.x_head_stride;
  T* out = static_cast<T*>(p.out) + token * p.out_token_stride + head * p.out_head_stride;
  T* res = p.residual != nullptr ? static_cast<T*>(p.residual) + (valid ? row : 0) * p.residual_row_stride : nullptr;
  const T* w = static_cast<const T*>(p.weight);
  const float inv_hidden = 1.f / static_cast<float>(p.hidden);

  if (p.vectorized) {
    constexpr int E = Vec16<DTYPE>::kElems;
    const int nvec = static_cast<int>(p.hidden / E);
    /* The weight, before the wait (the same for every row). */
    uint4 w_raw[kNormVecsPerThread];
#pragma unroll
    for (int j = 0; j < kNormVecsPerThread; ++j) {
      const int c = t + j * tpr;
      w_raw[j] = c < nvec ? *reinterpret_cast<const uint4*>(w + c * E) : make_uint4(0, 0, 0, 0);
    }
    grid_prologue();
    Vec16<DTYPE> v[kNormVecsPerThread];
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kNormVecsPerThread; ++j) {
      const int c = t + j * tpr;
      if (valid && c < nvec) {
        v[j].load(x + c * E);
        if (res != nullptr) {
          Vec16<DTYPE> r;
          r.load(res + c * E);
#pragma unroll
          for (int e = 0; e < E; ++e) v[j].v[e] += r.v[e];
          /* The residual is stored rounded to the dtype; the norm is taken of the f32
           * sum (as FlashInfer's fused_add_rmsnorm and the CPU reference do). */
          v[j].store(res + c * E);
        }
#pragma unroll
        for (int e = 0; e < E; ++e) sum += v[j].v[e] * v[j].v[e];
      }
    }
    sum = norm_group_sum(sum, tpr, scratch);
    const float inv_rms = rsqrtf(sum * inv_hidden + p.eps);
#pragma unroll
    for (int j = 0; j < kNormVecsPerThread; ++j) {
      const int c = t + j * tpr;
      if (valid && c < nvec) {
        Vec16<DTYPE> wv;
        wv.from_raw(w_raw[j]);
#pragma unroll
        for (int e = 0; e < E; ++e) v[j].v[e] = v[j].v[e] * inv_rms * wv.v[e];
        v[j].store(out + c * E);
      }
    }
    return;
  }

  /* Scalar fallback: two passes over the row. */
  grid_prologue();
  float sum = 0.f;
  if (valid) {
    for (long long c = t; c < p.hidden; c += tpr) {
      float v = DType<DTYPE>::to_f32(x[c]);
      if (res != nullptr) {
        v += DType<DTYPE>::to_f32(res[c]);
        res[c] = DType<DTYPE>::from_f32(v);
      }
      sum += v * v;
    }
  }
  sum = norm_group_sum(sum, tpr, scratch);
  const float inv_rms = rsqrtf(sum * inv_hidden + p.eps);
  if (valid) {
    for (long long c = t; c < p.hidden; c += tpr) {
      /* The second pass reads the sum back from the residual, so here (unlike the
       * vector path) 16-bit rows normalise the rounded sum: within a rounding. */
      const float v = DType<DTYPE>::to_f32(res != nullptr ? res[c] : x[c]);
      out[c] = DType<DTYPE>::from_f32(v * inv_rms * DType<DTYPE>::to_f32(w[c]));
    }
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = threads_per_row * rows_per_block and grid = ceil(num_rows / rows_per_block). */
extern "C" __global__ void __launch_bounds__(512) msgl_norm_kernel(const msgl_norm_params p) {
  msgl::norm_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(512) norm_kernel(const msgl_norm_params p) {
  norm_impl<DTYPE>(p);
}

/* Checks the launch shape Rust chose and launches. */
static int32_t launch_norm(const char* op, msgl_norm_params& p, int32_t dtype, int32_t threads_per_row,
                           int32_t rows_per_block, int32_t vectorized, msgl_stream stream) {
  const bool pow2 = threads_per_row > 0 && (threads_per_row & (threads_per_row - 1)) == 0;
  if (!pow2 || threads_per_row > kNormMaxThreads || rows_per_block < 1 ||
      static_cast<int64_t>(threads_per_row) * rows_per_block > kNormMaxThreads ||
      (threads_per_row > kWarpSize && rows_per_block != 1))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: bad launch shape: %d threads per row, %d rows per block", op,
                     threads_per_row, rows_per_block);
  const int64_t elems = 16 / dtype_size(dtype);
  if (vectorized && (p.hidden % elems != 0 || p.hidden / elems > static_cast<int64_t>(threads_per_row) * kNormVecsPerThread))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %d threads per row cannot hold a row of %lld elements in registers",
                     op, threads_per_row, static_cast<long long>(p.hidden));
  p.threads_per_row = threads_per_row;
  p.rows_per_block = rows_per_block;
  p.vectorized = vectorized;
  if (p.num_rows == 0) return MSGL_OK;
  const dim3 grid(static_cast<unsigned>((p.num_rows + rows_per_block - 1) / rows_per_block));
  const dim3 block(static_cast<unsigned>(threads_per_row * rows_per_block));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
#define MSGL_CASE(D) \
  case D: (void)launch_pdl(norm_kernel<D>, grid, block, 0, s, p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d", op, dtype);
  }
  return check_launch(op);
}

constexpr uint32_t kFloatDtypes = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);

/* Alignment the vector path needs: 16 bytes for the data pointer and every stride. */
static int32_t expect_vector_rows(const msgl_tensor* t, const char* op, const char* name, int32_t vectorized) {
  return expect_rows(t, op, name, vectorized ? 16 : dtype_size(t->dtype));
}
}  // namespace msgl

extern "C" int32_t msgl_rms_norm(const msgl_tensor* out, const msgl_tensor* x, const msgl_tensor* weight, float eps,
                                 int32_t threads_per_row, int32_t rows_per_block, int32_t vectorized,
                                 msgl_stream stream) {
  using namespace msgl;
  const char* op = "rms_norm";
  MSGL_TRY(expect_tensor(out, op, "out", 2, kFloatDtypes));
  MSGL_TRY(expect_tensor(x, op, "x", 2, kFloatDtypes));
  MSGL_TRY(expect_tensor(weight, op, "weight", 1, kFloatDtypes));
  MSGL_TRY(expect_same(x, "x", out, "out", op));
  MSGL_TRY(expect_same(x, "x", weight, "weight", op));
  MSGL_TRY(expect_dim(out, op, "out", 0, x->shape[0]));
  MSGL_TRY(expect_dim(out, op, "out", 1, x->shape[1]));
  MSGL_TRY(expect_dim(weight, op, "weight", 0, x->shape[1]));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  MSGL_TRY(expect_contiguous(weight, op, "weight"));
  MSGL_TRY(expect_vector_rows(x, op, "x", vectorized));
  MSGL_TRY(expect_vector_rows(out, op, "out", vectorized));
  MSGL_TRY(expect_vector_rows(weight, op, "weight", vectorized));
  msgl_norm_params p{};
  p.out = out->data;
  p.x = x->data;
  p.weight = weight->data;
  p.num_rows = x->shape[0];
  p.hidden = x->shape[1];
  p.heads = 1;
  p.x_token_stride = x->strides[0];
  p.out_token_stride = out->strides[0];
  p.eps = eps;
  return launch_norm(op, p, x->dtype, threads_per_row, rows_per_block, vectorized, stream);
}

extern "C" int32_t msgl_fused_add_rms_norm(const msgl_tensor* x, const msgl_tensor* residual,
                                           const msgl_tensor* weight, float eps, int32_t threads_per_row,
                                           int32_t rows_per_block, int32_t vectorized, msgl_stream stream) {
  using namespace msgl;
  const char* op = "fused_add_rms_norm";
  MSGL_TRY(expect_tensor(x, op, "x", 2, kFloatDtypes));
  MSGL_TRY(expect_tensor(residual, op, "residual", 2, kFloatDtypes));
  MSGL_TRY(expect_tensor(weight, op, "weight", 1, kFloatDtypes));
  MSGL_TRY(expect_same(x, "x", residual, "residual", op));
  MSGL_TRY(expect_same(x, "x", weight, "weight", op));
  MSGL_TRY(expect_dim(residual, op, "residual", 0, x->shape[0]));
  MSGL_TRY(expect_dim(residual, op, "residual", 1, x->shape[1]));
  MSGL_TRY(expect_dim(weight, op, "weight", 0, x->shape[1]));
  MSGL_TRY(expect_contiguous(weight, op, "weight"));
  MSGL_TRY(expect_vector_rows(x, op, "x", vectorized));
  MSGL_TRY(expect_vector_rows(residual, op, "residual", vectorized));
  MSGL_TRY(expect_vector_rows(weight, op, "weight", vectorized));
  msgl_norm_params p{};
  p.out = x->data;
  p.x = x->data;
  p.residual = residual->data;
  p.weight = weight->data;
  p.num_rows = x->shape[0];
  p.hidden = x->shape[1];
  p.heads = 1;
  p.x_token_stride = x->strides[0];
  p.out_token_stride = x->strides[0];
  p.residual_row_stride = residual->strides[0];
  p.eps = eps;
  return launch_norm(op, p, x->dtype, threads_per_row, rows_per_block, vectorized, stream);
}

extern "C" int32_t msgl_head_rms_norm(const msgl_tensor* x, const msgl_tensor* weight, float eps,
                                      int32_t threads_per_row, int32_t rows_per_block, int32_t vectorized,
                                      msgl_stream stream) {
  using namespace msgl;
  const char* op = "head_rms_norm";
  MSGL_TRY(expect_tensor(x, op, "x", 3, kFloatDtypes));
  MSGL_TRY(expect_tensor(weight, op, "weight", 1, kFloatDtypes));
  MSGL_TRY(expect_same(x, "x", weight, "weight", op));
  MSGL_TRY(expect_dim(weight, op, "weight", 0, x->shape[2]));
  MSGL_TRY(expect_contiguous(weight, op, "weight"));
  MSGL_TRY(expect_vector_rows(x, op, "x", vectorized));
  MSGL_TRY(expect_vector_rows(weight, op, "weight", vectorized));
  msgl_norm_params p{};
  p.out = x->data;
  p.x = x->data;
  p.weight = weight->data;
  p.num_rows = x->shape[0] * x->shape[1];
  p.hidden = x->shape[2];
  p.heads = x->shape[1] > 0 ? x->shape[1] : 1;
  p.x_token_stride = x->strides[0];
  p.x_head_stride = x->strides[1];
  p.out_token_stride = x->strides[0];
  p.out_head_stride = x->strides[1];
  p.eps = eps;
  return launch_norm(op, p, x->dtype, threads_per_row, rows_per_block, vectorized, stream);
}
#endif
