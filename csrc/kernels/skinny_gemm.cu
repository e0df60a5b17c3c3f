/*
 * skinny_gemm.cu: out[m, n] = x[m, :] . w[n, :] (+ bias[n]) for m <= 16 rows, the
 * shape of the decode projections, where the time is that of reading w once.
 *
 * Why not cuBLASLt: at m = 1..64 its kernels reach 2.7-2.8 TB/s of weights on an
 * H200 (GPU.md), short of the ~4 TB/s a stream of loads can pull. The recipe
 * here is the memory one: 16-byte loads of w that skip L1 (each byte is used
 * once), several k-steps of loads issued before the first use, every weight byte
 * read once for all rows of x, and enough blocks to fill every SM.
 *
 * Tensor cores, with w as the A operand: out^T [n, m] = w [n, k] x^T [k, m]
 * is mma.sync m16n8k16 with 16 rows of w as A and 8 rows of x as B (N_TILES
 * B tiles for up to 16 rows). At m <= 16 the products are almost free (m = 1
 * wastes 7/8 of each mma, and the tensor cores still have ~100x headroom), while
 * CUDA-core FMAs at m = 16 would need most of the chip's f32 rate.
 *
 * Fragments straight from global memory: the k order inside a dot product is
 * free, so a lane (g = lane / 4, t = lane % 4) loads the 8 consecutive k values
 * [8t, 8t + 8) of a k-step of 32 as one 16-byte vector of each of its rows (w
 * rows g and g + 8, x row g), and the vector's four 32-bit pairs p0..p3 feed two
 * mmas: {w_g.p0, w_g8.p0, w_g.p1, w_g8.p1} x {x.p0, x.p1}, then the same with p2,
 * p3. Logical k 2t, 2t + 1 of an mma is then physical 8t, 8t + 1 and logical
 * 2t + 8, 2t + 9 physical 8t + 2, 8t + 3 in both operands, a permutation of k
 * that A and B share, so no shuffle or shared-memory staging is needed.
 *
 * Decomposition: a block of 8 warps owns 16 * M_TILES rows of w and a range of
 * K: all of it, or its 1/C share when the launcher groups C blocks (C = the K
 * split) into a thread-block cluster, which it does when the tiles alone would
 * leave SMs idle or a wave half empty (o_proj and down of small models: 64
 * tiles on 132 SMs). Warp i reduces the i-th eighth of the block's k-steps (a
 * contiguous range), loading the next kSkinnyUnroll / M_TILES k-steps while it
 * multiplies the current ones (two register stages, so a warp never waits with
 * nothing in flight); the eight f32 partial tiles are summed through shared
 * memory, then rank 0 of the cluster adds the other blocks' sums, read from
 * their shared memory in rank order (deterministic), adds the bias and rounds
 * once. Rows of w past n and rows of x past m read as zeros.
 *
 * Weight prefetch under programmatic dependent launch: the weights do not depend
 * on the kernel before this one, so each warp first copies the first
 * `prefetch_steps` k-steps of its share of w (the very 16-byte vectors its lanes
 * will use, into slots of its own in dynamic shared memory, with cp.async), then
 * lets the next kernel launch (griddepcontrol.launch_dependents), and only then
 * waits for the previous one (griddepcontrol.wait) before reading x. A launch
 * that starts while the previous kernel runs (the norm, rope or attention before
 * a projection) thus streams its weights meanwhile; k-steps past the prefetched
 * ones are read from global memory as before. The products and their order are
 * those of the unprefetched kernel, so results are bitwise the same.
 *
 * The bulk prefetch (bulk_prefetch = 1, sm_90): the same idea with the copy
 * engine. One thread copies the block's whole slice of w, each of its 16 M_TILES
 * rows' K range as one contiguous cp.async.bulk, into rows of shared memory
 * skinny_bulk_row_bytes apart, completing on one transaction barrier, and every
 * warp waits on that barrier (after the dependency wait) before its first read.
 * The cp.async prefetch moves 16 bytes an instruction from every lane, 4096
 * instructions a block for Qwen3-0.6B's o_proj, and a block streamed only ~10-15
 * GB/s (the sixteenth session's timeline: the 64-block o_proj and down took
 * 6.4 and 4.9 us after their predecessors ended however early they launched); a
 * bulk copy is one instruction a row and keeps the whole slice in flight. Rows
 * are padded to an odd multiple of 64 bytes, so that a phase of 8 lanes (rows g
 * and g + 1, 64 bytes each) reads all 32 banks once. Products and order are
 * unchanged: bitwise the same results.
 *
 * The gated variant (GATED = 1, a gate_up projection with SiLU-and-mul in its
 * epilogue): w holds 2 n rows, the gate rows 0..n and the up rows n..2n, and
 * out[m, j] = silu(gate[m, j]) * up[m, j]. A lane's A rows g and g + 8 of tile i
 * are gate row j0 + 8 i + g and up row n + j0 + 8 i + g (j0 = the block's first
 * output), so a block makes 8 * M_TILES outputs from 16 * M_TILES weight rows,
 * and one thread of the epilogue holds the gate and up sums of an output. Every
 * weight row is reduced exactly as the plain kernel reduces it, and both sums are
 * rounded to the dtype before silu_mul's f32 math (activation.cu): bitwise the
 * result of the gate_up GEMM followed by silu_mul.
 *
 * The pre-norm variant (NORM = 1, the decoder layer's residual step fused in front
 * of the qkv or gate_up projection, saving the norm's launch): x is the previous
 * block's output h, and after the dependency wait every block computes, for each
 * of its m rows, s = h + residual in f32, the row's mean square, and the GEMM input
 * s * rsqrt(mean(s^2) + eps) * norm_w rounded to the dtype, into shared memory
 * (rows padded by 64 bytes, so that the 16-byte loads of two rows in one phase
 * fall in different banks); block 0 also writes s rounded to residual_out. The
 * math is fused_add_rms_norm's (norm.cu: the norm of the f32 sum), the sum of
 * squares in another order, so the input may differ from the two-kernel path's in
 * the last bit. The main loop then reads x from shared memory instead of L2. A
 * separate residual_out is what makes this safe: every block reads the residual
 * while block 0 writes the new one. Re-reading h and residual per block costs L2
 * traffic of 2 m k bytes a block, small at decode sizes (4 KiB at m = 1, k = 1024).
 */
