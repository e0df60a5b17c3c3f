/*
 * moe_gemm.cu: the grouped GEMMs of a mixture-of-experts layer over moe_align's
 * sorted list, on the tensor cores (mma.sync m16n8k16, bf16/f16 in, f32
 * accumulate). One kernel serves both projections:
 *
 *   GATE_UP = 1  act[r, j] = silu(A_r . Wg[e, j]) * (A_r . Wu[e, j]),  A_r = x[sorted_ids[r] / top_k]
 *   GATE_UP = 0  part[p, j] = topk_weights[p] * (act[r] . Wd[e, j]),   p = sorted_ids[r]
 *
 * where e is the expert of row r and W[e] its [n_w, k] matrix (the HF Linear
 * layout; the gate_up matrix holds the gate rows, then the up rows).
 *
 * Work decomposition. moe_align cut every expert's run of the sorted list into
 * tiles of at most BM rows (multiples of its 16-row granule); a CTA computes one
 * tile x BN output columns (gate_up: BN / 2 gate and the BN / 2 matching up
 * columns). The grid is sized from a bound on the tile count and CTAs past the
 * real count return at once, so nothing is copied to the host. Tiles are
 * ordered in groups of 8 (all column tiles of 8 row tiles, row fastest), so the
 * tiles of one expert share its weight tiles in L2. A tile shorter than BM (an
 * expert's last) skips the mma of its empty 16-row slices; the common full tile
 * runs a main loop without those guards.
 *
 * Per CTA: a WM x WN grid of warps, each owning a (BM / WM) x (BN / WN) piece.
 * A rows (gathered by token for gate_up, zero-filled for padding) and weight rows
 * stream into a STAGES-deep ring of shared-memory tiles with 16-byte cp.async
 * (rows padded by 16 bytes, so ldmatrix is free of bank conflicts); fragments come
 * from ldmatrix. SiLU-and-mul is fused into the gate_up epilogue: each warp owns
 * the same columns of the gate half and of the up half, so a gate accumulator and
 * its up partner sit in the same registers. The routing weight is applied in the
 * down epilogue, which writes each pair's row for moe_sum.
 *
 * Programmatic dependent launch (pdl = 1, sm_90): the down GEMM issues its first
 * weight stages before waiting for the gate_up GEMM (the weights do not depend on
 * it), and every GEMM lets its successor launch once its main loop is done.
 *
 * The TILE table below is the configuration space the host's heuristic picks
 * from by tokens per expert (kernel-runtime gpu/moe.rs, after mini-sglang's
 * get_default_config): 16-row tiles with deep pipelines stream the weights of a
 * decode step across every SM; 32- and 64-row tiles serve batches of a few to a
 * few dozen tokens per expert; 128 x 128 tiles with 64 x 64 warp tiles the
 * prefill batches. A thread's copies of a tile are rows lr, lr + RSTEP, ... at
 * one 16-byte column, so it keeps a row index per A copy and a validity bit per
 * weight copy rather than a pointer per copy: that is what lets the 64 x 64 warp
 * tiles take 64-wide k stages without spilling.
 *
 * Tiles 18.. are wgmma tiles (sm_90a, moe_wgmma_impl; a trap on other archs, and
 * the host refuses them on devices other than sm_90): the mma.sync tiles are
 * register-bound at large M (every warp holds its A and B fragments), while
 * wgmma reads both operands from shared memory. Same decomposition, pair list,
 * epilogues and PDL; the ring holds 128-byte-swizzled rows for the descriptors.
 */
#include "minisgl/mma.cuh"

