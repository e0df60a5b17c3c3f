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

}  // namespace msgl

#endif
