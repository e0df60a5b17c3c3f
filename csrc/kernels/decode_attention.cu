/*
 * decode_attention.cu: attention of decode steps (one new token per sequence, or a
 * few: at most ROWS query rows per (sequence, kv head)) over the paged KV cache.
 *
 *   out[t, h] = softmax(scale * q[t, h] . K^T + causal mask) V
 *
 * Decode reads every cached key and value once and does two multiply-adds per
 * element and query row: it is bound by HBM bandwidth, so the design is about bytes
 * in flight, not tensor cores.
 *
 * Work decomposition. A block of 4 warps owns one (sequence, kv head, split): the
 * query rows of that kv head (the GQA group's heads, times the new tokens: `rows`
 * <= ROWS, packed token-major as in attention.cu) and keys [split * kv_chunk,
 * (split + 1) * kv_chunk) of the sequence (kv_chunk fixed by the host's plan, or,
 * for a CUDA graph's fixed-split plan, the sequence's own equal chunks:
 * attention_row_chunk). Inside the block a key row of HEAD_DIM
 * elements is read by LANES lanes, each holding one 16-byte vector (two for f32 at
 * head dim 256); a warp reads 32 / LANES keys side by side, the block 4x that, and
 * every iteration a lane copies U keys of K and of V (16 bytes each) into its own
 * shared-memory slots with cp.async, up to 4 iterations ahead of the one it
 * computes (DecodeLayout::kStages, within 64 KiB a block: three blocks an SM), so
 * an SM keeps over 100 KiB in flight, registers hold no loads in flight, and the
 * query rows of a GQA group share every load. Page numbers are loaded one
 * iteration ahead of their use, so a K/V copy never waits behind its page-table
 * load.
 *
 * Per key: the partial dot products of the lane's vector are summed over the LANES
 * lanes of the key with xor shuffles, and each lane group keeps its own online
 * softmax state (max, sum, output slice) in the log2 domain, in f32. At the end
 * the key groups of a warp merge through shuffles, the 4 warps through shared
 * memory, and the block writes `out` (one split) or its normalised partial and
 * log2-sum-exp, merged by the combine phase shared with attention.cu
 * (minisgl/attention.cuh).
 *
 * The split merge in the attention launch (split_counters given): a block that
 * wrote a partial counts itself in its (sequence, kv head)'s counter (after a
 * fence, so its partial is visible first); the block that brings the count to
 * the sequence's split count merges the splits of that group's query rows, in
 * split order with the combine phase's own code (decode_combine_row: the same
 * bits whichever block comes last), and sets the counter back to zero, so the
 * buffer is ready for the next launch and for every replay of a CUDA graph. That
 * saves the combine launch of split decode steps.
 *
 * The cluster merge (plan phase 2, instance MERGE = 2, the tensor-core block, at
 * most 16 splits): the max_splits blocks of a (sequence, kv head) are launched as
 * one thread-block cluster; each leaves its split's partial in its shared memory
 * and, after a cluster barrier, the cluster's warps merge the rows reading the
 * other blocks' shared memory (decode_cluster_merge). No partial goes through HBM,
 * no fence, counter or second grid. It gives the combine launch's bits (the same
 * decode_combine_row_from, in split order). Off by default (gpu/decode_plan.rs,
 * MINISGL_DECODE_CLUSTER): graph-timed launches alone at batch 1 are faster
 * (ctx 512: 5.8 against 7.5 us), but inside a decode step the launch takes
 * longer than the attention and combine launches together (ncu, alone: 14.6
 * against 7.3 + 2.9 us) and steps got slower (docs/PERF.md, twelfth session).
 *
 * Split sizes: kv_chunk keys per split for the batch (the host's `waves` plan),
 * or, with params.num_q_tiles = 1 (the host's `keys` plan; that field is the tile
 * kernel's), at most kv_chunk keys, each sequence cut into equal splits
 * (decode_row_chunk), or kv_chunk = 0: the graph plan's equal chunks.
 *
 * Programmatic dependent launch (minisgl/device.cuh): grid_prologue waits for
 * the previous grid, then lets the next launch. The CUDA-core block reads nothing
 * before it; the tensor-core block first issues its pipeline's first tiles when
 * they hold only keys of earlier steps (the kernel before, rope_store, writes
 * this step's rows and q), so that memory round trip overlaps the previous
 * kernel.
 *
 * The fused prologue (tensor.h: fused_rope; the tensor-core block, instance
 * FUSED = 1): the layer's rope_store runs in this launch instead of one before
 * it. Each block normalises and rotates its own query rows into shared memory,
 * and the block whose split holds a new token's key writes that token's k and v
 * rows into the caches (and into its first tiles, whose copies went before the
 * wait without those rows); decode_rope_prologue below. A decode step's layer
 * then waits on one grid less: rope_store's launch and its drain were a link of
 * every layer's dependency chain. The bits are those of rope_store followed by
 * the plain launch (the same row math: minisgl/rope_row.cuh) wherever out_loc and
 * the block table name the same slot for a new token, as every step's layout does
 * (a block reads a new key from its tile, rope_store's reader from the page).
 *
 * That is the CUDA-core block. For bf16/f16 the tensor-core block (ROWS = 16,
 * decode_attention_mma_block below) takes the same work with mma.sync products.
 *
 * Instance parameters: DTYPE (f32, f16, bf16), HEAD_DIM (a power of two, 32..256;
 * 64..256 for ROWS 16), ROWS (16: the tensor-core block; 1, 2, 4 or 8: the
 * CUDA-core block holding that many query rows; the host picks), STAGES (the
 * tensor-core block's pipeline depth, 2..4; 0 for the CUDA-core blocks: the AOT
 * launcher takes it from params.num_warps, 0 there meaning the head dimension's
 * default). __launch_bounds__ asks for as many resident blocks as the shared
 * memory allows (mma_decode_blocks_per_sm), so fewer stages also mean fewer
 * registers: bf16 head dim 128 is 176 registers at 3 stages (2 blocks an SM)
 * and 143 at 2 (3 blocks), head dim 64 128-130, none spilling (nvcc
 * --resource-usage, CUDA 13.0).
 */
#include "minisgl/attention.cuh"
#include "minisgl/mma.cuh"
#include "minisgl/rope_row.cuh"