namespace msgl {

/* ---- the tile table ------------------------------------------------------------ */

/* TILE -> tile shape: BM x BN per CTA, BK per pipeline stage, a WM x WN grid of
 * warps, STAGES-deep cp.async ring, MINB CTAs per SM for the register budget, and
 * PF: the L2 prefetch size hint of the weight copies in bytes (0: none; 256: each
 * 16-byte copy asks L2 for its whole 256-byte block, so a 128-byte row segment of
 * a 64-wide stage also brings the next stage's segment of that row: twice the
 * weight bytes in flight per CTA for the streaming tiles). */
template <int TILE> struct MoeTile;
#define MSGL_MOE_TILE(T, BM_, BN_, BK_, WM_, WN_, STAGES_, MINB_, PF_)                                    \
  template <> struct MoeTile<T> {                                                                         \
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_, MINB = MINB_; \
    static constexpr int PF = PF_;                                                                        \
    static constexpr bool WGMMA = false;                                                                  \
  };
MSGL_MOE_TILE(0, 16, 64, 64, 1, 2, 8, 1, 0)   // decode: 64-thread CTAs, 7 stages in flight
MSGL_MOE_TILE(1, 16, 128, 128, 1, 4, 4, 1, 0) // decode when k % 128 == 0: 256-byte row segments
MSGL_MOE_TILE(2, 32, 128, 64, 1, 4, 4, 1, 0)  // up to ~24 tokens per expert
MSGL_MOE_TILE(3, 64, 128, 64, 2, 2, 4, 1, 0)  // up to ~96 tokens per expert
MSGL_MOE_TILE(4, 128, 128, 64, 2, 2, 3, 1, 0) // prefill: 64 x 64 warp tiles
MSGL_MOE_TILE(5, 16, 32, 128, 1, 1, 4, 4, 0)  // decode, GEMV-like: one warp, 52 KB, 4 CTAs per SM, 4x the CTAs of tile 1
MSGL_MOE_TILE(6, 16, 64, 128, 1, 2, 3, 3, 0)  // decode: 65 KB, 3 CTAs per SM, 2x the CTAs of tile 1
MSGL_MOE_TILE(7, 16, 128, 64, 1, 4, 4, 2, 0)  // a few rows per expert: 83 KB, 2 CTAs per SM
MSGL_MOE_TILE(8, 32, 128, 64, 1, 4, 3, 3, 0)  // tile 2 with 3 stages: 69 KB, 3 CTAs per SM
MSGL_MOE_TILE(9, 32, 64, 128, 1, 2, 4, 2, 0)  // tile 2 at half the columns: 2x the CTAs, 256-byte rows
MSGL_MOE_TILE(10, 64, 128, 64, 2, 4, 4, 2, 0) // tile 3 with 8 warps (32 x 32 warp tiles)
MSGL_MOE_TILE(11, 128, 128, 64, 2, 4, 3, 2, 0) // prefill, 8 warps (64 x 32 warp tiles), 2 CTAs per SM
MSGL_MOE_TILE(12, 128, 256, 64, 2, 4, 3, 1, 0) // prefill, 8 warps (64 x 64 warp tiles), 166 KB
MSGL_MOE_TILE(13, 16, 64, 64, 1, 2, 8, 1, 256)    // tile 0 with the 256-byte L2 prefetch of the weights
MSGL_MOE_TILE(14, 16, 128, 64, 1, 4, 4, 2, 256)   // tile 7 with the prefetch
MSGL_MOE_TILE(15, 32, 128, 64, 1, 4, 4, 1, 256)   // tile 2 with the prefetch
MSGL_MOE_TILE(16, 32, 128, 64, 1, 4, 3, 3, 256)   // tile 8 with the prefetch
MSGL_MOE_TILE(17, 64, 128, 64, 2, 2, 4, 1, 256)   // tile 3 with the prefetch
#undef MSGL_MOE_TILE
/* wgmma tiles (sm_90a, moe_wgmma_impl): BM = 64 rows per consumer warpgroup (WG
 * warpgroups of 4 warps: WM = WG, WN = 4 in the table's terms), BN = 128 or 256
 * columns, BK = 64 (one 128-byte swizzled row), STAGES-deep ring (loads run
 * STAGES - 2 stages ahead), MINB CTAs per SM. */
#define MSGL_MOE_WGMMA_TILE(T, BM_, BN_, BK_, WG_, STAGES_, MINB_)                                        \
  template <> struct MoeTile<T> {                                                                         \
    static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WG_, WN = 4, STAGES = STAGES_, MINB = MINB_;  \
    static constexpr int PF = 0;                                                                          \
    static constexpr bool WGMMA = true;                                                                   \
  };
MSGL_MOE_WGMMA_TILE(18, 64, 128, 64, 1, 4, 2)   // 97 KB: 2 CTAs per SM
MSGL_MOE_WGMMA_TILE(19, 128, 128, 64, 2, 4, 1)  // 129 KB
MSGL_MOE_WGMMA_TILE(20, 128, 256, 64, 2, 3, 1)  // 145 KB, 128 accumulators per thread
MSGL_MOE_WGMMA_TILE(21, 128, 256, 64, 2, 4, 1)  // 193 KB
MSGL_MOE_WGMMA_TILE(22, 64, 256, 64, 1, 4, 1)   // 161 KB
MSGL_MOE_WGMMA_TILE(23, 128, 128, 64, 2, 6, 1)  // 193 KB: tile 19 with loads 4 stages ahead
#undef MSGL_MOE_WGMMA_TILE
constexpr int kMoeTiles = 24;

/* The BM (BK when `bk`) of tile `tile`, 0 when there is no such tile. */
template <int TILE = 0> __host__ __device__ constexpr int moe_tile_bm(int tile, bool bk = false) {
  if constexpr (TILE >= kMoeTiles) {
    return 0;
  } else {
    return tile == TILE ? (bk ? MoeTile<TILE>::BK : MoeTile<TILE>::BM) : moe_tile_bm<TILE + 1>(tile, bk);
  }
}

template <int TILE> __host__ __device__ constexpr int moe_tile_threads() { return MoeTile<TILE>::WM * MoeTile<TILE>::WN * 32; }

/* Output columns of one CTA. */
template <int TILE, int GATE_UP> __host__ __device__ constexpr int moe_tile_cols() {
  return GATE_UP ? MoeTile<TILE>::BN / 2 : MoeTile<TILE>::BN;
}

/* Dynamic shared memory of a CTA for reduction length k. */
template <int TILE> __host__ __device__ constexpr long long moe_tile_smem() {
  using C = MoeTile<TILE>;
  // wgmma tiles: unpadded swizzled rows, plus the slack that aligns the ring to 1024 bytes.
  if constexpr (C::WGMMA) return static_cast<long long>(C::STAGES) * (C::BM + C::BN) * C::BK * 2 + 1024;
  return static_cast<long long>(C::STAGES) * (C::BM + C::BN) * (C::BK + 8) * 2;
}

/* CTAs of the grid for `max_tiles` tiles and n output columns. */
template <int TILE, int GATE_UP> __host__ __device__ constexpr long long moe_tile_grid(int max_tiles, int n) {
  constexpr int cols = moe_tile_cols<TILE, GATE_UP>();
  return static_cast<long long>(max_tiles) * ((n + cols - 1) / cols);
}

/* ---- the tiled kernel ----------------------------------------------------------- */

/* A 16-byte cp.async of weights (zero-filled past `bytes`), with the L2 prefetch
 * size hint PF (0, 64, 128 or 256 bytes; a hint only: the copy is the same). */
template <int PF> __device__ __forceinline__ void moe_cp_async16(void* smem, const void* gmem, int bytes) {
  static_assert(PF == 0 || PF == 64 || PF == 128 || PF == 256, "prefetch sizes of PTX cp.async");
  if constexpr (PF == 256) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(smem_u32(smem)), "l"(gmem), "r"(bytes) : "memory");
  } else if constexpr (PF == 128) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(smem_u32(smem)), "l"(gmem), "r"(bytes) : "memory");
  } else if constexpr (PF == 64) {
    asm volatile("cp.async.cg.shared.global.L2::64B [%0], [%1], 16, %2;" ::"r"(smem_u32(smem)), "l"(gmem), "r"(bytes) : "memory");
  } else {
    cp_async16(smem, gmem, bytes);
  }
}

