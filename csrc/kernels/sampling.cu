/*
 * sampling.cu: one next token per row of logits, on the GPU, so that a decode
 * step returns token ids instead of a [batch, vocab] copy of the logits.
 *
 * Per row (params: temperature, top_k, top_p, min_p, u):
 *   - temperature <= 0 or top_k == 1: the argmax (first index on ties);
 *   - else, with p = softmax(logits / temperature), a token is kept when
 *       top-k: at least top_k tokens are >= it (ties at the boundary stay),
 *       top-p: the tokens >= it carry at least top_p of the mass (the smallest
 *              head of the ranking whose mass reaches top_p, ties kept),
 *       min-p: p >= min_p * max(p);
 *     the filters are independent and see the same p (SGLang's
 *     top_k_top_p_min_p sampling), so the most likely token always survives;
 *     then the token is drawn by inverse CDF in index order with the uniform
 *     number u in [0, 1) (the engine derives u from the request's seed and output
 *     index, so sampling is reproducible): the first index whose inclusive prefix
 *     of kept weights exp((v - m) / T) passes u * (kept mass), m the row's max.
 *
 * Decomposition: one block of 1024 threads per row. The row is cut into items,
 * in index order: item 0 is the head before the row's first 16-byte boundary,
 * items 1..n the 16-byte vectors, item n + 1 the tail (head and tail hold fewer
 * elements than a vector, maybe none), so every row is read with 16-byte loads
 * whatever its length, offset or stride. Warp w owns the w-th of 32 contiguous
 * runs of items; its lanes read the run coalesced, kSampleUnroll vectors in
 * flight each.
 *   1. One pass over the row: each lane keeps its first maximum and, when the row
 *      samples without filters, an online sum of exp(v / T) relative to a
 *      reference that follows its maximum up (lazily: rarely rescaled). The
 *      warps' results give the row's max m, its argmax (greedy rows stop here)
 *      and each run's mass relative to m.
 *   2. Filtered rows: the top-k and top-p thresholds by bisection over the
 *      order-preserving integer image of the (raw) logits, 32 passes each (a
 *      count for top-k, an exp-sum for top-p); min-p in the scaled log domain;
 *      then one more pass for each run's kept mass.
 *   3. The draw: a prefix over the runs' masses (index order, since runs are
 *      contiguous) finds the run that holds u * total; the block re-reads only
 *      that run (it is in L2) and scans it in index order, 1024 items a tile.
 * So the common case (tempered, no filter) reads its row once, plus 1/32 of it.
 * No sort, no scratch memory. kernel-runtime's CPU reference (cpu::sampling) runs
 * the same algorithm with sums in f64 and in another order, so a draw within f32
 * rounding of a CDF boundary may pick a neighbour. Where rounding leaves the
 * target past the last kept weight the draw takes the last token of positive
 * weight (the CPU's sums never get there). A row whose max is not finite (only
 * -inf and NaN, or a +inf) has no finite mass: it takes the CPU's rule verbatim,
 * the last kept token, else its argmax, else (all NaN) token 0.
 */
#include "minisgl/dtype.cuh"

