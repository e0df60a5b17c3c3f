/*
 * rope.cu: rotary position embedding in place, neox layout, on strided q and k.
 *
 *   for i < rotary_dim / 2, with c = cos_sin[pos][i], s = cos_sin[pos][rotary_dim / 2 + i]:
 *     x[i]                  <- x[i] * c - x[i + rotary_dim / 2] * s
 *     x[i + rotary_dim / 2] <- x[i + rotary_dim / 2] * c + x[i] * s
 *
 * Decomposition: one thread per (token, head, chunk of the first half), heads of q
 * then heads of k, over a grid-stride loop. In the vector path a chunk is one
 * 16-byte vector of each half (8 bf16/f16 pairs or 4 f32 pairs) with the matching
 * 32 or 16 bytes of cos and sin; consecutive threads take consecutive chunks of a
 * head, so every access of a warp is coalesced. The scalar path (rotary_dim / 2 not
 * a multiple of the vector, or unaligned views) takes one pair per thread.
 * The vector path's rotation is minisgl/rope_row.cuh's (rope_store's and the fused
 * decode prologue's too). Dimensions past rotary_dim are not touched; a position outside the cos/sin cache
 * leaves its token unchanged instead of reading out of bounds.
 */
#include "minisgl/rope_row.cuh" /* rope_rotate_pair */

namespace msgl {

constexpr int kRopeThreads = 256;

template <int DTYPE>
__device__ __forceinline__ void rope_impl(const msgl_rope_params& p) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int E = Vec16<DTYPE>::kElems;
  const int half = p.rotary_dim / 2;
  const int per_chunk = p.vectorized ? E : 1;
  const int chunks = half / per_chunk;
  const int heads = p.num_q_heads + p.num_k_heads;
  const long long items = p.num_tokens * heads * chunks;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < items;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int chunk = static_cast<int>(i % chunks);
    const long long rest = i / chunks;
    const int head = static_cast<int>(rest % heads);
    const long long token = rest / heads;
    const long long pos = load_index(p.positions, p.index_is_64, token);
    if (pos < 0 || pos >= p.max_positions) continue;
    T* x = head < p.num_q_heads
               ? static_cast<T*>(p.q) + token * p.q_token_stride + head * p.q_head_stride
               : static_cast<T*>(p.k) + token * p.k_token_stride + (head - p.num_q_heads) * p.k_head_stride;
    const float* cs = p.cos_sin + pos * p.rotary_dim;
    const int d = chunk * per_chunk;
    if (p.vectorized) {
      Vec16<DTYPE> a, b;
      a.load(x + d);
      b.load(x + half + d);
      rope_rotate_pair<DTYPE>(a, b, cs, half, d);
      a.store(x + d);
      b.store(x + half + d);
    } else {
      const float c = cs[d], s = cs[half + d];
      const float x1 = DType<DTYPE>::to_f32(x[d]), x2 = DType<DTYPE>::to_f32(x[half + d]);
      x[d] = DType<DTYPE>::from_f32(x1 * c - x2 * s);
      x[half + d] = DType<DTYPE>::from_f32(x2 * c + x1 * s);
    }
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 256 and any grid (grid-stride loop). */
extern "C" __global__ void __launch_bounds__(256) msgl_rope_kernel(const msgl_rope_params p) {
  msgl::rope_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(256) rope_kernel(const msgl_rope_params p) {
  rope_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_rope(const msgl_tensor* q, const msgl_tensor* k, const msgl_tensor* positions,
                             const msgl_tensor* cos_sin, int32_t vectorized, int32_t grid, msgl_stream stream) {
  using namespace msgl;
  const char* op = "rope";
  constexpr uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(q, op, "q", 3, floats));
  MSGL_TRY(expect_tensor(k, op, "k", 3, floats));
  MSGL_TRY(expect_tensor(positions, op, "positions", 1, kIndexDtypes));
  MSGL_TRY(expect_tensor(cos_sin, op, "cos_sin", 2, dtype_bit(MSGL_F32)));
  MSGL_TRY(expect_same(q, "q", k, "k", op));
  if (positions->device != q->device || cos_sin->device != q->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `positions` and `cos_sin` must be on the device of `q`", op);
  const int64_t num_tokens = q->shape[0];
  const int64_t head_dim = q->shape[2];
  MSGL_TRY(expect_dim(k, op, "k", 0, num_tokens));
  MSGL_TRY(expect_dim(k, op, "k", 2, head_dim));
  MSGL_TRY(expect_dim(positions, op, "positions", 0, num_tokens));
  MSGL_TRY(expect_contiguous(positions, op, "positions"));
  MSGL_TRY(expect_contiguous(cos_sin, op, "cos_sin"));
  const int64_t rotary_dim = cos_sin->shape[1];
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: rotary dimension %lld must be even and at most the head dimension %lld",
                     op, static_cast<long long>(rotary_dim), static_cast<long long>(head_dim));
  const int64_t elems = 16 / dtype_size(q->dtype);
  if (vectorized && (rotary_dim / 2) % elems != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the vector path needs rotary_dim / 2 to be a multiple of %lld", op,
                     static_cast<long long>(elems));
  MSGL_TRY(expect_rows(q, op, "q", vectorized ? 16 : dtype_size(q->dtype)));
  MSGL_TRY(expect_rows(k, op, "k", vectorized ? 16 : dtype_size(q->dtype)));
  MSGL_TRY(expect_rows(cos_sin, op, "cos_sin", vectorized ? 16 : 4));
  if (grid < 1) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: grid %d must be positive", op, grid);
  if (num_tokens == 0) return MSGL_OK;

  msgl_rope_params p{};
  p.q = q->data;
  p.k = k->data;
  p.positions = positions->data;
  p.cos_sin = static_cast<const float*>(cos_sin->data);
  p.num_tokens = num_tokens;
  p.q_token_stride = q->strides[0];
  p.q_head_stride = q->strides[1];
  p.k_token_stride = k->strides[0];
  p.k_head_stride = k->strides[1];
  p.max_positions = cos_sin->shape[0];
  p.num_q_heads = static_cast<int32_t>(q->shape[1]);
  p.num_k_heads = static_cast<int32_t>(k->shape[1]);
  p.rotary_dim = static_cast<int32_t>(rotary_dim);
  p.index_is_64 = positions->dtype == MSGL_I64;
  p.vectorized = vectorized;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (q->dtype) {
#define MSGL_CASE(D) \
  case D: rope_kernel<D><<<static_cast<unsigned>(grid), kRopeThreads, 0, s>>>(p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d", op, q->dtype);
  }
  return check_launch(op);
}
#endif