namespace msgl {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * kWarpSize;
/* The most splits the cluster merge takes: sm_90's largest (non-portable)
 * cluster (gpu/decode_plan.rs: MAX_CLUSTER_SPLITS). */
constexpr int kDecodeMaxClusterSplits = 16;

template <int DTYPE, int HEAD_DIM, int ROWS> struct DecodeLayout {
  static constexpr int kElemBytes = DType<DTYPE>::kBytes;
  static constexpr int kRowBytes = HEAD_DIM * kElemBytes;
  /* Lanes reading one key row: one 16-byte vector each, at most a warp. */
  static constexpr int kLanes = kRowBytes / 16 < kWarpSize ? kRowBytes / 16 : kWarpSize;
  /* Elements and 16-byte vectors per lane. */
  static constexpr int kElems = HEAD_DIM / kLanes;
  static constexpr int kVecs = kElems * kElemBytes / 16;
  static constexpr int kVecElems = 16 / kElemBytes;
  /* Keys a warp and a block read side by side. */
  static constexpr int kKeysPerWarp = kWarpSize / kLanes;
  static constexpr int kKeysPerStep = kKeysPerWarp * kDecodeWarps;
  /* Keys per lane per iteration: more loads in flight where registers allow. */
  static constexpr int kUnroll = ROWS <= 4 ? 4 : 2;
  /* Pipeline depth: up to 4 iterations in flight, within 64 KiB per block (three
   * blocks per SM). */
  static constexpr int kStageBytes = kDecodeThreads * kUnroll * kVecs * 2 * 16;
  static constexpr int kStages = 65536 / kStageBytes > 4 ? 4 : (65536 / kStageBytes < 2 ? 2 : 65536 / kStageBytes);
  static constexpr int kMergeBytes = kDecodeWarps * ROWS * HEAD_DIM * 4;
  /* Dynamic shared memory: the pipeline, reused by the merge of the warps. */
  static constexpr int kSmemBytes = kStages * kStageBytes > kMergeBytes ? kStages * kStageBytes : kMergeBytes;
  static_assert((HEAD_DIM & (HEAD_DIM - 1)) == 0 && HEAD_DIM >= 32 && HEAD_DIM <= 256, "head dim");
  static_assert(kVecs >= 1 && kElems == kVecs * kVecElems, "lane layout");
};

/* A lane's VECS 16-byte vectors of one key row as its E = VECS * (16 / element
 * bytes) floats, in order. */
template <int DTYPE, int VECS, int E>
__device__ __forceinline__ void unpack_vectors(const uint4 (&raw)[VECS], float (&out)[E]) {
  constexpr int VE = 16 / DType<DTYPE>::kBytes;
  static_assert(E == VECS * VE, "lane layout");
#pragma unroll
  for (int v = 0; v < VECS; ++v) {
    Vec16<DTYPE> x;
    x.from_raw(raw[v]);
#pragma unroll
    for (int i = 0; i < VE; ++i) out[v * VE + i] = x.v[i];
  }
}

/* Keys per split of a sequence of kv_len keys. With p.num_q_tiles == 1 (the
 * host's balanced plan; the field is the tile kernel's and unused here otherwise)
 * p.kv_chunk is the largest split: a sequence gets ceil(kv_len / kv_chunk) splits
 * of equal size (rounded up to 64 keys), so no split is a short tail and a
 * sequence shorter than kv_chunk is one split. Otherwise as attention.cu:
 * attention_row_chunk (kv_chunk fixed by the host, or 0: the graph plan). */
__device__ __forceinline__ int decode_row_chunk(int kv_len, const msgl_attention_params& p) {
  if (p.kv_chunk > 0 && p.num_q_tiles == 1) {
    const int n = kv_len > p.kv_chunk ? (kv_len + p.kv_chunk - 1) / p.kv_chunk : 1;
    const int even = (kv_len + n - 1) / n;
    return (even + 63) / 64 * 64;
  }
  return attention_row_chunk(kv_len, p.kv_chunk, p.max_splits, p.min_chunk);
}

/* Merges the num_splits (> 1) split partials of one (token, head) row into `out`
 * with one warp: the decode kernel's merge, in its combine launch, in the last
 * block of a split merge and in a cluster's blocks alike (so all three give the
 * same bits). lse_at(s) is split s's log2-sum-exp, part_at(s, i) element i of its
 * normalised partial row, read from global memory or from the cluster's shared
 * memory. Unlike attention.cuh's
 * attention_combine_row it has every load of a batch of splits in flight at once
 * (lane s reads split s's log2-sum-exp; 8 splits' partial rows a step, the first
 * 8 with the log2-sum-exps), where that one waits on each split in turn: 32
 * splits were 64 dependent L2 round trips on the critical path of a batch-1
 * step, now 4. The sums run in split order. */
template <int DTYPE, int HEAD_DIM, typename LseAt, typename PartAt>
__device__ __forceinline__ void decode_combine_row_from(typename DType<DTYPE>::Storage* out, int num_splits, int lane,
                                                        LseAt lse_at, PartAt part_at) {
  constexpr int PER_LANE = HEAD_DIM / kWarpSize;
  constexpr int BATCH = 8;
  /* One round trip for the first 32 log2-sum-exps and the first BATCH partial
   * rows (they do not depend on the maximum). */
  const float ls0 = lane < num_splits ? lse_at(lane) : neg_inf();
  float first[BATCH][PER_LANE];
#pragma unroll
  for (int j = 0; j < BATCH; ++j) {
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) first[j][i] = j < num_splits ? part_at(j, i * kWarpSize + lane) : 0.f;
  }
  float max_lse = ls0;
  for (int s0 = kWarpSize; s0 < num_splits; s0 += kWarpSize)
    if (s0 + lane < num_splits) max_lse = fmaxf(max_lse, lse_at(s0 + lane));
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, o));
  float acc[PER_LANE];
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.f;
  float total = 0.f;
  for (int s0 = 0; s0 < num_splits; s0 += kWarpSize) {
    /* Lane j: the weight of split s0 + j (0 past the end or for an empty split). */
    float ls = ls0;
    if (s0 > 0) ls = s0 + lane < num_splits ? lse_at(s0 + lane) : neg_inf();
    const float w_lane = ls == neg_inf() ? 0.f : fast_exp2(ls - max_lse);
    const int n = num_splits - s0 < kWarpSize ? num_splits - s0 : kWarpSize;
    for (int b = 0; b < n; b += BATCH) {
      float x[BATCH][PER_LANE];
      if (s0 == 0 && b == 0) {
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
#pragma unroll
          for (int i = 0; i < PER_LANE; ++i) x[j][i] = first[j][i];
        }
      } else {
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
#pragma unroll
          for (int i = 0; i < PER_LANE; ++i) x[j][i] = b + j < n ? part_at(s0 + b + j, i * kWarpSize + lane) : 0.f;
        }
      }
#pragma unroll
      for (int j = 0; j < BATCH; ++j) {
        const float w = __shfl_sync(0xffffffffu, w_lane, (b + j) % kWarpSize);
        if (b + j < n) {
          total += w;
#pragma unroll
          for (int i = 0; i < PER_LANE; ++i) acc[i] += w * x[j][i];
        }
      }
    }
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) out[i * kWarpSize + lane] = DType<DTYPE>::from_f32(acc[i] * inv);
}

/* decode_combine_row_from over the partials in global memory (the combine launch
 * and the counter merge). */
template <int DTYPE, int HEAD_DIM>
__device__ __forceinline__ void decode_combine_row(const msgl_attention_params& p, long long row, int num_splits,
                                                   int lane) {
  using T = typename DType<DTYPE>::Storage;
  const float* lse = p.lse_partial + row * p.max_splits;
  const float* po = p.o_partial + row * p.max_splits * HEAD_DIM;
  decode_combine_row_from<DTYPE, HEAD_DIM>(
      static_cast<T*>(p.out) + row * HEAD_DIM, num_splits, lane, [&](int s) { return load_f32_cg(lse + s); },
      [&](int s, int idx) { return load_f32_cg(po + s * HEAD_DIM + idx); });
}

/* The decode kernel's combine phase: one (token, head) row per warp, as
 * attention.cuh's attention_combine, with decode_row_chunk and decode_combine_row.
 * Its own grid_prologue: the row's sequence and length (q_indptr and kv_lens,
 * copied from the host before the step's first kernel) are read before the wait
 * for the attention phase, so that round trip overlaps it. */
template <int DTYPE, int HEAD_DIM> __device__ __forceinline__ void decode_combine(const msgl_attention_params& p) {
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
  const bool live = row < p.num_tokens * p.num_q_heads;
  int kv_len = 0;
  if (live) {
    const int token = static_cast<int>(row / p.num_q_heads);
    int lo = 0, hi = p.num_seqs - 1; /* the sequence of `token`: the last s with q_indptr[s] <= token */
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (p.q_indptr[mid] <= token) lo = mid; else hi = mid - 1;
    }
    kv_len = p.kv_lens[lo];
  }
  grid_prologue_launch_first(p.combine_launch_first != 0);
  if (!live) return;
  const int lane = threadIdx.x % kWarpSize;
  const int num_splits = attention_num_splits(kv_len, decode_row_chunk(kv_len, p));
  if (num_splits <= 1) return;
  decode_combine_row<DTYPE, HEAD_DIM>(p, row, num_splits, lane);
}

/* The split merge of the attention launch (see the header): called by every
 * thread of a block that has written its split's partials. */
template <int DTYPE, int HEAD_DIM, int WARPS = kDecodeWarps>
__device__ __forceinline__ void decode_merge_splits(const msgl_attention_params& p, int rows, int q_start, int group,
                                                    int seq, int kv_head, int num_splits) {
  __shared__ int last;
  __threadfence(); /* this thread's partials are visible device-wide before the count */
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = p.split_counters + static_cast<long long>(seq) * p.num_kv_heads + kv_head;
    last = atomicAdd(counter, 1) == num_splits - 1;
    if (last) atomicExch(counter, 0); /* every split has counted: ready for the next launch */
  }
  __syncthreads();
  if (!last) return;
  __threadfence(); /* the other blocks' partials, counted before ours */
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (int r = warp; r < rows; r += WARPS) {
    const long long row =
        static_cast<long long>(q_start + r / group) * p.num_q_heads + kv_head * group + r % group;
    decode_combine_row<DTYPE, HEAD_DIM>(p, row, num_splits, lane);
  }
}

/* The end of a decode block: merges the 4 warps' online-softmax states (sm_o
 * [4][R][HEAD_DIM] unnormalised outputs, sm_m and sm_l [4][R] maxima and sums, in
 * shared memory) of its `rows` rows and writes `out` (one split) or the split's
 * normalised partial and log2-sum-exp. Called by every thread after a barrier. */
/* The cluster merge (MERGE = 2; see the header): the blocks of a (sequence, kv
 * head) are one thread-block cluster, block rank s holding split s. Each block
 * has left its split's normalised partial rows in its own shared memory (sm_part
 * [rows][HEAD_DIM], log2-sum-exps in sm_lse[rows]); after a cluster barrier the
 * cluster's warps take the rows in turn and merge them with decode_combine_row_from
 * over distributed shared memory, so no partial goes through HBM and no second
 * grid runs. Blocks past the sequence's splits join in (they hold no partial and
 * are not read). A second barrier keeps every block's shared memory alive until
 * the other blocks have read it. Called by every thread of every block of the
 * cluster when the sequence has more than one split. */
template <int DTYPE, int HEAD_DIM, int WARPS = kDecodeWarps>
__device__ __forceinline__ void decode_cluster_merge(const msgl_attention_params& p, const float* sm_part,
                                                     const float* sm_lse, int rows, int q_start, int group,
                                                     int kv_head, int num_splits) {
  using T = typename DType<DTYPE>::Storage;
  cluster_sync(); /* every block's partials written and visible to the cluster */
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int warps = static_cast<int>(cluster_size()) * WARPS;
  for (int r = static_cast<int>(cluster_rank()) * WARPS + warp; r < rows; r += warps) {
    const long long row =
        static_cast<long long>(q_start + r / group) * p.num_q_heads + kv_head * group + r % group;
    decode_combine_row_from<DTYPE, HEAD_DIM>(
        static_cast<T*>(p.out) + row * HEAD_DIM, num_splits, lane,
        [&](int s) { return load_cluster_f32(sm_lse + r, static_cast<unsigned>(s)); },
        [&](int s, int idx) { return load_cluster_f32(sm_part + r * HEAD_DIM + idx, static_cast<unsigned>(s)); });
  }
  cluster_sync(); /* the other blocks are done reading this block's shared memory */
}

