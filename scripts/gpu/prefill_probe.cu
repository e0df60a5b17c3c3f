/*
 * prefill_probe.cu: one prefill attention tile (csrc/kernels/prefill_attention.cu),
 * timed alone on the GPU and checked against a naive kernel, with a per-block
 * timeline of the warp-specialised loop. A development tool for the GPU machine:
 * a tile variant is a compile here (scripts/gpu/build_prefill_probe.sh, seconds),
 * not a bundle, and one device call can time a dozen of them.
 *
 *   prefill_probe_T28 [hq hkv b L page]...   (default: the three bench cases)
 *
 * Per case it prints a SUMMARY line (median of 20 launches after 5 warm-ups, CUDA
 * events, TFLOP/s with the bench's causal count), the largest error against the
 * naive kernel, and, for the warp-specialised tiles, the timeline of the blocks'
 * first consumer warp (MSGL_PREFILL_PROBE points, clock64 cycles): start to Q in,
 * Q to K_0, the loop per K/V tile, the epilogue, and the gap between one block's
 * end and the next block's start on the same SM (globaltimer).
 *
 * Setup as benches/attention.rs: bf16, head dim 128, random q/k/v in [-1, 1), the
 * pages of each sequence a random permutation of the cache's, a TMA tile's maps as
 * gpu/prefill.rs builds them (3-D [slots][heads][128], boxes 64 x 1 x rows, 128-byte
 * swizzle), cuTensorMapEncodeTiled taken from the runtime (no -lcuda).
 */
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

/* The probe: lane 0 of the first consumer warp stamps points 0..4, the producer's
 * thread 0 points 8..11 (a persistent block: of its last item); point 0 also keeps
 * the SM and the global time (slots 5, 6), point 4 the global time (slot 7). */
constexpr int kProbeSlots = 16;
__device__ unsigned long long g_probe[1 << 20];
#if !defined(MSGL_NO_PROBE) /* -DMSGL_NO_PROBE: the kernel as it ships, to time the probe's cost */
#define MSGL_PREFILL_PROBE(point)                                                             \
  do {                                                                                        \
    if (threadIdx.x == ((point) >= 8 ? 0 : 128) && blockIdx.x < (1 << 20) / kProbeSlots) {    \
      unsigned long long* rec = g_probe + blockIdx.x * kProbeSlots;                           \
      rec[point] = clock64(); /* a store only: a load here would stall the stamping thread */ \
      if ((point) == 0 || (point) == 4) {                                                     \
        unsigned long long gt, sm;                                                            \
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));                                \
        asm volatile("{ .reg .u32 r; mov.u32 r, %%smid; cvt.u64.u32 %0, r; }" : "=l"(sm));     \
        if ((point) == 0) rec[5] = gt, rec[6] = sm;                                           \
        if ((point) == 4) rec[7] = gt;                                                        \
      }                                                                                       \
    }                                                                                         \
  } while (0)
#endif

#if defined(MSGL_PROBE_KERNEL) /* another copy of the kernel (build_prefill_probe.sh's PREFILL_SRC) */
#include MSGL_PROBE_KERNEL
#else
#include "../../csrc/kernels/prefill_attention.cu"
#endif

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

constexpr int D = 128;
using Bf = __nv_bfloat16;

/* The reference: one warp a (token, q head), fp32, the same causal rule (the row's
 * position is prefix + its index in the run). */
__global__ void naive_attention(float* out, const Bf* q, const Bf* kc, const Bf* vc, const int* indptr,
                                const int* kv_lens, const int* table, int max_pages, int page, int hq, int hkv,
                                int seqs, float scale) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  const int total = indptr[seqs] * hq;
  if (warp >= total) return;
  const int tok = warp / hq, h = warp % hq, kvh = h / (hq / hkv);
  int s = 0;
  while (indptr[s + 1] <= tok) ++s;
  const int pos = kv_lens[s] - (indptr[s + 1] - indptr[s]) + (tok - indptr[s]);
  float qv[4], acc[4] = {0, 0, 0, 0}, m = -INFINITY, l = 0;
  for (int i = 0; i < 4; ++i) qv[i] = __bfloat162float(q[(long long)(tok * hq + h) * D + lane * 4 + i]);
  for (int k = 0; k <= pos; ++k) {
    const long long slot = (long long)table[s * max_pages + k / page] * page + k % page;
    const Bf* kr = kc + (slot * hkv + kvh) * D + lane * 4;
    float dot = 0;
    for (int i = 0; i < 4; ++i) dot += qv[i] * __bfloat162float(kr[i]);
    for (int o = 16; o; o /= 2) dot += __shfl_xor_sync(~0u, dot, o);
    const float x = dot * scale, mn = fmaxf(m, x), a = expf(m - mn), pr = expf(x - mn);
    const Bf* vr = vc + (slot * hkv + kvh) * D + lane * 4;
    for (int i = 0; i < 4; ++i) acc[i] = acc[i] * a + pr * __bfloat162float(vr[i]);
    l = l * a + pr;
    m = mn;
  }
  for (int i = 0; i < 4; ++i) out[(long long)(tok * hq + h) * D + lane * 4 + i] = acc[i] / l;
}