/* The k loop of one CTA over its STAGES-deep ring. FULL: every m16 row tile of
 * the warp is inside the tile's rows (no per-tile guards in the hot loop). */
template <int DTYPE, int TILE, int GATE_UP, bool FULL, typename LoadStage>
__device__ __forceinline__ void moe_tiled_mainloop(float (&acc)[MoeTile<TILE>::BM / MoeTile<TILE>::WM / 16]
                                                             [MoeTile<TILE>::BN / MoeTile<TILE>::WN / 8][4],
                                                   const unsigned short* smem, int KT, int rows, const LoadStage& load_stage) {
  using Cfg = MoeTile<TILE>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, WN = Cfg::WN, STAGES = Cfg::STAGES;
  constexpr int TM = BM / Cfg::WM, TN = BN / WN, MI = TM / 16, NI = TN / 8;
  constexpr int ROW = BK + 8;
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int wm = warp / WN, wn = warp % WN;
  // Shared-memory row of this warp's n8 tile j (gate_up: the first half from the
  // gate rows, the second from the matching up rows).
  auto b_row = [&](int j) {
    if (GATE_UP) return j < NI / 2 ? wn * (TN / 2) + j * 8 : BN / 2 + wn * (TN / 2) + (j - NI / 2) * 8;
    return wn * TN + j * 8;
  };
  auto active = [&](int i) { return FULL || wm * TM + i * 16 < rows; };
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int next = kt + STAGES - 1;
    if (next < KT) load_stage(next % STAGES, next);
    cp_async_commit();
    const unsigned short* as = smem + (kt % STAGES) * (BM + BN) * ROW;
    const unsigned short* bs = as + BM * ROW;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      unsigned af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i)
        if (active(i)) ldmatrix_x4(af[i], as + (wm * TM + i * 16 + lane % 16) * ROW + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int j = 0; j < NI; j += 2) {
        unsigned r4[4];
        // Tiles j and j + 1 are adjacent rows in shared memory (both gate or both up).
        ldmatrix_x4(r4, bs + (b_row(j) + (lane / 16) * 8 + lane % 8) * ROW + kk * 16 + ((lane / 8) % 2) * 8);
        bf[j][0] = r4[0];
        bf[j][1] = r4[1];
        bf[j + 1][0] = r4[2];
        bf[j + 1][1] = r4[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
        if (active(i)) {
#pragma unroll
          for (int j = 0; j < NI; ++j) mma16816<DTYPE>(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
    }
  }
}

template <int DTYPE, int TILE, int GATE_UP>
__device__ __forceinline__ void moe_tiled_impl(const msgl_moe_gemm_params& p) {
  using Cfg = MoeTile<TILE>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, WM = Cfg::WM, WN = Cfg::WN, STAGES = Cfg::STAGES;
  constexpr int THREADS = WM * WN * kWarpSize;
  constexpr int TM = BM / WM, TN = BN / WN, MI = TM / 16, NI = TN / 8;
  constexpr int ROW = BK + 8;                 // shared-memory row, elements
  constexpr int CH = BK / 8;                  // 16-byte chunks per row
  constexpr int A_ITERS = BM * CH / THREADS;  // chunks per thread per stage
  constexpr int B_ITERS = BN * CH / THREADS;
  constexpr int COLS = moe_tile_cols<TILE, GATE_UP>();
  constexpr int GROUP = 8;
  static_assert(BM * CH % THREADS == 0 && BN * CH % THREADS == 0, "tile loads must divide among the threads");
  static_assert(NI % 2 == 0 && (!GATE_UP || NI % 4 == 0), "warp tiles come in pairs of n8 tiles");
  static_assert(THREADS >= BM, "one thread per tile row loads the pair list");
  static_assert(B_ITERS <= 32, "one validity bit per weight copy");
  extern __shared__ __align__(16) unsigned char moe_smem[];
  __shared__ int s_pair[BM];
  using T = unsigned short;

  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int wm = warp / WN, wn = warp % WN;

  // CTA -> (tile, column tile), in groups of GROUP tiles (the tiles of one
  // expert are consecutive, so a group shares the expert's weight tiles in L2).
  const int num_n = (p.n + COLS - 1) / COLS;
  const int pid = blockIdx.x;
  const int per_group = GROUP * num_n;
  const int first = pid / per_group * GROUP;
  const int group_size = p.max_tiles - first < GROUP ? p.max_tiles - first : GROUP;
  const int ti = first + (pid % per_group) % group_size;
  const int nt = (pid % per_group) / group_size;
  // gate_up reads the tiles written by the kernel just before (the sort); down
  // reads them before its predecessor (gate_up) has finished, so that its weight
  // prefetch overlaps gate_up's tail under programmatic dependent launch (the
  // sort ran to completion before gate_up started; L2-only loads, never a stale L1 line).
  if (GATE_UP) grid_dependency_wait();
  if (ti >= __ldcg(p.tiles) || __ldcg(p.tiles + 1) != BM) return;
  const int r0 = __ldcg(p.tiles + 2 + ti);
  const int e = __ldcg(p.block_experts + r0 / p.block_m);
  const int end = __ldcg(p.expert_offsets + e + 1) - r0;
  const int rows = end < BM ? end : BM;  // rows of this tile (a multiple of block_m)
  // k is a multiple of 8 (16-byte chunks); the last stage of a k that is not a
  // multiple of BK zero-fills its chunks past k, which add nothing to the products.
  const int K = p.k, KT = (K + BK - 1) / BK;

  // A thread copies the 16-byte chunk `lc` of rows lr, lr + RSTEP, ... of each
  // tile: addresses are recomputed per copy from a row index, so that the
  // registers hold one index per A row instead of a pointer per copy.
  constexpr int RSTEP = THREADS / CH;
  static_assert(THREADS % CH == 0 && (BN / 2) % RSTEP == 0, "row steps must tile the gate and up halves");
  const int lr = tid / CH, lc = tid % CH;
  const long long n_w = GATE_UP ? 2LL * p.n : p.n;
  const T* w = static_cast<const T*>(p.w) + static_cast<long long>(e) * n_w * K + lc * 8;
  const int j0 = GATE_UP ? nt * (BN / 2) : nt * BN;
  unsigned b_valid = 0;
#pragma unroll
  for (int i = 0; i < B_ITERS; ++i) {
    const int r = lr + i * RSTEP;
    const int j = j0 + (GATE_UP && i * RSTEP >= BN / 2 ? r - BN / 2 : r);
    b_valid |= static_cast<unsigned>(j < p.n) << i;
  }
  T* smem = reinterpret_cast<T*>(moe_smem);
  auto load_b = [&](int s, int kt) {
    T* bs = smem + s * (BM + BN) * ROW + BM * ROW + lc * 8;
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
      const int r = lr + i * RSTEP;
      // Gate rows j0.. in the first half of the tile, the matching up rows n + j0.. in the second.
      const int row = GATE_UP && i * RSTEP >= BN / 2 ? p.n + j0 + r - BN / 2 : j0 + r;
      const bool valid = (b_valid >> i & 1u) && kt * BK + lc * 8 < K;
      moe_cp_async16<Cfg::PF>(bs + r * ROW, w + (valid ? static_cast<long long>(row) * K + kt * BK : 0), valid ? 16 : 0);
    }
  };
  // The weights do not depend on the previous kernel: start their pipeline first.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_b(s, s);
    cp_async_commit();
  }
  if (!GATE_UP) grid_dependency_wait();

  if (tid < BM) s_pair[tid] = tid < rows ? __ldcg(p.sorted_ids + r0 + tid) : -1;
  __syncthreads();

  // The source row of each of this thread's A copies (-1: zero fill).
  const T* a = static_cast<const T*>(p.a) + lc * 8;
  int a_row[A_ITERS];
