/*
 * minisgl/rope_row.cuh: one (token, head) row of the attention prologue, the
 * vector path of rope_store.cu: the per-head RMSNorm (optional), the rotary
 * embedding (neox layout) and one rounding to the dtype.
 *
 *   dst = rope(src * rsqrt(mean(src^2) + eps) * w)     (the norm only with w)
 *
 * Shared by rope_store.cu and the decode attention's fused prologue
 * (decode_attention.cu), so that both give the same bits for the same group
 * width: the arithmetic, its order and the group's reduction are this file's.
 *
 * A row is held by a group of G threads (a power of two, at most 32, aligned to
 * its width in the warp); thread t of the group holds units t, t + G, ... (at
 * most kRopeRowUnits of them): a unit is a pair of 16-byte vectors rotated
 * together (vector u of the first rotary half and vector u of the second), or
 * one vector past rotary_dim (partial rotary). The caller guarantees the head
 * fits (units <= G * kRopeRowUnits), that the rotated half and the head are whole
 * vectors, and 16-byte aligned rows. Every thread of a group must call
 * rope_row_apply for the same row (the sum of squares is a group shuffle).
 */
#ifndef MINISGL_ROPE_ROW_CUH
#define MINISGL_ROPE_ROW_CUH
#include "minisgl/dtype.cuh"