__global__ void fill_random(Bf* x, long long n, unsigned seed) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
    x[i] = __float2bfloat16((h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

typedef CUresult (*EncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static msgl_tensor_map kv_map(EncodeTiled encode, void* cache, long long slots, int hkv, int rows) {
  CUtensorMap m;
  const cuuint64_t dims[3] = {D, (cuuint64_t)hkv, (cuuint64_t)slots};
  const cuuint64_t strides[2] = {D * 2, (cuuint64_t)hkv * D * 2};
  const cuuint32_t box[3] = {64, 1, (cuuint32_t)rows}, elem[3] = {1, 1, 1};
  CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, cache, dims, strides, box, elem,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
    exit(1);
  }
  msgl_tensor_map out;
  static_assert(sizeof(out) == sizeof(m), "a tensor map is 128 bytes");
  memcpy(&out, &m, sizeof(m));
  return out;
}

/* A template, so that the branches for the other kind of tile are discarded. */
template <int TILE> static void run_case(int hq, int hkv, int b, int L, int page, EncodeTiled encode, int sms) {
  using namespace msgl;
  const int group = hq / hkv, tokens = b * L;
  int bm = 0, warps = 0;
  if constexpr (prefill_is_wgmma(TILE)) bm = prefill_wg_rows<TILE, D>(), warps = bm / 16;
  else bm = prefill_rows<TILE, D>(), warps = prefill_threads<TILE, D>() / 32;
  const int pages_per_seq = (L + page - 1) / page, num_pages = b * pages_per_seq + 1;
  std::vector<int> order(num_pages), table(b * pages_per_seq), indptr(b + 1), kv(b, L);
  for (int i = 0; i < num_pages; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (int i = 0; i < b * pages_per_seq; ++i) table[i] = order[i];
  for (int s = 0; s <= b; ++s) indptr[s] = s * L;
  const long long slots = (long long)num_pages * page;
  Bf *q, *kc, *vc, *out;
  float* ref;
  int *d_indptr, *d_kv, *d_table;
  CK(cudaMalloc(&q, (size_t)tokens * hq * D * 2));
  CK(cudaMalloc(&out, (size_t)tokens * hq * D * 2));
  CK(cudaMalloc(&ref, (size_t)tokens * hq * D * 4));
  CK(cudaMalloc(&kc, (size_t)slots * hkv * D * 2));
  CK(cudaMalloc(&vc, (size_t)slots * hkv * D * 2));
  CK(cudaMalloc(&d_indptr, (b + 1) * 4));
  CK(cudaMalloc(&d_kv, b * 4));
  CK(cudaMalloc(&d_table, table.size() * 4));
  int* d_counter; /* the dynamic tiles' item counter (two zeros, left zero by each launch) */
  CK(cudaMalloc(&d_counter, 8));
  CK(cudaMemset(d_counter, 0, 8));
  CK(cudaMemcpy(d_indptr, indptr.data(), (b + 1) * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_kv, kv.data(), b * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  fill_random<<<1024, 256>>>(q, (long long)tokens * hq * D, 3);
  fill_random<<<1024, 256>>>(kc, slots * hkv * D, 1);
  fill_random<<<1024, 256>>>(vc, slots * hkv * D, 2);

  msgl_prefill_params pp{};
  msgl_attention_params& p = pp.a;
  p.out = out;
  p.q = q;
  p.k_cache = kc;
  p.v_cache = vc;
  p.q_indptr = d_indptr;
  p.kv_lens = d_kv;
  p.block_table = d_table;
  p.split_counters = d_counter;
  p.q_token_stride = (long long)hq * D;
  p.q_head_stride = D;
  p.num_tokens = tokens;
  p.num_pages = num_pages;
  p.num_seqs = b;
  p.num_q_heads = hq;
  p.num_kv_heads = hkv;
  p.page_size = page;
  p.max_pages = pages_per_seq;
  p.num_warps = warps;
  p.num_q_tiles = b * ((L * group + bm - 1) / bm);
  p.kv_chunk = 0x7fffffff;
  p.max_splits = 1;
  const float scale = 1.0f / sqrtf((float)D);
  p.scale_log2 = scale * 1.4426950408889634f;
  if constexpr (prefill_is_wgmma(TILE)) {
    if (PrefillWgTile<TILE, D>::TMA && page >= 8 && (page & (page - 1)) == 0) {
      const int rows = std::min(page, PrefillWgTile<TILE, D>::BN);
      pp.k_map = kv_map(encode, kc, slots, hkv, rows);
      pp.v_map = kv_map(encode, vc, slots, hkv, rows);
      pp.kv_tma_rows = rows;
      if (bm % group == 0) { /* Q by TMA too, as gpu/prefill.rs builds it */
        CUtensorMap m;
        const cuuint64_t dims[3] = {D, (cuuint64_t)hq, (cuuint64_t)tokens};
        const cuuint64_t strides[2] = {D * 2, (cuuint64_t)hq * D * 2};
        const cuuint32_t box[3] = {64, (cuuint32_t)group, (cuuint32_t)(bm / group)}, elem[3] = {1, 1, 1};
        if (encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, q, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS) {
          memcpy(&pp.q_map, &m, sizeof(m));
          pp.q_tma = getenv("PROBE_Q_CPASYNC") ? 0 : 1;
        }
      }
    }
  }
  /* The batch's ranking, as gpu/prefill.rs's item_ranks builds it (equal prompts:
   * batch order), unless PROBE_SEARCH is set (the kernel searches). */
  if (!getenv("PROBE_SEARCH") && b <= MSGL_PREFILL_RANKS) {
    const int tiles = (L * group + bm - 1) / bm;
    pp.ranks.count = b;
    for (int r = 0; r < b; ++r) {
      pp.ranks.before[r] = r + 1 < b ? b * tiles : 0;
      pp.ranks.tiles[r] = tiles;
      pp.ranks.seq[r] = r;
      pp.ranks.q_start[r] = r * L;
      pp.ranks.q_len[r] = L;
      pp.ranks.kv_len[r] = L;
    }
  }
  const int threads = prefill_block_threads<TILE, D>();
  const int smem = (int)prefill_block_smem_bytes<TILE, D>();
  long long blocks = (long long)p.num_q_tiles * hkv;
  if constexpr (prefill_is_wgmma(TILE)) {
    if (PrefillWgTile<TILE, D>::PERSISTENT) blocks = std::min<long long>(blocks, (long long)sms * prefill_block_min_blocks<TILE, D>());
  }
  CK(cudaFuncSetAttribute(msgl_prefill_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  auto launch = [&]() { msgl_prefill_attention_kernel<<<(unsigned)blocks, threads, smem>>>(pp); };

  /* Correctness first (the probe zeroed before it: its stamps are first-write). */
  void* probe_addr;
  CK(cudaGetSymbolAddress(&probe_addr, g_probe));
  CK(cudaMemset(probe_addr, 0, sizeof(unsigned long long) << 20));
  launch();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<unsigned long long> rec((size_t)blocks * kProbeSlots);
  CK(cudaMemcpy(rec.data(), probe_addr, rec.size() * 8, cudaMemcpyDeviceToHost));
  naive_attention<<<(tokens * hq * 32 + 255) / 256, 256>>>(ref, q, kc, vc, d_indptr, d_kv, d_table, pages_per_seq,
                                                              page, hq, hkv, b, scale);
  CK(cudaDeviceSynchronize());
  std::vector<Bf> got((size_t)tokens * hq * D);
  std::vector<float> want(got.size());
  CK(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(want.data(), ref, want.size() * 4, cudaMemcpyDeviceToHost));
  double max_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = fabs((double)__bfloat162float(got[i]) - want[i]);
    if (!(e <= max_err)) max_err = e; /* NaN sticks */
  }

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int i = 0; i < 5; ++i) launch();
  std::vector<float> times;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(ms * 1000.f);
  }
  std::sort(times.begin(), times.end());
  const double us = times[times.size() / 2];
  const double flops = 4.0 * hq * D * b * ((double)L * (L + 1) / 2);
  printf("SUMMARY probe tile=%d %s %d/%d b=%d L=%d page=%d %10.2f us %8.1f TFLOP/s max_err %.4f %s\n", TILE,
         MSGL_PROBE_NAME, hq, hkv, b, L, page, us, flops / us / 1e6, max_err, max_err < 0.02 ? "ok" : "WRONG");

  /* The timeline of the first launch (warp-specialised tiles only stamp). */
  if (rec[0] != 0) {
    double start_q = 0, q_k0 = 0, loop = 0, epi = 0, steps = 0, find = 0, q_issue = 0, k0_issue = 0, pstart = 0;
    long long n = 0;
    std::vector<std::pair<unsigned long long, unsigned long long>> per_sm_start_end;
    std::vector<std::vector<std::pair<unsigned long long, unsigned long long>>> sm_spans(256);
    for (long long i = 0; i < blocks; ++i) {
      const unsigned long long* r = &rec[i * kProbeSlots];
      if (r[0] == 0 || r[1] == 0 || r[2] == 0 || r[3] == 0 || r[4] == 0) continue;
      ++n;
      start_q += r[1] - r[0];
      q_k0 += r[2] - r[1];
      loop += r[3] - r[2];
      epi += r[4] - r[3];
      find += (double)(long long)(r[8] - r[0]);
      pstart += (double)(long long)(r[11] - r[0]);
      q_issue += (double)(long long)(r[9] - r[0]);
      k0_issue += (double)(long long)(r[10] - r[0]);
      if (r[6] < 256) sm_spans[r[6]].push_back({r[5], r[7]});
    }
    /* K/V tiles a block walks: its q tile's causal extent (BN keys a tile). */
    double gaps = 0, busy = 0, span_lo = 1e30, span_hi = 0;
    long long ngaps = 0;
    for (auto& v : sm_spans) {
      std::sort(v.begin(), v.end());
      for (size_t i = 0; i < v.size(); ++i) {
        busy += v[i].second - v[i].first;
        span_lo = std::min(span_lo, (double)v[i].first);
        span_hi = std::max(span_hi, (double)v[i].second);
        if (i > 0) { gaps += (double)v[i].first - v[i - 1].second; ++ngaps; }
      }
    }
    (void)steps;
    if (n > 0)
      printf("TIMELINE producer, cycles from the consumers' start: its start %.0f, item found %.0f, Q issued %.0f, "
             "K_0 issued %.0f\n", pstart / n, find / n, q_issue / n, k0_issue / n);
    if (n > 0)
      printf("TIMELINE tile=%d %s %d/%d b=%d L=%d: blocks %lld, cycles a block: start->Q %.0f, Q->K0 %.0f, loop %.0f, "
             "epilogue %.0f; SM gap between blocks %.0f ns (mean of %lld); SM busy %.1f%% of the first-to-last span\n",
             TILE, MSGL_PROBE_NAME, hq, hkv, b, L, n, start_q / n, q_k0 / n, loop / n, epi / n,
             ngaps ? gaps / ngaps : 0.0, ngaps, 100.0 * busy / (sms * (span_hi - span_lo)));
    /* Loop cycles per K/V tile, by the block's tile count (a few sizes). */
    if constexpr (prefill_is_wgmma(TILE)) {
      constexpr int BN = PrefillWgTile<TILE, D>::BN;
      std::vector<double> sum(L / BN + 2, 0);
      std::vector<int> cnt(L / BN + 2, 0);
      for (long long i = 0; i < blocks; ++i) {
        const unsigned long long* r = &rec[i * kProbeSlots];
        if (r[2] == 0 || r[3] == 0) continue;
        /* the item of block i: depth-major order (prefill_find_tile), b sequences */
        const long long item = i / hkv;
        const int tiles_per_seq = (L * group + bm - 1) / bm;
        const int depth = (int)(item / b);
        const int tile_in_seq = tiles_per_seq - 1 - depth;
        const int last_pos = (tile_in_seq * bm + bm - 1) / group;
        const int kv_tiles = last_pos / BN + 1;
        if (kv_tiles < (int)sum.size()) { sum[kv_tiles] += r[3] - r[2]; cnt[kv_tiles]++; }
      }
      printf("TIMELINE per-tile loop cycles (kv tiles: cycles/tile):");
      for (size_t k = 1; k < sum.size(); k += std::max<size_t>(1, sum.size() / 8))
        if (cnt[k]) printf(" %zu:%.0f", k, sum[k] / cnt[k] / k);
      printf("\n");
    }
  }
  cudaFree(q); cudaFree(out); cudaFree(ref); cudaFree(kc); cudaFree(vc);
  cudaFree(d_indptr); cudaFree(d_kv); cudaFree(d_table); cudaFree(d_counter);
  cudaEventDestroy(e0); cudaEventDestroy(e1);
}

int main(int argc, char** argv) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  if (fn == nullptr) { fprintf(stderr, "no cuTensorMapEncodeTiled\n"); return 1; }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (argc > 1) {
    for (int i = 1; i + 4 < argc; i += 5)
      run_case<MSGL_TILE>(atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]), atoi(argv[i + 3]), atoi(argv[i + 4]),
               (EncodeTiled)fn, sms);
  } else {
    run_case<MSGL_TILE>(32, 8, 1, 4096, 16, (EncodeTiled)fn, sms);
    run_case<MSGL_TILE>(32, 8, 8, 1024, 16, (EncodeTiled)fn, sms);
    run_case<MSGL_TILE>(16, 8, 1, 4096, 16, (EncodeTiled)fn, sms);
  }
  return 0;
}