#pragma unroll
  for (int i = 0; i < A_ITERS; ++i) {
    const int r = lr + i * RSTEP;
    const int pair = s_pair[r];
    const bool valid = pair >= 0 && pair < p.num_pairs;
    a_row[i] = !valid ? -1 : GATE_UP ? pair / p.top_k : r0 + r;
  }
  auto load_a = [&](int s, int kt) {
    T* as = smem + s * (BM + BN) * ROW + lc * 8;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      const int r = lr + i * RSTEP;
      const bool valid = a_row[i] >= 0 && kt * BK + lc * 8 < K;
      cp_async16(as + r * ROW, a + (valid ? static_cast<long long>(a_row[i]) * p.a_stride + kt * BK : 0), valid ? 16 : 0);
    }
  };
  // Groups so far: B0..B(S-2); now A0..A(S-2). The main loop's wait<STAGES - 2>
  // still finds stage kt's A and B complete (every A group follows its B group).
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load_a(s, s);
    cp_async_commit();
  }
  auto load_stage = [&](int s, int kt) {
    load_a(s, kt);
    load_b(s, kt);
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.f;
  if (rows >= BM) {
    moe_tiled_mainloop<DTYPE, TILE, GATE_UP, true>(acc, smem, KT, rows, load_stage);
  } else {
    moe_tiled_mainloop<DTYPE, TILE, GATE_UP, false>(acc, smem, KT, rows, load_stage);
  }
  cp_async_wait<0>();
  grid_dependents_launch();

  using Out = typename DType<DTYPE>::Storage;
  Out* out = static_cast<Out*>(p.out);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rl = wm * TM + i * 16 + g + 8 * h;  // row within the tile
      if (rl >= rows) continue;
      if (GATE_UP) {
        const long long r = static_cast<long long>(r0) + rl;
#pragma unroll
        for (int j = 0; j < NI / 2; ++j) {
          const int col = nt * (BN / 2) + wn * (TN / 2) + j * 8 + 2 * t;
          const float y0 = silu_f32(acc[i][j][2 * h]) * acc[i][j + NI / 2][2 * h];
          const float y1 = silu_f32(acc[i][j][2 * h + 1]) * acc[i][j + NI / 2][2 * h + 1];
          if (col < p.n) *reinterpret_cast<unsigned*>(out + r * p.out_stride + col) = pack2<DTYPE>(y0, y1);
        }
      } else {
        const int pair = s_pair[rl];
        if (pair < 0 || pair >= p.num_pairs) continue;
        const float wt = __ldcg(p.topk_weights + pair);
        Out* o = out + static_cast<long long>(pair) * p.out_stride;
#pragma unroll
        for (int j = 0; j < NI; ++j) {
          const int col = nt * BN + wn * TN + j * 8 + 2 * t;
          if (col < p.n) *reinterpret_cast<unsigned*>(o + col) = pack2<DTYPE>(acc[i][j][2 * h] * wt, acc[i][j][2 * h + 1] * wt);
        }
      }
    }
  }
}

