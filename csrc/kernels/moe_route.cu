/*
 * moe_route.cu: the router of a mixture-of-experts layer, the top-k of the softmax
 * of each token's router logits (mini-sglang's select_experts / topk_softmax):
 *
 *   p[e] = exp(l[e] - max l) / sum_e' exp(l[e'] - max l)          (f32)
 *   ids  = the top_k experts by logit, largest first, ties to the lower index
 *   w[j] = p[ids[j]], divided by sum_j p[ids[j]] when `renormalize`
 *
 * Decomposition (minisgl/moe.cuh, moe_route_token): one warp per token. Lane i
 * holds logits i, i + 32, ... in registers (MSGL_MOE_MAX_EXPERTS / 32 of them,
 * unrolled so that the array never leaves registers); the max and the sum of
 * exponentials are warp reductions. The experts are chosen on the logits, which
 * orders them exactly as the probabilities do without the rounding of exp: each of
 * top_k rounds takes the lane-local best not yet taken, then a butterfly argmax
 * across the warp (larger value, else lower index). Lane j keeps the j-th choice.
 *
 * Phase 1 (moe_route_align, decode-sized batches) runs in one block of 1024
 * threads: its 32 warps route the tokens, then the same block sorts the pairs by
 * expert (moe_align's single-block sort), saving a launch on the decode path.
 *
 * Phase 2 (moe_router_route, decode steps of at most MSGL_MOE_ROUTER_MAX_TOKENS
 * tokens): the router GEMM in the same launch, so a MoE layer's routing is one
 * link of the step's dependency chain instead of two (the router GEMM's launch,
 * at 0.5 MiB of weights for Qwen3-30B-A3B, was latency, and so was this kernel's).
 * A block per expert: its 4 warps split the expert's weight row, each thread
 * holding up to kRouterRegVecs 16-byte vectors of it in registers, loaded before
 * the grid dependency wait (weights no kernel of the step writes), so that a row
 * of up to 4096 bf16 elements is on chip when the previous kernel ends and the
 * link after it is x's L2 round trip, the dot products and the routing (the
 * eighteenth session's ncu: a warp per expert, half its row after the wait, took
 * 17 us alone, 12.8 us of the 30B's layer). Each thread dots its vectors with
 * every token's row of x; the warps' sums meet in shared memory, added in warp
 * order, and the f32 sum, rounded to the dtype as the GEMM's output is (so the
 * routing is that of the logits a router GEMM would give, up to its summation
 * order), goes to an f32 scratch. Each block then counts itself in a ticket after
 * a fence; the last one copies the logits into shared memory (L2 loads: other SMs
 * wrote them), sets the ticket back to zero (for the next launch and every replay
 * of a CUDA graph) and routes the tokens, a warp each, with moe_route_token (four
 * logits a lane where the experts are at most 128). Deterministic: fixed orders,
 * no atomics on the data. The AOT library launches it as its own kernel
 * (moe_router_kernel: 128-thread bounds, only this code in its instruction
 * stream); NVRTC's single entry takes it as phase 2.
 *
 * Programmatic dependent launch (sm_90, device.cuh's protocol): phases 0 and 1
 * read only the router logits of the GEMM before them, so they wait for it first
 * and then let the gate_up GEMM launch, whose blocks are resident and waiting when
 * the sort is done instead of being launched after it. Phase 2 loads its first
 * weight vectors before the wait (weights no kernel of the step writes) and x, the
 * previous kernel's output, after it.
 */
#include "minisgl/moe.cuh"

