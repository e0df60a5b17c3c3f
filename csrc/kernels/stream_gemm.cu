/*
 * stream_gemm.cu: out[m, n] = x[m, :] . w[n, :] (+ bias[n]) for m <= 16 rows and
 * large weights (tens to hundreds of MiB: Llama-3-8B's projections, LM heads),
 * streamed by the copy engine. Off by default in `linear` (gpu/stream_gemm.rs says
 * why: it matches or beats cuBLASLt launch for launch, 3.2-3.9 TB/s on Llama-3-8B's
 * projections at m = 1, but graphed decode steps got slower with it).
 *
 * Why a third decode GEMM: skinny_gemm.cu keeps its weights in flight in
 * registers (at most two stages of two k-steps a warp, 32-64 KiB an SM), and its
 * grid of one block per 16-row tile leaves the last wave part empty (Llama-3-8B
 * qkv: 384 tiles on 264 slots); cuBLASLt's split-K kernels reach 2.5-3.7 TB/s on
 * these shapes (docs/PERF.md, fifth session). Here the copy engine does the
 * streaming:
 *
 *   - one producer thread issues tensor copies (`cp.async.bulk.tensor`, sm_90)
 *     into a ring of `stages` shared-memory stages of `chunk` k (256, 512 or
 *     1024: 8-32 KiB of weights), each completing on its own mbarrier with a byte
 *     count; about 100-150 KiB an SM in flight, and no registers spent. When k is
 *     a multiple of 256, one 3-D copy a stage brings each of 16 weight rows' whole
 *     chunk (and one more the x rows'); else 2-D copies of 16 rows x 256 k (8 KiB
 *     each). Few large copies matter: with 1-D bulk copies of one row's chunk each
 *     (1-2 KiB), the copy count, not HBM, bounded an earlier version (1.5-2.8
 *     TB/s at 1 KiB rows, 3.5-4.0 at 2 KiB, and m = 16 with its 16 x-row copies a
 *     stage half that; docs/PERF.md, eighth session);
 *   - a persistent grid of one block an SM (up to the tile count), block b owning
 *     the contiguous tiles [T b / G, T (b + 1) / G) of the T = ceil(n / 16)
 *     16-row weight tiles, so that every SM streams the same bytes within one
 *     tile (Llama-3-8B qkv: 2 or 3 tiles a block, 97% of the ideal) with no
 *     cross-block reduction: each tile is summed over its whole K in one block;
 *   - the weights are read with an L2 evict-first policy (each byte is used once;
 *     x, the KV cache and the activations keep L2).
 *
 * The products are skinny_gemm.cu's: mma.sync m16n8k16 with 16 weight rows as A
 * and 8 rows of x as B (N_TILES tiles for up to 16 rows), and the same k
 * permutation (lane (g, t) reads elements [8t, 8t + 8) of a k-step of 32 of
 * weight rows g and g + 8 and of x row g as 16-byte vectors; logical k of an mma
 * is then a permutation that A and B share). Each of the 4 consumer warps takes
 * every 4th k-step of a stage; at a tile's end their f32 tiles are summed in warp
 * order through shared memory, the bias added and the result rounded once: the
 * result depends only on the shape, never on timing or the grid.
 *
 * Shared memory: a stage holds the chunk of 16 weight rows and of 8 N_TILES x
 * rows, dense, as the copy engine writes them. When k is a multiple of 256 the
 * maps are 3-D views [rows][k / 256][256] and one copy a stage brings each row's
 * whole chunk, a contiguous run of 2 chunk bytes (`whole_rows`: rows 2 chunk
 * bytes apart); else 2-D boxes [rows][256] land one after another (rows 512 bytes
 * apart). Either way the lanes g and g + 1 of an 8-lane phase hit the same banks,
 * a 2-way conflict on reads that are a small share of the time. The tensor maps
 * (built on the host, gpu/stream_gemm.rs) zero-fill what lies outside the
 * matrices: weight rows past n, x rows past m, k past the end; a k-chunk shorter
 * than `chunk` (the last, when k is not a multiple of it) copies and multiplies
 * only its boxes and k-steps.
 *
 * Programmatic dependent launch (device.cuh): the producer issues the weight
 * copies of the first `stages` units before grid_prologue() (weights only, into
 * shared memory; nothing else is read or written before it), then their x
 * copies. The consumers call grid_prologue() at their start. Outputs are
 * written only after a stage's x copies landed, i.e. after the producer's wait.
 *
 * Barrier protocol, unit u (tile, k-chunk) of a block in stage s = u mod stages:
 * full[s] (count 1) is armed by the producer's arrive.expect_tx with the unit's
 * bytes and completes when the copies land; empty[s] (count 4) gets one arrival
 * from each consumer warp once it has read the stage; the producer waits on it
 * before reusing the stage. Phases alternate by u / stages.
 */
