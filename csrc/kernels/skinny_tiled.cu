/*
 * skinny_tiled.cu: out[m, n] = x[m, :] . w[n, :] (+ bias[n]) for the mid-sized
 * decode batches (m = 1..256, best at 17..64) and for weights too large for
 * skinny_gemm.cu, at the weight-streaming limit.
 *
 * Why another kernel: skinny_gemm.cu keeps its weights in flight in registers
 * (two stages of 2 k-steps a warp, 32 KiB an SM), too few bytes to hide HBM
 * latency on Llama-3-8B's 32-224 MiB projections (2.2-2.7 TB/s), and it reads x
 * from L2 once per warp, which at m = 64 would be four times the weight bytes.
 * cuBLASLt reaches 2.45-2.61 TB/s there and spends 7-8 us on Qwen3-0.6B's
 * 4-12 MiB projections at m = 64 (1-3 us of weight reads). Here:
 *
 *   - the weights stream through a multi-stage cp.async pipeline in shared
 *     memory (`stages` stages, `chunk` k-steps of 32 a warp each), so the bytes
 *     in flight (stages - 1 stages, 16 KiB each at chunk 2, per block, two blocks
 *     an SM) cost no registers;
 *   - each lane copies exactly the 16-byte weight vectors it later feeds to the
 *     tensor cores, so the weight slots need no layout change (the fragment trick
 *     of skinny_gemm.cu: lane (g, t) holds elements [8t, 8t + 8) of a k-step of
 *     rows g and g + 8, and x row g the same elements; the k permutation this
 *     makes inside an mma is shared by A and B);
 *   - the x rows of a stage (8 * N_TILES rows x the block's k-steps) are staged
 *     once per block in shared memory by all threads and shared by the block's
 *     `warps_n` warps that own different weight rows (x traffic = w traffic x
 *     8 N_TILES / (16 warps_n));
 *   - mma.sync m16n8k16 with w as A (16 rows) and x as B (8 rows per tile, N_TILES
 *     tiles), f32 accumulators (4 N_TILES registers a lane).
 *
 * Decomposition: 8 warps = warps_n x warps_k. A block owns 16 warps_n weight rows
 * (warp wn the rows 16 wn..16 wn + 15), 8 N_TILES rows of x (the row group
 * blockIdx / splits % y_chunks; m above 8 N_TILES runs y_chunks row groups,
 * adjacent in launch order so they find their weights in L2) and a range of K:
 * all of it, or its 1/C share when the launcher groups C blocks into a
 * thread-block cluster (the K split that fills the SMs when there are few tiles).
 * A stage covers `chunk * warps_k` consecutive k-steps of the block's range; warp
 * (wn, wk) multiplies the wk-th `chunk` of them. The warps' f32 tiles are summed
 * in shared memory in wk order, rank 0 of the cluster adds the other blocks'
 * sums in rank order (distributed shared memory), adds the bias and rounds once:
 * the result depends on the plan (the split changes the order of the sum), never
 * on timing. Rows of w past n, rows of x past m and k-steps past the block's range
 * are copied as zeros.
 *
 * Programmatic dependent launch (device.cuh): the weight copies of the first
 * stages - 1 stages are issued before grid_prologue() (weights only, into shared
 * memory; nothing else is read and nothing is written before it); the x copies of
 * those stages and everything else come after.
 */
#include "minisgl/mma.cuh"
#include "minisgl/device.cuh"

namespace msgl {

constexpr int kTiledWarps = 8;
constexpr int kTiledThreads = kTiledWarps * kWarpSize;

/* cp.async.wait_group with a run-time count (the pipeline depth is a plan
 * parameter): waits until at most n of this thread's groups are in flight. */
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  switch (n) {
    case 0: cp_async_wait<0>(); break;
    case 1: cp_async_wait<1>(); break;
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    default: cp_async_wait<6>(); break;
  }
}

/* Two mmas of one k-step of 32: acc += w rows (lo = g, hi = g + 8) . x row. */
template <int DTYPE>
__device__ __forceinline__ void tiled_step(float (&acc)[4], const uint4& lo, const uint4& hi, const uint4& x) {
  const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y};
  mma16816<DTYPE>(acc, a0, x.x, x.y);
  const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w};
  mma16816<DTYPE>(acc, a1, x.z, x.w);
}

