/*
 * moe_align.cu: batching the (token, slot) pairs of a MoE layer by expert, as
 * mini-sglang's moe_align_block_size does, but stable (the pairs of one expert
 * keep their order), so the layout is a pure function of topk_ids:
 *
 *   expert_offsets[e]   padded start of expert e's run (runs rounded up to BLOCK_M),
 *                       expert_offsets[E] = the padded total
 *   sorted_ids[i]       pair index at position i, num_pairs for padding
 *   block_experts[b]    expert of positions [b BLOCK_M, (b + 1) BLOCK_M)
 *   tiles               the GEMM tiles: each expert's run cut into pieces of at
 *                       most tile_m rows (count, tile_m, first row of each)
 *
 * Decomposition (minisgl/moe.cuh). Phase 0, one block of 1024 threads: counts per
 * expert with shared-memory atomics, one warp scans the padded counts and the
 * tiles per expert, then the offsets, block experts, tiles and padding entries
 * are written. Phase 1, one block per expert: each round every thread tests 4
 * consecutive ids (one 16-byte load) and a block-wide exclusive scan of the hit
 * counts places the expert's pairs in pair order. Phase 2 (small batches, one
 * block): phase 0's count, then rounds of 1024 pairs ranked within each warp with
 * __match_any_sync and across the 32 warps by a scan of per-warp 16-bit counters
 * in shared memory.
 */
#include "minisgl/moe.cuh"

namespace msgl {

template <int BLOCK_M>
__device__ __forceinline__ void moe_align_impl(const msgl_moe_align_params& a) {
  const MoeAlignOut p{a.topk_ids, a.sorted_ids, a.block_experts, a.expert_offsets, a.tiles, a.num_pairs, a.num_experts, a.tile_m};
  if (a.phase == 1) {
    moe_align_expert(p);
    return;
  }
  __shared__ int count[MSGL_MOE_MAX_EXPERTS];
  __shared__ int start[MSGL_MOE_MAX_EXPERTS + 1];
  extern __shared__ unsigned short warp_count[];
  moe_align_count<BLOCK_M>(p, count, start);
  if (a.phase == 2) moe_align_ranked(p, start, warp_count);
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 1024 and grid = 1 (phases 0 and 2; phase 2 with
 * moe_align_ranked_smem(num_experts) bytes of dynamic shared memory) or
 * num_experts (phase 1). */
extern "C" __global__ void __launch_bounds__(1024) msgl_moe_align_kernel(const msgl_moe_align_params p) {
  msgl::moe_align_impl<MSGL_BLOCK_M>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(BLOCK_M) for each AOT instance */

namespace msgl {
template <int BLOCK_M>
__global__ void __launch_bounds__(1024) moe_align_kernel(const msgl_moe_align_params p) {
  moe_align_impl<BLOCK_M>(p);
}

template <int BLOCK_M>
int32_t launch_moe_align(msgl_moe_align_params p, cudaStream_t s) {
  if (p.num_pairs <= MSGL_MOE_ALIGN_SMALL) {
    p.phase = 2;
    moe_align_kernel<BLOCK_M><<<1, kMoeAlignThreads, moe_align_ranked_smem(p.num_experts), s>>>(p);
  } else {
    p.phase = 0;
    moe_align_kernel<BLOCK_M><<<1, kMoeAlignThreads, 0, s>>>(p);
    p.phase = 1;
    moe_align_kernel<BLOCK_M><<<p.num_experts, kMoeAlignThreads, 0, s>>>(p);
  }
  return check_launch("moe_align");
}
}  // namespace msgl

extern "C" int32_t msgl_moe_align(const msgl_tensor* sorted_ids, const msgl_tensor* block_experts,
                                  const msgl_tensor* expert_offsets, const msgl_tensor* tiles, const msgl_tensor* topk_ids,
                                  int32_t block_m, int32_t tile_m, msgl_stream stream) {
  using namespace msgl;
  const char* op = "moe_align";
  msgl_moe_align_params p;
  MSGL_TRY(moe_align_check(op, sorted_ids, block_experts, expert_offsets, tiles, topk_ids, block_m, tile_m, p));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (block_m) {
#define MSGL_CASE(BM) \
  case BM: return launch_moe_align<BM>(p, s);
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance BLOCK_M=%d", op, block_m);
  }
}
#endif