template <int DTYPE, int HEAD_DIM, int R, int MERGE, int WARPS = kDecodeWarps>
__device__ __forceinline__ void decode_merge_warps(const msgl_attention_params& p, float* sm_o, const float* sm_m,
                                                   const float* sm_l, float* sm_lse, int rows, int q_start, int group,
                                                   int seq, int kv_head, int split, int num_splits) {
  using T = typename DType<DTYPE>::Storage;
  for (int idx = threadIdx.x; idx < rows * HEAD_DIM; idx += WARPS * kWarpSize) {
    const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, sm_m[w * R + r]);
    const float ref = mx == neg_inf() ? 0.f : mx;
    float total = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float wt = fast_exp2(sm_m[w * R + r] - ref);
      total += sm_l[w * R + r] * wt;
      acc += sm_o[(w * R + r) * HEAD_DIM + d] * wt;
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    const long long row =
        static_cast<long long>(q_start + r / group) * p.num_q_heads + kv_head * group + r % group;
    if (num_splits == 1) {
      static_cast<T*>(p.out)[row * HEAD_DIM + d] = DType<DTYPE>::from_f32(acc * inv);
    } else if constexpr (MERGE == 2) {
      /* In place: warp 0's slot of (r, d) is read by this thread alone, above. */
      sm_o[r * HEAD_DIM + d] = acc * inv;
      if (d == 0) sm_lse[r] = total > 0.f ? ref + fast_log2(total) : neg_inf();
    } else {
      const long long prow = row * p.max_splits + split;
      p.o_partial[prow * HEAD_DIM + d] = acc * inv;
      if (d == 0) p.lse_partial[prow] = total > 0.f ? ref + fast_log2(total) : neg_inf();
    }
  }
  if constexpr (MERGE == 2) {
    if (num_splits > 1)
      decode_cluster_merge<DTYPE, HEAD_DIM, WARPS>(p, sm_o, sm_lse, rows, q_start, group, kv_head, num_splits);
  }
  /* A compile-time switch: the merge's code in an instance that never merges
   * made ptxas schedule the tensor-core block with fewer registers (168 instead
   * of 205 at head dim 128, before the STAGES variants) and fewer loads in flight. */
  if constexpr (MERGE == 1) {
    if (num_splits > 1) decode_merge_splits<DTYPE, HEAD_DIM, WARPS>(p, rows, q_start, group, seq, kv_head, num_splits);
  }
}

/* Attention phase: one (sequence, kv head, split) per block; blockIdx.x =
 * kv_head + num_kv_heads * (split + max_splits * seq). */
template <int DTYPE, int HEAD_DIM, int ROWS, int MERGE>
__device__ __forceinline__ void decode_attention_block(const msgl_attention_params& p) {
  using L = DecodeLayout<DTYPE, HEAD_DIM, ROWS>;
  using T = typename DType<DTYPE>::Storage;
  constexpr int LANES = L::kLanes, E = L::kElems, VECS = L::kVecs, VE = L::kVecElems;
  constexpr int STEP = L::kKeysPerStep, U = L::kUnroll, STAGES = L::kStages;
  __shared__ float sm_m[kDecodeWarps][ROWS];
  __shared__ float sm_l[kDecodeWarps][ROWS];

  const int kv_head = static_cast<int>(blockIdx.x % p.num_kv_heads);
  const int rest = static_cast<int>(blockIdx.x / p.num_kv_heads);
  const int split = rest % p.max_splits;
  const int seq = rest / p.max_splits;
  if (seq >= p.num_seqs) return;
  const int q_start = p.q_indptr[seq];
  const int q_len = p.q_indptr[seq + 1] - q_start;
  const int kv_len = p.kv_lens[seq];
  const int group = p.num_q_heads / p.num_kv_heads;
  const int rows = q_len * group; /* the host guarantees rows <= ROWS */
  if (rows <= 0 || rows > ROWS) return;
  const int kv_chunk = decode_row_chunk(kv_len, p);
  const int num_splits = attention_num_splits(kv_len, kv_chunk);
  if (split >= num_splits) return;
  const int kv_begin = split * kv_chunk;
  const int kv_stop = min(kv_len, kv_begin + kv_chunk);

  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int sub = lane % LANES;                                 /* vector slot of the key row */
  const int slot = warp * L::kKeysPerWarp + lane / LANES;       /* key slot of the lane group */

  /* Query rows (scaled into the log2 domain) and their causal limits. */
  float q[ROWS][E];
  int pos[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    pos[r] = -1; /* padding row: every key masked */
#pragma unroll
    for (int e = 0; e < E; ++e) q[r][e] = 0.f;
    if (r < rows) {
      pos[r] = kv_len - q_len + r / group;
      const T* src = static_cast<const T*>(p.q) + static_cast<long long>(q_start + r / group) * p.q_token_stride +
                     static_cast<long long>(kv_head * group + r % group) * p.q_head_stride + sub * E;
#pragma unroll
      for (int v = 0; v < VECS; ++v) {
        Vec16<DTYPE> x;
        x.load(src + v * VE);
#pragma unroll
        for (int i = 0; i < VE; ++i) q[r][v * VE + i] = x.v[i] * p.scale_log2;
      }
    }
  }

  const int* pages = p.block_table + static_cast<long long>(seq) * p.max_pages;
  const int page_size = p.page_size;
  const int page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  /* The page holding `key`, or -1 past the split; page numbers outside the cache
   * read as zeros (as attention.cu's loads do). */
  auto page_of = [&](int key) -> int {
    if (key >= kv_stop) return -1;
    const int page = pages[page_shift >= 0 ? key >> page_shift : key / page_size];
    return page >= 0 && page < p.num_pages ? page : -1;
  };
  /* Element offset of this lane's vector of `key` in page `page`. */
  auto offset_of = [&](int key, int page) -> long long {
    const int in_page = page_shift >= 0 ? key & (page_size - 1) : key % page_size;
    const long long cache_slot = static_cast<long long>(page) * page_size + in_page;
    return (cache_slot * p.num_kv_heads + kv_head) * HEAD_DIM + sub * E;
  };
  const uint4* k_cache = static_cast<const uint4*>(p.k_cache); /* in 16-byte vectors */
  const uint4* v_cache = static_cast<const uint4*>(p.v_cache);

  float o[ROWS][E];
  float m[ROWS], l[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    m[r] = neg_inf();
    l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) o[r][e] = 0.f;
  }

  /* The pipeline: iteration it's K and V vectors land in stage it % STAGES of this
   * thread's own slots (so no barrier is needed: a thread reads only what its own
   * cp.async wrote, after cp.async.wait_group). Slots of one (stage, kind, u, v)
   * are consecutive over the threads, so a warp's accesses are conflict-free. */
  extern __shared__ __align__(16) unsigned char decode_smem[];
  uint4* stages = reinterpret_cast<uint4*>(decode_smem);
  auto slot_of = [&](int stage, int kind, int u, int v) -> uint4* {
    return stages + (((stage * 2 + kind) * U + u) * VECS + v) * kDecodeThreads + threadIdx.x;
  };
  const int iters = (kv_stop - kv_begin + STEP * U - 1) / (STEP * U); /* uniform over the block */
  int page[U];
#pragma unroll
  for (int u = 0; u < U; ++u) page[u] = page_of(kv_begin + slot + u * STEP);
  /* Issues the loads of iteration `it` (from the pages in `page`), then loads the
   * pages of iteration it + 1, which stay in flight until the next issue. */
  auto issue = [&](int it) {
    if (it < iters) {
      const int base = kv_begin + it * STEP * U;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool valid = page[u] >= 0;
        const long long off = valid ? offset_of(base + slot + u * STEP, page[u]) / VE : 0;
#pragma unroll
        for (int v = 0; v < VECS; ++v) {
          cp_async16(slot_of(it % STAGES, 0, u, v), k_cache + off + v, valid ? 16 : 0);
          cp_async16(slot_of(it % STAGES, 1, u, v), v_cache + off + v, valid ? 16 : 0);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) page[u] = page_of(base + STEP * U + slot + u * STEP);
    }
    cp_async_commit(); /* one group per iteration, empty past the end */
  };