namespace msgl {

constexpr int kSampleThreads = 1024;
constexpr int kSampleWarps = kSampleThreads / kWarpSize;
static_assert(kSampleWarps == kWarpSize, "the draw's prefix over the runs is one warp, a lane a run");
/* Vectors a lane has in flight in a pass over its run: on an H200, 2 measured as
 * fast as 4 from one row to 256 (8 was slower: it spills), with registers to
 * spare. */
constexpr int kSampleUnroll = 2;
constexpr int kSampleNone = 0x7fffffff;
constexpr float kSampleLog2e = 1.4426950408889634f;
/* Pass 1 moves a lane's sum reference up once a value would weigh more than 2^this. */
constexpr float kSampleRebase = 64.f;

/* Orders floats as unsigned integers: a < b  <=>  key(a) < key(b) (NaN aside). */
__device__ __forceinline__ unsigned int sample_key(float v) {
  const unsigned int b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* What stands for the absent elements of the head and tail items: a NaN (never
 * kept, never the max, no weight) whose key, 0, is below every bisection
 * candidate. */
__device__ __forceinline__ float sample_pad() { return __uint_as_float(0xffffffffu); }

__device__ __forceinline__ float sample_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ int sample_min(int a, int b) { return a < b ? a : b; }

/* The items of one row (see the header): item i covers the elements
 * [head + (i - 1) * E, head + i * E) that lie in [0, vocab); items 1..vectors are
 * whole aligned vectors, item 0 is the head and item vectors + 1 the tail. Indices
 * fit an int: the launcher takes at most 2^31 - 2 columns. */
template <int DTYPE> struct SampleItems {
  using T = typename DType<DTYPE>::Storage;
  static constexpr int E = Vec16<DTYPE>::kElems;
  const T* x;
  int vocab;
  int head;     /* elements before the first 16-byte boundary, < E */
  int vectors;  /* whole vectors after the head */
  int per_warp; /* items of a warp's run (the last runs may be shorter or empty) */

  __device__ SampleItems(const T* row, int n) : x(row), vocab(n) {
    const int misalign = static_cast<int>(reinterpret_cast<unsigned long long>(row) / sizeof(T) % E);
    head = sample_min((E - misalign) % E, n);
    vectors = (n - head) / E;
    per_warp = (vectors + 2 + kSampleWarps - 1) / kSampleWarps;
  }
  __device__ int items() const { return vectors + 2; }
  /* The index of item i's element 0 (negative for the head's absent ones). */
  __device__ int first(int i) const { return head + (i - 1) * E; }
  __device__ int run_begin(int w) const { return sample_min(w * per_warp, items()); }
  __device__ int run_end(int w) const { return sample_min((w + 1) * per_warp, items()); }
  /* A whole item's 16 bytes. */
  __device__ uint4 raw(int i) const { return *reinterpret_cast<const uint4*>(x + first(i)); }
  /* Any item as floats, absent elements as sample_pad(). */
  __device__ Vec16<DTYPE> load(int i) const {
    Vec16<DTYPE> v;
    if (i >= 1 && i <= vectors) {
      v.from_raw(raw(i));
    } else {
      const int g = first(i);
#pragma unroll
      for (int e = 0; e < E; ++e) v.v[e] = g + e >= 0 && g + e < vocab ? DType<DTYPE>::to_f32(x[g + e]) : sample_pad();
    }
    return v;
  }
};

/* Calls g(v, n, item) for the items of warp w's run that this lane holds
 * (begin + lane, + 32, ...), in index order, in groups: v[0..n) are the items
 * item, item + 32, ..., loaded together (n = N, each lane with N vectors in
 * flight, or 1 for the head, the tail and the last few). */
template <int DTYPE, int N, class G>
__device__ __forceinline__ void for_each_group(const SampleItems<DTYPE>& r, int w, int lane, G&& g) {
  const int begin = r.run_begin(w);
  const int end = r.run_end(w);
  int i = begin + lane;
  Vec16<DTYPE> v[N];
  if (i == 0) { /* the head: warp 0's lane 0, whose run is never empty */
    v[0] = r.load(0);
    g(v, 1, 0);
    i += kWarpSize;
  }
  const int whole_end = sample_min(end, r.vectors + 1);
  for (; i + (N - 1) * kWarpSize < whole_end; i += N * kWarpSize) {
    uint4 raw[N];
#pragma unroll
    for (int u = 0; u < N; ++u) raw[u] = r.raw(i + u * kWarpSize);
#pragma unroll
    for (int u = 0; u < N; ++u) v[u].from_raw(raw[u]);
    g(v, N, i);
  }
  for (; i < whole_end; i += kWarpSize) {
    v[0].from_raw(r.raw(i));
    g(v, 1, i);
  }
  const int tail = r.vectors + 1;
  if (tail >= begin && tail < end && (tail - begin) % kWarpSize == lane) {
    v[0] = r.load(tail);
    g(v, 1, tail);
  }
}

/* Calls f(values, item) for each item of warp w's run that this lane holds, in
 * index order. */
template <int DTYPE, class F>
__device__ __forceinline__ void for_each_item(const SampleItems<DTYPE>& r, int w, int lane, F&& f) {
  for_each_group<DTYPE, kSampleUnroll>(r, w, lane, [&](const Vec16<DTYPE>* v, int n, int item) {
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u)
      if (u < n) f(v[u], item + u * kWarpSize);
  });
}

/* Whether (v, i) beats (best, best_i): larger value, or equal value and lower index. */
__device__ __forceinline__ bool sample_better(float v, int i, float best, int best_i) {
  return v > best || (v == best && i < best_i);
}

/* The first maximum over the warp (every lane), kSampleNone for no index. */
__device__ __forceinline__ void warp_argmax(float& best, int& best_i) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int i = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (sample_better(v, i, best, best_i)) best = v, best_i = i;
  }
}

