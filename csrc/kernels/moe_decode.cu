/*
 * moe_decode.cu: the experts of a mixture-of-experts layer for a decode step of a
 * few tokens, as weight streams (GEMV) per (token, expert) pair, without the sort:
 *
 *   GATE_UP = 1  act[p, j] = silu(x_t . Wg[e, j]) * (x_t . Wu[e, j]),  p = t * top_k + s, e = ids[p]
 *   GATE_UP = 0  out[t, j] = sum_{s < top_k} w[t, s] (act[t * top_k + s] . Wd[e, j])
 *
 * W[e] is expert e's [n_w, k] matrix (the HF Linear layout; the gate_up matrix
 * holds the gate rows, then the up rows). Pairs whose expert id lies outside the
 * experts are skipped (their act rows are never written nor read).
 *
 * Why. At one to a few tokens a step, the grouped GEMMs of moe_gemm.cu run 16-row
 * tensor-core tiles that are 1/16 full, behind moe_align's sort, and a third
 * kernel sums the top-k rows: at Qwen3-30B-A3B's shapes and one token that is ~40
 * us a layer for 75 MB of expert weights (an 18 us stream). Here every weight
 * row is read once with 16-byte loads straight from the routing (no sort), the
 * SiLU-and-mul is fused into the gate_up pass and the weighted top-k sum into
 * the down pass, so a layer's experts are two launches that stream the touched
 * weights. Tokens that share an expert read its rows once each: the path is for
 * batches small enough that they rarely do (the host's rule, gpu/moe.rs).
 *
 * Decomposition: a block of 4 warps owns `cols_per_block` output columns of one
 * pair (gate_up) or one token (down); a warp takes 2 columns at a time and its
 * lanes stride over the row's 16-byte vectors, U vectors of each row in flight
 * before the multiply-adds (gate_up: the gate and up rows of both columns, 16
 * loads a lane; down: the top_k rows of both columns, items (slot, vector) in
 * slot order). The activation row (x or act) is read through L1 by every warp of
 * the block. Sums are f32: a lane's partial dot products (weighted by the
 * routing weight in the down pass), then the warp's xor-shuffle tree; one
 * rounding to the dtype at the end. Deterministic: no atomics, fixed orders.
 *
 * Programmatic dependent launch (pdl = 1): the gate_up pass waits for the router
 * before reading ids; the down pass reads ids and weights (the router's, two
 * kernels back: device.cuh's guarantee) and asks L2 for its first columns'
 * weight rows before waiting for the gate_up pass.
 *
 * The down pass by the copy engine (bulk = 1, sm_90; the host's rule,
 * gpu/moe.rs): its routing is known before the wait, so the block's whole weight
 * set (top_k x cols_per_block rows of k elements, 96 KiB at Qwen3-30B-A3B's
 * shapes) is copied into shared memory by thread 0 before the wait, one
 * cp.async.bulk a row on one transaction barrier, instead of a hint to L2 and
 * three register round trips after it; after the wait the block stages the
 * token's act rows (one round trip) and computes from shared memory. Same
 * products, same order, same bits as the register path. Off by default: in the
 * 30B's step its 108 KiB blocks become resident only as gate_up's leave, so the
 * bytes the register path's L2 hints fetch during gate_up are copied after it
 * (+5% a step, docs/PERF.md, eighteenth session).
 *
 * Instance parameters: DTYPE (bf16 or f16), GATE_UP (1: gate_up + SiLU-and-mul,
 * 0: down + weighted sum). k and n are multiples of 8 (16-byte rows).
 */
#include "minisgl/bulk.cuh"

namespace msgl {

constexpr int kMoeDecodeWarps = 4;
constexpr int kMoeDecodeThreads = kMoeDecodeWarps * kWarpSize;
/* Output columns a warp computes side by side. */
constexpr int kMoeDecodeCols = 2;
/* 16-byte vectors of each row a lane has in flight. */
constexpr int kMoeDecodeUnroll = 4;

template <int DTYPE>
__device__ __forceinline__ float moe_decode_dot(const uint4& w, const uint4& a) {
  Vec16<DTYPE> wv, av;
  wv.from_raw(w);
  av.from_raw(a);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < Vec16<DTYPE>::kElems; ++i) s = fmaf(wv.v[i], av.v[i], s);
  return s;
}