#include "minisgl/bulk.cuh"
#include "minisgl/device.cuh"
#include "minisgl/mma.cuh"

namespace msgl {

constexpr int kStreamConsumers = 4;
constexpr int kStreamThreads = (kStreamConsumers + 1) * kWarpSize;
constexpr int kStreamTileRows = 16;
constexpr int kStreamMaxStages = 8;
/* The dynamic shared memory a block may take: sm_90's 227 KiB less the static
 * barriers and partial tiles. */
constexpr int kStreamMaxSharedBytes = 227 * 1024 - 4096 - 256 - 128;

/* k elements of one box (512 bytes a row). */
constexpr int kStreamBoxK = 256;
constexpr int kStreamBoxRowBytes = 2 * kStreamBoxK;

/* One stage of `chunk` k: chunk / 256 boxes of 16 weight rows and as many of
 * 8 N_TILES x rows. */
__host__ __device__ constexpr int stream_stage_bytes(int n_tiles, int chunk) {
  return (kStreamTileRows + 8 * n_tiles) * 2 * chunk;
}

/* A 3-D tensor copy of the box at (0, j0, row0) of a map that views a matrix as
 * [rows][k / 256][256] (one box: each row's whole chunk, contiguous in memory). */
__device__ __forceinline__ void tensor_copy_3d(void* dst, const msgl_tensor_map* map, int j0, int row0,
                                               unsigned long long* bar, unsigned long long policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(0), "r"(j0), "r"(row0), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}


/* A 2-D tensor copy of the box at (k0, row0) of the tensor map `map` (a
 * __grid_constant__ parameter) into this block's shared memory (128-byte
 * aligned), completing on `bar`, with an L2 policy. */
__device__ __forceinline__ void tensor_copy_2d(void* dst, const msgl_tensor_map* map, int k0, int row0,
                                               unsigned long long* bar, unsigned long long policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(k0), "r"(row0), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

__device__ __forceinline__ unsigned long long l2_policy_evict_first() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
  return p;
}

__device__ __forceinline__ unsigned long long l2_policy_evict_last() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}

/* Two mmas of one k-step of 32: acc += w rows (lo = g, hi = g + 8) . x row. */
template <int DTYPE>
__device__ __forceinline__ void stream_step(float (&acc)[4], const uint4& lo, const uint4& hi, const uint4& x) {
  const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y};
  mma16816<DTYPE>(acc, a0, x.x, x.y);
  const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w};
  mma16816<DTYPE>(acc, a1, x.z, x.w);
}

/* Where a block is in its sequence of units: the tile and k-chunk of the unit,
 * its stage in the ring, and how many times the ring has wrapped (the barrier
 * phase). Advanced by counting, not dividing: 64-bit divisions in the producer's
 * loop cost about a microsecond a unit, which bounded the first version at 1.8
 * TB/s whatever the ring depth. */
struct StreamCursor {
  long long tile;
  long long chunk;
  int stage;
  unsigned wraps;
  __device__ __forceinline__ void advance(long long chunks, int stages) {
    if (++chunk == chunks) {
      chunk = 0;
      ++tile;
    }
    if (++stage == stages) {
      stage = 0;
      ++wraps;
    }
  }
};