#pragma unroll
  for (int it = 0; it < STAGES - 1; ++it) issue(it);

  for (int it = 0; it < iters; ++it) {
    issue(it + STAGES - 1);
    cp_async_wait<STAGES - 1>(); /* iteration it's group has landed */
    const int base = kv_begin + it * STEP * U;
    const int stage = it % STAGES;
    uint4 kraw[U][VECS], vraw[U][VECS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int v = 0; v < VECS; ++v) {
        kraw[u][v] = *slot_of(stage, 0, u, v);
        vraw[u][v] = *slot_of(stage, 1, u, v);
      }
    }

    float s[U][ROWS];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float k[E];
      unpack_vectors<DTYPE>(kraw[u], k);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float acc = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) acc = fmaf(q[r][e], k[e], acc);
        s[u][r] = acc;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int x = LANES / 2; x >= 1; x /= 2) s[u][r] += __shfl_xor_sync(0xffffffffu, s[u][r], x);
      }
    }
    /* Mask (past the split, causal) and the online softmax of this lane group. */
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      float mx = m[r];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int key = base + slot + u * STEP;
        s[u][r] = (key < kv_stop && key <= pos[r]) ? s[u][r] : neg_inf();
        mx = fmaxf(mx, s[u][r]);
      }
      const float ref = mx == neg_inf() ? 0.f : mx;
      const float alpha = fast_exp2(m[r] - ref);
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        s[u][r] = fast_exp2(s[u][r] - ref);
        sum += s[u][r];
      }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int e = 0; e < E; ++e) o[r][e] *= alpha;
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float v[E];
      unpack_vectors<DTYPE>(vraw[u], v);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int e = 0; e < E; ++e) o[r][e] = fmaf(s[u][r], v[e], o[r][e]);
      }
    }
  }

  cp_async_wait<0>();
  __syncthreads(); /* every thread is done with the pipeline: its memory holds the warps' outputs next */
  float (*sm_o)[ROWS][HEAD_DIM] = reinterpret_cast<float (*)[ROWS][HEAD_DIM]>(decode_smem);

  /* Merge the key groups of the warp (lanes lane ^ x, x >= LANES, hold the same
   * vector slot of other keys). */
#pragma unroll
  for (int x = LANES; x < kWarpSize; x *= 2) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float m_other = __shfl_xor_sync(0xffffffffu, m[r], x);
      const float l_other = __shfl_xor_sync(0xffffffffu, l[r], x);
      const float mx = fmaxf(m[r], m_other);
      const float ref = mx == neg_inf() ? 0.f : mx;
      const float a = fast_exp2(m[r] - ref), b = fast_exp2(m_other - ref);
      l[r] = l[r] * a + l_other * b;
      m[r] = mx;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float o_other = __shfl_xor_sync(0xffffffffu, o[r][e], x);
        o[r][e] = o[r][e] * a + o_other * b;
      }
    }
  }
  if (lane < LANES) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int e = 0; e < E; ++e) sm_o[warp][r][sub * E + e] = o[r][e];
      if (sub == 0) {
        sm_m[warp][r] = m[r];
        sm_l[warp][r] = l[r];
      }
    }
  }
  __syncthreads();

  static_assert(MERGE != 2, "the cluster merge is the tensor-core block's");
  decode_merge_warps<DTYPE, HEAD_DIM, ROWS, MERGE>(p, &sm_o[0][0][0], &sm_m[0][0], &sm_l[0][0], nullptr, rows, q_start,
                                                   group, seq, kv_head, split, num_splits);
}

/* The fused attention prologue of the tensor-core block (p.fused_rope; tensor.h):
 * rope_store's work for this block, with its row math (minisgl/rope_row.cuh) and
 * group width (p.rope.threads_per_head), so the bits are those of a rope_store
 * launch followed by the attention launch.
 *   - The block's query rows, normalised and rotated, into q_s (rows past `rows`
 *     zero), where stage_q would have copied rope_store's output.
 *   - The k and v rows of the new tokens whose keys lie in this block's split
 *     [kv_begin, kv_stop), into the caches at their out_loc slots (slots outside
 *     the cache skipped, as rope_store does). Splits partition the keys, so
 *     every new row is written once, by the block that reads it. A new key in a
 *     tile this warp copied before the wait (`patched_tiles` per warp: those
 *     copies skipped its rows) is also written into that tile's shared-memory
 *     rows; a later tile reads it from the cache after the barrier below.
 * The work rows are the `rows` query rows, then the new keys' k rows, then their
 * v rows, a group of G threads a row (the same row for the whole group: its
 * shuffles stay whole), all in one pass for a decode step (2-4 query rows and at
 * most one new key: fewer rows than the block's 128 / G groups). */
/* Pulls the 128-byte line at `ptr` into L1 (a hint: no register, no wait). */
__device__ __forceinline__ void prefetch_l1(const void* ptr) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(ptr));
}

struct DecodeRopeRows {
  int rows, first_new, new_keys;
  __device__ __forceinline__ DecodeRopeRows(int rows_, int q_len, int kv_begin, int kv_stop, int kv_len)
      : rows(rows_), first_new(max(kv_len - q_len, kv_begin)),
        new_keys(max(0, kv_stop - max(kv_len - q_len, kv_begin))) {}
  __device__ __forceinline__ int count() const { return rows + 2 * new_keys; }
  /* Whether work row `row` (>= rows) is a v row, and the key of that k or v row. */
  __device__ __forceinline__ bool is_v(int row) const { return row >= rows + new_keys; }
  __device__ __forceinline__ int key(int row) const { return first_new + row - rows - (is_v(row) ? new_keys : 0); }
};

/* Before the grid dependency wait: the zero rows of q_s, and the step's inputs and
 * constants of this thread's first work row (its position and out_loc entries,
 * its cos / sin row and norm weights) pulled into L1, so that after the wait the
 * row waits only for the previous kernel's q, k and v. */
template <int DTYPE, int HEAD_DIM, int ROW, int WARPS>
__device__ __forceinline__ void decode_rope_prologue_early(const msgl_attention_params& p,
                                                           typename DType<DTYPE>::Storage* q_s,
                                                           const DecodeRopeRows& w, int q_start, int q_len,
                                                           int group, int kv_len) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int VE = Vec16<DTYPE>::kElems;
  const msgl_rope_store_params& r = p.rope;
  for (int c = threadIdx.x; c < (16 - w.rows) * (HEAD_DIM / VE); c += WARPS * kWarpSize) {
    const int row = w.rows + c / (HEAD_DIM / VE);
    reinterpret_cast<uint4*>(q_s + row * ROW)[c % (HEAD_DIM / VE)] = make_uint4(0, 0, 0, 0);
  }
  const int G = r.threads_per_head, t = static_cast<int>(threadIdx.x) % G;
  const int row = static_cast<int>(threadIdx.x) / G;
  if (row >= w.count()) return;
  const bool is_q = row < w.rows, is_v = w.is_v(row);
  const long long token = is_q ? q_start + row / group : q_start + w.key(row) - (kv_len - q_len);
  if (!is_q) prefetch_l1(static_cast<const char*>(r.out_loc) + token * (r.out_loc_is_64 ? 8 : 4));
  if (is_v) return;
  const long long pos = load_index(r.positions, r.positions_is_64, token);
  const RopeRowUnits L(HEAD_DIM, r.rotary_dim, VE);
  const T* weight = static_cast<const T*>(is_q ? r.q_weight : r.k_weight);
#pragma unroll
  for (int j = 0; j < kRopeRowUnits; ++j) {
    const int u = t + j * G;
    if (u < L.units && L.is_pair(u)) {
      if (pos >= 0 && pos < r.max_positions) {
        prefetch_l1(r.cos_sin + pos * r.rotary_dim + L.column(u));
        prefetch_l1(r.cos_sin + pos * r.rotary_dim + L.half + L.column(u));
      }
      if (weight != nullptr) prefetch_l1(weight + L.half + L.column(u));
    }
    if (u < L.units && weight != nullptr) prefetch_l1(weight + L.column(u));
  }
}

/* After the wait: the work rows (see above). Every thread calls it; it ends with a
 * barrier (q_s and the patched rows are then visible to the block, and so are the
 * cache rows: __syncthreads orders the block's global writes before its later
 * cp.async reads). */