/* A lane's state in pass 1: its maximum and the group of items where it first
 * appeared (item, item + 32, ..., `items` of them; none while every value seen
 * was -inf or NaN) and, when summing, the sum of 2^(v * k - c) over its values,
 * the reference c (kSampleFloor at first) moved up only when a value would weigh
 * more than 2^kSampleRebase: after the first group that is rare, where rescaling
 * on every new maximum would not be. A NaN value makes the sum NaN (see
 * run_pass). */
struct SampleLane {
  float best;
  int item;
  int items;
  float sum;
  float c;
};

/* Below every v * k of a row: no value weighs 2^(v * k - kSampleFloor) without
 * moving c up first, and -inf weighs 0, not NaN. */
constexpr float kSampleFloor = -1e30f;

template <int DTYPE, bool SUM>
__device__ __forceinline__ void lane_add(SampleLane& s, const Vec16<DTYPE>* v, int n, int item, float k) {
  constexpr int E = Vec16<DTYPE>::kElems;
  float gm = v[0].v[0];
#pragma unroll
  for (int u = 0; u < kSampleUnroll; ++u)
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (u < n) gm = fmaxf(gm, v[u].v[e]); /* NaN only when all are */
  if (gm > s.best) s.best = gm, s.item = item, s.items = n;
  if (SUM) {
    if (fmaf(gm, k, -s.c) > kSampleRebase) {
      const float c = gm * k;
      s.sum *= sample_exp2(s.c - c);
      s.c = c;
    }
#pragma unroll
    for (int u = 0; u < kSampleUnroll; ++u)
#pragma unroll
      for (int e = 0; e < E; ++e)
        if (u < n) s.sum += sample_exp2(fmaf(v[u].v[e], k, -s.c));
  }
}

/* Pass 1's result for a warp's run (every lane): its first maximum (kSampleNone
 * when it holds no value above -inf) and, when summing, sum * 2^c = the sum of
 * 2^(v * k) over its values. */
struct SampleRun {
  float best;
  int best_i;
  float sum;
  float c;
};