template <int DTYPE, int N_TILES>
__device__ __forceinline__ void stream_gemm_impl(const msgl_stream_gemm_params& p) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int kTileValues = N_TILES * 4 * kWarpSize; /* f32 values of one warp's tile */
  constexpr int kXRows = 8 * N_TILES;
  __shared__ unsigned long long full[kStreamMaxStages];
  __shared__ unsigned long long empty[kStreamMaxStages];
  __shared__ float partial[kStreamConsumers][kTileValues];
  extern __shared__ __align__(128) unsigned char stream_smem_raw[];
  /* Tensor copies need 128-byte aligned destinations (the launch adds 128 bytes). */
  unsigned char* const stream_smem = stream_smem_raw + ((128 - (smem_u32(stream_smem_raw) & 127)) & 127);

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int stages = p.stages;
  const int chunk_elems = p.chunk;
  const int stage_bytes = stream_stage_bytes(N_TILES, chunk_elems);
  const int x_offset = kStreamTileRows * 2 * chunk_elems; /* the x rows after the weight rows */
  /* Where element (row r, box b) of a stage's weights starts: r * row_pitch + b *
   * w_box_pitch (x: x_box_pitch). 3-D maps (whole_rows) write each row's chunk
   * contiguously; 2-D maps write box after box of [rows][256]. */
  const bool whole_rows = p.whole_rows != 0;
  const int row_pitch = whole_rows ? 2 * chunk_elems : kStreamBoxRowBytes;
  const int w_box_pitch = whole_rows ? kStreamBoxRowBytes : kStreamTileRows * kStreamBoxRowBytes;
  const int x_box_pitch = whole_rows ? kStreamBoxRowBytes : kXRows * kStreamBoxRowBytes;
  const long long tiles = (p.n + kStreamTileRows - 1) / kStreamTileRows;
  const long long t_begin = tiles * blockIdx.x / gridDim.x;
  const long long t_end = tiles * (blockIdx.x + 1) / gridDim.x;
  const long long chunks = (p.k + chunk_elems - 1) / chunk_elems;
  const long long units = (t_end - t_begin) * chunks;

  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kStreamConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == kStreamConsumers) {
    /* The producer: one thread issues every copy. */
    if (lane != 0) return;
    const unsigned long long stream_policy = l2_policy_evict_first();
    const unsigned long long keep_policy = l2_policy_evict_last();
    auto boxes = [&](const StreamCursor& c) {
      const long long rest = p.k - c.chunk * chunk_elems;
      const int kc = rest < chunk_elems ? static_cast<int>(rest) : chunk_elems;
      return (kc + kStreamBoxK - 1) / kStreamBoxK;
    };
    /* Whole boxes are counted: the maps zero-fill their parts outside the matrices
     * (a 3-D box always spans the whole chunk). */
    auto issue_w = [&](const StreamCursor& c) {
      const int nb = whole_rows ? chunk_elems / kStreamBoxK : boxes(c);
      unsigned char* stage = stream_smem + static_cast<long long>(c.stage) * stage_bytes;
      mbar_arrive_expect_tx(&full[c.stage], static_cast<unsigned>(nb * (kStreamTileRows + kXRows) * kStreamBoxRowBytes));
      const int k0 = static_cast<int>(c.chunk * chunk_elems);
      const int n0 = static_cast<int>(c.tile * kStreamTileRows);
      if (whole_rows) {
        tensor_copy_3d(stage, &p.w_map, k0 / kStreamBoxK, n0, &full[c.stage], stream_policy);
      } else {
        for (int b = 0; b < nb; ++b)
          tensor_copy_2d(stage + b * w_box_pitch, &p.w_map, k0 + b * kStreamBoxK, n0, &full[c.stage], stream_policy);
      }
    };
    auto issue_x = [&](const StreamCursor& c) {
      unsigned char* stage = stream_smem + static_cast<long long>(c.stage) * stage_bytes + x_offset;
      const int k0 = static_cast<int>(c.chunk * chunk_elems);
      if (whole_rows) {
        tensor_copy_3d(stage, &p.x_map, k0 / kStreamBoxK, 0, &full[c.stage], keep_policy);
      } else {
        const int nb = boxes(c);
        for (int b = 0; b < nb; ++b)
          tensor_copy_2d(stage + b * x_box_pitch, &p.x_map, k0 + b * kStreamBoxK, 0, &full[c.stage], keep_policy);
      }
    };
    prefetch_tensor_map(&p.w_map);
    prefetch_tensor_map(&p.x_map);
    const long long first = units < stages ? units : stages;
    StreamCursor c{t_begin, 0, 0, 0};
    for (long long u = 0; u < first; ++u, c.advance(chunks, stages)) issue_w(c);
    grid_prologue();
    StreamCursor cx{t_begin, 0, 0, 0};
    for (long long u = 0; u < first; ++u, cx.advance(chunks, stages)) issue_x(cx);
    for (long long u = first; u < units; ++u, c.advance(chunks, stages)) {
      /* The stage's previous use (wrap c.wraps - 1) must have been read. */
      mbar_wait(&empty[c.stage], (c.wraps - 1) & 1);
      issue_w(c);
      issue_x(c);
    }
    return;
  }

  /* The consumers: warp w takes the k-steps w, w + 4, ... of each stage. Element
   * (row r, k-step q, lane t) of a stage is in box q / 8 of row r, at byte
   * (q % 8) * 64 + 16 t of the box's row. */
  grid_prologue();
  const int g = lane / 4, t = lane % 4;
  const T* bias = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out);
  StreamCursor c{t_begin, 0, 0, 0};
  while (c.tile < t_end) {
    const long long tile = c.tile;
    float acc[N_TILES][4];
#pragma unroll
    for (int j = 0; j < N_TILES; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    do {
      const long long rest = p.k - c.chunk * chunk_elems;
      const int steps = (rest < chunk_elems ? static_cast<int>(rest) : chunk_elems) / 32;
      mbar_wait(&full[c.stage], c.wraps & 1);
      const unsigned char* stage = stream_smem + static_cast<long long>(c.stage) * stage_bytes;
      const unsigned char* w_lo = stage + g * row_pitch + t * 16;
      const unsigned char* w_hi = w_lo + 8 * row_pitch;
      const unsigned char* xr = stage + x_offset + g * row_pitch + t * 16;
#pragma unroll 4
      for (int q = warp; q < steps; q += kStreamConsumers) {
        const int box = q / 8, col = (q % 8) * 64;
        const int w_off = box * w_box_pitch + col;
        const int x_off = box * x_box_pitch + col;
        const uint4 lo = *reinterpret_cast<const uint4*>(w_lo + w_off);
        const uint4 hi = *reinterpret_cast<const uint4*>(w_hi + w_off);
#pragma unroll
        for (int j = 0; j < N_TILES; ++j)
          stream_step<DTYPE>(acc[j], lo, hi,
                             *reinterpret_cast<const uint4*>(xr + j * 8 * row_pitch + x_off));
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[c.stage]);
      c.advance(chunks, stages);
    } while (c.chunk != 0);

    /* Sum the 4 warps' tiles in warp order (value (j * 4 + e) * 32 + lane). */
#pragma unroll
    for (int j = 0; j < N_TILES; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) partial[warp][(j * 4 + e) * kWarpSize + lane] = acc[j][e];
    asm volatile("bar.sync 1, %0;" ::"n"(kStreamConsumers * kWarpSize) : "memory");
    const long long n0 = tile * kStreamTileRows;
    for (int v = threadIdx.x; v < kTileValues; v += kStreamConsumers * kWarpSize) {
      /* Accumulator e of lane (g', t') of x tile j: weight row g' + 8 (e / 2), x row 8 j + 2 t' + e % 2. */
      const int l = v % kWarpSize;
      const int e = (v / kWarpSize) % 4;
      const int j = v / (4 * kWarpSize);
      const long long n = n0 + l / 4 + 8 * (e / 2);
      const long long m = 8 * j + 2 * (l % 4) + e % 2;
      if (n < p.n && m < p.m) {
        float sum = partial[0][v];
#pragma unroll
        for (int w = 1; w < kStreamConsumers; ++w) sum += partial[w][v];
        if (bias != nullptr) sum += DType<DTYPE>::to_f32(bias[n]);
        out[m * p.n + n] = DType<DTYPE>::from_f32(sum);
      }
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kStreamConsumers * kWarpSize) : "memory");
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 160, grid = min(ceil(n / 16), SMs), stages * stream_stage_bytes(N_TILES, chunk)
 * + 128 bytes of dynamic shared memory, without the PDL attribute (the waits are
 * no-ops). */
extern "C" __global__ void __launch_bounds__(160, 1)
    msgl_stream_gemm_kernel(const __grid_constant__ msgl_stream_gemm_params p) {
  msgl::stream_gemm_impl<MSGL_DTYPE, MSGL_N_TILES>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include <atomic>

#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE, N_TILES) for each AOT instance */

namespace msgl {
template <int DTYPE, int N_TILES>
__global__ void __launch_bounds__(160, 1) stream_gemm_kernel(const __grid_constant__ msgl_stream_gemm_params p) {
  stream_gemm_impl<DTYPE, N_TILES>(p);
}

/* Launches one instance with `smem` bytes of dynamic shared memory, raising the
 * instance's limit on the current device first when it is above what was
 * allowed there so far. */
template <int DTYPE, int N_TILES>
static cudaError_t launch_stream(dim3 grid, size_t smem, cudaStream_t s, const msgl_stream_gemm_params& p) {
  constexpr int kMaxDevices = 64;
  static std::atomic<size_t> allowed[kMaxDevices];
  auto kernel = stream_gemm_kernel<DTYPE, N_TILES>;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool tracked = device >= 0 && device < kMaxDevices;
  if (!tracked || smem > allowed[device].load(std::memory_order_relaxed)) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
    if (tracked) allowed[device].store(smem, std::memory_order_relaxed);
  }
  return launch_pdl(kernel, grid, dim3(kStreamThreads), smem, s, p);
}
}  // namespace msgl

extern "C" int64_t msgl_stream_gemm_smem_bytes(int32_t n_tiles, int32_t chunk, int32_t stages) {
  using namespace msgl;
  if ((n_tiles != 1 && n_tiles != 2) || (chunk != 256 && chunk != 512 && chunk != 1024) || stages < 2 ||
      stages > kStreamMaxStages)
    return -1;
  /* 128 bytes for the alignment of the ring (the kernel's first lines). */
  return static_cast<int64_t>(stages) * stream_stage_bytes(n_tiles, chunk) + 128;
}

extern "C" int32_t msgl_stream_gemm(const msgl_tensor* out, const msgl_tensor* x, const msgl_tensor* w,
                                    const msgl_tensor* bias, const msgl_tensor_map* w_map,
                                    const msgl_tensor_map* x_map, int32_t whole_rows, int32_t chunk,
                                    int32_t stages, int32_t blocks, msgl_stream stream) {
  using namespace msgl;
  const char* op = "stream_gemm";
  constexpr uint32_t halves = dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(out, op, "out", 2, halves));
  MSGL_TRY(expect_tensor(x, op, "x", 2, halves));
  MSGL_TRY(expect_tensor(w, op, "w", 2, halves));
  MSGL_TRY(expect_same(x, "x", out, "out", op));
  MSGL_TRY(expect_same(x, "x", w, "w", op));
  const int64_t m = x->shape[0], k = x->shape[1], n = w->shape[0];
  MSGL_TRY(expect_dim(w, op, "w", 1, k));
  MSGL_TRY(expect_dim(out, op, "out", 0, m));
  MSGL_TRY(expect_dim(out, op, "out", 1, n));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  MSGL_TRY(expect_contiguous(w, op, "w"));
  MSGL_TRY(expect_rows(x, op, "x", 16));
  MSGL_TRY(expect_rows(w, op, "w", 16));
  if (bias != nullptr) {
    MSGL_TRY(expect_tensor(bias, op, "bias", 1, halves));
    MSGL_TRY(expect_same(x, "x", bias, "bias", op));
    MSGL_TRY(expect_dim(bias, op, "bias", 0, n));
    MSGL_TRY(expect_contiguous(bias, op, "bias"));
  }
  if (m < 1 || m > 16 || k % 32 != 0 || k == 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: needs 1..16 rows and k a positive multiple of 32, got m=%lld k=%lld",
                     op, static_cast<long long>(m), static_cast<long long>(k));
  const int32_t n_tiles = m <= 8 ? 1 : 2;
  const int64_t smem = msgl_stream_gemm_smem_bytes(n_tiles, chunk, stages);
  if (smem < 0 || smem > kStreamMaxSharedBytes)
    return set_error(MSGL_ERR_INVALID_ARGUMENT,
                     "%s: chunk %d must be 256, 512 or 1024 and stages %d 2..%d within %d bytes of shared memory", op,
                     chunk, stages, kStreamMaxStages, kStreamMaxSharedBytes);
  if (w_map == nullptr || x_map == nullptr)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the tensor maps of w and x are required", op);
  if (whole_rows != 0 && (whole_rows != 1 || k % kStreamBoxK != 0))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: whole_rows %d needs 0 or 1, and 1 needs k %% 256 == 0 (k=%lld)", op,
                     whole_rows, static_cast<long long>(k));
  if (n == 0) return MSGL_OK;
  const int64_t tiles = (n + kStreamTileRows - 1) / kStreamTileRows;
  if (blocks < 1 || blocks > tiles)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: blocks %d must be 1..%lld (the 16-row tiles)", op, blocks,
                     static_cast<long long>(tiles));

  msgl_stream_gemm_params p{};
  p.w_map = *w_map;
  p.x_map = *x_map;
  p.out = out->data;
  p.bias = bias != nullptr ? bias->data : nullptr;
  p.m = m;
  p.n = n;
  p.k = k;
  p.stages = stages;
  p.chunk = chunk;
  p.whole_rows = whole_rows;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  bool launched = false;
  cudaError_t err = cudaSuccess;
#define MSGL_CASE(D, NT)                                                                              \
  if (!launched && x->dtype == D && n_tiles == NT) {                                                  \
    err = launch_stream<D, NT>(dim3(static_cast<unsigned>(blocks)), static_cast<size_t>(smem), s, p); \
    launched = true;                                                                                  \
  }
  MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
  if (!launched)
    return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d N_TILES=%d", op, x->dtype, n_tiles);
  if (err != cudaSuccess)
    return set_error(MSGL_ERR_CUDA, "%s: %lld bytes of shared memory: %s", op, static_cast<long long>(smem),
                     cudaGetErrorString(err));
  return check_launch(op);
}
#endif