#include "minisgl/bulk.cuh"
#include "minisgl/device.cuh"
#include "minisgl/mma.cuh"

namespace msgl {

constexpr int kSkinnyWarps = 8;
constexpr int kSkinnyThreads = kSkinnyWarps * kWarpSize;
/* k-steps of 16 weight rows per register stage, per warp (halved for M_TILES 2):
 * 4 16-byte loads per lane, two stages in flight. Two stages of 4 k-steps would
 * hold twice the loads but need more than the 128 registers that two blocks an
 * SM leave a thread (ptxas spilled). */
constexpr int kSkinnyUnroll = 2;
/* Bytes of dynamic shared memory one prefetched k-step of one 16-row tile takes
 * in a block: 8 warps x 32 lanes x 2 vectors (rows g and g + 8) x 16 bytes. */
constexpr int kSkinnyStepBytes = kSkinnyWarps * kWarpSize * 2 * 16;
/* The prefetch budget: at most 96 KiB a block (prefetch_steps * M_TILES <= 12),
 * which still leaves two blocks an SM with their partial tiles. */
constexpr int kSkinnyMaxPrefetchTileSteps = 12;
/* The widest rows the pre-norm variant (NORM) normalises into shared memory: 16
 * rows of 2048 are 65 KiB, which with the prefetch still leaves two blocks an SM
 * when the host trims the prefetch (gpu/skinny.rs). */
constexpr int kSkinnyMaxNormK = 2048;

/* A 16-byte load of streamed weights: read-only path, not kept in L1 (each byte
 * is used once). */
__device__ __forceinline__ uint4 load_stream16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

/* A 16-byte load of x: cached in L2 only. x was written by the previous kernel,
 * whose blocks may have shared this SM with ours under programmatic dependent
 * launch: no L1 or read-only-cache line of it is trusted. */
__device__ __forceinline__ uint4 load_global_cg16(const void* p) {
  uint4 r;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

/* Two mmas of one k-step of 32: acc += w rows (lo = g, hi = g + 8) . x row. */
template <int DTYPE>
__device__ __forceinline__ void skinny_step(float (&acc)[4], const uint4& lo, const uint4& hi, const uint4& x) {
  const unsigned a0[4] = {lo.x, hi.x, lo.y, hi.y};
  mma16816<DTYPE>(acc, a0, x.x, x.y);
  const unsigned a1[4] = {lo.z, hi.z, lo.w, hi.w};
  mma16816<DTYPE>(acc, a1, x.z, x.w);
}

/* One register stage: U k-steps of this lane's w rows and x rows. */
template <int U, int M_TILES, int N_TILES> struct SkinnyStage {
  uint4 w[U][M_TILES][2];
  uint4 x[U][N_TILES];
};

/* Bytes between two rows of w in shared memory under the bulk prefetch, for a
 * block of `block_steps` k-steps (64 bytes each): the slice rounded up to 128
 * bytes, plus 64 (see the file comment). */
__host__ __device__ constexpr long long skinny_bulk_row_bytes(long long block_steps) {
  return (block_steps * 64 + 127) / 128 * 128 + 64;
}

/* Bytes between two normalised rows in shared memory (NORM): the row, plus 64 so
 * that lanes reading rows g and g + 1 in one 8-lane phase hit different banks. */
__host__ __device__ constexpr long long skinny_norm_row_bytes(long long k) { return 2 * k + 64; }

/* The pre-norm residual step of NORM (see the file comment): rows [0, m) of
 * x + residual, normalised into `xs` (rows skinny_norm_row_bytes(k) apart); block
 * `writer` also stores the rounded sums to residual_out. Ends with a barrier. */
template <int DTYPE>
__device__ __forceinline__ void skinny_norm_rows(const msgl_skinny_gemm_params& p, unsigned char* xs, bool writer) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int E = Vec16<DTYPE>::kElems;
  __shared__ float row_sums[16][kSkinnyWarps];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const long long chunks = p.k / E;
  const char* h = static_cast<const char*>(p.x);
  const char* r = static_cast<const char*>(p.residual);
  /* s = h + residual of one 16-byte chunk, in f32. */
  auto sum_chunk = [&](long long row, long long c, Vec16<DTYPE>& s) {
    Vec16<DTYPE> rv;
    s.from_raw(load_global_cg16(h + (row * p.x_stride + c * E) * 2));
    rv.from_raw(load_global_cg16(r + (row * p.residual_stride + c * E) * 2));
#pragma unroll
    for (int e = 0; e < E; ++e) s.v[e] += rv.v[e];
  };
  for (long long row = 0; row < p.m; ++row) {
    float ss = 0.f;
    for (long long c = threadIdx.x; c < chunks; c += kSkinnyThreads) {
      Vec16<DTYPE> s;
      sum_chunk(row, c, s);
#pragma unroll
      for (int e = 0; e < E; ++e) ss += s.v[e] * s.v[e];
      if (writer) *reinterpret_cast<uint4*>(static_cast<T*>(p.residual_out) + row * p.k + c * E) = s.to_raw();
    }
#pragma unroll
    for (int o = kWarpSize / 2; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) row_sums[row][warp] = ss;
  }
  __syncthreads();
  const T* nw = static_cast<const T*>(p.norm_w);
  const float inv_k = 1.f / static_cast<float>(p.k);
  for (long long row = 0; row < p.m; ++row) {
    float ss = 0.f;
#pragma unroll
    for (int w = 0; w < kSkinnyWarps; ++w) ss += row_sums[row][w];
    const float inv_rms = rsqrtf(ss * inv_k + p.eps);
    for (long long c = threadIdx.x; c < chunks; c += kSkinnyThreads) {
      Vec16<DTYPE> s, wv;
      sum_chunk(row, c, s);
      wv.from_raw(load_global_cg16(nw + c * E));
#pragma unroll
      for (int e = 0; e < E; ++e) s.v[e] = s.v[e] * inv_rms * wv.v[e];
      *reinterpret_cast<uint4*>(xs + row * skinny_norm_row_bytes(p.k) + c * 16) = s.to_raw();
    }
  }
  __syncthreads();
}

template <int DTYPE, int N_TILES, int M_TILES, int GATED, int NORM>
__device__ __forceinline__ void skinny_gemm_impl(const msgl_skinny_gemm_params& p) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int U = kSkinnyUnroll / M_TILES;
  constexpr int kTileValues = M_TILES * N_TILES * 4 * kWarpSize;
  /* Outputs (columns of out) a block makes. */
  constexpr int kBlockCols = GATED ? 8 * M_TILES : 16 * M_TILES;
  __shared__ float partial[kSkinnyWarps][kTileValues];
  extern __shared__ __align__(16) unsigned char skinny_smem[];

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, t = lane % 4;
  const unsigned splits = cluster_size();
  const unsigned rank = cluster_rank();
  const long long n0 = static_cast<long long>(blockIdx.x / splits) * kBlockCols;
  /* This block's k-steps, then this warp's eighth of them. */
  const long long steps = p.k / 32;
  const long long b_begin = steps * rank / splits;
  const long long b_steps = steps * (rank + 1) / splits - b_begin;
  const long long s_begin = b_begin + b_steps * warp / kSkinnyWarps;
  const long long s_end = b_begin + b_steps * (warp + 1) / kSkinnyWarps;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  /* This lane's rows: byte pointers to element 8t of k-step 0. */
  const char* w_row[M_TILES][2];
  bool w_ok[M_TILES][2];
#pragma unroll
  for (int i = 0; i < M_TILES; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      /* The output column this A row feeds, and the weight row. */
      const long long col = GATED ? n0 + 8 * i + g : n0 + 16 * i + 8 * h + g;
      const long long r = GATED && h == 1 ? p.n + col : col;
      w_ok[i][h] = col < p.n;
      w_row[i][h] = static_cast<const char*>(p.w) + (w_ok[i][h] ? r : 0) * p.k * 2 + t * 16;
    }