template <int DTYPE, bool SUM>
__device__ SampleRun run_pass(const SampleItems<DTYPE>& r, int w, int lane, float k) {
  SampleLane s{-__int_as_float(0x7f800000), -1, 0, 0.f, kSampleFloor};
  for_each_group<DTYPE, kSampleUnroll>(
      r, w, lane, [&](const Vec16<DTYPE>* v, int n, int item) { lane_add<DTYPE, SUM>(s, v, n, item, k); });
  if (SUM && !(s.sum <= 3.402823466e38f)) {
    /* A NaN (or +inf) logit: sum the lane's values again, skipping NaN weights. */
    s.sum = 0.f;
    for_each_item(r, w, lane, [&](const Vec16<DTYPE>& v, int) {
#pragma unroll
      for (int e = 0; e < Vec16<DTYPE>::kElems; ++e) s.sum += fmaxf(sample_exp2(fmaf(v.v[e], k, -s.c)), 0.f);
    });
  }
  /* The lane's first maximum inside its group (read again: cheaper than tracking
   * the element on every new maximum). */
  int best_i = kSampleNone;
  for (int u = s.items - 1; u >= 0; --u) {
    const int item = s.item + u * kWarpSize;
    const Vec16<DTYPE> v = r.load(item);
#pragma unroll
    for (int e = Vec16<DTYPE>::kElems - 1; e >= 0; --e)
      if (v.v[e] == s.best) best_i = r.first(item) + e;
  }
  SampleRun out{s.best, best_i, 0.f, s.c};
  warp_argmax(out.best, out.best_i);
  if (SUM) {
#pragma unroll
    for (int o = kWarpSize / 2; o >= 1; o /= 2) out.c = fmaxf(out.c, __shfl_xor_sync(0xffffffffu, out.c, o));
    out.sum = s.sum * sample_exp2(s.c - out.c);
#pragma unroll
    for (int o = kWarpSize / 2; o >= 1; o /= 2) out.sum += __shfl_xor_sync(0xffffffffu, out.sum, o);
  }
  return out;
}

/* Sum over the block; every thread gets the total. */
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  float total = 0.f;
#pragma unroll 8
  for (int w = 0; w < kSampleWarps; ++w) total += scratch[w];
  return total;
}

/* Integer sum over the block; every thread gets the total. */
__device__ __forceinline__ long long block_count(long long v, long long* scratch) {
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = v;
  __syncthreads();
  long long total = 0;
#pragma unroll 8
  for (int w = 0; w < kSampleWarps; ++w) total += scratch[w];
  return total;
}

/* The block's shared memory. */
struct SampleShared {
  float best[kSampleWarps];
  int index[kSampleWarps];
  float mass[kSampleWarps];
  float ref[kSampleWarps];
  float part[kSampleWarps];
  long long count[kSampleWarps];
  int pick;
};

/* Block-wide min (or max) of one int a thread; every thread gets it. */
__device__ __forceinline__ int block_pick(int v, bool max, SampleShared& sh) {
  __syncthreads(); /* earlier readers of sh.pick are done */
  if (threadIdx.x == 0) sh.pick = max ? -1 : kSampleNone;
  __syncthreads();
  if (max && v >= 0) atomicMax(&sh.pick, v);
  if (!max && v != kSampleNone) atomicMin(&sh.pick, v);
  __syncthreads();
  return sh.pick;
}

/* What the filters keep, and what a kept token weighs: 2^(v * k - mk), mk = m * k
 * the row max's (the same in pass 1, the filters and the draw). */
struct SampleKeep {
  unsigned int t_key;
  float min_scaled; /* log(min_p), or -inf */
  float m;
  float inv_t;
  float k; /* log2(e) / T */
  float mk;
  __device__ bool kept(float v) const { return sample_key(v) >= t_key && (v - m) * inv_t >= min_scaled; }
  __device__ float weight(float v) const { return kept(v) ? sample_exp2(fmaf(v, k, -mk)) : 0.f; }
};

/* top-k: the largest key t with count(key >= t) >= top_k. */
template <int DTYPE>
__device__ unsigned int top_k_key(const SampleItems<DTYPE>& r, long long top_k, int w, int lane, SampleShared& sh) {
  unsigned int t = 0;
#pragma unroll 1
  for (int bit = 31; bit >= 0; --bit) {
    const unsigned int cand = t | (1u << bit);
    int c = 0;
    for_each_item(r, w, lane, [&](const Vec16<DTYPE>& v, int) {
#pragma unroll
      for (int e = 0; e < Vec16<DTYPE>::kElems; ++e) c += sample_key(v.v[e]) >= cand;
    });
    if (block_count(c, sh.count) >= top_k) t = cand;
  }
  return t;
}

