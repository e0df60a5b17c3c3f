/*
 * minisgl/device.cuh: device helpers shared by the kernels.
 *
 * Device code only, and no system headers: every kernel source must also compile
 * under NVRTC, which sees this file through the run-time header table.
 */
#ifndef MINISGL_DEVICE_CUH
#define MINISGL_DEVICE_CUH

#include "minisgl/tensor.h"

namespace msgl {

constexpr int kWarpSize = 32;

/* Programmatic dependent launch (sm_90; no-ops when the kernel was launched
 * without the attribute): `grid_dependency_wait` blocks until the grid this one
 * depends on has finished (its memory is visible); `grid_dependents_launch` lets
 * the next grid launch once every block of this one has called it (or exited).
 *
 * The kernels of the decode path (norm, skinny GEMM, rope_store, decode
 * attention, silu_mul) are launched with the attribute by their AOT launchers
 * (check.h: launch_pdl) and keep one protocol:
 *   1. before the wait, a kernel reads only data that no kernel of the step
 *      writes (its weights: the skinny GEMM stages its weight slice in shared
 *      memory, the norms load their weight vectors; decode attention the cached
 *      keys of earlier steps, through the block table the host copied before
 *      the step) and writes nothing;
 *   2. then `grid_prologue`: it waits for the previous grid and only then lets
 *      the next one launch. The next kernel's weight prologue therefore runs
 *      while this one works, and no more than two kernels are ever resident:
 *      a kernel that starts early knows that the kernel two back has finished,
 *      which some kernels rely on (moe_gemm's down reads the sort's tiles before
 *      its own wait). Letting the next grid launch before the wait made chains
 *      of waiting grids as deep as the stream (each holding its shared memory)
 *      and broke that guarantee: batch-7 overlapped decoding differed, and
 *      batch 64 got slower (docs/PERF.md, fourth session, calls 5-7).
 * A kernel after the wait sees the memory of every kernel before it. Weights
 * written by a kernel (dummy weights made on the device, casts at load) are
 * written long before a decode step; a test that writes a weight on the device
 * right before a launch that prefetches it must synchronise in between. */
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Step 2 of the protocol above: wait for the previous grid, then let the next launch. */
__device__ __forceinline__ void grid_prologue() {
  grid_dependency_wait();
  grid_dependents_launch();
}

/* The one exception to step 2, for a small kernel (a few blocks that all fit at
 * once) whose successor has a long weight or key prologue: let the next grid
 * launch first, then wait. The successor's blocks then become resident, and run
 * their prologue, while the kernel before this one still works (a skinny GEMM
 * after the split combine streams its weights during the attention launch
 * instead of after it). What the successor gives up is the guarantee that the
 * kernel two back has finished when it starts: it may only run this with
 * launch_first where its successor's pre-wait part reads nothing that a kernel of
 * the step writes (true of the skinny GEMMs, whose prologue reads weights, and of
 * decode attention, whose prologue reads the block table, the lengths and the
 * keys of earlier steps), and only where this kernel's blocks are one wave (so
 * the chain of launched-early grids stays three deep: the running one, this
 * one, the successor). Uniform per launch. */
__device__ __forceinline__ void grid_prologue_launch_first(bool launch_first) {
  if (launch_first) {
    grid_dependents_launch();
    grid_dependency_wait();
  } else {
    grid_prologue();
  }
}

/* Thread-block clusters (sm_90; on older archs every block is a cluster of one).
 * `cluster_rank` / `cluster_size`: this block's rank in its cluster and the
 * cluster's block count (1 when launched without a cluster dimension);
 * `cluster_sync`: a barrier of every thread of the cluster that also orders
 * their shared-memory writes before the others' reads; `load_cluster_f32`: a
 * float from another block's shared memory (the same variable, block `rank`). */
__device__ __forceinline__ unsigned cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
#else
  return 0;
#endif
}
__device__ __forceinline__ unsigned cluster_size() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
#else
  return 1;
#endif
}
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}
__device__ __forceinline__ float load_cluster_f32(const float* local, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned addr, remote;
  float v;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(local));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
#else
  (void)rank;
  return *local;
#endif
}

/* The widest plain copy unit (in bytes) that divides `bytes`: 16, 8, 4, 2 or 1. */
__host__ __device__ constexpr int vec_bytes_for(long long bytes) {
  return bytes % 16 == 0 ? 16 : bytes % 8 == 0 ? 8 : bytes % 4 == 0 ? 4 : bytes % 2 == 0 ? 2 : 1;
}

/* A copy unit of N bytes as one machine word (uint4 for 16 bytes). */
template <int N> struct VecOf;
template <> struct VecOf<16> { using type = uint4; };
template <> struct VecOf<8> { using type = uint2; };
template <> struct VecOf<4> { using type = unsigned int; };
template <> struct VecOf<2> { using type = unsigned short; };
template <> struct VecOf<1> { using type = unsigned char; };

template <int N> __device__ __forceinline__ typename VecOf<N>::type zero_vec();
template <> __device__ __forceinline__ uint4 zero_vec<16>() { return make_uint4(0, 0, 0, 0); }
template <> __device__ __forceinline__ uint2 zero_vec<8>() { return make_uint2(0, 0); }
template <> __device__ __forceinline__ unsigned int zero_vec<4>() { return 0u; }
template <> __device__ __forceinline__ unsigned short zero_vec<2>() { return 0; }
template <> __device__ __forceinline__ unsigned char zero_vec<1>() { return 0; }

/* Reads index i of an int32 or int64 index array. */
__device__ __forceinline__ long long load_index(const void* indices, int is_64, long long i) {
  return is_64 ? static_cast<const long long*>(indices)[i]
               : static_cast<long long>(static_cast<const int*>(indices)[i]);
}

/*
 * Copies one row of ROW_BYTES bytes with `num_threads` cooperating threads (a warp,
 * or several warps for wide rows), `thread` being this thread's rank among them.
 * All loads are issued before the first store so that a thread keeps several
 * 16-byte requests in flight.
 */
template <int ROW_BYTES, int NUM_THREADS>
__device__ __forceinline__ void copy_row(void* __restrict__ dst, const void* __restrict__ src, int thread) {
  constexpr int VB = vec_bytes_for(ROW_BYTES);
  using V = typename VecOf<VB>::type;
  constexpr int NV = ROW_BYTES / VB;
  constexpr int PER_THREAD = (NV + NUM_THREADS - 1) / NUM_THREADS;
  const V* s = static_cast<const V*>(src);
  V* d = static_cast<V*>(dst);
  V buf[PER_THREAD];
#pragma unroll
  for (int j = 0; j < PER_THREAD; ++j) {
    const int k = thread + j * NUM_THREADS;
    if (NV % NUM_THREADS == 0 || k < NV) buf[j] = s[k];
  }
#pragma unroll
  for (int j = 0; j < PER_THREAD; ++j) {
    const int k = thread + j * NUM_THREADS;
    if (NV % NUM_THREADS == 0 || k < NV) d[k] = buf[j];
  }
}

/* Writes zeros over one row of ROW_BYTES bytes, cooperating as copy_row does. */
template <int ROW_BYTES, int NUM_THREADS>
__device__ __forceinline__ void zero_row(void* __restrict__ dst, int thread) {
  constexpr int VB = vec_bytes_for(ROW_BYTES);
  using V = typename VecOf<VB>::type;
  constexpr int NV = ROW_BYTES / VB;
  V* d = static_cast<V*>(dst);
  for (int k = thread; k < NV; k += NUM_THREADS) d[k] = zero_vec<VB>();
}

}  // namespace msgl

#endif /* MINISGL_DEVICE_CUH */
