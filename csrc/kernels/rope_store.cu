/*
 * rope_store.cu: the attention prologue of a layer in one launch: per-head
 * RMSNorm of q and k (Qwen3's q_norm / k_norm, optional), rotary embedding (neox
 * layout, as rope.cu) and the KV store into the paged caches (as store.cu).
 *
 *   q[t, h]              <- rope(norm(q[t, h]) * q_weight)   in place
 *   k_cache[out_loc[t], h] = rope(norm(k[t, h]) * k_weight)  (k is only read)
 *   v_cache[out_loc[t], h] = v[t, h]
 *
 * Unfused this is four launches (q norm, k norm, rope, store) that each move a
 * few hundred kilobytes at decode sizes and so cost their launch latency, and the
 * normalised q and k make a round trip through memory; here every head is read
 * once and written once, in f32 with one rounding at the end (so 16-bit results
 * may differ from the unfused sequence by that one rounding of the intermediate).
 *
 * Decomposition: one group of `threads_per_head` threads (a power of two, at
 * most 32, aligned in its warp) per (token, head) row, rows in the order q heads,
 * k heads, v heads of each token, 256 threads a block. In the vector path a
 * thread holds at most kRopeRowUnits "units" in registers: a unit is a pair of
 * 16-byte vectors rotated together (vector u of the first rotary half and vector
 * u of the second), or one vector past rotary_dim (partial rotary); the group
 * reduces the sum of squares with shuffles over its own lanes only (rows of one
 * warp may take different branches: v rows do not reduce); that row math is
 * minisgl/rope_row.cuh's, which the decode attention's fused prologue shares, so
 * the two give the same bits. The scalar path
 * (unaligned views, or halves that are not whole vectors) takes one element per
 * unit and reads the row twice (once for the sum, once to write).
 *
 * Programmatic dependent launch: the q/k norm weights do not depend on the
 * previous kernel, so the vector path loads a thread's weight vectors first, then
 * waits for the previous one (the QKV projection) and lets the next launch
 * (device.cuh: grid_prologue) before reading q, k, v, the positions and the slots; nothing is
 * written before the wait.
 */
#include "minisgl/rope_row.cuh"

