/*
 * minisgl/bulk.cuh: the sm_90 copy-engine primitives shared by the kernels that
 * stream weights into shared memory without spending registers or load slots:
 *
 *   mbar_init / mbar_init_fence            a shared-memory transaction barrier and
 *                                          the fence that publishes its init to the
 *                                          async proxy
 *   mbar_arrive / mbar_arrive_expect_tx    an arrival (with the bytes still to land)
 *   mbar_wait                              spin until a phase completes
 *   bulk_copy_g2s                          one contiguous global -> shared copy
 *                                          (cp.async.bulk) completing on a barrier
 *   tensor_copy_3d_g2s                     one box of a 3-D tensor map (TMA)
 *                                          completing on a barrier
 *   prefetch_tensor_map                    a tensor map's descriptor, ahead of use
 *
 * Device code only, no system headers (NVRTC). sm_90 instructions: include only
 * from kernels built for sm_90 or later.
 */
#ifndef MINISGL_BULK_CUH
#define MINISGL_BULK_CUH

#include "minisgl/mma.cuh"

namespace msgl {

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

/* After the inits and before the barrier syncing the block: makes them visible to
 * the copy engine (the async proxy) as well as to the other threads. */
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

/* Spins until the barrier's phase of parity `parity` has completed. */
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
  const unsigned addr = smem_u32(bar);
  unsigned done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
  }
}

/* Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global
 * memory into this block's shared memory; the bytes count toward `bar`'s
 * transaction count when they land. */
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

/* Fetches a tensor map's descriptor ahead of its first copy. */
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

/* A 3-D tensor copy (TMA) of the box at coordinates (c0, c1, c2) of the tensor map at
 * `map` (a __grid_constant__ parameter or global memory) into this block's shared
 * memory at `dst` (aligned as the map's swizzle needs); the box's bytes count toward
 * `bar`'s transaction count when they land. Coordinates outside the tensor read as
 * zeros. */
__device__ __forceinline__ void tensor_copy_3d_g2s(void* dst, const void* map, int c0, int c1, int c2,
                                                   unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::
          "r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}

}  // namespace msgl

#endif