/* Mass of the logits whose key is >= cand, over the block (a NaN logit makes it
 * NaN, as on the CPU: then top-p keeps everything). */
template <int DTYPE>
__device__ float mass_from_key(const SampleItems<DTYPE>& r, unsigned int cand, const SampleKeep& keep, int w, int lane,
                               SampleShared& sh) {
  float s = 0.f;
  for_each_item(r, w, lane, [&](const Vec16<DTYPE>& v, int) {
#pragma unroll
    for (int e = 0; e < Vec16<DTYPE>::kElems; ++e)
      if (sample_key(v.v[e]) >= cand) s += sample_exp2(fmaf(v.v[e], keep.k, -keep.mk));
  });
  return block_sum(s, sh.part);
}

/* top-p over the full distribution: the largest key t whose head mass reaches
 * top_p of the total (candidate 1 takes every logit but the padding). */
template <int DTYPE>
__device__ unsigned int top_p_key(const SampleItems<DTYPE>& r, float top_p, const SampleKeep& keep, int w, int lane,
                                  SampleShared& sh) {
  const float target = top_p * mass_from_key(r, 1u, keep, w, lane, sh);
  unsigned int t = 0;
#pragma unroll 1
  for (int bit = 31; bit >= 0; --bit) {
    const unsigned int cand = t | (1u << bit);
    if (mass_from_key(r, cand, keep, w, lane, sh) >= target) t = cand;
  }
  return t;
}

/* The kept mass of warp w's run (every lane). */
template <int DTYPE>
__device__ float run_kept_mass(const SampleItems<DTYPE>& r, const SampleKeep& keep, int w, int lane) {
  float s = 0.f;
  for_each_item(r, w, lane, [&](const Vec16<DTYPE>& v, int) {
#pragma unroll
    for (int e = 0; e < Vec16<DTYPE>::kElems; ++e) s += keep.weight(v.v[e]);
  });
#pragma unroll
  for (int o = kWarpSize / 2; o >= 1; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

/* The first index of the row that `pred` takes, over the block (kSampleNone if
 * none), or the last (-1 if none). */
template <int DTYPE, class P>
__device__ int find_index(const SampleItems<DTYPE>& r, bool last, P&& pred, int w, int lane, SampleShared& sh) {
  int found = last ? -1 : kSampleNone;
  for_each_item(r, w, lane, [&](const Vec16<DTYPE>& v, int item) {
#pragma unroll
    for (int e = 0; e < Vec16<DTYPE>::kElems; ++e) {
      const int i = r.first(item) + e;
      if (pred(v.v[e]) && (last ? i > found : i < found)) found = i;
    }
  });
  return block_pick(found, last, sh);
}

/* The run holding the draw, from `mass` (lane l: run l's mass): the first run
 * whose inclusive prefix passes u * total, else (rounding) the last run with
 * mass, else -1; `target` becomes the draw's target measured from the run's start.
 * The same in every warp. */
__device__ __forceinline__ int choose_run(float mass, float u, int lane, float& target) {
  float incl = mass;
#pragma unroll
  for (int o = 1; o < kWarpSize; o *= 2) {
    const float n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  float excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) excl = 0.f;
  const float goal = u * __shfl_sync(0xffffffffu, incl, kWarpSize - 1);
  const unsigned int passes = __ballot_sync(0xffffffffu, mass > 0.f && incl > goal);
  const unsigned int heavy = __ballot_sync(0xffffffffu, mass > 0.f);
  if (heavy == 0) return -1;
  const int run = passes ? __ffs(passes) - 1 : kWarpSize - 1 - __clz(heavy);
  target = __shfl_sync(0xffffffffu, goal - excl, run);
  return run;
}

/* The draw inside items [begin, end), the whole block: the first index at which
 * the running sum of kept weights, in index order, passes target; else the last
 * index of positive weight; else -1. Tiles of one item a thread. */
template <int DTYPE>
__device__ int draw_in_run(const SampleItems<DTYPE>& r, int begin, int end, float target, const SampleKeep& keep,
                           SampleShared& sh) {
  constexpr int E = Vec16<DTYPE>::kElems;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  float running = 0.f; /* the weight of the tiles before, the same in every thread */
  int last = -1;
#pragma unroll 1
  for (int base = begin; base < end; base += kSampleThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    const int first = r.first(i);
    float w[E];
    float local = 0.f;
    if (i < end) {
      const Vec16<DTYPE> v = r.load(i);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        w[e] = keep.weight(v.v[e]);
        local += w[e];
        if (w[e] > 0.f) last = first + e;
      }
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) w[e] = 0.f;
    }
    /* This thread's exclusive prefix inside the tile, and the tile's total. */
    float incl = local;
#pragma unroll
    for (int o = 1; o < kWarpSize; o *= 2) {
      const float n = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += n;
    }
    float excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = 0.f;
    __syncthreads(); /* the previous tile is done with sh.part */
    if (lane == kWarpSize - 1) sh.part[warp] = incl;
    __syncthreads();
    float before = 0.f, tile = 0.f;
#pragma unroll 8
    for (int j = 0; j < kSampleWarps; ++j) {
      const float part = sh.part[j];
      if (j < warp) before += part;
      tile += part;
    }
    if (running + tile > target) {
      /* The draw falls in this tile: the first index whose prefix passes target
       * (the threads' prefixes round differently: the lowest claim wins). */
      float acc = running + before + excl;
      int mine = kSampleNone;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        acc += w[e];
        if (mine == kSampleNone && w[e] > 0.f && acc > target) mine = first + e;
      }
      const int found = block_pick(mine, false, sh);
      if (found != kSampleNone) return found;
    }
    running += tile;
  }
  /* Rounding left the target past the run's last weight: take that token. */
  return block_pick(last, true, sh);
}

