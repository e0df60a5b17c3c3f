/*
 * minisgl/dtype.cuh: the float element types of the kernels (f32, f16, bf16) and
 * their conversions to and from f32, for device code.
 *
 * No system header and no cuda_fp16.h / cuda_bf16.h: every kernel must also compile
 * under NVRTC, which sees only the run-time header table. A 16-bit element is its
 * raw bits (unsigned short):
 *   - bf16 <-> f32 by bit manipulation (bf16 is the top half of an f32), rounding to
 *     nearest even, NaN kept quiet;
 *   - f16 <-> f32 with the PTX `cvt` instructions (`cvt.rn.f16.f32`, `cvt.f32.f16`);
 *   - pairs packed for the tensor cores with `cvt.rn.{bf16x2,f16x2}.f32` (sm_80+).
 *
 * DType<MSGL_BF16>::Storage is the element, DType<..>::to_f32 / from_f32 convert one,
 * and Vec16<D> holds the elements of one 16-byte vector as floats.
 */
#ifndef MINISGL_DTYPE_CUH
#define MINISGL_DTYPE_CUH

#include "minisgl/device.cuh"

namespace msgl {

__device__ __forceinline__ float bf16_bits_to_f32(unsigned short b) {
  return __uint_as_float(static_cast<unsigned int>(b) << 16);
}

__device__ __forceinline__ unsigned short f32_to_bf16_bits(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);                                                            /* round to nearest even */
  return static_cast<unsigned short>(u >> 16);
}

__device__ __forceinline__ float f16_bits_to_f32(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ unsigned short f32_to_f16_bits(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

/* Element traits by msgl_dtype code. */
template <int DTYPE> struct DType;

template <> struct DType<MSGL_F32> {
  using Storage = float;
  static constexpr int kBytes = 4;
  __device__ __forceinline__ static float to_f32(float v) { return v; }
  __device__ __forceinline__ static float from_f32(float v) { return v; }
};

template <> struct DType<MSGL_F16> {
  using Storage = unsigned short;
  static constexpr int kBytes = 2;
  __device__ __forceinline__ static float to_f32(unsigned short v) { return f16_bits_to_f32(v); }
  __device__ __forceinline__ static unsigned short from_f32(float v) { return f32_to_f16_bits(v); }
};

template <> struct DType<MSGL_BF16> {
  using Storage = unsigned short;
  static constexpr int kBytes = 2;
  __device__ __forceinline__ static float to_f32(unsigned short v) { return bf16_bits_to_f32(v); }
  __device__ __forceinline__ static unsigned short from_f32(float v) { return f32_to_bf16_bits(v); }
};

/* Two f32 values as one packed 32-bit pair of 16-bit floats: `lo` in bits 0..15,
 * `hi` in bits 16..31 (the operand layout of mma.sync). */
template <int DTYPE> __device__ __forceinline__ unsigned int pack2(float lo, float hi);

template <> __device__ __forceinline__ unsigned int pack2<MSGL_BF16>(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned int r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<unsigned int>(f32_to_bf16_bits(lo)) | (static_cast<unsigned int>(f32_to_bf16_bits(hi)) << 16);
#endif
}

template <> __device__ __forceinline__ unsigned int pack2<MSGL_F16>(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned int r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<unsigned int>(f32_to_f16_bits(lo)) | (static_cast<unsigned int>(f32_to_f16_bits(hi)) << 16);
#endif
}

/* The elements of one 16-byte vector as floats (8 for 16-bit types, 4 for f32). */
template <int DTYPE> struct Vec16 {
  static constexpr int kElems = 16 / DType<DTYPE>::kBytes;
  float v[kElems];

  __device__ __forceinline__ void from_raw(const uint4& raw) {
    const unsigned int w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (DTYPE == MSGL_F32) {
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] = __uint_as_float(w[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        v[2 * i] = DType<DTYPE>::to_f32(static_cast<unsigned short>(w[i] & 0xffffu));
        v[2 * i + 1] = DType<DTYPE>::to_f32(static_cast<unsigned short>(w[i] >> 16));
      }
    }
  }

  __device__ __forceinline__ uint4 to_raw() const {
    unsigned int w[4];
    if constexpr (DTYPE == MSGL_F32) {
#pragma unroll
      for (int i = 0; i < 4; ++i) w[i] = __float_as_uint(v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        w[i] = static_cast<unsigned int>(DType<DTYPE>::from_f32(v[2 * i])) |
               (static_cast<unsigned int>(DType<DTYPE>::from_f32(v[2 * i + 1])) << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }

  /* Loads 16 bytes from a 16-byte aligned address. */
  __device__ __forceinline__ void load(const void* p) { from_raw(*static_cast<const uint4*>(p)); }
  /* Stores 16 bytes to a 16-byte aligned address. */
  __device__ __forceinline__ void store(void* p) const { *static_cast<uint4*>(p) = to_raw(); }
};

/* One element of a DTYPE array as f32, and the store back. */
template <int DTYPE> __device__ __forceinline__ float load_f32(const void* base, long long i) {
  return DType<DTYPE>::to_f32(static_cast<const typename DType<DTYPE>::Storage*>(base)[i]);
}
template <int DTYPE> __device__ __forceinline__ void store_f32(void* base, long long i, float v) {
  static_cast<typename DType<DTYPE>::Storage*>(base)[i] = DType<DTYPE>::from_f32(v);
}

}  // namespace msgl

#endif /* MINISGL_DTYPE_CUH */