namespace msgl {

constexpr int kRouteWarps = 4;
constexpr int kRouteThreads = kRouteWarps * kWarpSize;

/* 16-byte vectors of the expert's row a phase-2 thread holds at once: 4 x 128
 * threads cover 512 vectors (4096 bf16 or f16 elements) before the wait, within
 * the 64 registers the 1024-thread bounds of NVRTC's single entry allow. */
constexpr int kRouterRegVecs = 4;

/* Phase 2: the router's logits, then (last block) the routing. Grid: one block
 * per expert, kRouteThreads threads. */
template <int DTYPE>
__device__ __forceinline__ void moe_router_route_impl(const msgl_moe_route_params& p) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int VE = Vec16<DTYPE>::kElems, RV = kRouterRegVecs, MAXT = MSGL_MOE_ROUTER_MAX_TOKENS;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int expert = static_cast<int>(blockIdx.x);
  const int nv = p.hidden / VE;
  const int tokens = static_cast<int>(p.num_tokens);
  const uint4* wrow = reinterpret_cast<const uint4*>(static_cast<const T*>(p.router_w) +
                                                     static_cast<long long>(expert) * p.hidden);
  uint4 w[RV];
  auto load_w = [&](int v0) {
#pragma unroll
    for (int i = 0; i < RV; ++i) {
      const int v = v0 + i * kRouteThreads + tid;
      w[i] = v < nv ? __ldg(wrow + v) : make_uint4(0, 0, 0, 0);
    }
  };
  load_w(0); /* the weights do not depend on the previous kernel */
  grid_prologue();
  float acc[MAXT];
#pragma unroll
  for (int t = 0; t < MAXT; ++t) acc[t] = 0.f;
  for (int v0 = 0; v0 < nv; v0 += kRouteThreads * RV) {
    if (v0 > 0) load_w(v0);
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
      if (t < tokens) {
        const uint4* xrow = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) + t * p.x_stride);
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < RV; ++i) {
          const int v = v0 + i * kRouteThreads + tid;
          if (v < nv) {
            Vec16<DTYPE> a, b;
            a.from_raw(w[i]);
            b.from_raw(xrow[v]);
#pragma unroll
            for (int e = 0; e < VE; ++e) s = fmaf(a.v[e], b.v[e], s);
          }
        }
        acc[t] += s;
      }
    }
  }
  __shared__ float warp_sums[kRouteWarps][MAXT];
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    if (t < tokens) {
      float s = acc[t];
#pragma unroll
      for (int o = kWarpSize / 2; o >= 1; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) warp_sums[warp][t] = s;
    }
  }
  __syncthreads();
  if (tid < tokens) {
    float s = warp_sums[0][tid];
#pragma unroll
    for (int w2 = 1; w2 < kRouteWarps; ++w2) s += warp_sums[w2][tid];
    p.logits_f32[static_cast<long long>(tid) * p.num_experts + expert] = DType<DTYPE>::to_f32(DType<DTYPE>::from_f32(s));
    __threadfence(); /* this block's logits are visible device-wide before its count */
  }
  __shared__ int last;
  __syncthreads();
  if (tid == 0) {
    last = atomicAdd(p.ticket, 1) == static_cast<int>(gridDim.x) - 1;
    if (last) atomicExch(p.ticket, 0); /* every block has counted: ready for the next launch */
  }
  __syncthreads();
  if (!last) return;
  __threadfence(); /* the other blocks' logits, counted before ours */
  extern __shared__ float router_logits[]; /* [tokens, num_experts] */
  const int n = tokens * p.num_experts;
  for (int i = tid; i < n; i += blockDim.x) router_logits[i] = __ldcg(p.logits_f32 + i);
  __syncthreads();
  for (int t = warp; t < tokens; t += kRouteWarps) {
    if (p.num_experts <= 4 * kWarpSize)
      moe_route_token<MSGL_F32, 4>(router_logits, p.num_experts, p.num_experts, p.top_k, p.renormalize, t, p.topk_ids,
                                   p.topk_weights);
    else
      moe_route_token<MSGL_F32>(router_logits, p.num_experts, p.num_experts, p.top_k, p.renormalize, t, p.topk_ids,
                                p.topk_weights);
  }
}