  /* The bulk prefetch (before the dependency wait): thread 0 copies each row of
   * the block's slice, row r = 16 i + 8 h + g of the layout above, and arms the
   * barrier with the bytes; rows past n are not copied (and read as zeros). */
  __shared__ __align__(8) unsigned long long bulk_bar;
  const long long bulk_row_bytes = skinny_bulk_row_bytes((steps + splits - 1) / splits);
  const bool bulk = p.bulk_prefetch != 0;
  if (bulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
      mbar_init(&bulk_bar, 1);
      mbar_init_fence();
      const unsigned row_bytes = static_cast<unsigned>(b_steps * 64);
      unsigned rows = 0;
      for (int r = 0; r < 16 * M_TILES; ++r) {
        const long long col = GATED ? n0 + 8 * (r / 16) + r % 8 : n0 + r;
        rows += col < p.n ? 1u : 0u;
      }
      mbar_arrive_expect_tx(&bulk_bar, rows * row_bytes);
      for (int r = 0; r < 16 * M_TILES; ++r) {
        const long long col = GATED ? n0 + 8 * (r / 16) + r % 8 : n0 + r;
        const long long wr = GATED && (r / 8) % 2 == 1 ? p.n + col : col;
        if (col < p.n)
          bulk_copy_g2s(skinny_smem + r * bulk_row_bytes, static_cast<const char*>(p.w) + wr * p.k * 2 + b_begin * 64,
                        row_bytes, &bulk_bar);
      }
    }
    __syncthreads(); /* the barrier initialised before anyone waits on it */
#else
    __trap(); /* the host asks for the bulk prefetch on sm_90 only */
#endif
  }
  /* This lane's first 16 bytes of row g of the bulk slice (row (i, h) is 16 i + 8 h rows on). */
  const unsigned char* bulk_lane = skinny_smem + g * bulk_row_bytes + t * 16;

  /* The prefetch (before the dependency wait: weights only, nothing written).
   * Slot (q, i, h) of this lane holds k-step s_begin + q of its row (i, h); a
   * warp's 32 lanes fill 32 consecutive 16-byte slots (conflict-free). Rows past
   * n are copied as zeros. */
  const long long pre = p.prefetch_steps < s_end - s_begin ? p.prefetch_steps : s_end - s_begin;
  const uint4* stash = reinterpret_cast<const uint4*>(skinny_smem) +
                       static_cast<long long>(warp) * p.prefetch_steps * M_TILES * 2 * kWarpSize + lane;
  auto slot = [&](long long q, int i, int h) { return stash + ((q * M_TILES + i) * 2 + h) * kWarpSize; };
  for (long long q = 0; q < pre; ++q) {
#pragma unroll
    for (int i = 0; i < M_TILES; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        cp_async16(const_cast<uint4*>(slot(q, i, h)), w_row[i][h] + (s_begin + q) * 64, w_ok[i][h] ? 16 : 0);
  }
  cp_async_commit();
  /* Wait for the previous kernel, then let the next one stage its weights (device.cuh). */
  grid_prologue();

  /* NORM: the normalised rows, in dynamic shared memory after the prefetch slots
   * (or the bulk rows). */
  unsigned char* xs = skinny_smem + (bulk ? 16 * M_TILES * bulk_row_bytes
                                          : static_cast<long long>(p.prefetch_steps) * M_TILES * kSkinnyStepBytes);
  if constexpr (NORM) skinny_norm_rows<DTYPE>(p, xs, blockIdx.x == 0);

  const char* x_row[N_TILES];
  bool x_ok[N_TILES];
#pragma unroll
  for (int j = 0; j < N_TILES; ++j) {
    const long long r = 8 * j + g;
    x_ok[j] = r < p.m;
    x_row[j] = NORM ? reinterpret_cast<const char*>(xs) + (x_ok[j] ? r : 0) * skinny_norm_row_bytes(p.k) + t * 16
                    : static_cast<const char*>(p.x) + (x_ok[j] ? r : 0) * p.x_stride * 2 + t * 16;
  }

  float acc[M_TILES][N_TILES][4];
#pragma unroll
  for (int i = 0; i < M_TILES; ++i)
#pragma unroll
    for (int j = 0; j < N_TILES; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  /* Loads the x rows of k-steps [s, s + U) (zeros past s_end) into a stage. */
  auto load_x = [&](SkinnyStage<U, M_TILES, N_TILES>& st, long long s) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool in = s + u < s_end;
      const long long off = (s + u) * 64;
#pragma unroll
      for (int j = 0; j < N_TILES; ++j) {
        if (!(in && x_ok[j]))
          st.x[u][j] = zero;
        else if constexpr (NORM)
          st.x[u][j] = *reinterpret_cast<const uint4*>(x_row[j] + off);
        else
          st.x[u][j] = load_global_cg16(x_row[j] + off);
      }
    }
  };
  /* Loads the w rows of k-steps [s, s + U): from the bulk rows or the prefetched
   * slots, else from global memory (zeros past s_end and past n). */
  auto load_w = [&](SkinnyStage<U, M_TILES, N_TILES>& st, long long s) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool in = s + u < s_end;
      const long long q = s + u - s_begin;
      const long long off = (s + u) * 64;
      if (bulk) {
        const unsigned char* at = bulk_lane + (s + u - b_begin) * 64;
#pragma unroll
        for (int i = 0; i < M_TILES; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            st.w[u][i][h] =
                in && w_ok[i][h] ? *reinterpret_cast<const uint4*>(at + (16 * i + 8 * h) * bulk_row_bytes) : zero;
      } else if (in && q < pre) {
#pragma unroll
        for (int i = 0; i < M_TILES; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) st.w[u][i][h] = *slot(q, i, h);
      } else {
#pragma unroll
        for (int i = 0; i < M_TILES; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) st.w[u][i][h] = in && w_ok[i][h] ? load_stream16(w_row[i][h] + off) : zero;
      }
    }
  };
  auto multiply_stage = [&](const SkinnyStage<U, M_TILES, N_TILES>& st) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < N_TILES; ++j)