template <int DTYPE, int N_TILES>
__device__ __forceinline__ void skinny_tiled_impl(const msgl_skinny_tiled_params& p) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int R = 8 * N_TILES;             /* x rows a block takes */
  constexpr int kTile = N_TILES * 4 * kWarpSize; /* f32 values of one warp's tile */
  extern __shared__ __align__(16) unsigned char tiled_smem[];
  uint4* const base = reinterpret_cast<uint4*>(tiled_smem);

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const int warps_n = p.warps_n;
  const int warps_k = kTiledWarps / warps_n;
  const int wn = warp % warps_n, wk = warp / warps_n;
  const int chunk = p.chunk;
  const int stages = p.stages;
  const int sk = chunk * warps_k; /* block k-steps per stage */
  const unsigned splits = cluster_size();
  const unsigned rank = cluster_rank();
  const long long cell = blockIdx.x / splits;
  const long long n0 = (cell / p.y_chunks) * 16 * warps_n;
  const long long row0 = (cell % p.y_chunks) * R;
  const long long steps = p.k / 32;
  const long long b_begin = steps * rank / splits;
  const long long b_end = steps * (rank + 1) / splits;
  /* Stages of this block (k / 32 < 2^31: int arithmetic for the slot indices). */
  const int n_stages = static_cast<int>((b_end - b_begin + sk - 1) / sk);

  /* Stage slot layout (uint4 units): the weights, warp by warp (chunk x 2 rows x
   * 32 lanes each), then the x rows ((k-step * R + row) * 4 + part). A lane's
   * weight slots and a warp's x reads are 32 consecutive vectors: conflict-free. */
  const int w_vecs = kTiledWarps * chunk * 2 * kWarpSize;
  const int x_vecs = sk * R * 4;
  const int stage_vecs = w_vecs + x_vecs;

  const char* w_row[2];
  bool w_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const long long col = n0 + 16 * wn + 8 * h + g;
    w_ok[h] = col < p.n;
    w_row[h] = static_cast<const char*>(p.w) + (w_ok[h] ? col : 0) * p.k * 2 + t * 16;
  }
  auto issue_w = [&](int s) {
    uint4* slots = base + (s % stages) * stage_vecs + warp * chunk * 2 * kWarpSize + lane;
    const long long ks0 = b_begin + static_cast<long long>(s) * sk + wk * chunk;
    for (int c = 0; c < chunk; ++c) {
      const long long ks = ks0 + c;
      const bool in = ks < b_end;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        cp_async16(slots + (c * 2 + h) * kWarpSize, w_row[h] + (in ? ks * 64 : 0), in && w_ok[h] ? 16 : 0);
    }
  };
  const char* const x = static_cast<const char*>(p.x);
  auto issue_x = [&](int s) {
    uint4* slots = base + (s % stages) * stage_vecs + w_vecs;
    const long long ks0 = b_begin + static_cast<long long>(s) * sk;
    for (int v = threadIdx.x; v < x_vecs; v += kTiledThreads) {
      const int q = v % 4, r = (v / 4) % R, kl = v / (4 * R);
      const long long ks = ks0 + kl, row = row0 + r;
      const bool ok = ks < b_end && row < p.m;
      cp_async16(slots + v, x + (ok ? row * p.x_stride * 2 + ks * 64 + q * 16 : 0), ok ? 16 : 0);
    }
  };

  /* The weight prefetch, then the dependency wait, then the x rows of the same
   * stages: one group, waited whole (the stages land together anyway). */
  const int pre = stages - 1 < n_stages ? stages - 1 : n_stages;
  for (int s = 0; s < pre; ++s) issue_w(s);
  grid_prologue();
  for (int s = 0; s < pre; ++s) issue_x(s);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  float acc[N_TILES][4];