/* ---- the wgmma tiles (sm_90a) ---------------------------------------------------- */

/* One warpgroup's m64nNk16 wgmma (bf16 or f16 in, f32 accumulate), both operands
 * K-major from shared memory through descriptors; `scale_d` 0 overwrites d, 1 adds
 * to it. d is the "wgmma register fragment D" of PTX: warp w of the warpgroup owns
 * rows 16 w .. 16 w + 15; in its lane (g = lane / 4, t = lane % 4) d[4 i + 2 h + c]
 * is row 16 w + g + 8 h, column 8 i + 2 t + c (n8 block i, like the mma.sync
 * accumulators side by side). */
template <int N> struct MoeWgmma;
template <> struct MoeWgmma<128> {
  template <int DTYPE>
  static __device__ __forceinline__ void mma(float (&d)[64], unsigned long long da, unsigned long long db, int scale_d) {
    if constexpr (DTYPE == MSGL_BF16) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
          "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
          "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
          "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
          "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
          "}, %64, %65, p, 1, 1, 0, 0;\n}"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
          : "l"(da), "l"(db), "r"(scale_d));
    } else {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
          "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
          "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
          "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
          "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
          "}, %64, %65, p, 1, 1, 0, 0;\n}"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
          : "l"(da), "l"(db), "r"(scale_d));
    }
  }
};
template <> struct MoeWgmma<256> {
  template <int DTYPE>
  static __device__ __forceinline__ void mma(float (&d)[128], unsigned long long da, unsigned long long db, int scale_d) {
    if constexpr (DTYPE == MSGL_BF16) {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
          "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
          "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
          "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
          "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
          "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
          "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
          "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
          "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
          "}, %128, %129, p, 1, 1, 0, 0;\n}"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
          : "l"(da), "l"(db), "r"(scale_d));
    } else {
      asm volatile(
          "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
          "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
          "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
          "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
          "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
          "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
          "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
          "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
          "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
          "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
          "}, %128, %129, p, 1, 1, 0, 0;\n}"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
          : "l"(da), "l"(db), "r"(scale_d));
    }
  }
};

/* The shared-memory layout of the wgmma tiles. A stage is the A tile (BM rows)
 * then the B tile (BN rows), each row BK = 64 elements = 128 bytes, in the
 * canonical K-major 128-byte-swizzle layout (the one TMA's SWIZZLE_128B writes):
 * row r at byte r * 128, its 16-byte chunk c at chunk position c ^ (r % 8), the
 * tile based at a multiple of 1024 bytes (the swizzle XORs address bits 4..6 with
 * bits 7..9, so the 8-row atoms must be 1024-byte aligned). The descriptor of a
 * 64-row (A) or BN-row (B) operand: start address >> 4 (bits 0..13), leading
 * byte offset 16 >> 4 (bits 16..29; unused by a swizzled K-major operand whose
 * K extent, 16 elements = 32 bytes, stays inside one 128-byte row), stride byte
 * offset 1024 >> 4 (bits 32..45: from one 8-row atom to the next), base offset 0
 * (bits 49..51; the atoms are aligned), layout type 1 = 128-byte swizzle (bits
 * 62..63). The k16 step kk of a stage starts 32 kk bytes into the rows: the
 * hardware applies the swizzle to the computed address, so the start address
 * moves by the unswizzled offset (as CUTLASS's and DeepGEMM's k iterators do). */
