/*
 * attention.cu: causal attention over a paged KV cache for a ragged batch, prefill
 * (with a cached prefix) and decode alike, FlashAttention-2 style.
 *
 *   out[t, h] = softmax(scale * q[t, h] . K^T + causal mask) V
 *
 * Work decomposition. Query rows of one sequence and one kv head are packed as
 * (token, head in the GQA group) pairs, token-major, so a decode step of a 4:1 GQA
 * model puts its 4 query heads in the rows of one tile. A block of `num_warps`
 * warps owns 16 * num_warps such rows (a q tile), one kv head and one split of the
 * sequence's keys ([split * kv_chunk, (split + 1) * kv_chunk), cut at the tile's last
 * causal position). The 1-D grid enumerates (q tile, kv head, split); a block finds
 * its sequence with a warp-wide prefix sum over q_indptr. Each warp owns 16 rows.
 *
 * Per block: the Q tile is staged in shared memory once; K and V tiles of BN keys
 * are gathered from the pages with 16-byte cp.async (zero-filled past the end and
 * for out-of-range page numbers) into one K and one V buffer, the load of V[i]
 * overlapping S = Q K[i]^T and the load of K[i + 1] overlapping O += P V[i]. Rows
 * are padded by 16 bytes, so ldmatrix and the row-wise software loads are free of
 * bank conflicts. Softmax is online, in f32, in the log2 domain.
 *
 * Products (instance parameter MMA): with MMA = 1 (bf16/f16) the tensor cores
 * (mma.sync m16n8k16, f32 accumulate): Q and K fragments with ldmatrix, V fragments
 * with ldmatrix.trans, P re-packed from the S accumulators in registers (FA2's
 * register reuse). With MMA = 0 (always for f32) a CUDA-core path computes exactly
 * the same accumulator fragments (same rows and columns per lane) from shared
 * memory, so the softmax, masking and epilogue are shared by both.
 *
 * Splits: with one split a block writes `out` directly. Otherwise it writes its
 * normalised f32 partial output and log2-sum-exp per row, and phase 1 (one warp
 * per (token, head)) merges the partials of every sequence with more than one
 * split. The host chooses kv_chunk so that small batches of long sequences (decode)
 * still fill the GPU.
 */
#include "minisgl/attention.cuh"
#include "minisgl/mma.cuh"

namespace msgl {

/* Keys per K/V tile. */
template <int DTYPE, int HEAD_DIM> struct AttnTile {
  static constexpr int kElemBytes = DType<DTYPE>::kBytes;
  static constexpr int BN = (kElemBytes == 2 && HEAD_DIM <= 128) ? 64 : 32;
  /* Shared-memory row length in elements: the head plus 16 bytes of padding. */
  static constexpr int kRow = HEAD_DIM + 16 / kElemBytes;
  /* 16-byte chunks per head row. */
  static constexpr int kChunks = HEAD_DIM * kElemBytes / 16;
};

/* Dynamic shared memory of a block: Q tile, one K and one V tile. */
__host__ __device__ constexpr long long attention_smem_bytes(int dtype_bytes, int head_dim, int bn, int num_warps) {
  return static_cast<long long>(16 * num_warps + 2 * bn) * (head_dim + 16 / dtype_bytes) * dtype_bytes;
}

/* The sequence holding q tile `tile` and the tile's index inside it: a warp-wide
 * prefix sum of ceil(q_len * group / rows_per_tile) over the sequences. */
__device__ __forceinline__ bool attention_find_tile(const msgl_attention_params& p, int tile, int group, int rows_per_tile,
                                                    int& seq, int& tile_in_seq) {
  const int lane = threadIdx.x % kWarpSize;
  int before = 0;
  for (int base = 0; base < p.num_seqs; base += kWarpSize) {
    const int s = base + lane;
    int count = 0;
    if (s < p.num_seqs) {
      const int q_len = p.q_indptr[s + 1] - p.q_indptr[s];
      count = (q_len * group + rows_per_tile - 1) / rows_per_tile;
    }
    int incl = count;
#pragma unroll
    for (int o = 1; o < kWarpSize; o *= 2) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, before + incl > tile);
    if (hit != 0) {
      const int first = __ffs(hit) - 1;
      const int incl_first = __shfl_sync(0xffffffffu, incl, first);
      const int count_first = __shfl_sync(0xffffffffu, count, first);
      seq = base + first;
      tile_in_seq = tile - (before + incl_first - count_first);
      return true;
    }
    before += __shfl_sync(0xffffffffu, incl, kWarpSize - 1);
  }
  return false;
}