#pragma unroll
        for (int i = 0; i < M_TILES; ++i) skinny_step<DTYPE>(acc[i][j], st.w[u][i][0], st.w[u][i][1], st.x[u][j]);
  };

  /* Two stages in turn: stage b is loaded while stage a is multiplied. The first
   * x loads are in flight while this thread's prefetch copies land. */
  SkinnyStage<U, M_TILES, N_TILES> a, b;
  long long s = s_begin;
  if (s < s_end) load_x(a, s);
  cp_async_wait<0>(); /* this thread's own slots: no barrier needed */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bulk) mbar_wait(&bulk_bar, 0);
#endif
  if (s < s_end) load_w(a, s);
  while (s < s_end) {
    if (s + U < s_end) {
      load_x(b, s + U);
      load_w(b, s + U);
    }
    multiply_stage(a);
    s += U;
    if (s >= s_end) break;
    if (s + U < s_end) {
      load_x(a, s + U);
      load_w(a, s + U);
    }
    multiply_stage(b);
    s += U;
  }

  /* Sum the warps' partial tiles: value ((i * N_TILES + j) * 4 + c) * 32 + lane;
   * each thread owns the values e = threadIdx.x (mod 256) and leaves their sum in
   * partial[0][e]. */
#pragma unroll
  for (int i = 0; i < M_TILES; ++i)
