/*
 * minisgl/mma.cuh: the tensor-core and asynchronous-copy primitives of the
 * matrix kernels (sm_80+ instructions, used on sm_90 through mma.sync):
 *
 *   cp_async16 / cp_async_commit / cp_async_wait<N>   16-byte global -> shared copies
 *   ldmatrix_x4 / ldmatrix_x4_trans                   shared -> mma fragments (transposed for B)
 *   mma16816<DTYPE>                                   m16n8k16, bf16/f16 in, f32 accumulate
 *   silu_f32                                          g / (1 + exp(-g)), fast exp
 *
 * Fragment layout of mma.sync.m16n8k16 (lane = 4 g + t): A holds rows g and
 * g + 8, columns 2t, 2t + 1, 2t + 8, 2t + 9; B (k x n, "col") holds column g,
 * rows 2t, 2t + 1, 2t + 8, 2t + 9; the accumulator holds rows g and g + 8,
 * columns 2t and 2t + 1.
 *
 * Device code only, no system headers (NVRTC).
 */
#ifndef MINISGL_MMA_CUH
#define MINISGL_MMA_CUH

#include "minisgl/dtype.cuh"

namespace msgl {

/* The 32-bit shared-memory address of a generic pointer into shared memory. */
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

/* 16-byte asynchronous copy global -> shared, through L2 only; `bytes` = 0 writes
 * 16 zero bytes and reads nothing (the address must still be valid to form). */
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(smem)), "l"(gmem), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* Waits until at most N committed groups of this thread are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}

/* ldmatrix_x4 with each 8x8 matrix transposed (B operands stored row-major). */
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
}

/* d += a * b on the tensor cores: m16n8k16, 16-bit inputs, f32 accumulators. */
template <int DTYPE>
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (DTYPE == MSGL_BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ float silu_f32(float g) { return g / (1.f + __expf(-g)); }

}  // namespace msgl

#endif /* MINISGL_MMA_CUH */