namespace msgl {

constexpr int kRopeStoreThreads = 256;

template <int DTYPE>
__device__ __forceinline__ void rope_store_impl(const msgl_rope_store_params& p) {
  using T = typename DType<DTYPE>::Storage;
  const int G = p.threads_per_head;
  const int hq = p.num_q_heads, hkv = p.num_kv_heads, d = p.head_dim;
  const int heads = hq + 2 * hkv;
  const long long row = static_cast<long long>(blockIdx.x) * (kRopeStoreThreads / G) + threadIdx.x / G;
  const int t = static_cast<int>(threadIdx.x % G);
  /* The whole group leaves together, so the group shuffles stay complete. */
  if (row >= p.num_tokens * heads) return;
  const long long token = row / heads;
  const int head = static_cast<int>(row % heads);
  const bool is_q = head < hq;
  const bool is_v = head >= hq + hkv;
  const int kv_head = is_v ? head - hq - hkv : head - hq;
  const T* w = is_v ? nullptr : static_cast<const T*>(is_q ? p.q_weight : p.k_weight);
  const int rdim = p.rotary_dim;
  const int half = rdim / 2;

  /* The norm weight vectors of this thread's units (vector path), before the wait. */
  const RopeRowWeights weights =
      rope_row_weights<DTYPE>(p.vectorized ? w : nullptr, d, rdim, t, G);
  grid_prologue_launch_first(p.launch_first != 0);

  long long slot = 0;
  if (!is_q) {
    slot = load_index(p.out_loc, p.out_loc_is_64, token);
    if (slot < 0 || slot >= p.num_slots) return; /* as store.cu: never write outside the cache */
  }
  if (is_v) {
    const T* src = static_cast<const T*>(p.v) + token * p.v_token_stride + kv_head * p.v_head_stride;
    T* dst = static_cast<T*>(p.v_cache) + (slot * hkv + kv_head) * d;
    if (p.vectorized) {
      constexpr int E = Vec16<DTYPE>::kElems;
      for (int c = t; c < d / E; c += G) reinterpret_cast<uint4*>(dst)[c] = reinterpret_cast<const uint4*>(src)[c];
    } else {
      for (int c = t; c < d; c += G) dst[c] = src[c];
    }
    return;
  }

  const T* src = is_q ? static_cast<const T*>(p.q) + token * p.q_token_stride + head * p.q_head_stride
                      : static_cast<const T*>(p.k) + token * p.k_token_stride + kv_head * p.k_head_stride;
  T* dst = is_q ? static_cast<T*>(p.q) + token * p.q_token_stride + head * p.q_head_stride
                : static_cast<T*>(p.k_cache) + (slot * hkv + kv_head) * d;
  const long long pos = load_index(p.positions, p.positions_is_64, token);
  const bool rotate = pos >= 0 && pos < p.max_positions;
  const float* cs = p.cos_sin + (rotate ? pos : 0) * rdim;
  const float inv_d = 1.f / static_cast<float>(d);

  if (p.vectorized) {
    rope_row_apply<DTYPE>(src, dst, w != nullptr, weights, rotate ? cs : nullptr, d, rdim, p.eps, t, G);
    return;
  }

  /* Scalar path. Every element belongs to one unit of one thread, and the group
   * sum orders every read of the first pass before any write of the second, so q
   * can be rewritten in place. */
  float inv_rms = 1.f;
  if (w != nullptr) {
    float sum = 0.f;
    for (int c = t; c < d; c += G) {
      const float x = DType<DTYPE>::to_f32(src[c]);
      sum += x * x;
    }
    inv_rms = rsqrtf(rope_row_group_sum(sum, G) * inv_d + p.eps);
  }
  for (int u = t; u < half; u += G) {
    float x1 = DType<DTYPE>::to_f32(src[u]), x2 = DType<DTYPE>::to_f32(src[half + u]);
    if (w != nullptr) {
      x1 = x1 * inv_rms * DType<DTYPE>::to_f32(w[u]);
      x2 = x2 * inv_rms * DType<DTYPE>::to_f32(w[half + u]);
    }
    if (rotate) {
      const float c = cs[u], s = cs[half + u];
      const float r1 = x1 * c - x2 * s, r2 = x2 * c + x1 * s;
      x1 = r1, x2 = r2;
    }
    dst[u] = DType<DTYPE>::from_f32(x1);
    dst[half + u] = DType<DTYPE>::from_f32(x2);
  }
  for (int c = rdim + t; c < d; c += G) {
    float x = DType<DTYPE>::to_f32(src[c]);
    if (w != nullptr) x = x * inv_rms * DType<DTYPE>::to_f32(w[c]);
    dst[c] = DType<DTYPE>::from_f32(x);
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 256 and grid = ceil(num_tokens * (hq + 2 hkv) / (256 / threads_per_head)). */
extern "C" __global__ void __launch_bounds__(256) msgl_rope_store_kernel(const msgl_rope_store_params p) {
  msgl::rope_store_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(256) rope_store_kernel(const msgl_rope_store_params p) {
  rope_store_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_rope_store(const msgl_tensor* q, const msgl_tensor* k, const msgl_tensor* v,
                                   const msgl_tensor* k_cache, const msgl_tensor* v_cache,
                                   const msgl_tensor* positions, const msgl_tensor* out_loc,
                                   const msgl_tensor* cos_sin, const msgl_tensor* q_weight,
                                   const msgl_tensor* k_weight, float eps, int32_t threads_per_head,
                                   int32_t vectorized, int32_t launch_first, msgl_stream stream) {
  using namespace msgl;
  const char* op = "rope_store";
  constexpr uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(q, op, "q", 3, floats));
  MSGL_TRY(expect_tensor(k, op, "k", 3, floats));
  MSGL_TRY(expect_tensor(v, op, "v", 3, floats));
  MSGL_TRY(expect_tensor(k_cache, op, "k_cache", 3, floats));
  MSGL_TRY(expect_tensor(v_cache, op, "v_cache", 3, floats));
  MSGL_TRY(expect_tensor(positions, op, "positions", 1, kIndexDtypes));
  MSGL_TRY(expect_tensor(out_loc, op, "out_loc", 1, kIndexDtypes));
  MSGL_TRY(expect_tensor(cos_sin, op, "cos_sin", 2, dtype_bit(MSGL_F32)));
  MSGL_TRY(expect_same(q, "q", k, "k", op));
  MSGL_TRY(expect_same(q, "q", v, "v", op));
  MSGL_TRY(expect_same(q, "q", k_cache, "k_cache", op));
  MSGL_TRY(expect_same(q, "q", v_cache, "v_cache", op));
  if (positions->device != q->device || out_loc->device != q->device || cos_sin->device != q->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `positions`, `out_loc` and `cos_sin` must be on the device of `q`", op);
  if ((q_weight == nullptr) != (k_weight == nullptr))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `q_weight` and `k_weight` must be given together", op);
  const int64_t num_tokens = q->shape[0];
  const int64_t hkv = k->shape[1];
  const int64_t head_dim = q->shape[2];
  for (const msgl_tensor* t : {k, v}) {
    MSGL_TRY(expect_dim(t, op, t == k ? "k" : "v", 0, num_tokens));
    MSGL_TRY(expect_dim(t, op, t == k ? "k" : "v", 1, hkv));
    MSGL_TRY(expect_dim(t, op, t == k ? "k" : "v", 2, head_dim));
  }
  for (const msgl_tensor* t : {k_cache, v_cache}) {
    const char* name = t == k_cache ? "k_cache" : "v_cache";
    MSGL_TRY(expect_dim(t, op, name, 0, k_cache->shape[0]));
    MSGL_TRY(expect_dim(t, op, name, 1, hkv));
    MSGL_TRY(expect_dim(t, op, name, 2, head_dim));
    MSGL_TRY(expect_contiguous(t, op, name));
  }
  MSGL_TRY(expect_dim(positions, op, "positions", 0, num_tokens));
  MSGL_TRY(expect_dim(out_loc, op, "out_loc", 0, num_tokens));
  MSGL_TRY(expect_contiguous(positions, op, "positions"));
  MSGL_TRY(expect_contiguous(out_loc, op, "out_loc"));
  MSGL_TRY(expect_contiguous(cos_sin, op, "cos_sin"));
  const int64_t rotary_dim = cos_sin->shape[1];
  if (rotary_dim <= 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: rotary dimension %lld must be even and at most the head dimension %lld",
                     op, static_cast<long long>(rotary_dim), static_cast<long long>(head_dim));
  const bool pow2 = threads_per_head > 0 && threads_per_head <= kWarpSize && (threads_per_head & (threads_per_head - 1)) == 0;
  if (!pow2) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: bad launch shape: %d threads per head", op, threads_per_head);
  const int64_t elems = 16 / dtype_size(q->dtype);
  if (vectorized) {
    const int64_t units = rotary_dim / 2 / elems + (head_dim - rotary_dim) / elems;
    if ((rotary_dim / 2) % elems != 0 || head_dim % elems != 0 || units > int64_t{threads_per_head} * kRopeRowUnits)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the vector path cannot hold heads of %lld (rotary %lld) in %d threads",
                       op, static_cast<long long>(head_dim), static_cast<long long>(rotary_dim), threads_per_head);
  }
  const int64_t align = vectorized ? 16 : dtype_size(q->dtype);
  MSGL_TRY(expect_rows(q, op, "q", align));
  MSGL_TRY(expect_rows(k, op, "k", align));
  MSGL_TRY(expect_rows(v, op, "v", align));
  MSGL_TRY(expect_rows(k_cache, op, "k_cache", align));
  MSGL_TRY(expect_rows(v_cache, op, "v_cache", align));
  MSGL_TRY(expect_rows(cos_sin, op, "cos_sin", vectorized ? 16 : 4));
  if (q_weight != nullptr) {
    for (const msgl_tensor* t : {q_weight, k_weight}) {
      const char* name = t == q_weight ? "q_weight" : "k_weight";
      MSGL_TRY(expect_tensor(t, op, name, 1, floats));
      MSGL_TRY(expect_same(q, "q", t, name, op));
      MSGL_TRY(expect_dim(t, op, name, 0, head_dim));
      MSGL_TRY(expect_rows(t, op, name, align));
    }
  }
  if (num_tokens == 0) return MSGL_OK;

  msgl_rope_store_params p{};
  p.q = q->data;
  p.k = k->data;
  p.v = v->data;
  p.k_cache = k_cache->data;
  p.v_cache = v_cache->data;
  p.positions = positions->data;
  p.out_loc = out_loc->data;
  p.cos_sin = static_cast<const float*>(cos_sin->data);
  p.q_weight = q_weight != nullptr ? q_weight->data : nullptr;
  p.k_weight = k_weight != nullptr ? k_weight->data : nullptr;
  p.num_tokens = num_tokens;
  p.q_token_stride = q->strides[0];
  p.q_head_stride = q->strides[1];
  p.k_token_stride = k->strides[0];
  p.k_head_stride = k->strides[1];
  p.v_token_stride = v->strides[0];
  p.v_head_stride = v->strides[1];
  p.max_positions = cos_sin->shape[0];
  p.num_slots = k_cache->shape[0];
  p.num_q_heads = static_cast<int32_t>(q->shape[1]);
  p.num_kv_heads = static_cast<int32_t>(hkv);
  p.head_dim = static_cast<int32_t>(head_dim);
  p.rotary_dim = static_cast<int32_t>(rotary_dim);
  p.positions_is_64 = positions->dtype == MSGL_I64;
  p.out_loc_is_64 = out_loc->dtype == MSGL_I64;
  p.threads_per_head = threads_per_head;
  p.vectorized = vectorized;
  p.eps = eps;
  p.launch_first = launch_first != 0;
  const int64_t rows = num_tokens * (q->shape[1] + 2 * hkv);
  const int64_t rows_per_block = kRopeStoreThreads / threads_per_head;
  const dim3 grid(static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (q->dtype) {
#define MSGL_CASE(D) \
  case D: (void)launch_pdl(rope_store_kernel<D>, grid, dim3(kRopeStoreThreads), 0, s, p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d", op, q->dtype);
  }
  return check_launch(op);
}
#endif