#pragma unroll
    for (int j = 0; j < N_TILES; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) partial[warp][((i * N_TILES + j) * 4 + c) * kWarpSize + lane] = acc[i][j][c];
  __syncthreads();
  for (int e = threadIdx.x; e < kTileValues; e += kSkinnyThreads) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kSkinnyWarps; ++w) sum += partial[w][e];
    partial[0][e] = sum;
  }
  /* Every block's sums written and visible. Unsplit, the block barrier: the gated
   * epilogue reads the up sum of value e + 64, which another warp summed (without
   * it, racecheck found 12288 hazards a launch of Qwen3-0.6B's gate_up, and under
   * the sanitizers' timing the outputs were wrong). */
  if (splits > 1)
    cluster_sync();
  else
    __syncthreads();
  if (rank == 0) {
    const T* bias = static_cast<const T*>(p.bias);
    T* out = static_cast<T*>(p.out);
    /* The sum of value e over the cluster, in rank order. */
    auto total = [&](int e) {
      float sum = partial[0][e];
      for (unsigned r = 1; r < splits; ++r) sum += load_cluster_f32(&partial[0][e], r);
      return sum;
    };
    /* Accumulator c of lane (g', t') of tile (i, j): A row g' + 8 (c / 2), x row
     * 8 j + 2 t' + c % 2. GATED: the epilogue takes the values of c = 0, 1 (gate
     * rows) and finds the up sum of the same output at c + 2, 64 values on. */
    constexpr int kOuts = GATED ? kTileValues / 2 : kTileValues;
    for (int o = threadIdx.x; o < kOuts; o += kSkinnyThreads) {
      const int e = GATED ? (o / (2 * kWarpSize)) * (4 * kWarpSize) + o % (2 * kWarpSize) : o;
      const int l = e % kWarpSize;
      const int c = (e / kWarpSize) % 4;
      const int ij = e / (4 * kWarpSize);
      const int i = ij / N_TILES, j = ij % N_TILES;
      const long long n = GATED ? n0 + 8 * i + l / 4 : n0 + 16 * i + l / 4 + 8 * (c / 2);
      const long long m = 8 * j + 2 * (l % 4) + c % 2;
      if (n < p.n && m < p.m) {
        float sum = total(e);
        if constexpr (GATED) {
          float up = total(e + 2 * kWarpSize);
          if (bias != nullptr) {
            sum += DType<DTYPE>::to_f32(bias[n]);
            up += DType<DTYPE>::to_f32(bias[p.n + n]);
          }
          /* The GEMM's outputs rounded to the dtype, then silu_mul's f32 math. */
          const float gate = DType<DTYPE>::to_f32(DType<DTYPE>::from_f32(sum));
          const float upr = DType<DTYPE>::to_f32(DType<DTYPE>::from_f32(up));
          out[m * p.n + n] = DType<DTYPE>::from_f32(silu_f32(gate) * upr);
        } else {
          if (bias != nullptr) sum += DType<DTYPE>::to_f32(bias[n]);
          out[m * p.n + n] = DType<DTYPE>::from_f32(sum);
        }
      }
    }
  }
  if (splits > 1) cluster_sync(); /* rank 0 has read the others' shared memory */
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 256, grid = ceil(n / (16 * M_TILES)) (GATED: ceil(n / (8 * M_TILES))),
 * prefetch_steps * M_TILES * kSkinnyStepBytes (bulk_prefetch: 16 * M_TILES *
 * skinny_bulk_row_bytes(k / 32) instead; NORM: + m * skinny_norm_row_bytes(k))
 * of dynamic shared memory, without
 * clusters (no K split) and without the PDL attribute (the waits are no-ops). */