__device__ __forceinline__ unsigned long long moe_wgmma_desc(unsigned smem_addr) {
  return static_cast<unsigned long long>((smem_addr & 0x3ffff) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

/* Byte offset of the 16-byte chunk c of row r in a 128-byte-swizzled tile. */
__device__ __forceinline__ unsigned moe_sw128(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

/* Orders this thread's completed shared-memory writes (cp.async) before later
 * reads by the async proxy (wgmma operands); a barrier after it publishes them. */
__device__ __forceinline__ void moe_fence_proxy_async() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
__device__ __forceinline__ void moe_wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void moe_wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void moe_wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
/* Pins the accumulators at this point of the program: the compiler may neither
 * read them before a wgmma.wait_group nor move their zeroing past a wgmma. */
template <int R> __device__ __forceinline__ void moe_fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/* A wgmma tile: CTA = WM consumer warpgroups (BM = 64 WM rows, warpgroup wg owns
 * rows 64 wg ..) x BN columns (gate_up: BN / 2 gate rows then the BN / 2 matching up
 * rows of W, so that a gate accumulator and its up partner are in the same thread,
 * n8 blocks i and i + BN / 16). Every thread loads (no producer warps): a
 * STAGES-deep ring, loads of stage kt + STAGES - 2 issued while the wgmma of stage
 * kt - 1 may still run (one wgmma group in flight), so that the buffer a load
 * overwrites is the one of stage kt - 2, whose wgmma every warpgroup has waited for
 * before the barrier of iteration kt. The tile's rows, the zero-filled k tail, the
 * guarded n tail, the pair list and PDL are as in moe_tiled_impl. */
template <int DTYPE, int TILE, int GATE_UP>
__device__ __forceinline__ void moe_wgmma_impl(const msgl_moe_gemm_params& p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Cfg = MoeTile<TILE>;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, WG = Cfg::WM, STAGES = Cfg::STAGES;
  constexpr int THREADS = WG * 128;
  constexpr int CH = BK / 8;  // 16-byte chunks per row
  constexpr int A_ITERS = BM * CH / THREADS, B_ITERS = BN * CH / THREADS;
  constexpr int COLS = moe_tile_cols<TILE, GATE_UP>();
  constexpr int GROUP = 8;
  constexpr int NB = BN / 8;                              // n8 blocks of a warpgroup's accumulator
  constexpr unsigned A_BYTES = BM * BK * 2, STAGE_BYTES = (BM + BN) * BK * 2;
  static_assert(BK == 64, "a 128-byte-swizzled row is 64 16-bit elements");
  static_assert(BM == 64 * WG && (BN == 128 || BN == 256), "wgmma tiles: 64 rows per warpgroup, n128 or n256");
  static_assert(BM * CH % THREADS == 0 && BN * CH % THREADS == 0, "tile loads must divide among the threads");
  static_assert(B_ITERS <= 32, "one validity bit per weight copy");
  static_assert(STAGES >= 3, "a load two stages ahead of the wgmma group in flight");
  extern __shared__ __align__(16) unsigned char moe_smem[];
  __shared__ int s_pair[BM];
  using T = unsigned short;

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / kWarpSize, lane = tid % kWarpSize;

  // CTA -> (tile, column tile), as moe_tiled_impl.
  const int num_n = (p.n + COLS - 1) / COLS;
  const int pid = blockIdx.x;
  const int per_group = GROUP * num_n;
  const int first = pid / per_group * GROUP;
  const int group_size = p.max_tiles - first < GROUP ? p.max_tiles - first : GROUP;
  const int ti = first + (pid % per_group) % group_size;
  const int nt = (pid % per_group) / group_size;
  if (GATE_UP) grid_dependency_wait();
  if (ti >= __ldcg(p.tiles) || __ldcg(p.tiles + 1) != BM) return;
  const int r0 = __ldcg(p.tiles + 2 + ti);
  const int e = __ldcg(p.block_experts + r0 / p.block_m);
  const int end = __ldcg(p.expert_offsets + e + 1) - r0;
  const int rows = end < BM ? end : BM;
  const int K = p.k, KT = (K + BK - 1) / BK;

  // The ring, 1024-byte aligned (moe_tile_smem reserves the slack).
  const unsigned raw = smem_u32(moe_smem);
  const unsigned base = (raw + 1023u) & ~1023u;
  unsigned char* smem = moe_smem + (base - raw);

  // Thread -> chunk lc of rows lr, lr + RSTEP, ...; RSTEP is a multiple of 8, so
  // every row of a thread has the same swizzled chunk position.
  constexpr int RSTEP = THREADS / CH;
  static_assert(RSTEP % 8 == 0 && (BN / 2) % RSTEP == 0, "row steps must keep the swizzle phase and tile the halves");
  const int lr = tid / CH, lc = tid % CH;
  const unsigned chunk = moe_sw128(lr, lc);  // + r * 128 for row lr + i * RSTEP
  const long long n_w = GATE_UP ? 2LL * p.n : p.n;
  const T* w = static_cast<const T*>(p.w) + static_cast<long long>(e) * n_w * K + lc * 8;
  const int j0 = GATE_UP ? nt * (BN / 2) : nt * BN;
  unsigned b_valid = 0;
#pragma unroll
  for (int i = 0; i < B_ITERS; ++i) {
    const int r = lr + i * RSTEP;
    const int j = j0 + (GATE_UP && i * RSTEP >= BN / 2 ? r - BN / 2 : r);
    b_valid |= static_cast<unsigned>(j < p.n) << i;
  }
  auto load_b = [&](int s, int kt) {
    unsigned char* bs = smem + s * STAGE_BYTES + A_BYTES + chunk;
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
      const int r = lr + i * RSTEP;
      const int row = GATE_UP && i * RSTEP >= BN / 2 ? p.n + j0 + r - BN / 2 : j0 + r;
      const bool valid = (b_valid >> i & 1u) && kt * BK + lc * 8 < K;
      cp_async16(bs + i * RSTEP * 128, w + (valid ? static_cast<long long>(row) * K + kt * BK : 0), valid ? 16 : 0);
    }
  };
  // The weights do not depend on the previous kernel: start their pipeline first.
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < KT) load_b(s, s);
    cp_async_commit();
  }
  if (!GATE_UP) grid_dependency_wait();

  if (tid < BM) s_pair[tid] = tid < rows ? __ldcg(p.sorted_ids + r0 + tid) : -1;
  __syncthreads();

  const T* a = static_cast<const T*>(p.a) + lc * 8;
  int a_row[A_ITERS];
#pragma unroll
  for (int i = 0; i < A_ITERS; ++i) {
    const int pair = s_pair[lr + i * RSTEP];
    const bool valid = pair >= 0 && pair < p.num_pairs;
    a_row[i] = !valid ? -1 : GATE_UP ? pair / p.top_k : r0 + lr + i * RSTEP;
  }
  auto load_a = [&](int s, int kt) {
    unsigned char* as = smem + s * STAGE_BYTES + chunk;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      const bool valid = a_row[i] >= 0 && kt * BK + lc * 8 < K;
      cp_async16(as + i * RSTEP * 128, a + (valid ? static_cast<long long>(a_row[i]) * p.a_stride + kt * BK : 0), valid ? 16 : 0);
    }
  };
  // Groups so far: B0..B(S-3); now A0..A(S-3). Stage kt's A and B are complete
  // once at most STAGES - 3 groups are pending at iteration kt (each later group
  // holds a whole later stage).
#pragma unroll
  for (int s = 0; s < STAGES - 2; ++s) {
    if (s < KT) load_a(s, s);
    cp_async_commit();
  }

  float acc[NB * 4];