namespace msgl {

/* Units a thread holds at most (gpu/rope_store.rs: UNITS_PER_THREAD). */
constexpr int kRopeRowUnits = 2;

/* Sums `v` over this thread's group of `width` lanes (a power of two <= 32,
 * aligned to its width in the warp); only the group's lanes take part. */
__device__ __forceinline__ float rope_row_group_sum(float v, int width) {
  const unsigned lane = threadIdx.x % kWarpSize;
  const unsigned mask = width >= kWarpSize ? 0xffffffffu : ((1u << width) - 1u) << (lane & ~(unsigned)(width - 1));
  for (int o = width / 2; o >= 1; o /= 2) v += __shfl_xor_sync(mask, v, o);
  return v;
}

/* Rotates one pair of 16-byte vectors (columns [col, col + E) of the first rotary
 * half in `a`, their partners `half` columns on in `b`) by the cos / sin row `cs`
 * (cos at [0, half), sin after): the neox rotation, in f32. Shared with rope.cu. */
template <int DTYPE>
__device__ __forceinline__ void rope_rotate_pair(Vec16<DTYPE>& a, Vec16<DTYPE>& b, const float* cs, int half, int col) {
  constexpr int E = Vec16<DTYPE>::kElems;
  float c[E], s[E];
#pragma unroll
  for (int e = 0; e < E; e += 4) {
    const float4 cv = *reinterpret_cast<const float4*>(cs + col + e);
    const float4 sv = *reinterpret_cast<const float4*>(cs + half + col + e);
    c[e] = cv.x, c[e + 1] = cv.y, c[e + 2] = cv.z, c[e + 3] = cv.w;
    s[e] = sv.x, s[e + 1] = sv.y, s[e + 2] = sv.z, s[e + 3] = sv.w;
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const float x1 = a.v[e], x2 = b.v[e];
    a.v[e] = x1 * c[e] - x2 * s[e];
    b.v[e] = x2 * c[e] + x1 * s[e];
  }
}

/* Where a head's units lie: `pairs` rotated pairs (vector u of the first half at
 * column u * VE, its partner `half` columns on), then the lone vectors past
 * rotary_dim; `units` in all. */
struct RopeRowUnits {
  int half, pairs, units, rdim, ve;
  __device__ __forceinline__ RopeRowUnits(int d, int rotary_dim, int vec_elems)
      : half(rotary_dim / 2), pairs(rotary_dim / 2 / vec_elems),
        units(rotary_dim / 2 / vec_elems + (d - rotary_dim) / vec_elems), rdim(rotary_dim), ve(vec_elems) {}
  /* Whether unit u is a rotated pair. */
  __device__ __forceinline__ bool is_pair(int u) const { return u < pairs; }
  /* Unit u's first column (of the first half, for a pair). */
  __device__ __forceinline__ int column(int u) const { return u < pairs ? u * ve : rdim + (u - pairs) * ve; }
};

/* The norm weight vectors of a thread's units (raw 16-byte vectors: loaded where
 * the caller likes, e.g. before a grid dependency wait). */
struct RopeRowWeights {
  uint4 a[kRopeRowUnits];
  uint4 b[kRopeRowUnits];
};

/* Thread t (of G) of a row's group: the weight vectors of its units, zeros for
 * a null `w` or past the head. */
template <int DTYPE>
__device__ __forceinline__ RopeRowWeights rope_row_weights(const typename DType<DTYPE>::Storage* w, int d, int rdim,
                                                           int t, int G) {
  constexpr int VE = Vec16<DTYPE>::kElems;
  RopeRowWeights out;
#pragma unroll
  for (int j = 0; j < kRopeRowUnits; ++j) out.a[j] = out.b[j] = make_uint4(0, 0, 0, 0);
  if (w == nullptr) return out;
  const RopeRowUnits L(d, rdim, VE);
#pragma unroll
  for (int j = 0; j < kRopeRowUnits; ++j) {
    const int u = t + j * G;
    if (u < L.units) {
      const int ca = L.column(u);
      out.a[j] = *reinterpret_cast<const uint4*>(w + ca);
      if (L.is_pair(u)) out.b[j] = *reinterpret_cast<const uint4*>(w + L.half + ca);
    }
  }
  return out;
}

/* Thread t (of G) of a row's group: reads its units of `src`, normalises them
 * (when `norm`, with `w` from rope_row_weights), rotates the pairs by the cos /
 * sin row `cs` (cos at [0, rdim / 2), sin after; null: no rotation) and writes
 * them to `dst` (global or shared memory; may be `src`: every read of the group
 * comes before its sum, every write after). */
template <int DTYPE>
__device__ __forceinline__ void rope_row_apply(const typename DType<DTYPE>::Storage* src,
                                               typename DType<DTYPE>::Storage* dst, bool norm,
                                               const RopeRowWeights& w, const float* cs, int d, int rdim, float eps,
                                               int t, int G) {
  constexpr int E = Vec16<DTYPE>::kElems;
  const RopeRowUnits L(d, rdim, E);
  const int half = L.half;
  Vec16<DTYPE> a[kRopeRowUnits], b[kRopeRowUnits];
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kRopeRowUnits; ++j) {
    const int u = t + j * G;
    if (u < L.units) {
      const bool pair = L.is_pair(u);
      const int ca = L.column(u);
      a[j].load(src + ca);
#pragma unroll
      for (int e = 0; e < E; ++e) sum += a[j].v[e] * a[j].v[e];
      if (pair) {
        b[j].load(src + half + ca);
#pragma unroll
        for (int e = 0; e < E; ++e) sum += b[j].v[e] * b[j].v[e];
      }
    }
  }
  float inv_rms = 1.f;
  if (norm) inv_rms = rsqrtf(rope_row_group_sum(sum, G) * (1.f / static_cast<float>(d)) + eps);
#pragma unroll
  for (int j = 0; j < kRopeRowUnits; ++j) {
    const int u = t + j * G;
    if (u < L.units) {
      const bool pair = L.is_pair(u);
      const int ca = L.column(u);
      if (norm) {
        /* Same operation order as norm.cu: x * inv_rms * w. */
        Vec16<DTYPE> wa;
        wa.from_raw(w.a[j]);
#pragma unroll
        for (int e = 0; e < E; ++e) a[j].v[e] = a[j].v[e] * inv_rms * wa.v[e];
        if (pair) {
          Vec16<DTYPE> wb;
          wb.from_raw(w.b[j]);
#pragma unroll
          for (int e = 0; e < E; ++e) b[j].v[e] = b[j].v[e] * inv_rms * wb.v[e];
        }
      }
      if (pair && cs != nullptr) rope_rotate_pair<DTYPE>(a[j], b[j], cs, half, ca);
      a[j].store(dst + ca);
      if (pair) b[j].store(dst + half + ca);
    }
  }
}

}  // namespace msgl

#endif  // MINISGL_ROPE_ROW_CUH