extern "C" __global__ void __launch_bounds__(256, 2) msgl_skinny_gemm_kernel(const msgl_skinny_gemm_params p) {
  msgl::skinny_gemm_impl<MSGL_DTYPE, MSGL_N_TILES, MSGL_M_TILES, MSGL_GATED, MSGL_NORM>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include <atomic>

#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE, N_TILES, M_TILES, GATED, NORM) for each AOT instance */

namespace msgl {
template <int DTYPE, int N_TILES, int M_TILES, int GATED, int NORM>
__global__ void __launch_bounds__(256, 2) skinny_gemm_kernel(const msgl_skinny_gemm_params p) {
  skinny_gemm_impl<DTYPE, N_TILES, M_TILES, GATED, NORM>(p);
}

/* Launches one instance with `smem` bytes of dynamic shared memory, raising the
 * instance's limit on the current device first when it is above what was
 * allowed there so far (and asking for the largest shared-memory carveout, so
 * that two blocks with their prefetch fit an SM beside other kernels' blocks). */
template <int DTYPE, int N_TILES, int M_TILES, int GATED, int NORM>
static cudaError_t launch_skinny(dim3 grid, size_t smem, cudaStream_t s, unsigned k_splits,
                                 const msgl_skinny_gemm_params& p) {
  constexpr int kMaxDevices = 64;
  static std::atomic<size_t> allowed[kMaxDevices];
  auto kernel = skinny_gemm_kernel<DTYPE, N_TILES, M_TILES, GATED, NORM>;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool tracked = device >= 0 && device < kMaxDevices;
  if (!tracked || smem > allowed[device].load(std::memory_order_relaxed)) {
    /* Always: with the static partial tiles (16.5 KiB for NORM) even less than 48
     * KiB of dynamic memory can pass the default limit of 48 KiB a block. */
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) return err;
    if (tracked) allowed[device].store(smem, std::memory_order_relaxed);
  }
  return launch_pdl_cluster(kernel, grid, dim3(kSkinnyThreads), smem, s, k_splits, p);
}
}  // namespace msgl