__device__ __forceinline__ float moe_decode_warp_sum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ uint4 moe_decode_load(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}

/* gate_up: act[pair, c] for this block's columns, U vectors of each row a lane in
 * flight (a lane's vectors lane, lane + 32, ... in that order whatever U). */
template <int DTYPE, int U>
__device__ __forceinline__ void moe_decode_gate_up(const msgl_moe_decode_params& p) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int E = Vec16<DTYPE>::kElems;
  constexpr int C = kMoeDecodeCols;
  const int col_blocks = (p.n + p.cols_per_block - 1) / p.cols_per_block;
  const long long pair = blockIdx.x / col_blocks;
  const int col_begin = static_cast<int>(blockIdx.x % col_blocks) * p.cols_per_block;
  const int col_end = min(p.n, col_begin + p.cols_per_block);
  grid_prologue(); /* the router's ids and the layer's input */
  if (pair >= p.num_tokens * p.top_k) return;
  const int e = p.topk_ids[pair];
  if (e < 0 || e >= p.num_experts) return;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int kv = p.k / E;
  const T* x = static_cast<const T*>(p.a) + (pair / p.top_k) * p.a_stride;
  const T* we = static_cast<const T*>(p.w) + static_cast<long long>(e) * 2 * p.n * p.k;
  T* act = static_cast<T*>(p.out) + pair * p.out_stride;
  for (int c = col_begin + warp * C; c < col_end; c += kMoeDecodeWarps * C) {
    float g[C], u[C];
#pragma unroll
    for (int j = 0; j < C; ++j) g[j] = u[j] = 0.f;
    /* Loads from clamped addresses, unconditionally (so that the compiler issues
     * all of them before the first multiply-add); out-of-range ones count zero. */
    int cols[C];
#pragma unroll
    for (int j = 0; j < C; ++j) cols[j] = min(c + j, col_end - 1);
    for (int v0 = lane; v0 < kv; v0 += kWarpSize * U) {
      uint4 wg[C][U], wu[C][U], xa[U];
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int v = min(v0 + i * kWarpSize, kv - 1);
#pragma unroll
        for (int j = 0; j < C; ++j) {
          wg[j][i] = moe_decode_load(we + static_cast<long long>(cols[j]) * p.k + v * E);
          wu[j][i] = moe_decode_load(we + static_cast<long long>(p.n + cols[j]) * p.k + v * E);
        }
        xa[i] = moe_decode_load(x + v * E);
      }
#pragma unroll
      for (int i = 0; i < U; ++i) {
        if (v0 + i * kWarpSize < kv) {
#pragma unroll
          for (int j = 0; j < C; ++j) {
            g[j] += moe_decode_dot<DTYPE>(wg[j][i], xa[i]);
            u[j] += moe_decode_dot<DTYPE>(wu[j][i], xa[i]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const float gs = moe_decode_warp_sum(g[j]), us = moe_decode_warp_sum(u[j]);
      if (lane == 0 && c + j < col_end) act[c + j] = DType<DTYPE>::from_f32(silu_f32(gs) * us);
    }
  }
}

/* down: out[token, c] = the weighted sum over the token's slots, for this block's columns. */
template <int DTYPE>
__device__ __forceinline__ void moe_decode_down(const msgl_moe_decode_params& p) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int E = Vec16<DTYPE>::kElems;
  constexpr int U = kMoeDecodeUnroll * 2, C = kMoeDecodeCols;
  __shared__ int s_expert[MSGL_MOE_MAX_TOP_K];
  __shared__ float s_weight[MSGL_MOE_MAX_TOP_K];
  const int col_blocks = (p.n + p.cols_per_block - 1) / p.cols_per_block;
  const long long token = blockIdx.x / col_blocks;
  const int col_begin = static_cast<int>(blockIdx.x % col_blocks) * p.cols_per_block;
  const int col_end = min(p.n, col_begin + p.cols_per_block);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int kv = p.k / E;
  const int per_lane = (kv + kWarpSize - 1) / kWarpSize; /* vectors of a row a lane reads */
  const int items = p.top_k * per_lane;
  const T* wd = static_cast<const T*>(p.w);
  const bool live = token < p.num_tokens;
  /* The routing is two kernels back (the router, then gate_up): readable before the wait. */
  if (live && threadIdx.x < p.top_k) {
    const long long pair = token * p.top_k + threadIdx.x;
    const int e = p.topk_ids[pair];
    s_expert[threadIdx.x] = e >= 0 && e < p.num_experts ? e : -1;
    s_weight[threadIdx.x] = p.topk_weights[pair];
  }
  __syncthreads();
  /* Ask L2 for this warp's first columns' rows while the gate_up pass finishes. */
  if (live) {
    for (int it = lane; it < p.top_k * C; it += kWarpSize) {
      const int s = it / C, c = col_begin + warp * C + it % C;
      if (s_expert[s] >= 0 && c < col_end) {
        const T* row = wd + (static_cast<long long>(s_expert[s]) * p.n + c) * p.k;
        for (int off = 0; off < p.k; off += 128 / static_cast<int>(sizeof(T)))
          asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
      }
    }
  }
  grid_prologue(); /* the gate_up pass's act rows */
  if (!live) return;
  const T* act = static_cast<const T*>(p.a) + token * p.top_k * p.a_stride;
  T* out = static_cast<T*>(p.out) + token * p.out_stride;
  for (int c = col_begin + warp * C; c < col_end; c += kMoeDecodeWarps * C) {
    float acc[C];
#pragma unroll
    for (int j = 0; j < C; ++j) acc[j] = 0.f;
    int cols[C];
#pragma unroll
    for (int j = 0; j < C; ++j) cols[j] = min(c + j, col_end - 1);
    for (int it0 = 0; it0 < items; it0 += U) {
      uint4 wv[C][U], av[U];
      float f[U];
      /* Clamped addresses, unconditional loads (see the gate_up pass); an item past
       * the row, of a dropped pair or past the slots weighs zero. */
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int it = min(it0 + i, items - 1);
        const int s = it / per_lane, vr = lane + (it % per_lane) * kWarpSize;
        const int v = min(vr, kv - 1);
        const int e = s_expert[s];
        f[i] = it0 + i < items && e >= 0 && vr < kv ? s_weight[s] : 0.f;
        const int ec = e >= 0 ? e : 0;
        av[i] = moe_decode_load(act + s * p.a_stride + v * E);
#pragma unroll
        for (int j = 0; j < C; ++j) wv[j][i] = moe_decode_load(wd + (static_cast<long long>(ec) * p.n + cols[j]) * p.k + v * E);
      }
#pragma unroll
      for (int i = 0; i < U; ++i) {
        if (f[i] != 0.f) {
#pragma unroll
          for (int j = 0; j < C; ++j) acc[j] = fmaf(f[i], moe_decode_dot<DTYPE>(wv[j][i], av[i]), acc[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const float total = moe_decode_warp_sum(acc[j]);
      if (lane == 0 && c + j < col_end) out[c + j] = DType<DTYPE>::from_f32(total);
    }
  }
}

/* down with the block's weight rows staged by the copy engine before the wait
 * (bulk = 1): shared memory holds row (s, c) of expert s_expert[s], column c, at
 * (s * cols_per_block + c - col_begin) * k elements, then the token's top_k act
 * rows. The products and their order are moe_decode_down's: per lane, slot by
 * slot, its vectors lane, lane + 32, ...; an item of a dropped pair or of a zero
 * weight is skipped as there. */
template <int DTYPE>
__device__ __forceinline__ void moe_decode_down_bulk(const msgl_moe_decode_params& p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using T = typename DType<DTYPE>::Storage;
  constexpr int E = Vec16<DTYPE>::kElems, C = kMoeDecodeCols;
  __shared__ int s_expert[MSGL_MOE_MAX_TOP_K];
  __shared__ float s_weight[MSGL_MOE_MAX_TOP_K];
  __shared__ __align__(8) unsigned long long bar;
  extern __shared__ __align__(16) unsigned char moe_decode_smem[];
  const int col_blocks = (p.n + p.cols_per_block - 1) / p.cols_per_block;
  const long long token = blockIdx.x / col_blocks;
  const int col_begin = static_cast<int>(blockIdx.x % col_blocks) * p.cols_per_block;
  const int col_end = min(p.n, col_begin + p.cols_per_block);
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int kv = p.k / E;
  const unsigned row_bytes = static_cast<unsigned>(p.k) * sizeof(T);
  const bool live = token < p.num_tokens;
  /* The routing is two kernels back (the router, then gate_up): readable before the wait. */
  if (live && tid < p.top_k) {
    const long long pair = token * p.top_k + tid;
    const int e = p.topk_ids[pair];
    s_expert[tid] = e >= 0 && e < p.num_experts ? e : -1;
    s_weight[tid] = p.topk_weights[pair];
  }
  if (tid == 0) {
    mbar_init(&bar, 1);
    mbar_init_fence();
  }
  __syncthreads();
  if (live && tid == 0) {
    unsigned bytes = 0;
    for (int s = 0; s < p.top_k; ++s)
      if (s_expert[s] >= 0) bytes += static_cast<unsigned>(col_end - col_begin) * row_bytes;
    mbar_arrive_expect_tx(&bar, bytes);
    const unsigned char* wd = static_cast<const unsigned char*>(p.w);
    for (int s = 0; s < p.top_k; ++s) {
      if (s_expert[s] < 0) continue;
      for (int c = col_begin; c < col_end; ++c)
        bulk_copy_g2s(moe_decode_smem + static_cast<long long>(s * p.cols_per_block + c - col_begin) * row_bytes,
                      wd + (static_cast<long long>(s_expert[s]) * p.n + c) * row_bytes, row_bytes, &bar);
    }
  }
  grid_prologue(); /* the gate_up pass's act rows */
  if (!live) return;
  /* The token's act rows, after the weight rows: one round trip for the block. */
  unsigned char* act_smem = moe_decode_smem + static_cast<long long>(p.top_k) * p.cols_per_block * row_bytes;
  const T* act = static_cast<const T*>(p.a) + token * p.top_k * p.a_stride;
  for (int i = tid; i < p.top_k * kv; i += kMoeDecodeThreads) {
    const int s = i / kv, v = i % kv;
    reinterpret_cast<uint4*>(act_smem + static_cast<long long>(s) * row_bytes)[v] =
        moe_decode_load(act + s * p.a_stride + v * E);
  }
  __syncthreads();
  mbar_wait(&bar, 0);
  T* out = static_cast<T*>(p.out) + token * p.out_stride;
  for (int c = col_begin + warp * C; c < col_end; c += kMoeDecodeWarps * C) {
    float acc[C];
#pragma unroll
    for (int j = 0; j < C; ++j) acc[j] = 0.f;
    for (int s = 0; s < p.top_k; ++s) {
      const float f = s_weight[s];
      if (s_expert[s] < 0 || f == 0.f) continue;
      const uint4* arow = reinterpret_cast<const uint4*>(act_smem + static_cast<long long>(s) * row_bytes);
      const unsigned char* wrow = moe_decode_smem + static_cast<long long>(s * p.cols_per_block + c - col_begin) * row_bytes;
      for (int v = lane; v < kv; v += kWarpSize) {
        const uint4 av = arow[v];
#pragma unroll
        for (int j = 0; j < C; ++j) {
          if (c + j < col_end)
            acc[j] = fmaf(f, moe_decode_dot<DTYPE>(reinterpret_cast<const uint4*>(wrow + j * row_bytes)[v], av), acc[j]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < C; ++j) {
      const float total = moe_decode_warp_sum(acc[j]);
      if (lane == 0 && c + j < col_end) out[c + j] = DType<DTYPE>::from_f32(total);
    }
  }
#else
  __trap(); /* the host asks for the bulk path on sm_90 only */
#endif
}

template <int DTYPE, int GATE_UP>
__device__ __forceinline__ void moe_decode_impl(const msgl_moe_decode_params& p) {
  static_assert(DTYPE == MSGL_BF16 || DTYPE == MSGL_F16, "moe_decode takes bf16 or f16");
  if constexpr (GATE_UP) {
    moe_decode_gate_up<DTYPE, kMoeDecodeUnroll>(p);
  } else if (p.bulk) {
    moe_decode_down_bulk<DTYPE>(p);
  } else {
    moe_decode_down<DTYPE>(p);
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 128 and grid = (pairs or tokens) * ceil(n / cols_per_block). */
extern "C" __global__ void __launch_bounds__(128) msgl_moe_decode_kernel(const msgl_moe_decode_params p) {
  msgl::moe_decode_impl<MSGL_DTYPE, MSGL_GATE_UP>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE, GATE_UP) for each AOT instance */

namespace msgl {
template <int DTYPE, int GATE_UP>
__global__ void __launch_bounds__(128) moe_decode_kernel(const msgl_moe_decode_params p) {
  moe_decode_impl<DTYPE, GATE_UP>(p);
}

/* gate_up with two vectors a row in flight (gate_up_unroll = 2): 80 registers
 * against 122, six blocks an SM against four (Qwen3-30B-A3B's 768 blocks in one
 * wave on 132 SMs). */
template <int DTYPE>
__global__ void __launch_bounds__(128) moe_decode_gate_up_light_kernel(const msgl_moe_decode_params p) {
  moe_decode_gate_up<DTYPE, 2>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_moe_decode(const msgl_tensor* out, const msgl_tensor* a, const msgl_tensor* w,
                                   const msgl_tensor* topk_ids, const msgl_tensor* topk_weights, int32_t gate_up,
                                   int32_t cols_per_block, int32_t bulk, int32_t gate_up_unroll, int32_t pdl,
                                   msgl_stream stream) {
  using namespace msgl;
  const char* op = "moe_decode";
  constexpr uint32_t halves = dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(out, op, "out", 2, halves));
  MSGL_TRY(expect_tensor(a, op, "a", 2, halves));
  MSGL_TRY(expect_tensor(w, op, "w", 3, halves));
  MSGL_TRY(expect_tensor(topk_ids, op, "topk_ids", 2, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(topk_weights, op, "topk_weights", 2, dtype_bit(MSGL_F32)));
  MSGL_TRY(expect_same(out, "out", a, "a", op));
  MSGL_TRY(expect_same(out, "out", w, "w", op));
  MSGL_TRY(expect_contiguous(w, op, "w"));
  MSGL_TRY(expect_contiguous(topk_ids, op, "topk_ids"));
  MSGL_TRY(expect_contiguous(topk_weights, op, "topk_weights"));
  MSGL_TRY(expect_rows(a, op, "a", 16));
  const int64_t tokens = topk_ids->shape[0], top_k = topk_ids->shape[1];
  const int64_t experts = w->shape[0], k = w->shape[2];
  const int64_t n = gate_up ? w->shape[1] / 2 : w->shape[1];
  const int64_t pairs = tokens * top_k;
  MSGL_TRY(expect_dim(topk_weights, op, "topk_weights", 0, tokens));
  MSGL_TRY(expect_dim(topk_weights, op, "topk_weights", 1, top_k));
  MSGL_TRY(expect_dim(a, op, "a", 0, gate_up ? tokens : pairs));
  MSGL_TRY(expect_dim(a, op, "a", 1, k));
  MSGL_TRY(expect_dim(out, op, "out", 0, gate_up ? pairs : tokens));
  MSGL_TRY(expect_dim(out, op, "out", 1, n));
  if (k % 8 != 0 || n % 8 != 0 || k == 0 || (gate_up && w->shape[1] % 2 != 0))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: k = %lld and n = %lld must be positive multiples of 8", op,
                     static_cast<long long>(k), static_cast<long long>(n));
  if (top_k < 1 || top_k > MSGL_MOE_MAX_TOP_K || experts < 1 || experts > MSGL_MOE_MAX_EXPERTS)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: top_k %lld or %lld experts out of range", op,
                     static_cast<long long>(top_k), static_cast<long long>(experts));
  if (cols_per_block < 1)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: cols_per_block must be positive", op);
  if (bulk != 0 && (bulk != 1 || gate_up))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: bulk %d must be 0, or 1 for the down pass", op, bulk);
  if (gate_up_unroll != 0 && gate_up_unroll != 2 && gate_up_unroll != 4)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: gate_up_unroll %d must be 0, 2 or 4", op, gate_up_unroll);
  if (reinterpret_cast<uintptr_t>(w->data) % 16 != 0 || reinterpret_cast<uintptr_t>(a->data) % 16 != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `w` and `a` must be 16-byte aligned", op);
  if (topk_ids->device != out->device || topk_weights->device != out->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the routing is not on the device of `out`", op);
  if (tokens == 0 || n == 0) return MSGL_OK;

  msgl_moe_decode_params p{};
  p.a = a->data;
  p.w = w->data;
  p.out = out->data;
  p.topk_ids = static_cast<const int32_t*>(topk_ids->data);
  p.topk_weights = static_cast<const float*>(topk_weights->data);
  p.a_stride = a->shape[0] > 1 ? a->strides[0] : k;
  p.out_stride = out->shape[0] > 1 ? out->strides[0] : n;
  p.num_tokens = tokens;
  p.num_experts = static_cast<int32_t>(experts);
  p.top_k = static_cast<int32_t>(top_k);
  p.n = static_cast<int32_t>(n);
  p.k = static_cast<int32_t>(k);
  p.cols_per_block = cols_per_block;
  p.bulk = bulk;
  p.gate_up_unroll = gate_up_unroll;
  const int64_t blocks = (gate_up ? pairs : tokens) * ((n + cols_per_block - 1) / cols_per_block);
  if (blocks > 0x7fffffff) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: too many blocks", op);
  const int64_t smem = bulk ? top_k * (static_cast<int64_t>(cols_per_block) + 1) * k * dtype_size(out->dtype) : 0;
  if (bulk) {
    int device = 0, major = 0, limit = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
      return set_error(MSGL_ERR_CUDA, "%s: cannot query the device", op);
    if (major < 9 || smem + 1024 > limit)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the bulk path needs sm_90 and %lld bytes of shared memory a block",
                       op, static_cast<long long>(smem));
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks));
  cfg.blockDim = dim3(kMoeDecodeThreads);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = static_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  cudaError_t err = cudaErrorInvalidValue;
  const int key = out->dtype * 2 + (gate_up ? 1 : 0);
  switch (key) {
#define MSGL_CASE(D, G)                                                                                   \
  case D * 2 + G:                                                                                         \
    if (G && gate_up_unroll == 2) {                                                                       \
      err = cudaLaunchKernelEx(&cfg, moe_decode_gate_up_light_kernel<D>, p);                              \
      break;                                                                                              \
    }                                                                                                     \
    err = smem > 0 ? cudaFuncSetAttribute(moe_decode_kernel<D, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                          static_cast<int>(smem))                                         \
                   : cudaSuccess;                                                                         \
    if (err == cudaSuccess) err = cudaLaunchKernelEx(&cfg, moe_decode_kernel<D, G>, p);                   \
    break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d GATE_UP=%d", op, out->dtype, gate_up ? 1 : 0);
  }
  if (err != cudaSuccess) return set_error(MSGL_ERR_CUDA, "%s: launch failed: %s", op, cudaGetErrorString(err));
  return check_launch(op);
}
#endif