template <int DTYPE>
__device__ __forceinline__ void moe_route_impl(const msgl_moe_route_params& p) {
  if (p.phase == 2) {
    moe_router_route_impl<DTYPE>(p);
    return;
  }
  grid_prologue();
  const int warp = threadIdx.x / kWarpSize;
  if (p.phase == 0) {
    const long long token = static_cast<long long>(blockIdx.x) * kRouteWarps + warp;
    if (token < p.num_tokens)
      moe_route_token<DTYPE>(p.logits, p.logits_stride, p.num_experts, p.top_k, p.renormalize, token, p.topk_ids,
                             p.topk_weights);
    return;
  }
  __shared__ int count[MSGL_MOE_MAX_EXPERTS];
  __shared__ int start[MSGL_MOE_MAX_EXPERTS + 1];
  extern __shared__ unsigned short warp_count[];
  for (long long token = warp; token < p.num_tokens; token += kMoeAlignWarps)
    moe_route_token<DTYPE>(p.logits, p.logits_stride, p.num_experts, p.top_k, p.renormalize, token, p.topk_ids,
                           p.topk_weights);
  __syncthreads();  // the ids written above are visible to the whole block
  const msgl_moe_align_params& a = p.align;
  const MoeAlignOut out{a.topk_ids, a.sorted_ids, a.block_experts, a.expert_offsets, a.tiles,
                        a.num_pairs, a.num_experts, a.tile_m};
  moe_align_count<MSGL_MOE_ROUTE_BLOCK_M>(out, count, start);
  moe_align_ranked(out, start, warp_count);
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * phase 0: block = 128 (4 tokens), grid = ceil(num_tokens / 4); phase 1: block =
 * 1024, grid = 1, moe_align_ranked_smem(num_experts) bytes of dynamic shared memory;
 * phase 2: block = 128, grid = num_experts (a block an expert), num_tokens *
 * num_experts floats of dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(1024) msgl_moe_route_kernel(const msgl_moe_route_params p) {
  msgl::moe_route_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(1024) moe_route_kernel(const msgl_moe_route_params p) {
  moe_route_impl<DTYPE>(p);
}

/* Phase 2 alone (the fused router): its own, smaller instruction stream and
 * 128-thread bounds. */
template <int DTYPE>
__global__ void __launch_bounds__(kRouteThreads) moe_router_kernel(const msgl_moe_route_params p) {
  moe_router_route_impl<DTYPE>(p);
}

int32_t moe_route_prepare(const char* op, const msgl_tensor* topk_ids, const msgl_tensor* topk_weights,
                          const msgl_tensor* logits, int32_t renormalize, msgl_moe_route_params& p) {
  constexpr uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(logits, op, "logits", 2, floats));
  MSGL_TRY(expect_tensor(topk_ids, op, "topk_ids", 2, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(topk_weights, op, "topk_weights", 2, dtype_bit(MSGL_F32)));
  const int64_t num_tokens = logits->shape[0];
  const int64_t num_experts = logits->shape[1];
  const int64_t top_k = topk_ids->shape[1];
  if (num_experts < 1 || num_experts > MSGL_MOE_MAX_EXPERTS)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %lld experts, expected 1..%d", op, static_cast<long long>(num_experts),
                     MSGL_MOE_MAX_EXPERTS);
  if (top_k < 1 || top_k > num_experts || top_k > MSGL_MOE_MAX_TOP_K)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: top_k %lld, expected 1..min(%lld, %d)", op, static_cast<long long>(top_k),
                     static_cast<long long>(num_experts), MSGL_MOE_MAX_TOP_K);
  MSGL_TRY(expect_dim(topk_ids, op, "topk_ids", 0, num_tokens));
  MSGL_TRY(expect_dim(topk_weights, op, "topk_weights", 0, num_tokens));
  MSGL_TRY(expect_dim(topk_weights, op, "topk_weights", 1, top_k));
  MSGL_TRY(expect_contiguous(topk_ids, op, "topk_ids"));
  MSGL_TRY(expect_contiguous(topk_weights, op, "topk_weights"));
  MSGL_TRY(expect_rows(logits, op, "logits", dtype_size(logits->dtype)));
  if (topk_ids->device != logits->device || topk_weights->device != logits->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the outputs are not on the device of `logits`", op);
  p = msgl_moe_route_params{};
  p.logits = logits->data;
  p.topk_ids = static_cast<int32_t*>(topk_ids->data);
  p.topk_weights = static_cast<float*>(topk_weights->data);
  p.num_tokens = num_tokens;
  p.logits_stride = num_tokens > 1 ? logits->strides[0] : num_experts;
  p.num_experts = static_cast<int32_t>(num_experts);
  p.top_k = static_cast<int32_t>(top_k);
  p.renormalize = renormalize != 0;
  return MSGL_OK;
}

int32_t launch_moe_route(const char* op, const msgl_moe_route_params& p, int32_t dtype, cudaStream_t s) {
  const bool fused = p.phase == 1, router = p.phase == 2;
  const int64_t blocks = fused    ? 1
                         : router ? p.num_experts
                                  : (p.num_tokens + kRouteWarps - 1) / kRouteWarps;
  if (blocks > 0x7fffffff) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: too many tokens", op);
  const unsigned threads = fused ? kMoeAlignThreads : kRouteThreads;
  const unsigned smem = fused    ? moe_align_ranked_smem(p.num_experts)
                        : router ? static_cast<unsigned>(p.num_tokens * p.num_experts * sizeof(float))
                                 : 0;
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (dtype) {
#define MSGL_CASE(D)                                                      \
  case D:                                                                 \
    if (router)                                                           \
      (void)launch_pdl(moe_router_kernel<D>, grid, dim3(threads), smem, s, p); \
    else                                                                  \
      (void)launch_pdl(moe_route_kernel<D>, grid, dim3(threads), smem, s, p);  \
    break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d", op, dtype);
  }
  return check_launch(op);
}
}  // namespace msgl

extern "C" int32_t msgl_moe_route(const msgl_tensor* topk_ids, const msgl_tensor* topk_weights, const msgl_tensor* logits,
                                  int32_t renormalize, msgl_stream stream) {
  using namespace msgl;
  const char* op = "moe_route";
  msgl_moe_route_params p;
  MSGL_TRY(moe_route_prepare(op, topk_ids, topk_weights, logits, renormalize, p));
  if (p.num_tokens == 0) return MSGL_OK;
  return launch_moe_route(op, p, logits->dtype, static_cast<cudaStream_t>(stream));
}