template <int DTYPE>
__device__ void sample_impl(const msgl_sample_params& p) {
  using T = typename DType<DTYPE>::Storage;
  __shared__ SampleShared sh;
  const long long row = blockIdx.x;
  const SampleItems<DTYPE> r(static_cast<const T*>(p.logits) + row * p.row_stride, static_cast<int>(p.vocab));
  const float* prm = p.params + row * 5;
  const float temperature = prm[0];
  const long long top_k = static_cast<long long>(prm[1]);
  const float top_p = prm[2];
  const float min_p = prm[3];
  const float u = prm[4];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const bool greedy = !(temperature > 0.f) || top_k == 1;
  const bool by_top_k = top_k > 1 && top_k < p.vocab;
  const bool filtered = by_top_k || top_p < 1.f || min_p > 0.f;
  const float inv_t = greedy ? 0.f : 1.f / temperature;
  const float k = inv_t * kSampleLog2e;

  /* 1. The argmax and the max, and without filters the runs' masses. */
  const bool sums = !greedy && !filtered;
  const SampleRun run = sums ? run_pass<DTYPE, true>(r, warp, lane, k) : run_pass<DTYPE, false>(r, warp, lane, k);
  if (lane == 0) sh.best[warp] = run.best, sh.index[warp] = run.best_i, sh.mass[warp] = run.sum, sh.ref[warp] = run.c;
  __syncthreads();
  float m = sh.best[lane];
  int best_i = sh.index[lane];
  warp_argmax(m, best_i);
  if (best_i == kSampleNone) {
    /* Nothing above -inf: the CPU's first maximum is the first value that is not
     * NaN (a -inf); an all-NaN row gives token 0. */
    best_i = find_index(r, false, [](float v) { return v == v; }, warp, lane, sh);
    if (best_i == kSampleNone) best_i = 0;
  }
  if (greedy) {
    if (threadIdx.x == 0) p.out[row] = best_i;
    return;
  }

  /* 2. The filters' thresholds and the runs' kept masses (lane l: run l's). */
  SampleKeep keep{0u, -__int_as_float(0x7f800000), m, inv_t, k, m * k};
  const bool finite = fabsf(m) <= 3.402823466e38f;
  float mass = 0.f;
  if (filtered) {
    if (by_top_k) keep.t_key = top_k_key(r, top_k, warp, lane, sh);
    if (top_p < 1.f) {
      const unsigned int t_p = top_p_key(r, top_p, keep, warp, lane, sh);
      keep.t_key = keep.t_key > t_p ? keep.t_key : t_p;
    }
    if (min_p > 0.f) keep.min_scaled = __logf(min_p);
    if (finite) {
      const float s = run_kept_mass(r, keep, warp, lane);
      if (lane == 0) sh.mass[warp] = s; /* pass 1's were never read */
      __syncthreads();
      mass = sh.mass[lane];
    }
  } else {
    mass = sh.mass[lane] * sample_exp2(sh.ref[lane] - keep.mk); /* ref <= mk */
  }

  /* 3. The draw; a row without a finite max has no mass: the last kept token. */
  int token = -1;
  if (finite) {
    float target = 0.f;
    const int chosen = choose_run(mass, u, lane, target);
    if (chosen >= 0) token = draw_in_run(r, r.run_begin(chosen), r.run_end(chosen), target, keep, sh);
  } else {
    token = find_index(r, true, [&](float v) { return keep.kept(v); }, warp, lane, sh);
  }
  if (threadIdx.x == 0) p.out[row] = token >= 0 ? token : best_i;
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance, compiled by NVRTC or into an AOT cubin; launched from Rust with
 * grid = rows, block = 1024. */
extern "C" __global__ void __launch_bounds__(1024) msgl_sample_kernel(const msgl_sample_params p) {
  msgl::sample_impl<MSGL_DTYPE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(DTYPE) for each AOT instance */

namespace msgl {
template <int DTYPE>
__global__ void __launch_bounds__(1024) sample_kernel(const msgl_sample_params p) {
  sample_impl<DTYPE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_sample(const msgl_tensor* logits, const msgl_tensor* params, const msgl_tensor* out,
                               msgl_stream stream) {
  using namespace msgl;
  const char* op = "sample";
  const uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(logits, op, "logits", 2, floats));
  MSGL_TRY(expect_tensor(params, op, "params", 2, dtype_bit(MSGL_F32)));
  MSGL_TRY(expect_tensor(out, op, "out", 1, dtype_bit(MSGL_I32)));
  const int64_t rows = logits->shape[0];
  MSGL_TRY(expect_dim(params, op, "params", 0, rows));
  MSGL_TRY(expect_dim(params, op, "params", 1, 5));
  MSGL_TRY(expect_dim(out, op, "out", 0, rows));
  MSGL_TRY(expect_rows(logits, op, "logits", dtype_size(logits->dtype)));
  MSGL_TRY(expect_contiguous(params, op, "params"));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  if (params->device != logits->device || out->device != logits->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: arguments `logits`, `params` and `out` must be on one device", op);
  if (logits->shape[1] < 1 || logits->shape[1] > 0x7ffffffe)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `logits` has %lld columns", op,
                     static_cast<long long>(logits->shape[1]));
  if (rows == 0) return MSGL_OK;
  msgl_sample_params p{};
  p.logits = logits->data;
  p.params = static_cast<const float*>(params->data);
  p.out = static_cast<int32_t*>(out->data);
  p.vocab = logits->shape[1];
  p.row_stride = logits->strides[0];
  p.num_rows = rows;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (logits->dtype) {
#define MSGL_CASE(D) \
  case D: sample_kernel<D><<<static_cast<unsigned>(rows), kSampleThreads, 0, s>>>(p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "sample: no AOT instance DTYPE=%d", logits->dtype);
  }
  return check_launch(op);
}
#endif