#pragma unroll
  for (int i = 0; i < NB * 4; ++i) acc[i] = 0.f;
  moe_fence_acc(acc);
  // A warpgroup whose 64 rows are all past the tile's rows (an expert's short last
  // tile) skips its wgmma; the condition is uniform over the warpgroup.
  const bool active = wg * 64 < rows;
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 3>();
    moe_fence_proxy_async();
    __syncthreads();
    const int next = kt + STAGES - 2;
    if (next < KT) {
      load_a(next % STAGES, next);
      load_b(next % STAGES, next);
    }
    cp_async_commit();
    if (active) {
      const unsigned as = base + (kt % STAGES) * STAGE_BYTES + wg * 64 * 128;
      const unsigned bs = base + (kt % STAGES) * STAGE_BYTES + A_BYTES;
      moe_wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        MoeWgmma<BN>::template mma<DTYPE>(acc, moe_wgmma_desc(as + kk * 32), moe_wgmma_desc(bs + kk * 32), 1);
      moe_wgmma_commit();
      moe_wgmma_wait<1>();
    }
  }
  moe_wgmma_wait<0>();
  moe_fence_acc(acc);
  cp_async_wait<0>();
  grid_dependents_launch();

  using Out = typename DType<DTYPE>::Storage;
  Out* out = static_cast<Out*>(p.out);
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rl = wg * 64 + warp * 16 + g + 8 * h;  // row within the tile
    if (rl >= rows) continue;
    if (GATE_UP) {
      const long long r = static_cast<long long>(r0) + rl;
#pragma unroll
      for (int i = 0; i < NB / 2; ++i) {
        const int col = nt * (BN / 2) + i * 8 + 2 * t;
        const float y0 = silu_f32(acc[4 * i + 2 * h]) * acc[4 * (i + NB / 2) + 2 * h];
        const float y1 = silu_f32(acc[4 * i + 2 * h + 1]) * acc[4 * (i + NB / 2) + 2 * h + 1];
        if (col < p.n) *reinterpret_cast<unsigned*>(out + r * p.out_stride + col) = pack2<DTYPE>(y0, y1);
      }
    } else {
      const int pair = s_pair[rl];
      if (pair < 0 || pair >= p.num_pairs) continue;
      const float wt = __ldcg(p.topk_weights + pair);
      Out* o = out + static_cast<long long>(pair) * p.out_stride;
#pragma unroll
      for (int i = 0; i < NB; ++i) {
        const int col = nt * BN + i * 8 + 2 * t;
        if (col < p.n) *reinterpret_cast<unsigned*>(o + col) = pack2<DTYPE>(acc[4 * i + 2 * h] * wt, acc[4 * i + 2 * h + 1] * wt);
      }
    }
  }
#else
  // wgmma needs sm_90a (the default build arch); an sm_80 / sm_90 build keeps the
  // table but a wgmma tile traps (the host does not pick one unless told).
  (void)p;
  __trap();
#endif
}

template <int DTYPE, int TILE, int GATE_UP>
__device__ __forceinline__ void moe_gemm_impl(const msgl_moe_gemm_params& p) {
  if constexpr (MoeTile<TILE>::WGMMA) {
    moe_wgmma_impl<DTYPE, TILE, GATE_UP>(p);
  } else {
    moe_tiled_impl<DTYPE, TILE, GATE_UP>(p);
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = moe_tile_threads<TILE>(), grid = moe_tile_grid<TILE, GATE_UP>(max_tiles, n)
 * and moe_tile_smem<TILE>() bytes of dynamic shared memory. */
extern "C" __global__ void __launch_bounds__(msgl::moe_tile_threads<MSGL_TILE>(), msgl::MoeTile<MSGL_TILE>::MINB)
    msgl_moe_gemm_kernel(const msgl_moe_gemm_params p) {
  msgl::moe_gemm_impl<MSGL_DTYPE, MSGL_TILE, MSGL_GATE_UP>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE, TILE, GATE_UP) for each AOT instance */

namespace msgl {
template <int DTYPE, int TILE, int GATE_UP>
__global__ void __launch_bounds__(moe_tile_threads<TILE>(), MoeTile<TILE>::MINB) moe_gemm_kernel(const msgl_moe_gemm_params p) {
  moe_gemm_impl<DTYPE, TILE, GATE_UP>(p);
}

template <int DTYPE, int TILE, int GATE_UP>
int32_t launch_moe_gemm(const msgl_moe_gemm_params& p, bool pdl, cudaStream_t s) {
  constexpr long long smem = moe_tile_smem<TILE>();
  const long long grid = moe_tile_grid<TILE, GATE_UP>(p.max_tiles, p.n);
  if (grid > 0x7fffffff) return set_error(MSGL_ERR_INVALID_ARGUMENT, "moe_gemm: %lld blocks exceed the grid limit", grid);
  if (grid == 0) return MSGL_OK;
  auto kernel = moe_gemm_kernel<DTYPE, TILE, GATE_UP>;
  if (smem > 48 * 1024) {
    // Once per process and device would do; the attribute is per function, and a
    // repeated set is cheap next to a failed launch, so it is set until it holds.
    static thread_local int done_for_device = -1;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) device = -2;
    if (done_for_device != device) {
      const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess)
        return set_error(MSGL_ERR_CUDA, "moe_gemm: %lld bytes of shared memory: %s", smem, cudaGetErrorString(err));
      done_for_device = device;
    }
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(moe_tile_threads<TILE>());
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, p);
  if (err != cudaSuccess) return set_error(MSGL_ERR_CUDA, "moe_gemm: launch failed: %s", cudaGetErrorString(err));
  return check_launch("moe_gemm");
}
}  // namespace msgl

