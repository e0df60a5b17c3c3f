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
 * (split + 1) * kv_chunk) of the sequence. Inside the block a key row of HEAD_DIM
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
 * Instance parameters: DTYPE (f32, f16, bf16), HEAD_DIM (a power of two, 32..256),
 * ROWS (1, 2, 4 or 8: query rows a block can hold; the host picks the smallest
 * that fits the batch).
 */
#include "minisgl/attention.cuh"
#include "minisgl/mma.cuh"

namespace msgl {

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * kWarpSize;

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

/* Attention phase: one (sequence, kv head, split) per block; blockIdx.x =
 * kv_head + num_kv_heads * (split + max_splits * seq). */
template <int DTYPE, int HEAD_DIM, int ROWS>
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
  const int num_splits = attention_num_splits(kv_len, p.kv_chunk);
  if (split >= num_splits) return;
  const int kv_begin = split * p.kv_chunk;
  const int kv_stop = min(kv_len, kv_begin + p.kv_chunk);

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
#pragma unroll
      for (int v = 0; v < VECS; ++v) {
        Vec16<DTYPE> x;
        x.from_raw(kraw[u][v]);
#pragma unroll
        for (int i = 0; i < VE; ++i) k[v * VE + i] = x.v[i];
      }
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
#pragma unroll
      for (int w = 0; w < VECS; ++w) {
        Vec16<DTYPE> x;
        x.from_raw(vraw[u][w]);
#pragma unroll
        for (int i = 0; i < VE; ++i) v[w * VE + i] = x.v[i];
      }
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

  /* Merge the warps and write: `out` for a sequence of one split, else the partial. */
  for (int idx = threadIdx.x; idx < rows * HEAD_DIM; idx += kDecodeThreads) {
    const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
    float mx = neg_inf();
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, sm_m[w][r]);
    const float ref = mx == neg_inf() ? 0.f : mx;
    float total = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float wt = fast_exp2(sm_m[w][r] - ref);
      total += sm_l[w][r] * wt;
      acc += sm_o[w][r][d] * wt;
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;
    const long long row =
        static_cast<long long>(q_start + r / group) * p.num_q_heads + kv_head * group + r % group;
    if (num_splits == 1) {
      static_cast<T*>(p.out)[row * HEAD_DIM + d] = DType<DTYPE>::from_f32(acc * inv);
    } else {
      const long long prow = row * p.max_splits + split;
      p.o_partial[prow * HEAD_DIM + d] = acc * inv;
      if (d == 0) p.lse_partial[prow] = total > 0.f ? ref + fast_log2(total) : neg_inf();
    }
  }
}

template <int DTYPE, int HEAD_DIM, int ROWS>
__device__ __forceinline__ void decode_attention_impl(const msgl_attention_params& p) {
  if (p.phase == 0) {
    decode_attention_block<DTYPE, HEAD_DIM, ROWS>(p);
  } else {
    attention_combine<DTYPE, HEAD_DIM>(p);
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 128 threads; phase 0: DecodeLayout::kSmemBytes of dynamic shared memory
 * (gpu/attention.rs mirrors the formula), grid = num_seqs *
 * num_kv_heads * max_splits; phase 1: grid = ceil(num_tokens * num_q_heads / 4). */
extern "C" __global__ void __launch_bounds__(128) msgl_decode_attention_kernel(const msgl_attention_params p) {
  msgl::decode_attention_impl<MSGL_DTYPE, MSGL_HEAD_DIM, MSGL_ROWS>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/attention_host.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE, HEAD_DIM, ROWS) for each AOT instance */

namespace msgl {

template <int DTYPE, int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(kDecodeThreads) decode_attention_kernel(const msgl_attention_params p) {
  decode_attention_impl<DTYPE, HEAD_DIM, ROWS>(p);
}

template <int DTYPE, int HEAD_DIM, int ROWS>
static int32_t launch_decode_attention(const msgl_attention_params& p, cudaStream_t s) {
  constexpr int smem = DecodeLayout<DTYPE, HEAD_DIM, ROWS>::kSmemBytes;
  cudaError_t err =
      cudaFuncSetAttribute(decode_attention_kernel<DTYPE, HEAD_DIM, ROWS>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess)
    return set_error(MSGL_ERR_CUDA, "decode_attention: %d bytes of shared memory: %s", smem, cudaGetErrorString(err));
  const long long blocks = static_cast<long long>(p.num_seqs) * p.num_kv_heads * p.max_splits;
  decode_attention_kernel<DTYPE, HEAD_DIM, ROWS><<<static_cast<unsigned>(blocks), kDecodeThreads, smem, s>>>(p);
  if (p.max_splits > 1) {
    msgl_attention_params p1 = p;
    p1.phase = 1;
    const long long rows = p.num_tokens * p.num_q_heads;
    decode_attention_kernel<DTYPE, HEAD_DIM, ROWS>
        <<<static_cast<unsigned>((rows + kDecodeWarps - 1) / kDecodeWarps), kDecodeThreads, 0, s>>>(p1);
  }
  return check_launch("decode_attention");
}
}  // namespace msgl

extern "C" int32_t msgl_decode_attention(const msgl_tensor* out, const msgl_tensor* q, const msgl_tensor* k_cache,
                                         const msgl_tensor* v_cache, const msgl_tensor* q_indptr,
                                         const msgl_tensor* kv_lens, const msgl_tensor* block_table,
                                         const msgl_tensor* o_partial, const msgl_tensor* lse_partial,
                                         const msgl_attention_params* plan, int32_t rows, msgl_stream stream) {
  using namespace msgl;
  const char* op = "decode_attention";
  if (plan == nullptr) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `plan` is null", op);
  if (rows != 1 && rows != 2 && rows != 4 && rows != 8)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: rows must be 1, 2, 4 or 8, got %d", op, rows);
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
  if (p.num_tokens == 0 || p.num_seqs == 0) return MSGL_OK;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#define MSGL_CASE(D, HD, R) \
  if (q->dtype == D && head_dim == HD && rows == R) return launch_decode_attention<D, HD, R>(p, s);
  MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
  return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d,HEAD_DIM=%lld,ROWS=%d", op, q->dtype,
                   static_cast<long long>(head_dim), rows);
}
#endif