template <int DTYPE, int HEAD_DIM, int ROW, int STAGES, int WARPS>
__device__ __forceinline__ void decode_rope_prologue(const msgl_attention_params& p, typename DType<DTYPE>::Storage* q_s,
                                                     const DecodeRopeRows& w, int q_start, int q_len, int group,
                                                     int kv_head, int kv_begin, int kv_len, int patched_tiles) {
  using T = typename DType<DTYPE>::Storage;
  constexpr int VE = Vec16<DTYPE>::kElems;
  constexpr int BN = 16; /* MmaDecode::kTileKeys */
  const msgl_rope_store_params& r = p.rope;
  const int G = r.threads_per_head, t = static_cast<int>(threadIdx.x) % G, rdim = r.rotary_dim;
  const T* q_weight = static_cast<const T*>(r.q_weight);
  const T* k_weight = static_cast<const T*>(r.k_weight);
  /* The cos / sin row of a token, or null (no rotation) outside the table. */
  auto cos_sin_of = [&](long long token) -> const float* {
    const long long pos = load_index(r.positions, r.positions_is_64, token);
    return pos >= 0 && pos < r.max_positions ? r.cos_sin + pos * rdim : nullptr;
  };
  for (int row = static_cast<int>(threadIdx.x) / G; row < w.count(); row += WARPS * kWarpSize / G) {
    if (row < w.rows) {
      const long long token = q_start + row / group;
      const T* src = static_cast<const T*>(r.q) + token * r.q_token_stride +
                     static_cast<long long>(kv_head * group + row % group) * r.q_head_stride;
      rope_row_apply<DTYPE>(src, q_s + row * ROW, q_weight != nullptr,
                            rope_row_weights<DTYPE>(q_weight, HEAD_DIM, rdim, t, G), cos_sin_of(token), HEAD_DIM,
                            rdim, r.eps, t, G);
      continue;
    }
    const bool is_v = w.is_v(row);
    const int key = w.key(row);
    const long long token = q_start + (key - (kv_len - q_len));
    /* The key's row in its warp's pipeline, when that tile was copied before the wait. */
    const int tile = (key - kv_begin) / BN, warp_tile = tile / WARPS;
    T* staged = nullptr;
    if (warp_tile < patched_tiles) {
      T* pipe = q_s + 16 * ROW + (tile % WARPS) * STAGES * 2 * BN * ROW;
      staged = pipe + ((warp_tile % STAGES) * 2 + (is_v ? 1 : 0)) * BN * ROW + ((key - kv_begin) % BN) * ROW;
    }
    const long long slot = load_index(r.out_loc, r.out_loc_is_64, token);
    if (slot < 0 || slot >= r.num_slots) {
      /* As rope_store: never write outside the cache. The skipped copy's row reads
       * as zeros (a layout whose slot lies outside has no row to read). */
      if (staged != nullptr)
        for (int c = t; c < HEAD_DIM / VE; c += G) reinterpret_cast<uint4*>(staged)[c] = make_uint4(0, 0, 0, 0);
      continue;
    }
    T* cache = static_cast<T*>(is_v ? r.v_cache : r.k_cache) + (slot * r.num_kv_heads + kv_head) * HEAD_DIM;
    if (is_v) {
      const uint4* src = reinterpret_cast<const uint4*>(static_cast<const T*>(r.v) + token * r.v_token_stride +
                                                        static_cast<long long>(kv_head) * r.v_head_stride);
      for (int c = t; c < HEAD_DIM / VE; c += G) {
        const uint4 x = src[c];
        reinterpret_cast<uint4*>(cache)[c] = x;
        if (staged != nullptr) reinterpret_cast<uint4*>(staged)[c] = x;
      }
      continue;
    }
    const T* src =
        static_cast<const T*>(r.k) + token * r.k_token_stride + static_cast<long long>(kv_head) * r.k_head_stride;
    const RopeRowWeights wk = rope_row_weights<DTYPE>(k_weight, HEAD_DIM, rdim, t, G);
    const float* cs = cos_sin_of(token);
    rope_row_apply<DTYPE>(src, cache, k_weight != nullptr, wk, cs, HEAD_DIM, rdim, r.eps, t, G);
    /* The same row again into the tile (the same arithmetic, so the same bits). */
    if (staged != nullptr) rope_row_apply<DTYPE>(src, staged, k_weight != nullptr, wk, cs, HEAD_DIM, rdim, r.eps, t, G);
  }
  __syncthreads();
}

/* The tensor-core decode block (ROWS = 16, bf16/f16): the same decomposition and
 * split layout, with the products on mma.sync m16n8k16, which also sums over the
 * head dimension, so a key costs no shuffles: the CUDA-core block spends most of
 * its issue slots on the cross-lane sums and the softmax of every lane group
 * (ncu: 40% of DRAM bandwidth at 6 cycles per issued instruction, 12 warps an
 * SM), this one a few instructions per 16 keys.
 *
 * The query rows (up to 16: GQA group x new tokens) are staged once and kept as
 * A fragments in registers. Keys come in tiles of 16; warp w of the block takes
 * tiles w, w + 4, ... of the split, through its own cp.async pipeline of
 * MmaDecode::kStages tiles of K and V in shared memory (rows padded by 16 bytes:
 * conflict-free ldmatrix), so warps never wait for each other until the merge.
 * The page of each key of a tile is one load per lane (lane % 16), shuffled to the
 * lanes that copy that key, one tile ahead of its use. */
/* The default pipeline depth of the tensor-core block (STAGES = 0): the deepest
 * that keeps two blocks an SM at head dim 128. */
__host__ __device__ constexpr int mma_decode_default_stages(int head_dim) {
  /* Head dim 128: 2 stages, 3 blocks an SM (measured: docs/PERF.md, fifth session, call 2). */
  return head_dim <= 64 ? 4 : 2;
}

/* Blocks of `smem_bytes` dynamic shared memory resident on an SM (228 KiB, 1 KiB
 * of it reserved per block), at most 4: what __launch_bounds__ asks the register
 * allocation for, and what gpu/attention.rs plans with. */
__host__ __device__ constexpr int mma_decode_blocks_per_sm(int smem_bytes) {
  return 233472 / (smem_bytes + 1024) > 4 ? 4 : (233472 / (smem_bytes + 1024) < 1 ? 1 : 233472 / (smem_bytes + 1024));
}

/* STAGES_REQ 1 (kDecodeThreeWarpStages) is the three-warp block: 2 stages, a
 * quarter less shared memory, four blocks an SM at head dim 128 (see
 * mma_decode_warps). */
constexpr int kDecodeThreeWarpStages = 1;
__host__ __device__ constexpr int mma_decode_warps(int stages) { return stages == kDecodeThreeWarpStages ? 3 : 4; }

template <int DTYPE, int HEAD_DIM, int STAGES_REQ = 0> struct MmaDecode {
  static constexpr int kElemBytes = DType<DTYPE>::kBytes;
  static constexpr int kRow = HEAD_DIM + 16 / kElemBytes; /* padded shared-memory row, elements */
  static constexpr int kChunks = HEAD_DIM * kElemBytes / 16; /* 16-byte chunks per row */
  static constexpr int kTileKeys = 16;
  static constexpr int kWarps = mma_decode_warps(STAGES_REQ);
  static constexpr int kStages = STAGES_REQ == kDecodeThreeWarpStages ? 2
                                 : STAGES_REQ > 0                     ? STAGES_REQ
                                                                      : mma_decode_default_stages(HEAD_DIM);
  static constexpr int kTileBytes = kTileKeys * kRow * kElemBytes; /* one K or V tile */
  static constexpr int kQBytes = 16 * kRow * kElemBytes;
  static constexpr int kPipeBytes = kQBytes + kWarps * kStages * 2 * kTileBytes;
  static constexpr int kMergeBytes = kWarps * 16 * HEAD_DIM * 4;
  static constexpr int kSmemBytes = kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes;
  static constexpr int kBlocksPerSm = mma_decode_blocks_per_sm(kSmemBytes);
  /* Three or more blocks an SM leave at most 168 registers a thread: at head dim
   * 128 and up the query fragments (HEAD_DIM / 4 registers) are read from shared
   * memory at every tile instead of held, so the accumulators fit without spills. */
  static constexpr bool kQFromSmem = kBlocksPerSm >= 3 && HEAD_DIM >= 128;
  static_assert(kStages >= 2 && kStages <= 8, "stages");
  static_assert(kSmemBytes <= 232448, "the pipeline exceeds 227 KiB of shared memory");
};