template <int DTYPE, int HEAD_DIM, int MMA>
__device__ __forceinline__ void attention_tile(const msgl_attention_params& p) {
  using T = typename DType<DTYPE>::Storage;
  using Tile = AttnTile<DTYPE, HEAD_DIM>;
  constexpr int BN = Tile::BN;
  constexpr int ROW = Tile::kRow;
  constexpr int CHUNKS = Tile::kChunks;
  constexpr int CHUNK_ELEMS = 16 / Tile::kElemBytes;
  constexpr int NT = BN / 8;        /* 8-key column tiles of S */
  constexpr int DT = HEAD_DIM / 8;  /* 8-wide column tiles of O */
  static_assert(HEAD_DIM % 16 == 0 && BN % 16 == 0, "tile shapes");

  extern __shared__ __align__(16) unsigned char attn_smem[];
  const int num_warps = p.num_warps;
  const int rows_per_tile = 16 * num_warps;
  const int threads = kWarpSize * num_warps;
  T* q_s = reinterpret_cast<T*>(attn_smem);
  T* k_s = q_s + rows_per_tile * ROW;
  T* v_s = k_s + BN * ROW;

  /* Which (q tile, kv head, split) this block is. */
  const int split = static_cast<int>(blockIdx.x % p.max_splits);
  const int rest = static_cast<int>(blockIdx.x / p.max_splits);
  const int kv_head = rest % p.num_kv_heads;
  const int tile = rest / p.num_kv_heads;
  const int group = p.num_q_heads / p.num_kv_heads;
  int seq = 0, tile_in_seq = 0;
  if (!attention_find_tile(p, tile, group, rows_per_tile, seq, tile_in_seq)) return;
  const int q_start = p.q_indptr[seq];
  const int q_len = p.q_indptr[seq + 1] - q_start;
  const int kv_len = p.kv_lens[seq];
  const int num_splits = attention_num_splits(kv_len, p.kv_chunk);
  if (split >= num_splits) return;
  const int row0 = tile_in_seq * rows_per_tile; /* first packed row of the tile */
  const int rows = min(rows_per_tile, q_len * group - row0);
  const int last_token = (row0 + rows - 1) / group;
  const int kv_begin = split * p.kv_chunk;
  const int kv_limit = min(kv_len, kv_begin + p.kv_chunk);
  const int kv_stop = min(kv_limit, kv_len - q_len + last_token + 1);
  const int num_tiles = kv_stop > kv_begin ? (kv_stop - kv_begin + BN - 1) / BN : 0;
  const int* pages = p.block_table + static_cast<long long>(seq) * p.max_pages;

  /* Stage Q: row r of the tile is token (row0 + r) / group, head kv_head * group + (row0 + r) % group. */
  for (int c = threadIdx.x; c < rows_per_tile * CHUNKS; c += threads) {
    const int r = c / CHUNKS, col = c % CHUNKS;
    const int pr = row0 + r;
    const bool valid = r < rows;
    const T* src = static_cast<const T*>(p.q);
    if (valid)
      src += static_cast<long long>(q_start + pr / group) * p.q_token_stride +
             static_cast<long long>(kv_head * group + pr % group) * p.q_head_stride + col * CHUNK_ELEMS;
    cp_async16(q_s + r * ROW + col * CHUNK_ELEMS, src, valid ? 16 : 0);
  }
  /* Page sizes are usually powers of two: then shift and mask instead of dividing. */
  const int page_size = p.page_size;
  const int page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
  /* Gathers keys [start, start + BN) of this kv head into `dst`, zeros past kv_stop
   * and for page numbers outside the cache. */
  auto load_kv = [&](T* dst, const void* cache, int start) {
    for (int c = threadIdx.x; c < BN * CHUNKS; c += threads) {
      const int r = c / CHUNKS, col = c % CHUNKS;
      const int kv = start + r;
      const T* src = static_cast<const T*>(cache);
      bool valid = kv < kv_stop;
      if (valid) {
        const int page_idx = page_shift >= 0 ? kv >> page_shift : kv / page_size;
        const int in_page = page_shift >= 0 ? kv & (page_size - 1) : kv - page_idx * page_size;
        const int page = pages[page_idx];
        valid = page >= 0 && page < p.num_pages;
        if (valid) {
          const long long slot = static_cast<long long>(page) * page_size + in_page;
          src += (slot * p.num_kv_heads + kv_head) * HEAD_DIM + col * CHUNK_ELEMS;
        }
      }
      cp_async16(dst + r * ROW + col * CHUNK_ELEMS, src, valid ? 16 : 0);
    }
  };
  if (num_tiles > 0) load_kv(k_s, p.k_cache, kv_begin);
  cp_async_commit();

  /* This lane's two rows of the warp's 16: g and g + 8 (the mma accumulator layout),
   * and the columns it holds: 2 * tid, 2 * tid + 1 of every 8-column tile. */
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int g = lane / 4, tid = lane % 4;
  const bool warp_active = warp * 16 < rows;
  int pos[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + g + 8 * h;
    pos[h] = r < rows ? kv_len - q_len + (row0 + r) / group : -1; /* -1: padding row, every key masked */
  }
  constexpr bool tensor_cores = MMA != 0 && DTYPE != MSGL_F32;

  float o[DT][4];
#pragma unroll
  for (int i = 0; i < DT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {neg_inf(), neg_inf()};
  float l[2] = {0.f, 0.f};
  const T* q_w = q_s + warp * 16 * ROW;

  for (int it = 0; it < num_tiles; ++it) {
    const int start = kv_begin + it * BN;
    load_kv(v_s, p.v_cache, start);
    cp_async_commit();
    cp_async_wait<1>(); /* Q and K[it] have landed */
    __syncthreads();

    float s[NT][4];
#pragma unroll
    for (int i = 0; i < NT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    if (warp_active) {
      if constexpr (tensor_cores) {
        {
#pragma unroll
          for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
            unsigned a[4];
            ldmatrix_x4(a, q_w + ((lane % 8) + ((lane / 8) % 2) * 8) * ROW + kk * 16 + (lane / 16) * 8);
#pragma unroll
            for (int nt = 0; nt < NT; nt += 2) {
              unsigned b[4];
              ldmatrix_x4(b, k_s + ((nt + lane / 16) * 8 + lane % 8) * ROW + kk * 16 + ((lane / 8) % 2) * 8);
              mma16816<DTYPE>(s[nt], a, b[0], b[1]);
              mma16816<DTYPE>(s[nt + 1], a, b[2], b[3]);
            }
          }
        }
      }
      if constexpr (!tensor_cores) {
        /* CUDA cores: the same fragment entries, dot products from shared memory. */
        for (int d = 0; d < HEAD_DIM; d += 2) {
          const float q0a = DType<DTYPE>::to_f32(q_w[g * ROW + d]), q0b = DType<DTYPE>::to_f32(q_w[g * ROW + d + 1]);
          const float q1a = DType<DTYPE>::to_f32(q_w[(g + 8) * ROW + d]);
          const float q1b = DType<DTYPE>::to_f32(q_w[(g + 8) * ROW + d + 1]);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const T* kr = k_s + (nt * 8 + tid * 2 + e) * ROW + d;
              const float ka = DType<DTYPE>::to_f32(kr[0]), kb = DType<DTYPE>::to_f32(kr[1]);
              s[nt][e] += q0a * ka + q0b * kb;
              s[nt][2 + e] += q1a * ka + q1b * kb;
            }
          }
        }
      }

      /* Scale, mask, online softmax (log2 domain). */
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = neg_inf();
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
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
        const float m_ref = m_new == neg_inf() ? 0.f : m_new;
        const float alpha = fast_exp2(m[h] - m_ref);
        m[h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pv = fast_exp2(s[nt][2 * h + e] - m_ref);
            s[nt][2 * h + e] = pv;
            sum += pv;
          }
        }
        l[h] = l[h] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          o[dt][2 * h] *= alpha;
          o[dt][2 * h + 1] *= alpha;
        }
      }
    }

    cp_async_wait<0>(); /* V[it] has landed */
    __syncthreads();    /* and every warp is done with K[it] */
    if (it + 1 < num_tiles) load_kv(k_s, p.k_cache, start + BN);
    cp_async_commit();

    if (warp_active) {
      if constexpr (tensor_cores) {
        {
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk) {
            unsigned a[4];
            a[0] = pack2<DTYPE>(s[2 * kk][0], s[2 * kk][1]);
            a[1] = pack2<DTYPE>(s[2 * kk][2], s[2 * kk][3]);
            a[2] = pack2<DTYPE>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            a[3] = pack2<DTYPE>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dt = 0; dt < DT; dt += 2) {
              unsigned b[4];
              ldmatrix_x4_trans(b, v_s + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * ROW + (dt + lane / 16) * 8);
              mma16816<DTYPE>(o[dt], a, b[0], b[1]);
              mma16816<DTYPE>(o[dt + 1], a, b[2], b[3]);
            }
          }
        }
      }
      if constexpr (!tensor_cores) {
        /* CUDA cores: P[row][key] comes from the lane of the quad holding that key. */
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int kq = 0; kq < 8; ++kq) {
            const int src = (lane & ~3) | (kq >> 1);
            const float p0 = __shfl_sync(0xffffffffu, s[nt][kq & 1], src);
            const float p1 = __shfl_sync(0xffffffffu, s[nt][2 + (kq & 1)], src);
            const T* vr = v_s + (nt * 8 + kq) * ROW + tid * 2;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
              const float va = DType<DTYPE>::to_f32(vr[dt * 8]), vb = DType<DTYPE>::to_f32(vr[dt * 8 + 1]);
              o[dt][0] += p0 * va;
              o[dt][1] += p0 * vb;
              o[dt][2] += p1 * va;
              o[dt][3] += p1 * vb;
            }
          }
        }
      }
    }
    __syncthreads(); /* every warp is done with V[it] before it is overwritten */
  }
  cp_async_wait<0>();

  if (!warp_active) return;
  /* Epilogue: normalise and write the rows this lane holds. */
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float total = l[h];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    const int r = warp * 16 + g + 8 * h;
    if (r >= rows) continue;
    const int pr = row0 + r;
    const long long row = static_cast<long long>(q_start + pr / group) * p.num_q_heads + kv_head * group + pr % group;
    const float inv = total > 0.f ? 1.f / total : 0.f;
    if (num_splits == 1) {
      T* out = static_cast<T*>(p.out) + row * HEAD_DIM;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const int d = dt * 8 + tid * 2;
        if constexpr (DTYPE == MSGL_F32) {
          *reinterpret_cast<float2*>(out + d) = make_float2(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
        } else {
          *reinterpret_cast<unsigned*>(out + d) = pack2<DTYPE>(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
        }
      }
    } else {
      const long long prow = row * p.max_splits + split;
      float* po = p.o_partial + prow * HEAD_DIM;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const int d = dt * 8 + tid * 2;
        *reinterpret_cast<float2*>(po + d) = make_float2(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
      }
      if (tid == 0) p.lse_partial[prow] = total > 0.f ? m[h] + fast_log2(total) : neg_inf();
    }
  }
}