extern "C" int32_t msgl_skinny_gemm(const msgl_tensor* out, const msgl_tensor* x, const msgl_tensor* w,
                                    const msgl_tensor* bias, const msgl_tensor* residual,
                                    const msgl_tensor* residual_out, const msgl_tensor* norm_w, float eps,
                                    int32_t m_tiles, int32_t k_splits, int32_t gated, int32_t prefetch_steps,
                                    int32_t bulk_prefetch, msgl_stream stream) {
  using namespace msgl;
  const char* op = gated ? "skinny_gemm_silu_mul" : "skinny_gemm";
  constexpr uint32_t halves = dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(out, op, "out", 2, halves));
  MSGL_TRY(expect_tensor(x, op, "x", 2, halves));
  MSGL_TRY(expect_tensor(w, op, "w", 2, halves));
  MSGL_TRY(expect_same(x, "x", out, "out", op));
  MSGL_TRY(expect_same(x, "x", w, "w", op));
  if (gated != 0 && gated != 1) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: gated %d must be 0 or 1", op, gated);
  if (gated && w->shape[0] % 2 != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `w` has %lld rows, not gate rows then as many up rows", op,
                     static_cast<long long>(w->shape[0]));
  const int64_t m = x->shape[0], k = x->shape[1], n = gated ? w->shape[0] / 2 : w->shape[0];
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
    MSGL_TRY(expect_dim(bias, op, "bias", 0, w->shape[0]));
    MSGL_TRY(expect_contiguous(bias, op, "bias"));
  }
  if (m < 1 || m > 16 || k % 32 != 0 || k == 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: needs 1..16 rows and k a positive multiple of 32, got m=%lld k=%lld",
                     op, static_cast<long long>(m), static_cast<long long>(k));
  if (m_tiles != 1 && m_tiles != 2)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: m_tiles %d must be 1 or 2", op, m_tiles);
  if (k_splits < 1 || k_splits > 8 || k_splits > k / 32)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: k_splits %d must be 1..8 and at most k / 32 = %lld", op,
                     k_splits, static_cast<long long>(k / 32));
  if (prefetch_steps < 0 || prefetch_steps * m_tiles > kSkinnyMaxPrefetchTileSteps)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: prefetch_steps %d must be 0..%d for m_tiles %d", op, prefetch_steps,
                     kSkinnyMaxPrefetchTileSteps / m_tiles, m_tiles);
  if (bulk_prefetch != 0 && (bulk_prefetch != 1 || prefetch_steps != 0))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: bulk_prefetch %d must be 0, or 1 with prefetch_steps 0 (got %d)", op,
                     bulk_prefetch, prefetch_steps);
  const int32_t norm = residual != nullptr || residual_out != nullptr || norm_w != nullptr ? 1 : 0;
  if (norm) {
    if (residual == nullptr || residual_out == nullptr || norm_w == nullptr)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: residual, residual_out and norm_w go together", op);
    MSGL_TRY(expect_tensor(residual, op, "residual", 2, halves));
    MSGL_TRY(expect_tensor(residual_out, op, "residual_out", 2, halves));
    MSGL_TRY(expect_tensor(norm_w, op, "norm_w", 1, halves));
    MSGL_TRY(expect_same(x, "x", residual, "residual", op));
    MSGL_TRY(expect_same(x, "x", residual_out, "residual_out", op));
    MSGL_TRY(expect_same(x, "x", norm_w, "norm_w", op));
    MSGL_TRY(expect_dim(residual, op, "residual", 0, m));
    MSGL_TRY(expect_dim(residual, op, "residual", 1, k));
    MSGL_TRY(expect_dim(residual_out, op, "residual_out", 0, m));
    MSGL_TRY(expect_dim(residual_out, op, "residual_out", 1, k));
    MSGL_TRY(expect_dim(norm_w, op, "norm_w", 0, k));
    MSGL_TRY(expect_contiguous(residual_out, op, "residual_out"));
    MSGL_TRY(expect_contiguous(norm_w, op, "norm_w"));
    MSGL_TRY(expect_rows(residual, op, "residual", 16));
    if (k > kSkinnyMaxNormK)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the pre-norm rows need k <= %d, got %lld", op, kSkinnyMaxNormK,
                       static_cast<long long>(k));
    if (residual_out->data == residual->data || residual_out->data == x->data)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: residual_out must not be x or residual", op);
  }
  if (n == 0) return MSGL_OK;

  msgl_skinny_gemm_params p{};
  p.out = out->data;
  p.x = x->data;
  p.w = w->data;
  p.bias = bias != nullptr ? bias->data : nullptr;
  p.m = m;
  p.n = n;
  p.k = k;
  p.x_stride = m > 1 ? x->strides[0] : k;
  p.prefetch_steps = prefetch_steps;
  p.bulk_prefetch = bulk_prefetch;
  if (norm) {
    p.residual = residual->data;
    p.residual_out = residual_out->data;
    p.norm_w = norm_w->data;
    p.residual_stride = m > 1 ? residual->strides[0] : k;
    p.eps = eps;
  }
  const int32_t n_tiles = m <= 8 ? 1 : 2;
  const int64_t cols_per_block = (gated ? 8 : 16) * int64_t{m_tiles};
  const int64_t tiles = (n + cols_per_block - 1) / cols_per_block;
  if (tiles * k_splits > int64_t{0x7fffffff})
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: grid of %lld blocks is too large", op,
                     static_cast<long long>(tiles * k_splits));
  const dim3 grid(static_cast<unsigned>(tiles * k_splits));
  const long long block_steps = (k / 32 + k_splits - 1) / k_splits;
  const size_t staged = bulk_prefetch ? static_cast<size_t>(16 * m_tiles * skinny_bulk_row_bytes(block_steps))
                                      : static_cast<size_t>(prefetch_steps) * m_tiles * kSkinnyStepBytes;
  const size_t smem = staged + (norm ? static_cast<size_t>(m * skinny_norm_row_bytes(k)) : 0);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  bool launched = false;
  cudaError_t err = cudaSuccess;
#define MSGL_CASE(D, NT, MT, GT, NM)                                                                              \
  if (!launched && x->dtype == D && n_tiles == NT && m_tiles == MT && gated == GT && norm == NM) {                \
    err = launch_skinny<D, NT, MT, GT, NM>(grid, smem, s, static_cast<unsigned>(k_splits), p);                    \
    launched = true;                                                                                              \
  }
  MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
  if (!launched)
    return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d N_TILES=%d M_TILES=%d GATED=%d NORM=%d", op,
                     x->dtype, n_tiles, m_tiles, gated, norm);
  if (err != cudaSuccess)
    return set_error(MSGL_ERR_CUDA, "%s: %zu bytes of shared memory: %s", op, smem, cudaGetErrorString(err));
  return check_launch(op);
}
#endif