template <int DTYPE, int HEAD_DIM, int STAGES_REQ, int MERGE, int FUSED>
__device__ __forceinline__ void decode_attention_mma_block(const msgl_attention_params& p) {
  using T = typename DType<DTYPE>::Storage;
  using M = MmaDecode<DTYPE, HEAD_DIM, STAGES_REQ>;
  constexpr int ROW = M::kRow, CHUNKS = M::kChunks, BN = M::kTileKeys, STAGES = M::kStages, WARPS = M::kWarps;
  constexpr int CE = 16 / M::kElemBytes; /* elements per chunk */
  constexpr int DK = HEAD_DIM / 16;      /* k-steps of Q K^T */
  constexpr int DT = HEAD_DIM / 8;       /* 8-wide column tiles of O */
  static_assert(BN * CHUNKS % kWarpSize == 0, "tile copy");
  extern __shared__ __align__(16) unsigned char decode_smem[];
  __shared__ float sm_m[WARPS][16];
  __shared__ float sm_l[WARPS][16];
  __shared__ float sm_lse[16]; /* the cluster merge's log2-sum-exps */

  /* blockIdx.x = kv_head + num_kv_heads * (split + max_splits * seq); with the
   * cluster merge the splits of a pair are adjacent (a cluster along x):
   * split + max_splits * (kv_head + num_kv_heads * seq). */
  int kv_head, split, seq;
  if constexpr (MERGE == 2) {
    split = static_cast<int>(blockIdx.x % p.max_splits);
    const int pair = static_cast<int>(blockIdx.x / p.max_splits);
    kv_head = pair % p.num_kv_heads;
    seq = pair / p.num_kv_heads;
  } else {
    kv_head = static_cast<int>(blockIdx.x % p.num_kv_heads);
    const int rest = static_cast<int>(blockIdx.x / p.num_kv_heads);
    split = rest % p.max_splits;
    seq = rest / p.max_splits;
  }
  /* The returns before the merge are uniform over a cluster (one sequence and kv
   * head), but for blocks past the sequence's splits, which join the merge. */
  if (seq >= p.num_seqs) return;
  const int q_start = p.q_indptr[seq];
  const int q_len = p.q_indptr[seq + 1] - q_start;
  const int kv_len = p.kv_lens[seq];
  const int group = p.num_q_heads / p.num_kv_heads;
  const int rows = q_len * group; /* the host guarantees rows <= 16 */
  if (rows <= 0 || rows > 16) return;
  const int kv_chunk = decode_row_chunk(kv_len, p);
  const int num_splits = attention_num_splits(kv_len, kv_chunk);
  if (split >= num_splits) {
    if constexpr (MERGE == 2) {
      if (num_splits > 1) {
        grid_prologue(); /* the merge writes `out`, which the previous kernel may still read */
        /* The same variables as the other blocks' (a remote read maps a local address). */
        decode_cluster_merge<DTYPE, HEAD_DIM, WARPS>(p, reinterpret_cast<const float*>(decode_smem), sm_lse, rows,
                                                     q_start, group, kv_head, num_splits);
      }
    }
    return;
  }
  const int kv_begin = split * kv_chunk;
  const int kv_stop = min(kv_len, kv_begin + kv_chunk);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;

  T* q_s = reinterpret_cast<T*>(decode_smem);
  T* pipe = q_s + 16 * ROW + warp * STAGES * 2 * BN * ROW; /* this warp's stages: K then V */
  auto k_stage = [&](int s) { return pipe + s * 2 * BN * ROW; };
  auto v_stage = [&](int s) { return pipe + (s * 2 + 1) * BN * ROW; };

  /* Stage Q (row r: token r / group, head kv_head * group + r % group; zeros past
   * `rows`): one cp.async group. */
  auto stage_q = [&]() {
    for (int c = threadIdx.x; c < 16 * CHUNKS; c += WARPS * kWarpSize) {
      const int r = c / CHUNKS, col = c % CHUNKS;
      const T* src = static_cast<const T*>(p.q);
      if (r < rows)
        src += static_cast<long long>(q_start + r / group) * p.q_token_stride +
               static_cast<long long>(kv_head * group + r % group) * p.q_head_stride + col * CE;
      cp_async16(q_s + r * ROW + col * CE, src, r < rows ? 16 : 0);
    }
    cp_async_commit();
  };

  const int g = lane / 4, tid = lane % 4;
  int pos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    pos[h] = r < rows ? kv_len - q_len + r / group : -1; /* -1: padding row, every key masked */
  }

  const int* pages = p.block_table + static_cast<long long>(seq) * p.max_pages;
  const int page_size = p.page_size;
  const int page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  const int total_tiles = (kv_stop - kv_begin + BN - 1) / BN;
  const int my_tiles = total_tiles > warp ? (total_tiles - warp + WARPS - 1) / WARPS : 0;
  auto tile_start = [&](int t) { return kv_begin + (warp + t * WARPS) * BN; };
  /* The page of key tile_start(t) + lane % 16, or -1 past the split / outside the cache. */
  auto page_for = [&](int t) -> int {
    const int key = tile_start(t) + lane % BN;
    if (t >= my_tiles || key >= kv_stop) return -1;
    const int page = pages[page_shift >= 0 ? key >> page_shift : key / page_size];
    return page >= 0 && page < p.num_pages ? page : -1;
  };
  /* The pages of the pipeline's first STAGES tiles, loaded side by side: one
   * memory round trip before the first copies instead of one per tile (a block
   * of a split batch has only a few tiles a warp, so the fill is its latency). */
  int first_pages[STAGES];
#pragma unroll
  for (int t = 0; t < STAGES; ++t) first_pages[t] = page_for(t);
  int page = first_pages[0]; /* the page of the next tile issue() copies (its caller advances it) */
  /* Keys from `new_from` to the split's end are not copied (the fused prologue
   * writes their rows into the tile); kv_len for every tile copied after it. Keys
   * past the split still get their zero rows: a masked key's weight is 0, and 0
   * times a stale NaN in shared memory would not be. */
  auto issue = [&](int t, int new_from) {
    if (t < my_tiles) {
      const int start = tile_start(t);
#pragma unroll
      for (int i = 0; i < BN * CHUNKS / kWarpSize; ++i) {
        const int c = lane + i * kWarpSize;
        const int j = c / CHUNKS, col = c % CHUNKS;
        const int pg = __shfl_sync(0xffffffffu, page, j);
        const int key = start + j;
        if (key >= new_from && key < kv_stop) continue;
        const int in_page = page_shift >= 0 ? key & (page_size - 1) : key % page_size;
        const long long off =
            pg >= 0 ? ((static_cast<long long>(pg) * page_size + in_page) * p.num_kv_heads + kv_head) * HEAD_DIM + col * CE : 0;
        cp_async16(k_stage(t % STAGES) + j * ROW + col * CE, static_cast<const T*>(p.k_cache) + off, pg >= 0 ? 16 : 0);
        cp_async16(v_stage(t % STAGES) + j * ROW + col * CE, static_cast<const T*>(p.v_cache) + off, pg >= 0 ? 16 : 0);
      }
    }
    cp_async_commit(); /* one group per tile, empty past the end */
  };
  /* The pipeline's first STAGES - 1 tiles of this warp, and Q. Under programmatic
   * dependent launch the tiles go before the grid dependency wait when they hold
   * only keys of earlier steps (every key before kv_len - q_len: the kernel before
   * this one, rope_store, writes the new tokens' rows, and the block table and
   * lengths are copied from the host before the step's first kernel), so their
   * page-table loads and copies overlap the previous kernel's tail; Q (that
   * kernel's output) and tiles that reach a new key are read after the wait. The
   * same copies either way: the bits do not depend on it. */
  /* With the fused prologue every warp copies its first tiles before the wait,
   * all but the new keys' rows, which the prologue writes into them. */
  constexpr bool fused = FUSED != 0;
  const int last_early_tile = (my_tiles < STAGES - 1 ? my_tiles : STAGES - 1) - 1;
  const bool early = fused || last_early_tile < 0 || tile_start(last_early_tile) + BN <= kv_len - q_len;
  auto issue_first = [&]() {
#pragma unroll
    for (int t = 0; t < STAGES - 1; ++t) {
      page = first_pages[t];
      issue(t, fused ? kv_len - q_len : kv_len);
    }
    page = first_pages[STAGES - 1];
  };
  if (early) issue_first();
  const DecodeRopeRows rope_rows(rows, q_len, kv_begin, kv_stop, kv_len);
  if constexpr (fused)
    decode_rope_prologue_early<DTYPE, HEAD_DIM, ROW, WARPS>(p, q_s, rope_rows, q_start, q_len, group, kv_len);
  grid_prologue();
  if constexpr (fused) {
    decode_rope_prologue<DTYPE, HEAD_DIM, ROW, STAGES, WARPS>(p, q_s, rope_rows, q_start, q_len, group, kv_head,
                                                              kv_begin, kv_len, STAGES - 1);
  } else {
    stage_q();
    if (early) {
      cp_async_wait<0>(); /* Q's group, the last one (the earlier tiles landed meanwhile) */
    } else {
      issue_first();
      /* Q's group has landed (the STAGES - 1 tile groups behind it may be in flight):
       * its copy overlapped the first K/V copies instead of delaying them by a
       * memory round trip. */
      cp_async_wait<STAGES - 1>();
    }
    __syncthreads(); /* Q was copied by every thread of the block */
  }
  const T* q_frag = q_s + ((lane % 8) + ((lane / 8) % 2) * 8) * ROW + (lane / 16) * 8;
  unsigned qa[M::kQFromSmem ? 1 : DK][4];
  if constexpr (!M::kQFromSmem) {
#pragma unroll
    for (int kk = 0; kk < DK; ++kk) ldmatrix_x4(qa[kk], q_frag + kk * 16);
  }

  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {neg_inf(), neg_inf()};
  float l[2] = {0.f, 0.f};
  for (int t = 0; t < my_tiles; ++t) {
    issue(t + STAGES - 1, kv_len);
    page = page_for(t + STAGES); /* one iteration ahead of its copies */
    cp_async_wait<STAGES - 1>();
    __syncwarp(); /* the tile's rows were copied by other lanes of the warp */
    const T* k_s = k_stage(t % STAGES);
    const T* v_s = v_stage(t % STAGES);
    const int start = tile_start(t);
    float s[2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < DK; ++kk) {
      unsigned b[4];
      ldmatrix_x4(b, k_s + ((lane / 16) * 8 + lane % 8) * ROW + kk * 16 + ((lane / 8) % 2) * 8);
      if constexpr (M::kQFromSmem) {
        unsigned a[4];
        ldmatrix_x4(a, q_frag + kk * 16);
        mma16816<DTYPE>(s[0], a, b[0], b[1]);
        mma16816<DTYPE>(s[1], a, b[2], b[3]);
      } else {
        mma16816<DTYPE>(s[0], qa[kk], b[0], b[1]);
        mma16816<DTYPE>(s[1], qa[kk], b[2], b[3]);
      }
    }
    float alpha[2];
    bool moved = false; /* some row with keys so far has a new maximum */
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = neg_inf();
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = start + nt * 8 + tid * 2 + e;
          float v = s[nt][2 * h + e] * p.scale_log2;
          v = (key < kv_stop && key <= pos[h]) ? v : neg_inf();
          s[nt][2 * h + e] = v;
          tile_max = fmaxf(tile_max, v);
        }
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(m[h], tile_max);
      const float ref = m_new == neg_inf() ? 0.f : m_new;
      alpha[h] = fast_exp2(m[h] - ref);
      moved |= alpha[h] != 1.f && m[h] != neg_inf();
      m[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = fast_exp2(s[nt][2 * h + e] - ref);
          s[nt][2 * h + e] = pv;
          sum += pv;
        }
      }
      l[h] = l[h] * alpha[h] + sum;
    }
    /* Rescale the accumulators only when some row's maximum moved: after the
     * first tiles it rarely does, and a factor of exactly 1 changes no bit, so
     * skipping it gives the same output while saving HEAD_DIM / 2 multiplies a
     * lane per tile. A row without an unmasked key yet (padding rows past
     * `rows`, whose factor is 0 at every tile) holds exact zeros, which no
     * factor changes either. */
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        o[dt][0] *= alpha[0];
        o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1];
        o[dt][3] *= alpha[1];
      }
    }
    unsigned a[4];
    a[0] = pack2<DTYPE>(s[0][0], s[0][1]);
    a[1] = pack2<DTYPE>(s[0][2], s[0][3]);
    a[2] = pack2<DTYPE>(s[1][0], s[1][1]);
    a[3] = pack2<DTYPE>(s[1][2], s[1][3]);