template <int DTYPE, int HEAD_DIM, int MMA>
__device__ __forceinline__ void attention_impl(const msgl_attention_params& p) {
  if (p.phase == 0) {
    attention_tile<DTYPE, HEAD_DIM, MMA>(p);
  } else {
    attention_combine<DTYPE, HEAD_DIM>(p);
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * block = 32 * num_warps, phase 0: grid = num_q_tiles * num_kv_heads * max_splits and
 * attention_smem_bytes(...) of dynamic shared memory; phase 1: block = 128,
 * grid = ceil(num_tokens * num_q_heads / 4), no shared memory. MMA = 1 needs a 16-bit DTYPE. */
extern "C" __global__ void __launch_bounds__(128) msgl_attention_kernel(const msgl_attention_params p) {
  msgl::attention_impl<MSGL_DTYPE, MSGL_HEAD_DIM, MSGL_MMA>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/attention_host.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE, HEAD_DIM, MMA) for each AOT instance */

namespace msgl {
constexpr int kAttnMaxWarps = 4;

template <int DTYPE, int HEAD_DIM, int MMA>
__global__ void __launch_bounds__(128) attention_kernel(const msgl_attention_params p) {
  attention_impl<DTYPE, HEAD_DIM, MMA>(p);
}

template <int DTYPE, int HEAD_DIM, int MMA>
static int32_t launch_attention(const msgl_attention_params& p, cudaStream_t s) {
  using Tile = AttnTile<DTYPE, HEAD_DIM>;
  const long long smem = attention_smem_bytes(Tile::kElemBytes, HEAD_DIM, Tile::BN, p.num_warps);
  cudaError_t err = cudaFuncSetAttribute(attention_kernel<DTYPE, HEAD_DIM, MMA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess)
    return set_error(MSGL_ERR_CUDA, "paged_attention: %lld bytes of shared memory: %s", smem, cudaGetErrorString(err));
  const long long blocks = static_cast<long long>(p.num_q_tiles) * p.num_kv_heads * p.max_splits;
  if (blocks > 0) attention_kernel<DTYPE, HEAD_DIM, MMA><<<static_cast<unsigned>(blocks), 32 * p.num_warps, smem, s>>>(p);
  if (p.max_splits > 1) {
    msgl_attention_params p1 = p;
    p1.phase = 1;
    const long long rows = p.num_tokens * p.num_q_heads;
    attention_kernel<DTYPE, HEAD_DIM, MMA><<<static_cast<unsigned>((rows + 3) / 4), 128, 0, s>>>(p1);
  }
  return check_launch("paged_attention");
}
}  // namespace msgl

extern "C" int32_t msgl_paged_attention(const msgl_tensor* out, const msgl_tensor* q, const msgl_tensor* k_cache,
                                        const msgl_tensor* v_cache, const msgl_tensor* q_indptr,
                                        const msgl_tensor* kv_lens, const msgl_tensor* block_table,
                                        const msgl_tensor* o_partial, const msgl_tensor* lse_partial,
                                        const msgl_attention_params* plan, int32_t mma, msgl_stream stream) {
  using namespace msgl;
  const char* op = "paged_attention";
  if (plan == nullptr) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `plan` is null", op);
  if (mma != 0 && q != nullptr && q->dtype == MSGL_F32)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the tensor-core path (MMA=1) needs bf16 or f16", op);
  if (plan->num_warps < 1 || plan->num_warps > kAttnMaxWarps || plan->kv_chunk < 1 || plan->max_splits < 1 ||
      plan->num_q_tiles < 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: bad plan (num_warps %d, kv_chunk %d, max_splits %d, num_q_tiles %d)",
                     op, plan->num_warps, plan->kv_chunk, plan->max_splits, plan->num_q_tiles);
  msgl_attention_params p;
  MSGL_TRY(attention_check_and_fill(op, out, q, k_cache, v_cache, q_indptr, kv_lens, block_table, o_partial, lse_partial,
                                    plan, &p));
  if (p.fused_rope != 0) /* the decode kernel's prologue: this kernel would leave q unrotated and the rows unstored */
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the fused prologue (fused_rope) is the decode kernel's", op);
  if (static_cast<long long>(p.num_q_tiles) * p.num_kv_heads * p.max_splits > 0x7fffffffLL)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the grid exceeds 2^31 blocks", op);
  const int64_t head_dim = q->shape[2];
  if (p.num_tokens == 0 || p.num_seqs == 0) return MSGL_OK;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#define MSGL_CASE(D, HD, MMA) \
  if (q->dtype == D && head_dim == HD && mma == MMA) return launch_attention<D, HD, MMA>(p, s);
  MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
  return set_error(MSGL_ERR_NO_INSTANCE, "%s: no AOT instance DTYPE=%d,HEAD_DIM=%lld,MMA=%d", op, q->dtype,
                   static_cast<long long>(head_dim), mma);
}
#endif