extern "C" int32_t msgl_moe_router_route(const msgl_tensor* topk_ids, const msgl_tensor* topk_weights,
                                         const msgl_tensor* x, const msgl_tensor* router_w,
                                         const msgl_tensor* logits_f32, const msgl_tensor* ticket, int32_t renormalize,
                                         msgl_stream stream) {
  using namespace msgl;
  const char* op = "moe_router_route";
  constexpr uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  msgl_moe_route_params p;
  /* The routing's checks, with the scratch standing in for the logits. */
  MSGL_TRY(moe_route_prepare(op, topk_ids, topk_weights, logits_f32, renormalize, p));
  MSGL_TRY(expect_tensor(x, op, "x", 2, floats));
  MSGL_TRY(expect_tensor(router_w, op, "router_w", 2, floats));
  MSGL_TRY(expect_same(x, "x", router_w, "router_w", op));
  MSGL_TRY(expect_tensor(logits_f32, op, "logits_f32", 2, dtype_bit(MSGL_F32)));
  MSGL_TRY(expect_contiguous(logits_f32, op, "logits_f32"));
  MSGL_TRY(expect_tensor(ticket, op, "ticket", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_contiguous(router_w, op, "router_w"));
  MSGL_TRY(expect_rows(x, op, "x", 16));
  MSGL_TRY(expect_rows(router_w, op, "router_w", 16));
  const int64_t tokens = x->shape[0], hidden = x->shape[1];
  MSGL_TRY(expect_dim(logits_f32, op, "logits_f32", 0, tokens));
  MSGL_TRY(expect_dim(router_w, op, "router_w", 0, logits_f32->shape[1]));
  MSGL_TRY(expect_dim(router_w, op, "router_w", 1, hidden));
  if (tokens > MSGL_MOE_ROUTER_MAX_TOKENS)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %lld tokens exceed the fused router's %d (moe_route after the GEMM)",
                     op, static_cast<long long>(tokens), MSGL_MOE_ROUTER_MAX_TOKENS);
  if (hidden <= 0 || (hidden * dtype_size(x->dtype)) % 16 != 0 || hidden > 0x7fffffff)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: hidden size %lld is not a positive multiple of 16 bytes", op,
                     static_cast<long long>(hidden));
  if (ticket->shape[0] < 1 || ticket->device != x->device || x->device != logits_f32->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `ticket` (one int32) and `x` must be on the device of the outputs", op);
  if (tokens == 0) return MSGL_OK;
  p.phase = 2;
  p.x = x->data;
  p.router_w = router_w->data;
  p.logits_f32 = static_cast<float*>(logits_f32->data);
  p.ticket = static_cast<int32_t*>(ticket->data);
  p.x_stride = tokens > 1 ? x->strides[0] : hidden;
  p.hidden = static_cast<int32_t>(hidden);
  return launch_moe_route(op, p, x->dtype, static_cast<cudaStream_t>(stream));
}

extern "C" int32_t msgl_moe_route_align(const msgl_tensor* topk_ids, const msgl_tensor* topk_weights,
                                        const msgl_tensor* sorted_ids, const msgl_tensor* block_experts,
                                        const msgl_tensor* expert_offsets, const msgl_tensor* tiles,
                                        const msgl_tensor* logits, int32_t renormalize, int32_t block_m, int32_t tile_m,
                                        msgl_stream stream) {
  using namespace msgl;
  const char* op = "moe_route_align";
  msgl_moe_route_params p;
  MSGL_TRY(moe_route_prepare(op, topk_ids, topk_weights, logits, renormalize, p));
  if (block_m != MSGL_MOE_ROUTE_BLOCK_M)
    return set_error(MSGL_ERR_NO_INSTANCE, "%s: block_m %d (the fused sort is built for %d)", op, block_m,
                     MSGL_MOE_ROUTE_BLOCK_M);
  MSGL_TRY(moe_align_check(op, sorted_ids, block_experts, expert_offsets, tiles, topk_ids, block_m, tile_m, p.align));
  if (p.align.num_experts != p.num_experts)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `expert_offsets` holds %d experts + 1, `logits` has %d", op,
                     p.align.num_experts, p.num_experts);
  if (p.align.num_pairs > MSGL_MOE_ROUTE_ALIGN_MAX)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %lld pairs exceed the fused limit of %d (route, then moe_align)", op,
                     static_cast<long long>(p.align.num_pairs), MSGL_MOE_ROUTE_ALIGN_MAX);
  if (p.num_tokens == 0) return MSGL_OK;
  p.phase = 1;
  return launch_moe_route(op, p, logits->dtype, static_cast<cudaStream_t>(stream));
}
#endif