#pragma unroll
    for (int dt = 0; dt < DT; dt += 2) {
      unsigned b[4];
      ldmatrix_x4_trans(b, v_s + (((lane / 8) % 2) * 8 + lane % 8) * ROW + (dt + lane / 16) * 8);
      mma16816<DTYPE>(o[dt], a, b[0], b[1]);
      mma16816<DTYPE>(o[dt + 1], a, b[2], b[3]);
    }
    __syncwarp(); /* every lane is done with this stage before it is refilled */
  }
  cp_async_wait<0>();
  __syncthreads(); /* the pipelines are drained: their memory holds the warps' outputs next */

  float* sm_o = reinterpret_cast<float*>(decode_smem); /* [4][16][HEAD_DIM] */
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float total = l[h];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    const int r = g + 8 * h;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<float2*>(sm_o + (warp * 16 + r) * HEAD_DIM + dt * 8 + tid * 2) =
          make_float2(o[dt][2 * h], o[dt][2 * h + 1]);
    if (tid == 0) {
      sm_m[warp][r] = m[h];
      sm_l[warp][r] = total;
    }
  }
  __syncthreads();
  decode_merge_warps<DTYPE, HEAD_DIM, 16, MERGE, WARPS>(p, sm_o, &sm_m[0][0], &sm_l[0][0], sm_lse, rows, q_start, group,
                                                        seq, kv_head, split, num_splits);
}

/* Dynamic shared memory of an instance's attention phase. */
template <int DTYPE, int HEAD_DIM, int ROWS, int STAGES> __host__ __device__ constexpr int decode_smem_bytes() {
  if constexpr (ROWS == 16) {
    return MmaDecode<DTYPE, HEAD_DIM, STAGES>::kSmemBytes;
  } else {
    return DecodeLayout<DTYPE, HEAD_DIM, ROWS>::kSmemBytes;
  }
}

/* Threads of an instance's attention-phase block (the combine phase always runs
 * kDecodeThreads): the three-warp tensor-core block's 96, else 128. */
template <int ROWS, int STAGES> __host__ __device__ constexpr int decode_block_threads() {
  if constexpr (ROWS == 16) {
    return mma_decode_warps(STAGES) * kWarpSize;
  } else {
    return kDecodeThreads;
  }
}

/* Blocks an SM the instance is built for (__launch_bounds__'s minimum): the
 * tensor-core block's shared-memory bound; 1 (no register cap) for the CUDA-core
 * blocks, as before. */
template <int DTYPE, int HEAD_DIM, int ROWS, int STAGES> __host__ __device__ constexpr int decode_min_blocks() {
  if constexpr (ROWS == 16) {
    /* The registers of kBlocksPerSm blocks of kWarps warps, as __launch_bounds__ counts
     * them at its 128 threads a block: the three-warp block's four blocks an SM are
     * three blocks' worth. */
    return (MmaDecode<DTYPE, HEAD_DIM, STAGES>::kBlocksPerSm * MmaDecode<DTYPE, HEAD_DIM, STAGES>::kWarps + 3) / 4;
  } else {
    return 1;
  }
}