extern "C" int32_t msgl_moe_gemm(const msgl_tensor* out, const msgl_tensor* a, const msgl_tensor* w,
                                 const msgl_tensor* sorted_ids, const msgl_tensor* block_experts,
                                 const msgl_tensor* expert_offsets, const msgl_tensor* tiles,
                                 const msgl_tensor* topk_weights, int32_t top_k, int32_t tile, int32_t gate_up,
                                 int32_t pdl, msgl_stream stream) {
  using namespace msgl;
  const char* op = "moe_gemm";
  constexpr uint32_t halves = dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(out, op, "out", 2, halves));
  MSGL_TRY(expect_tensor(a, op, "a", 2, halves));
  MSGL_TRY(expect_tensor(w, op, "w", 3, halves));
  MSGL_TRY(expect_same(a, "a", out, "out", op));
  MSGL_TRY(expect_same(a, "a", w, "w", op));
  MSGL_TRY(expect_tensor(sorted_ids, op, "sorted_ids", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(block_experts, op, "block_experts", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(expert_offsets, op, "expert_offsets", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(tiles, op, "tiles", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_contiguous(w, op, "w"));
  MSGL_TRY(expect_contiguous(sorted_ids, op, "sorted_ids"));
  MSGL_TRY(expect_contiguous(block_experts, op, "block_experts"));
  MSGL_TRY(expect_contiguous(expert_offsets, op, "expert_offsets"));
  MSGL_TRY(expect_contiguous(tiles, op, "tiles"));
  MSGL_TRY(expect_rows(a, op, "a", 16));
  MSGL_TRY(expect_rows(out, op, "out", 16));
  if (top_k < 1) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: top_k %d must be positive", op, top_k);
  const int bm = moe_tile_bm(tile);
  if (bm == 0) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: tile %d is not in the table (0..%d)", op, tile, kMoeTiles - 1);
  const int64_t num_experts = w->shape[0];
  const int64_t k = w->shape[2];
  const int64_t n = gate_up ? w->shape[1] / 2 : w->shape[1];
  const int64_t rows = sorted_ids->shape[0];
  MSGL_TRY(expect_dim(expert_offsets, op, "expert_offsets", 0, num_experts + 1));
  MSGL_TRY(expect_dim(a, op, "a", 1, k));
  MSGL_TRY(expect_dim(out, op, "out", 1, n));
  if (gate_up && w->shape[1] % 2 != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the gate_up weight has an odd row count %lld", op,
                     static_cast<long long>(w->shape[1]));
  if (k % 8 != 0 || n % 8 != 0 || k == 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: tile %d needs k %% 8 == 0 and n %% 8 == 0, got k = %lld, n = %lld", op,
                     tile, static_cast<long long>(k), static_cast<long long>(n));
  const int64_t blocks = block_experts->shape[0];
  const int64_t block_m = blocks > 0 ? rows / blocks : 0;
  if (blocks == 0 || block_m * blocks != rows || block_m % 16 != 0 || bm % block_m != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT,
                     "%s: `sorted_ids` (%lld rows) and `block_experts` (%lld blocks) do not give a row granule that divides the tile's %d rows",
                     op, static_cast<long long>(rows), static_cast<long long>(blocks), bm);
  if (tiles->shape[0] < 3)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: `tiles` has %lld entries", op, static_cast<long long>(tiles->shape[0]));
  int64_t num_pairs;
  if (gate_up) {
    num_pairs = a->shape[0] * top_k;
    MSGL_TRY(expect_dim(out, op, "out", 0, rows));
  } else {
    num_pairs = out->shape[0];
    MSGL_TRY(expect_dim(a, op, "a", 0, rows));
    MSGL_TRY(expect_tensor(topk_weights, op, "topk_weights", 1, dtype_bit(MSGL_F32)));
    MSGL_TRY(expect_dim(topk_weights, op, "topk_weights", 0, num_pairs));
    MSGL_TRY(expect_contiguous(topk_weights, op, "topk_weights"));
  }
  if (num_pairs >= 0x7fffffff || rows >= 0x7fffffff || tiles->shape[0] >= 0x7fffffff)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: too many pairs for int32 positions", op);
  for (const msgl_tensor* t : {sorted_ids, block_experts, expert_offsets, tiles})
    if (t->device != a->device) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: index tensors are not on the device of `a`", op);
  if (rows == 0 || n == 0) return MSGL_OK;

  msgl_moe_gemm_params p{};
  p.a = a->data;
  p.w = w->data;
  p.out = out->data;
  p.sorted_ids = static_cast<const int32_t*>(sorted_ids->data);
  p.block_experts = static_cast<const int32_t*>(block_experts->data);
  p.expert_offsets = static_cast<const int32_t*>(expert_offsets->data);
  p.tiles = static_cast<const int32_t*>(tiles->data);
  p.topk_weights = gate_up ? nullptr : static_cast<const float*>(topk_weights->data);
  p.a_stride = a->shape[0] > 1 ? a->strides[0] : k;
  p.out_stride = out->shape[0] > 1 ? out->strides[0] : n;
  p.num_pairs = num_pairs;
  p.num_experts = static_cast<int32_t>(num_experts);
  p.top_k = top_k;
  p.n = static_cast<int32_t>(n);
  p.k = static_cast<int32_t>(k);
  p.max_tiles = static_cast<int32_t>(tiles->shape[0] - 2);
  p.block_m = static_cast<int32_t>(block_m);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int32_t dtype = w->dtype;
  const int32_t gu = gate_up != 0;
#define MSGL_CASE(D, TL, GU) \
  if (dtype == D && tile == TL && gu == GU) return launch_moe_gemm<D, TL, GU>(p, pdl != 0, s);
  MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
  return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d TILE=%d GATE_UP=%d", op, dtype, tile, gu);
}
#endif