#pragma unroll
  for (int j = 0; j < N_TILES; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[j][c] = 0.f;

  for (int s = 0; s < n_stages; ++s) {
    if (s > 0) {
      /* Stage s landed (the groups after its own are the stages - 2 issued since),
       * and every warp is done with stage s - 1, whose slot is refilled next. */
      cp_async_wait_upto(stages - 2);
      __syncthreads();
    }
    if (s + stages - 1 < n_stages) {
      issue_w(s + stages - 1);
      issue_x(s + stages - 1);
    }
    cp_async_commit(); /* possibly empty: keeps one group per iteration */
    const uint4* ws = base + (s % stages) * stage_vecs + warp * chunk * 2 * kWarpSize + lane;
    const uint4* xs = base + (s % stages) * stage_vecs + w_vecs + g * 4 + t;
    for (int c = 0; c < chunk; ++c) {
      const uint4 lo = ws[(c * 2) * kWarpSize];
      const uint4 hi = ws[(c * 2 + 1) * kWarpSize];
      const uint4* xk = xs + (wk * chunk + c) * R * 4;
#pragma unroll
      for (int j = 0; j < N_TILES; ++j) tiled_step<DTYPE>(acc[j], lo, hi, xk[8 * j * 4]);
    }
  }

  /* The pipeline's shared memory now holds the warps' tiles (the launcher sizes
   * it for both): value (j * 4 + c) * 32 + lane of warp w at w * kTile. */
  cp_async_wait<0>();
  __syncthreads();
  float* partial = reinterpret_cast<float*>(tiled_smem);
#pragma unroll
  for (int j = 0; j < N_TILES; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) partial[warp * kTile + (j * 4 + c) * kWarpSize + lane] = acc[j][c];
  __syncthreads();
  /* Value o = wn * kTile + e: the sum over wk, in wk order, left in warp wn's tile. */
  const int vals = warps_n * kTile;
  for (int o = threadIdx.x; o < vals; o += kTiledThreads) {
    const int own = o / kTile, e = o % kTile;
    float sum = 0.f;
    for (int k = 0; k < warps_k; ++k) sum += partial[(own + warps_n * k) * kTile + e];
    partial[own * kTile + e] = sum;
  }
  if (splits > 1) {
    cluster_sync(); /* every block's sums written and visible */
  } else {
    __syncthreads();
  }
  if (rank == 0) {
    const T* bias = static_cast<const T*>(p.bias);
    T* out = static_cast<T*>(p.out);
    for (int o = threadIdx.x; o < vals; o += kTiledThreads) {
      const int own = o / kTile, e = o % kTile;
      /* Accumulator c of lane l of tile j: w row l / 4 + 8 (c / 2), x row 8 j + 2 (l % 4) + c % 2. */
      const int l = e % kWarpSize, c = (e / kWarpSize) % 4, j = e / (4 * kWarpSize);
      const long long col = n0 + 16 * own + l / 4 + 8 * (c / 2);
      const long long row = row0 + 8 * j + 2 * (l % 4) + c % 2;
      if (col < p.n && row < p.m) {
        const int at = own * kTile + e;
        float sum = partial[at];
        for (unsigned r = 1; r < splits; ++r) sum += load_cluster_f32(&partial[at], r);
        if (bias != nullptr) sum += DType<DTYPE>::to_f32(bias[col]);
        out[row * p.n + col] = DType<DTYPE>::from_f32(sum);
      }
    }
  }
  if (splits > 1) cluster_sync(); /* rank 0 has read the others' shared memory */
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 256, grid = tiles * y_chunks (no cluster: K whole), the dynamic shared
 * memory msgl_skinny_tiled_smem_bytes gives, without the PDL attribute. */
extern "C" __global__ void __launch_bounds__(256, 2) msgl_skinny_tiled_kernel(const msgl_skinny_tiled_params p) {
  msgl::skinny_tiled_impl<MSGL_DTYPE, MSGL_N_TILES>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include <atomic>

#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE, N_TILES) for each AOT instance */

namespace msgl {
template <int DTYPE, int N_TILES>
__global__ void __launch_bounds__(256, 2) skinny_tiled_kernel(const msgl_skinny_tiled_params p) {
  skinny_tiled_impl<DTYPE, N_TILES>(p);
}

/* Launches one instance, raising its dynamic shared-memory limit on the current
 * device first when `smem` is above what was allowed there so far (and asking
 * for the largest carveout, so that two blocks fit an SM). */
template <int DTYPE, int N_TILES>
static cudaError_t launch_tiled(dim3 grid, size_t smem, cudaStream_t s, unsigned k_splits,
                                const msgl_skinny_tiled_params& p) {
  constexpr int kMaxDevices = 64;
  static std::atomic<size_t> allowed[kMaxDevices];
  auto kernel = skinny_tiled_kernel<DTYPE, N_TILES>;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool tracked = device >= 0 && device < kMaxDevices;
  if (!tracked || smem > allowed[device].load(std::memory_order_relaxed)) {
    if (smem > (48 << 10))
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) return err;
    if (tracked) allowed[device].store(smem, std::memory_order_relaxed);
  }
  return launch_pdl_cluster(kernel, grid, dim3(kTiledThreads), smem, s, k_splits, p);
}
}  // namespace msgl

extern "C" int64_t msgl_skinny_tiled_smem_bytes(int32_t n_tiles, int32_t warps_n, int32_t chunk, int32_t stages) {
  if (warps_n < 1 || warps_n > 8 || 8 % warps_n != 0 || chunk < 1 || stages < 2 || n_tiles < 1) return -1;
  const int64_t stage = int64_t{chunk} * 8 * 1024 + int64_t{chunk} * (8 / warps_n) * (8 * n_tiles) * 64;
  const int64_t partial = int64_t{8} * n_tiles * 4 * 32 * 4;
  return stage * stages > partial ? stage * stages : partial;
}

extern "C" int32_t msgl_skinny_tiled(const msgl_tensor* out, const msgl_tensor* x, const msgl_tensor* w,
                                     const msgl_tensor* bias, int32_t n_tiles, int32_t warps_n, int32_t chunk,
                                     int32_t stages, int32_t k_splits, msgl_stream stream) {
  using namespace msgl;
  const char* op = "skinny_tiled";
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
  if (m < 1 || k % 32 != 0 || k == 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: needs m >= 1 and k a positive multiple of 32, got m=%lld k=%lld",
                     op, static_cast<long long>(m), static_cast<long long>(k));
  if (n_tiles != 1 && n_tiles != 2 && n_tiles != 4 && n_tiles != 8 && n_tiles != 16)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: n_tiles %d must be 1, 2, 4, 8 or 16", op, n_tiles);
  if (warps_n != 1 && warps_n != 2 && warps_n != 4 && warps_n != 8)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: warps_n %d must be 1, 2, 4 or 8", op, warps_n);
  if (chunk < 1 || chunk > 4 || stages < 2 || stages > 8)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: chunk %d must be 1..4 and stages %d 2..8", op, chunk, stages);
  if (k_splits < 1 || k_splits > 8 || k_splits > k / 32)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: k_splits %d must be 1..8 and at most k / 32 = %lld", op,
                     k_splits, static_cast<long long>(k / 32));
  const int64_t smem = msgl_skinny_tiled_smem_bytes(n_tiles, warps_n, chunk, stages);
  if (smem > (227 << 10))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: plan needs %lld bytes of shared memory (at most 227 KiB)", op,
                     static_cast<long long>(smem));
  if (n == 0) return MSGL_OK;

  msgl_skinny_tiled_params p{};
  p.out = out->data;
  p.x = x->data;
  p.w = w->data;
  p.bias = bias != nullptr ? bias->data : nullptr;
  p.m = m;
  p.n = n;
  p.k = k;
  p.x_stride = m > 1 ? x->strides[0] : k;
  p.warps_n = warps_n;
  p.chunk = chunk;
  p.stages = stages;
  const int64_t rows = int64_t{8} * n_tiles;
  p.y_chunks = static_cast<int32_t>((m + rows - 1) / rows);
  const int64_t tiles = (n + 16 * int64_t{warps_n} - 1) / (16 * int64_t{warps_n});
  if (tiles * p.y_chunks * k_splits > int64_t{0x7fffffff} || (m + rows - 1) / rows > int64_t{0x7fffffff})
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: grid too large", op);
  const dim3 grid(static_cast<unsigned>(tiles * p.y_chunks * k_splits));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  bool launched = false;
  cudaError_t err = cudaSuccess;
#define MSGL_CASE(D, NT)                                                                                           \
  if (!launched && x->dtype == D && n_tiles == NT) {                                                               \
    err = launch_tiled<D, NT>(grid, static_cast<size_t>(smem), s, static_cast<unsigned>(k_splits), p);              \
    launched = true;                                                                                               \
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