/* MERGE: the split merge in this launch (split_counters given; see the header). */
template <int DTYPE, int HEAD_DIM, int ROWS, int STAGES, int MERGE, int FUSED>
__device__ __forceinline__ void decode_attention_impl(const msgl_attention_params& p) {
  static_assert(ROWS == 16 || STAGES == 0, "STAGES selects the tensor-core block's pipeline only");
  static_assert(ROWS == 16 || FUSED == 0, "the fused prologue is the tensor-core block's");
  if constexpr (ROWS == 16) {
    static_assert(DTYPE != MSGL_F32, "the tensor-core decode block needs bf16 or f16");
    if (p.phase == 0) {
      decode_attention_mma_block<DTYPE, HEAD_DIM, STAGES, MERGE, FUSED>(p); /* its own grid_prologue */
      return;
    }
  }
  if (p.phase == 0) {
    grid_prologue();
    if constexpr (ROWS != 16) decode_attention_block<DTYPE, HEAD_DIM, ROWS, MERGE>(p);
  } else {
    decode_combine<DTYPE, HEAD_DIM>(p); /* its own grid_prologue */
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 128 threads; phase 0: decode_smem_bytes of dynamic shared memory
 * (gpu/attention.rs mirrors the formula), grid = num_seqs *
 * num_kv_heads * max_splits; phase 1 (every split launch: this instance never
 * merges in the attention launch, whatever split_counters holds):
 * grid = ceil(num_tokens * num_q_heads / 4). */
extern "C" __global__ void __launch_bounds__(
    128, msgl::decode_min_blocks<MSGL_DTYPE, MSGL_HEAD_DIM, MSGL_ROWS, MSGL_STAGES>())
    msgl_decode_attention_kernel(const msgl_attention_params p) {
  /* The fused prologue by a run-time branch here (one JIT instance for both). */
  if constexpr (MSGL_ROWS == 16) {
    if (p.fused_rope != 0 && p.phase == 0) {
      msgl::decode_attention_impl<MSGL_DTYPE, MSGL_HEAD_DIM, MSGL_ROWS, MSGL_STAGES, 0, 1>(p);
      return;
    }
  }
  msgl::decode_attention_impl<MSGL_DTYPE, MSGL_HEAD_DIM, MSGL_ROWS, MSGL_STAGES, 0, 0>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/attention_host.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE, HEAD_DIM, ROWS, STAGES) for each AOT instance */

namespace msgl {

template <int DTYPE, int HEAD_DIM, int ROWS, int STAGES, int MERGE, int FUSED>
__global__ void __launch_bounds__(kDecodeThreads, (decode_min_blocks<DTYPE, HEAD_DIM, ROWS, STAGES>()))
    decode_attention_kernel(const msgl_attention_params p) {
  decode_attention_impl<DTYPE, HEAD_DIM, ROWS, STAGES, MERGE, FUSED>(p);
}

/* FUSED: the instance with the fused prologue (a compile-time switch: its code
 * costs the plain instance 26 registers at head dim 128, 2 stages). */
template <int DTYPE, int HEAD_DIM, int ROWS, int STAGES, int MERGE, int FUSED>
static int32_t launch_decode_attention_as(const msgl_attention_params& p, cudaStream_t s) {
  constexpr int smem = decode_smem_bytes<DTYPE, HEAD_DIM, ROWS, STAGES>();
  cudaError_t err = cudaFuncSetAttribute(decode_attention_kernel<DTYPE, HEAD_DIM, ROWS, STAGES, MERGE, FUSED>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess)
    return set_error(MSGL_ERR_CUDA, "decode_attention: %d bytes of shared memory: %s", smem, cudaGetErrorString(err));
  const long long blocks = static_cast<long long>(p.num_seqs) * p.num_kv_heads * p.max_splits;
  unsigned cluster = 1;
  if constexpr (MERGE == 2) {
    cluster = static_cast<unsigned>(p.max_splits);
    if (cluster > 8) { /* 9..16 blocks a cluster: sm_90's non-portable sizes */
      err = cudaFuncSetAttribute(decode_attention_kernel<DTYPE, HEAD_DIM, ROWS, STAGES, MERGE, FUSED>,
                                 cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
      if (err != cudaSuccess)
        return set_error(MSGL_ERR_CUDA, "decode_attention: clusters of %u blocks: %s", cluster, cudaGetErrorString(err));
    }
  }
  (void)launch_pdl_cluster(decode_attention_kernel<DTYPE, HEAD_DIM, ROWS, STAGES, MERGE, FUSED>,
                           dim3(static_cast<unsigned>(blocks)), dim3(decode_block_threads<ROWS, STAGES>()), smem, s, cluster,
                           p);
  if (p.max_splits > 1 && MERGE == 0) {
    msgl_attention_params p1 = p;
    p1.phase = 1;
    const long long rows = p.num_tokens * p.num_q_heads;
    (void)launch_pdl(decode_attention_kernel<DTYPE, HEAD_DIM, ROWS, STAGES, 0, 0>,
                     dim3(static_cast<unsigned>((rows + kDecodeWarps - 1) / kDecodeWarps)), dim3(kDecodeThreads), 0, s, p1);
  }
  return check_launch("decode_attention");
}

/* The cluster-merging instance when asked for (tensor-core block only), the
 * counter-merging one when split counters came with a split launch, else the
 * plain one. */
template <int DTYPE, int HEAD_DIM, int ROWS, int STAGES>
static int32_t launch_decode_attention(const msgl_attention_params& p, bool cluster_merge, cudaStream_t s) {
  const bool counters = p.max_splits > 1 && p.split_counters != nullptr;
  if constexpr (ROWS == 16) {
    /* The fused prologue (the entry has refused it with the cluster merge). */
    if (p.fused_rope != 0) {
      if (counters) return launch_decode_attention_as<DTYPE, HEAD_DIM, ROWS, STAGES, 1, 1>(p, s);
      return launch_decode_attention_as<DTYPE, HEAD_DIM, ROWS, STAGES, 0, 1>(p, s);
    }
    if (cluster_merge && p.max_splits > 1) return launch_decode_attention_as<DTYPE, HEAD_DIM, ROWS, STAGES, 2, 0>(p, s);
  }
  if (counters) return launch_decode_attention_as<DTYPE, HEAD_DIM, ROWS, STAGES, 1, 0>(p, s);
  return launch_decode_attention_as<DTYPE, HEAD_DIM, ROWS, STAGES, 0, 0>(p, s);
}

/* Checks the fused prologue's half of the plan (tensor.h: fused_rope) and ties
 * its q and caches to the views the entry checked: the rope fields come from the
 * caller as raw pointers, so what can be checked here is their shape and
 * alignment against the attention's. */
static int32_t decode_rope_check(const char* op, const msgl_tensor* q, const msgl_tensor* k_cache,
                                 const msgl_tensor* v_cache, int32_t rows, bool cluster_merge,
                                 msgl_attention_params& p) {
  msgl_rope_store_params& r = p.rope;
  if (rows != 16 || cluster_merge)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the fused prologue needs the tensor-core instance without the cluster merge", op);
  const int64_t head_dim = q->shape[2], elems = 16 / dtype_size(q->dtype);
  if (r.num_tokens != p.num_tokens || r.num_q_heads != p.num_q_heads || r.num_kv_heads != p.num_kv_heads ||
      r.head_dim != head_dim)
    return set_error(MSGL_ERR_INVALID_ARGUMENT,
                     "%s: the fused prologue's shape (%lld tokens, %d/%d heads of %d) is not the attention's (%lld, %d/%d, %lld)",
                     op, static_cast<long long>(r.num_tokens), r.num_q_heads, r.num_kv_heads, r.head_dim,
                     static_cast<long long>(p.num_tokens), p.num_q_heads, p.num_kv_heads, static_cast<long long>(head_dim));
  const int G = r.threads_per_head;
  const bool pow2 = G > 0 && G <= kWarpSize && (G & (G - 1)) == 0;
  const int64_t rdim = r.rotary_dim;
  if (r.vectorized != 1 || !pow2 || rdim <= 0 || rdim % 2 != 0 || rdim > head_dim || (rdim / 2) % elems != 0 ||
      rdim / 2 / elems + (head_dim - rdim) / elems > int64_t{G} * kRopeRowUnits)
    return set_error(MSGL_ERR_INVALID_ARGUMENT,
                     "%s: the fused prologue needs rope_store's vector path (rotary %lld of %lld in %d threads a head)",
                     op, static_cast<long long>(rdim), static_cast<long long>(head_dim), G);
  if (r.k == nullptr || r.v == nullptr || r.positions == nullptr || r.out_loc == nullptr || r.cos_sin == nullptr ||
      (r.q_weight == nullptr) != (r.k_weight == nullptr) || r.max_positions < 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the fused prologue lacks k, v, positions, slots or cos/sin", op);
  const int64_t esize = dtype_size(q->dtype);
  const int64_t strides[4] = {r.k_token_stride, r.k_head_stride, r.v_token_stride, r.v_head_stride};
  bool aligned = reinterpret_cast<uintptr_t>(r.k) % 16 == 0 && reinterpret_cast<uintptr_t>(r.v) % 16 == 0 &&
                 reinterpret_cast<uintptr_t>(r.cos_sin) % 16 == 0 && rdim % 4 == 0;
  for (int64_t st : strides) aligned = aligned && (st * esize) % 16 == 0;
  for (const void* w : {r.q_weight, r.k_weight}) aligned = aligned && reinterpret_cast<uintptr_t>(w) % 16 == 0;
  if (!aligned) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the fused prologue's rows are not 16-byte aligned", op);
  r.q = q->data;
  r.q_token_stride = q->strides[0];
  r.q_head_stride = q->strides[1];
  r.k_cache = k_cache->data;
  r.v_cache = v_cache->data;
  r.num_slots = k_cache->shape[0] * k_cache->shape[1];
  return MSGL_OK;
}
}  // namespace msgl

extern "C" int32_t msgl_decode_attention(const msgl_tensor* out, const msgl_tensor* q, const msgl_tensor* k_cache,
                                         const msgl_tensor* v_cache, const msgl_tensor* q_indptr,
                                         const msgl_tensor* kv_lens, const msgl_tensor* block_table,
                                         const msgl_tensor* o_partial, const msgl_tensor* lse_partial,
                                         const msgl_tensor* split_counters, const msgl_attention_params* plan,
                                         int32_t rows, msgl_stream stream) {
  using namespace msgl;
  const char* op = "decode_attention";
  if (plan == nullptr) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `plan` is null", op);
  if (rows != 1 && rows != 2 && rows != 4 && rows != 8 && rows != 16)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: rows must be 1, 2, 4, 8 or 16, got %d", op, rows);
  if (rows == 16 && q != nullptr && q->dtype == MSGL_F32)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the tensor-core instance (rows 16) needs bf16 or f16", op);
  msgl_attention_params p;
  MSGL_TRY(attention_check_and_fill(op, out, q, k_cache, v_cache, q_indptr, kv_lens, block_table, o_partial, lse_partial,
                                    plan, &p));
  const int64_t head_dim = q->shape[2];
  if (head_dim < 32 || head_dim > 256 || (head_dim & (head_dim - 1)) != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: head dimension %lld is not a power of two in 32..256", op,
                     static_cast<long long>(head_dim));
  if (p.num_q_heads / p.num_kv_heads > rows)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: a GQA group of %d heads does not fit %d rows", op,
                     p.num_q_heads / p.num_kv_heads, rows);
  if (static_cast<long long>(p.num_seqs) * p.num_kv_heads * p.max_splits > 0x7fffffffLL)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the grid exceeds 2^31 blocks", op);
  /* plan->phase 2 asks for the cluster merge (the attention launch is phase 0
   * either way; the combine phase is never asked for through this entry). */
  if (plan->phase != 0 && plan->phase != 2)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: plan phase %d (0, or 2: the cluster merge)", op, plan->phase);
  const bool cluster_merge = plan->phase == 2;
  if (cluster_merge && (rows != 16 || p.max_splits > kDecodeMaxClusterSplits))
    return set_error(MSGL_ERR_INVALID_ARGUMENT,
                     "%s: the cluster merge needs the tensor-core instance (rows 16, got %d) and at most %d splits (got %d)",
                     op, rows, kDecodeMaxClusterSplits, p.max_splits);
  if (cluster_merge && split_counters != nullptr)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: split counters and the cluster merge exclude each other", op);
  if (split_counters != nullptr && p.max_splits > 1) {
    MSGL_TRY(expect_tensor(split_counters, op, "split_counters", 1, dtype_bit(MSGL_I32)));
    MSGL_TRY(expect_contiguous(split_counters, op, "split_counters"));
    if (split_counters->device != q->device)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `split_counters` must be on the device of `q`", op);
    if (split_counters->shape[0] < static_cast<int64_t>(p.num_seqs) * p.num_kv_heads)
      return set_error(MSGL_ERR_INVALID_ARGUMENT,
                       "%s: argument `split_counters` holds %lld counters for %lld (sequence, kv head) pairs", op,
                       static_cast<long long>(split_counters->shape[0]),
                       static_cast<long long>(p.num_seqs) * p.num_kv_heads);
    p.split_counters = static_cast<int32_t*>(split_counters->data);
  }
  if (p.fused_rope != 0) MSGL_TRY(decode_rope_check(op, q, k_cache, v_cache, rows, cluster_merge, p));
  /* plan->num_warps (the tile kernel's field): the tensor-core block's pipeline
   * stages, 0 for its default; the CUDA-core blocks have one pipeline (STAGES 0). */
  if (plan->num_warps < 0 || plan->num_warps > 8 || (rows != 16 && plan->num_warps != 0))
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: bad pipeline stages %d for rows %d", op, plan->num_warps, rows);
  const int stages =
      rows == 16 ? (plan->num_warps > 0 ? plan->num_warps : mma_decode_default_stages(static_cast<int>(head_dim))) : 0;
  if (p.num_tokens == 0 || p.num_seqs == 0) return MSGL_OK;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#define MSGL_CASE(D, HD, R, S) \
  if (q->dtype == D && head_dim == HD && rows == R && stages == S) \
    return launch_decode_attention<D, HD, R, S>(p, cluster_merge, s);
  MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
  return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d,HEAD_DIM=%lld,ROWS=%d,STAGES=%d", op, q->dtype,
                   static_cast<long long>(head_dim), rows, stages);
}
#endif
