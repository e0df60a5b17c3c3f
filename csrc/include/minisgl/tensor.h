/*
 * minisgl/tensor.h: the C ABI between Rust and every kernel.
 *
 * One header, three readers:
 *   - nvcc, compiling the ahead-of-time shared library (host launchers + kernels);
 *   - NVRTC, compiling one kernel instance at run time (device code only, so this
 *     header must not pull in any system header under __CUDACC_RTC__);
 *   - bindgen (`cargo xtask codegen`), producing kernel-runtime/src/sys/kernels.rs.
 *
 * Every host launcher has the shape
 *     int msgl_<kernel>(const msgl_tensor* ..., <scalars>, msgl_stream stream);
 * validates its arguments before launching, and returns MSGL_OK or a status code;
 * on failure msgl_last_error() returns a message naming the bad argument. The
 * message lives in thread-local storage and stays valid until the next call on the
 * same thread.
 *
 * Parameter structs (msgl_*_params) are what a __global__ entry receives by value:
 * the AOT launchers fill them on the C++ side, the run-time path (NVRTC or AOT
 * cubins) fills the bindgen mirror on the Rust side. Their sizes are pinned below
 * and in the generated Rust (bindgen's layout tests).
 */
#ifndef MINISGL_TENSOR_H
#define MINISGL_TENSOR_H

#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#else
#include <stddef.h>
#include <stdint.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct below or a launcher signature changes. */
#define MSGL_ABI_VERSION 12

/* The most dimensions a tensor view carries. */
#define MSGL_MAX_DIMS 6

/* Element types. The codes are part of the ABI (kernel-runtime's DType mirrors them). */
typedef enum msgl_dtype {
  MSGL_F32 = 0,
  MSGL_F16 = 1,
  MSGL_BF16 = 2,
  MSGL_I32 = 3,
  MSGL_I64 = 4,
  MSGL_U8 = 5
} msgl_dtype;

/* Status codes returned by every launcher. */
typedef enum msgl_status {
  MSGL_OK = 0,
  /* A tensor or scalar argument is wrong (dtype, shape, stride, device, alignment). */
  MSGL_ERR_INVALID_ARGUMENT = 1,
  /* The library has no instance for this specialisation (the runtime then JIT-compiles it). */
  MSGL_ERR_NO_INSTANCE = 2,
  /* A CUDA runtime call or the launch itself failed. */
  MSGL_ERR_CUDA = 3
} msgl_status;

/* Exported launchers; everything else in the library is hidden (-fvisibility=hidden). */
#if defined(__GNUC__)
#define MSGL_API __attribute__((visibility("default")))
#else
#define MSGL_API
#endif

/* The stream a launcher enqueues on: a cudaStream_t / CUstream. */
typedef void* msgl_stream;

/*
 * A strided view of device (or host) memory. Shapes and strides are in elements,
 * outermost dimension first. `device` is the CUDA ordinal, or -1 for host memory.
 */
typedef struct msgl_tensor {
  void* data;
  int32_t dtype;  /* msgl_dtype */
  int32_t ndim;
  int32_t device;
  int32_t reserved;
  int64_t shape[MSGL_MAX_DIMS];
  int64_t strides[MSGL_MAX_DIMS];
} msgl_tensor;

/*
 * store: scatter new K and V rows into the paged KV caches.
 *   k_cache[indices[i]] = k[i], v_cache[indices[i]] = v[i]   (rows of row_bytes bytes)
 * Instance parameter: ROW_BYTES.
 */
typedef struct msgl_store_params {
  void* k_cache;           /* device, [num_slots, ROW_BYTES] contiguous rows */
  void* v_cache;           /* device, [num_slots, ROW_BYTES] contiguous rows */
  const void* indices;     /* device, [num_tokens] int32 or int64 slot indices */
  const void* k;           /* device, [num_tokens] rows, k_row_stride bytes apart */
  const void* v;           /* device, [num_tokens] rows, v_row_stride bytes apart */
  int64_t k_row_stride;    /* bytes */
  int64_t v_row_stride;    /* bytes */
  int64_t num_tokens;
  int64_t num_slots;       /* rows in each cache; out-of-range indices are skipped */
  int32_t index_is_64;     /* 1 when indices are int64 */
  int32_t reserved;
} msgl_store_params;

/*
 * index: embedding gather, out[i] = weight[ids[i] - vocab_start] when
 * vocab_start <= ids[i] < vocab_start + num_rows, else a zero row (the vocab-parallel
 * shard of a tensor-parallel embedding; a full table has vocab_start = 0).
 * Instance parameter: ROW_BYTES.
 */
typedef struct msgl_index_params {
  void* out;               /* device, [num_tokens, ROW_BYTES] contiguous */
  const void* weight;      /* device, [num_rows, ROW_BYTES] contiguous */
  const void* ids;         /* device, [num_tokens] int32 or int64 */
  int64_t num_tokens;
  int64_t num_rows;
  int64_t vocab_start;
  int32_t index_is_64;
  int32_t reserved;
} msgl_index_params;


/*
 * norm: RMSNorm over rows of `hidden` elements, f32 accumulation.
 *   plain / per head:  out[row] = x[row] * rsqrt(mean(x[row]^2) + eps) * weight
 *   fused add:         residual[row] += x[row]; x[row] = norm(residual[row]) * weight
 * A row is (token, head): its address is token * token_stride + head * head_stride
 * (heads = 1 for a plain [tokens, hidden] matrix). `out` may alias `x` (in place).
 * Instance parameter: DTYPE (msgl_dtype of every tensor).
 */
typedef struct msgl_norm_params {
  void* out;                   /* device, rows (token, head) of `hidden` elements */
  void* x;                     /* device, rows (token, head) of `hidden` elements */
  void* residual;              /* device, [num_rows, hidden] rows; NULL unless fused add */
  const void* weight;          /* device, [hidden] */
  int64_t num_rows;            /* tokens x heads */
  int64_t hidden;
  int64_t heads;               /* rows per token (1 unless head_rms_norm) */
  int64_t x_token_stride;      /* elements */
  int64_t x_head_stride;       /* elements */
  int64_t out_token_stride;    /* elements */
  int64_t out_head_stride;     /* elements */
  int64_t residual_row_stride; /* elements */
  float eps;
  int32_t threads_per_row;     /* power of two, 1..512 */
  int32_t rows_per_block;      /* block = threads_per_row * rows_per_block threads */
  int32_t vectorized;          /* 1: 16-byte vectors, at most 4 per thread (host-checked alignment) */
} msgl_norm_params;

/*
 * rope: rotary embedding in place, neox layout: for i < rotary_dim / 2,
 *   (x[i], x[i + rotary_dim / 2]) <- (x[i] c - x[i + r/2] s, x[i + r/2] c + x[i] s)
 * with c = cos_sin[pos][i], s = cos_sin[pos][rotary_dim / 2 + i], pos = positions[t],
 * on every head of q and k. Tokens whose position is outside the cache are left as
 * they are. Instance parameter: DTYPE (of q and k).
 */
typedef struct msgl_rope_params {
  void* q;                     /* device, [num_tokens, num_q_heads, head_dim], unit last stride */
  void* k;                     /* device, [num_tokens, num_k_heads, head_dim], unit last stride */
  const void* positions;       /* device, [num_tokens] int32 or int64 */
  const float* cos_sin;        /* device, [max_positions, rotary_dim] f32 */
  int64_t num_tokens;
  int64_t q_token_stride;      /* elements */
  int64_t q_head_stride;
  int64_t k_token_stride;
  int64_t k_head_stride;
  int64_t max_positions;
  int32_t num_q_heads;
  int32_t num_k_heads;
  int32_t rotary_dim;
  int32_t index_is_64;
  int32_t vectorized;          /* 1: 16-byte vectors (host-checked alignment) */
  int32_t reserved;
} msgl_rope_params;

/*
 * rope_store: the attention prologue of one layer in one launch. For each token t
 * with position pos = positions[t] and KV slot slot = out_loc[t]:
 *   q[t, h]        <- rope(norm(q[t, h]) * q_weight)      (in place)
 *   k_cache[slot, h] = rope(norm(k[t, h]) * k_weight)     (k itself is not written)
 *   v_cache[slot, h] = v[t, h]
 * where norm is RMSNorm over the head (f32, eps) and is skipped when the weight is
 * NULL (models without q/k norm), and rope is rope.cu's neox rotation of the first
 * rotary_dim dimensions. Everything is computed in f32 and rounded once. Slots
 * outside the cache are not written; a position outside the cos/sin cache leaves
 * the head unrotated. Instance parameter: DTYPE (of q, k, v, the caches, weights).
 */
typedef struct msgl_rope_store_params {
  void* q;                     /* device, [num_tokens, num_q_heads, head_dim], unit last stride */
  const void* k;               /* device, [num_tokens, num_kv_heads, head_dim], unit last stride */
  const void* v;               /* device, [num_tokens, num_kv_heads, head_dim], unit last stride */
  void* k_cache;               /* device, [num_slots, num_kv_heads, head_dim] contiguous */
  void* v_cache;               /* device, [num_slots, num_kv_heads, head_dim] contiguous */
  const void* positions;       /* device, [num_tokens] int32 or int64 */
  const void* out_loc;         /* device, [num_tokens] int32 or int64 */
  const float* cos_sin;        /* device, [max_positions, rotary_dim] f32 */
  const void* q_weight;        /* device, [head_dim], or NULL: no q norm */
  const void* k_weight;        /* device, [head_dim], or NULL: no k norm */
  int64_t num_tokens;
  int64_t q_token_stride;      /* elements */
  int64_t q_head_stride;
  int64_t k_token_stride;
  int64_t k_head_stride;
  int64_t v_token_stride;
  int64_t v_head_stride;
  int64_t max_positions;
  int64_t num_slots;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t rotary_dim;
  int32_t positions_is_64;
  int32_t out_loc_is_64;
  int32_t threads_per_head;    /* power of two, 1..32; heads per block = 256 / threads_per_head */
  int32_t vectorized;          /* 1: 16-byte vectors held in registers (host-checked shape and alignment) */
  float eps;
  int32_t launch_first;        /* 1: lets the next kernel launch before waiting for the previous one
                                  (device.cuh: grid_prologue_launch_first); 0: grid_prologue */
} msgl_rope_store_params;

/*
 * skinny_gemm: out[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) for few rows m (the
 * weight-bound decode projections), on the tensor cores with the weights as the
 * A operand (out^T = w x^T). A block of 8 warps owns 16 * M_TILES rows of w and
 * a contiguous range of K (all of it, or a 1/C share when the launcher splits K
 * across a cluster of C blocks): each warp reduces a contiguous eighth of the
 * block's range, the warps' f32 partials are summed in shared memory, and the
 * cluster's blocks sum theirs through distributed shared memory in rank order,
 * so every weight byte is read once, there is no second pass, and the result
 * does not depend on timing. Before its grid dependency wait each warp copies
 * the first prefetch_steps k-steps of its weight rows into shared memory (the
 * weights do not depend on the previous kernel). GATED = 1 is a gate_up
 * projection with SiLU-and-mul fused: w [2n, k] holds the gate rows then the
 * up rows, out[m, j] = silu(gate[m, j]) * up[m, j] with both rounded to the
 * dtype first, and a block makes 8 * M_TILES outputs. NORM = 1 runs the pre-norm
 * residual step of a decoder layer first (what fused_add_rms_norm does): s = x +
 * residual in f32, residual_out = s rounded (written by block 0), and the GEMM's
 * input is s * rsqrt(mean(s^2) + eps) * norm_w, rounded to the dtype, which every
 * block computes into shared memory for its m rows. Instance parameters: DTYPE
 * (bf16 or f16), N_TILES (x rows / 8, rounded up: 1 or 2, so m <= 16), M_TILES
 * (16-row tiles of w per warp: 1 or 2), GATED (0 or 1), NORM (0 or 1).
 */
typedef struct msgl_skinny_gemm_params {
  void* out;                   /* device, [m, n] contiguous */
  const void* x;               /* device, [m, k], rows x_stride elements apart, 16-byte aligned */
  const void* w;               /* device, [n, k] ([2n, k] GATED) contiguous, 16-byte aligned */
  const void* bias;            /* device, [n] ([2n] GATED), or NULL */
  int64_t m;                   /* 1..8 * N_TILES */
  int64_t n;                   /* output columns */
  int64_t k;                   /* a multiple of 32 */
  int64_t x_stride;            /* elements, a multiple of 8 */
  int32_t prefetch_steps;      /* k-steps per warp staged before the wait: 0..12 / M_TILES; dynamic shared
                                  memory prefetch_steps * M_TILES * 8 KiB (+ the NORM rows); 0 with
                                  bulk_prefetch */
  int32_t bulk_prefetch;       /* 1 (sm_90): the block's whole slice of w copied by the copy engine before
                                  the wait instead, 16 M_TILES rows of skinny_bulk_row_bytes(ceil(k / 32 /
                                  splits)) bytes of dynamic shared memory (+ the NORM rows); else 0 */
  const void* residual;        /* NORM: device, [m, k], rows residual_stride elements apart, 16-byte aligned */
  void* residual_out;          /* NORM: device, [m, k] contiguous: x + residual rounded (not residual itself) */
  const void* norm_w;          /* NORM: device, [k] */
  int64_t residual_stride;     /* NORM: elements, a multiple of 8 */
  float eps;                   /* NORM: added to the mean square */
  int32_t reserved2;           /* 0 */
} msgl_skinny_gemm_params;

/*
 * skinny_tiled: out[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) for mid-sized
 * decode batches and large weights (skinny_tiled.cu): weights streamed through a
 * `stages`-deep cp.async pipeline in shared memory (`chunk` k-steps of 32 a warp
 * per stage, the first stages - 1 issued before the grid dependency wait), the
 * x rows of a stage staged once per block, mma.sync with w as the A operand. A
 * block of 8 warps = warps_n x (8 / warps_n) owns 16 warps_n rows of w, 8 N_TILES
 * rows of x (y_chunks row groups cover m) and a range of K (a 1/C share in a
 * cluster of C blocks); partial tiles are summed in shared memory and across the
 * cluster in a fixed order (deterministic). Instance parameters: DTYPE (bf16 or
 * f16), N_TILES (x rows / 8 a block: 1, 2, 4, 8 or 16).
 */
typedef struct msgl_skinny_tiled_params {
  void* out;                   /* device, [m, n] contiguous */
  const void* x;               /* device, [m, k], rows x_stride elements apart, 16-byte aligned */
  const void* w;               /* device, [n, k] contiguous, 16-byte aligned */
  const void* bias;            /* device, [n], or NULL */
  int64_t m;                   /* rows of x, >= 1 */
  int64_t n;                   /* output columns */
  int64_t k;                   /* a multiple of 32 */
  int64_t x_stride;            /* elements, a multiple of 8 */
  int32_t warps_n;             /* 1, 2, 4 or 8: warps of a block on different weight rows */
  int32_t chunk;               /* k-steps of 32 a warp per pipeline stage: 1..4 */
  int32_t stages;              /* pipeline depth: 2..8 */
  int32_t y_chunks;            /* ceil(m / (8 N_TILES)) */
} msgl_skinny_tiled_params;

/*
 * stream_gemm: out[m, n] = sum_k x[m, k] w[n, k] (+ bias[n]) for m <= 16 rows and
 * large weights (stream_gemm.cu): a persistent grid (one block an SM) of
 * contiguous 16-row weight tiles, each summed over its whole K in one block from
 * a ring of `stages` shared-memory stages that a producer thread fills with 2-D
 * tensor copies (sm_90) through the tensor maps of w and x. Deterministic: the sums depend on the shape only. Instance
 * parameters: DTYPE (bf16 or f16), N_TILES (8-row tiles of x: 1 for m <= 8, 2).
 */
/* A CUDA tensor map (CUtensorMap: 128 opaque bytes, built on the host by
 * cuTensorMapEncodeTiled), passed by value inside a kernel's params. */
typedef struct __attribute__((aligned(128))) msgl_tensor_map {
  uint64_t opaque[16];
} msgl_tensor_map;

typedef struct msgl_stream_gemm_params {
  msgl_tensor_map w_map;       /* w [n, k]: boxes of 256 k (whole_rows: chunk k) x 16 rows, zero fill */
  msgl_tensor_map x_map;       /* x [m, k]: boxes of 256 k (whole_rows: chunk k) x 8 N_TILES rows, zero fill */
  void* out;                   /* device, [m, n] contiguous */
  const void* bias;            /* device, [n], or NULL */
  int64_t m;                   /* rows of x, 1..16 */
  int64_t n;                   /* output columns */
  int64_t k;                   /* a multiple of 32 */
  int32_t stages;              /* pipeline depth: 2..8 */
  int32_t chunk;               /* k elements of a stage: 256, 512 or 1024 */
  int32_t whole_rows;          /* 1: 3-D maps [rows][k / 256][256], boxes {256, chunk / 256, rows} */
  int32_t reserved;            /* 0 */
} msgl_stream_gemm_params;

/*
 * fill_uniform: out[i] = center + half_width * (2 u(seed, i) - 1) with u the top 24
 * bits of splitmix64(seed + (i + 1) * 0x9e3779b97f4a7c15) over 2^24 (dummy weights;
 * kernel-runtime's cpu::random computes the same values). Instance parameter: DTYPE.
 */
typedef struct msgl_fill_uniform_params {
  void* out;                   /* device, [numel] contiguous */
  int64_t numel;
  uint64_t seed;
  float center;
  float half_width;
} msgl_fill_uniform_params;

/*
 * silu_mul: out[t, j] = silu(x[t, j]) * x[t, inter + j], f32 compute.
 * Instance parameter: DTYPE.
 */
typedef struct msgl_silu_mul_params {
  void* out;                   /* device, [num_tokens, inter] contiguous */
  const void* x;               /* device, [num_tokens, 2 * inter] contiguous */
  int64_t num_tokens;
  int64_t inter;
  int32_t vectorized;          /* 1: 16-byte vectors (inter * element size % 16 == 0, aligned) */
  int32_t blocks_per_row;      /* grid = num_tokens * blocks_per_row */
} msgl_silu_mul_params;

/*
 * argmax: out[r] = the first index of the largest value of row r (int32).
 * Two stages when a row is split across blocks: stage 0 scans `split_len` elements
 * per block into (value, index) partials, stage 1 reduces them (one warp per row).
 * Instance parameter: DTYPE (of x).
 */
typedef struct msgl_argmax_params {
  const void* x;               /* device, [rows, vocab], row_stride elements apart */
  int32_t* out;                /* device, [rows] */
  float* partial_value;        /* device, [rows, num_splits] when num_splits > 1 */
  int32_t* partial_index;      /* device, [rows, num_splits] when num_splits > 1 */
  int64_t rows;
  int64_t vocab;
  int64_t row_stride;          /* elements */
  int64_t split_len;           /* elements per split (a multiple of 8) */
  int32_t num_splits;
  int32_t stage;               /* 0: scan x, 1: reduce the partials */
  int32_t vectorized;          /* 1: 16-byte loads (row_stride and x aligned) */
  int32_t reserved;
} msgl_argmax_params;

/*
 * sample: one token per row of logits (see kernels/sampling.cu for the rules).
 * Instance parameter: DTYPE of the logits.
 */
typedef struct msgl_sample_params {
  const void* logits;          /* device, [rows, vocab], row_stride elements apart */
  const float* params;         /* device, [rows, 5]: temperature, top_k (0 = off), top_p, min_p, u */
  int32_t* out;                /* device, [rows] */
  int64_t vocab;
  int64_t row_stride;          /* elements */
  int64_t num_rows;
} msgl_sample_params;

/*
 * token_mask: logits[rows[i], t] = -inf where bit t % 32 of mask[i, t / 32] is clear
 * (constrained decoding). Instance parameter: DTYPE of the logits.
 */
typedef struct msgl_token_mask_params {
  void* logits;                /* device, [logits rows, vocab], row_stride elements apart */
  const uint32_t* mask;        /* device, [num_masked, words_per_row] contiguous: packed allowed bits */
  const int32_t* rows;         /* device, [num_masked]: the logits row of each mask */
  int64_t vocab;
  int64_t row_stride;          /* elements */
  int64_t words_per_row;       /* tokens past words_per_row * 32 are disallowed */
  int64_t num_masked;
  int64_t blocks_per_row;      /* ceil(vocab / 1024): grid = num_masked * blocks_per_row */
} msgl_token_mask_params;

/*
 * Penalties on the GPU (repetition, frequency, presence; the engine's
 * sampling::penalties): per penalty slot (one per request that has penalties) a
 * row of `vocab` int32 counters: bit 30 set when the token is in the prompt, the
 * low 30 bits its number of occurrences in the output so far.
 *
 * penalty_count: for i < n with 0 <= slots[i] < num_slots and 0 <= tokens[i] < vocab,
 * counts[slots[i], tokens[i]] += 1 (MODE 0: an output token) or |= bit 30 (MODE 1:
 * a prompt token). Instance parameter: MODE.
 */
typedef struct msgl_penalty_count_params {
  int32_t* counts;             /* device, [num_slots, vocab] contiguous */
  const int32_t* slots;        /* device, [n]; entries < 0 are skipped */
  const int32_t* tokens;       /* device, [n] */
  int64_t vocab;
  int64_t num_slots;
  int64_t n;
} msgl_penalty_count_params;

/*
 * apply_penalties: for i < n, logits row rows[i] (f32 math, stored back in DTYPE)
 * with c = counts[slots[i], t]: when c != 0 and repetition != 1, a positive logit
 * is divided by the repetition penalty and a negative one multiplied by it; then,
 * with k = c & (2^30 - 1) > 0, logit -= frequency * k + presence (round to nearest
 * at every operation, no fused multiply-add: the CPU reference's arithmetic).
 * Instance parameter: DTYPE of the logits.
 */
typedef struct msgl_apply_penalties_params {
  void* logits;                /* device, [logits rows, vocab], row_stride elements apart */
  const int32_t* counts;       /* device, [num_slots, vocab] contiguous */
  const int32_t* rows;         /* device, [n]: the logits row of each penalised row */
  const int32_t* slots;        /* device, [n]: its penalty slot */
  const float* penalties;      /* device, [n, 3]: repetition, frequency, presence */
  int64_t vocab;
  int64_t row_stride;          /* elements */
  int64_t n;
  int64_t blocks_per_row;      /* ceil(vocab / 1024): grid = n * blocks_per_row */
} msgl_apply_penalties_params;

/*
 * logprobs: for i < n, with row = logits[rows[i]] (NaN counted as -inf) and its
 * log-sum-exp L: out[i, 0] = the token sampled[rows[i]], out[i, 1] = the bits of
 * its f32 log probability row[token] - L, then top_n pairs (id, bits of row[id] - L)
 * of the most likely tokens, most likely first, lower id first on ties (pairs past
 * the vocabulary are (INT32_MAX, -inf)); -inf when the token has no probability.
 * Instance parameter: DTYPE of the logits.
 */
typedef struct msgl_logprobs_params {
  const void* logits;          /* device, [logits rows, vocab], row_stride elements apart */
  const int32_t* rows;         /* device, [n] */
  const int32_t* sampled;      /* device, [logits rows]: the step's sampled ids */
  int32_t* out;                /* device, [n, out_stride] */
  int64_t vocab;
  int64_t row_stride;          /* elements */
  int64_t n;
  int64_t top_n;               /* <= 20 */
  int64_t out_stride;          /* >= 2 + 2 * top_n */
} msgl_logprobs_params;

/*
 * cast / copy: dst[i] = convert(src[i]) over a strided n-d index space (shapes and
 * strides in elements, outermost first, dims already merged where both sides are
 * contiguous). Instance parameters: SRC, DST (msgl_dtype, floats) for cast;
 * ELEM_BYTES (1, 2, 4, 8) for copy.
 */
typedef struct msgl_convert_params {
  void* dst;
  const void* src;
  int64_t numel;
  int64_t shape[MSGL_MAX_DIMS];
  int64_t dst_strides[MSGL_MAX_DIMS];
  int64_t src_strides[MSGL_MAX_DIMS];
  int32_t ndim;
  int32_t contiguous;          /* 1: both sides dense (then shape/strides are unused) */
} msgl_convert_params;

/*
 * paged attention (prefill with a cached prefix, and decode): for each sequence s
 * with q_len = q_indptr[s+1] - q_indptr[s] new tokens and kv_len = kv_lens[s] keys,
 * query token j (position kv_len - q_len + j) of head h attends to keys
 * 0..=kv_len - q_len + j of kv head h / (num_q_heads / num_kv_heads).
 *
 * A block takes 16 * num_warps query rows of one (sequence, kv head), rows being
 * (token, head-in-group) pairs, and keys [split * kv_chunk, (split + 1) * kv_chunk)
 * of the sequence. When a sequence has more than one split, blocks write normalised
 * f32 partial outputs and their log2-sum-exp, and the combine phase merges them.
 * Instance parameters: DTYPE, HEAD_DIM, MMA (1: tensor-core products, bf16/f16 only;
 * 0: CUDA-core products).
 */
typedef struct msgl_attention_params {
  void* out;                   /* device, [num_tokens, num_q_heads, HEAD_DIM] contiguous */
  const void* q;               /* device, [num_tokens, num_q_heads, HEAD_DIM], unit last stride */
  const void* k_cache;         /* device, [num_pages, page_size, num_kv_heads, HEAD_DIM] contiguous */
  const void* v_cache;         /* device, same shape as k_cache */
  const int32_t* q_indptr;     /* device, [num_seqs + 1] */
  const int32_t* kv_lens;      /* device, [num_seqs] */
  const int32_t* block_table;  /* device, [>= num_seqs, max_pages] */
  float* o_partial;            /* device, [num_tokens, num_q_heads, max_splits, HEAD_DIM] (max_splits > 1) */
  float* lse_partial;          /* device, [num_tokens, num_q_heads, max_splits] (max_splits > 1) */
  int32_t* split_counters;     /* device, [>= num_seqs * num_kv_heads] zeros, or NULL: the decode kernel's
                                  last block of a (sequence, kv head) merges its splits (and resets the
                                  counter); NULL: the combine phase does. The prefill kernel's dynamic
                                  tiles: its item counter (two zeros, left zero) */
  int64_t q_token_stride;      /* elements */
  int64_t q_head_stride;       /* elements */
  int64_t num_tokens;
  int64_t num_pages;           /* pages in each cache (page numbers are bounds-checked) */
  int32_t num_seqs;
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t page_size;
  int32_t max_pages;           /* block_table row length */
  int32_t num_warps;           /* 1..4; a block holds 16 * num_warps query rows */
  int32_t num_q_tiles;         /* sum over sequences of ceil(q_len * group / (16 * num_warps)) */
  int32_t kv_chunk;            /* keys per split (a multiple of the key tile); decode only: 0 cuts each sequence into <= max_splits equal chunks */
  int32_t max_splits;          /* splits of the longest sequence (grid dimension) */
  int32_t phase;               /* 0: attention, 1: combine the splits */
  float scale_log2;            /* softmax scale * log2(e) */
  /* Decode attention only (the tensor-core block): fused_rope = 1 runs the layer's
   * attention prologue in the attention launch instead of a rope_store launch
   * before it. `rope` is rope_store's vector path (vectorized = 1): q, k and v
   * the projection's (unnormalised, unrotated) views, q the same view as `q`
   * above, which is only read (the normalised, rotated q goes to shared memory);
   * the block that reads a new token's keys writes its k and v rows into the
   * caches first, as rope_store would. 0: `q` holds the finished queries and
   * the caches the new rows. */
  msgl_rope_store_params rope;
  int32_t fused_rope;
  int32_t combine_launch_first; /* 1: the combine launch lets the next kernel launch before its wait
                                   (device.cuh: grid_prologue_launch_first); 0: grid_prologue */
  int32_t min_chunk;           /* kv_chunk = 0: the fewest keys a split holds, a multiple of 64 (0: 128) */
  int32_t max_blocks;          /* the prefill kernel's persistent tiles: at most this many blocks (0: as many
                                  as the SMs hold; tests set a few, so that each block walks many items) */
} msgl_attention_params;

/* The prefill kernel's parameters (prefill_attention.cu): the attention params and,
 * for the tiles that copy K and V by TMA (prefill_attention.cu's PrefillWgTile::TMA),
 * a tensor map of each cache, built on the host by cuTensorMapEncodeTiled: 3-D
 * [slots = num_pages * page_size][num_kv_heads][HEAD_DIM] (innermost last),
 * boxes of 64 elements x 1 head x kv_tma_rows slots, 128-byte swizzle, zero fill
 * outside. kv_tma_rows: min(page_size, the tile's keys) when page_size is a power
 * of two >= 8 and the slots fit 31 bits; 0 (maps unread) otherwise and for the
 * other tiles: the K/V tiles are gathered by cp.async. q_map: for those tiles, a map
 * of q, 3-D [num_tokens][num_q_heads][HEAD_DIM] with q's strides, boxes of 64
 * elements x group heads x (the tile's rows / group) tokens, 128-byte swizzle, zero
 * fill outside: a q tile's packed (token, head) rows are one box a 64-column block;
 * q_tma = 1 when it is set (the group divides the tile's rows), else 0: Q is gathered
 * by cp.async. ranks: msgl_prefill_ranks (read by the warp-specialised tiles only). */
#define MSGL_PREFILL_RANKS 256
/* The batch's sequences ranked by their q tiles, so that the warp-specialised tiles
 * find a grid item's sequence in the kernel's parameters instead of searching the
 * batch layout in memory (prefill_attention.cu: prefill_ranked_tile). count: the
 * sequences with new tokens, at most MSGL_PREFILL_RANKS (the engine's default
 * --max-running-requests, so that a default batch never searches; the kernel's
 * parameters are then ~7 KiB, past the 4 KiB of CUDA before 12.1 and within the
 * 32 KiB it allows on sm_70 and later); 0: no ranking (the kernel searches). Rank r
 * (0 <= r < count) is the sequence with the r-th most q tiles of the launched tile's
 * rows (ties in batch order): tiles[r] = ceil(q_len[r] * group / rows),
 * non-increasing in r; seq[r] its index in the batch, q_start[r] its first
 * token (q_indptr[seq]), q_len[r] >= 1 its new tokens, kv_len[r] its keys;
 * before[r] = sum over ranks j of min(tiles[j], tiles[r + 1]) (tiles[count] = 0):
 * the grid items of depth (q tiles from a sequence's end) below tiles[r + 1], where
 * the items of ranks 0..r alone begin. The launcher checks every field against the
 * tensors and the instance's rows. */
typedef struct msgl_prefill_ranks {
  int32_t count;
  int32_t reserved;
  int32_t before[MSGL_PREFILL_RANKS];
  int32_t tiles[MSGL_PREFILL_RANKS];
  int32_t seq[MSGL_PREFILL_RANKS];
  int32_t q_start[MSGL_PREFILL_RANKS];
  int32_t q_len[MSGL_PREFILL_RANKS];
  int32_t kv_len[MSGL_PREFILL_RANKS];
} msgl_prefill_ranks;

typedef struct msgl_prefill_params {
  msgl_tensor_map k_map;
  msgl_tensor_map v_map;
  msgl_tensor_map q_map;
  msgl_attention_params a;
  int32_t kv_tma_rows;
  int32_t q_tma;
  msgl_prefill_ranks ranks;
} msgl_prefill_params;

/*
 * Mixture of experts (Qwen3-MoE, Mixtral): routing, token batching by expert, the
 * grouped GEMMs over the experts and the sum over the top-k outputs. The flow of
 * one MoE layer over num_tokens tokens with top_k experts each (num_pairs =
 * num_tokens * top_k (token, slot) pairs, pair p = token * top_k + slot):
 *
 *   moe_route    router logits -> topk_ids [num_tokens, top_k] int32, topk_weights f32
 *   moe_align    topk_ids -> the pairs sorted by expert, each expert's run padded to
 *                BLOCK_M entries (padding = num_pairs), the expert of each block
 *                of BLOCK_M entries, the padded start of each expert's run
 *   moe_gemm     gate_up: act[row] = silu(x[tok] W1g^T) * (x[tok] W1u^T) for every
 *                row of the sorted list (GATE_UP = 1); down: part[pair] =
 *                weight[pair] * act[row] W2^T (GATE_UP = 0)
 *   moe_sum      out[t] = sum over the slots of part[t * top_k + slot]
 */
#define MSGL_MOE_MAX_EXPERTS 512
#define MSGL_MOE_MAX_TOP_K 32

/*
 * moe_align: a stable counting sort of the pairs by expert (pairs of one expert
 * keep their order), laid out as mini-sglang's moe_align_block_size does, with
 * every expert's run padded to a multiple of BLOCK_M rows:
 *   expert_offsets[e]  padded start of expert e's run, expert_offsets[num_experts]
 *                      the padded total;
 *   sorted_ids[i]      the pair at position i, or num_pairs for padding;
 *   block_experts[b]   the expert of positions [b * BLOCK_M, (b + 1) * BLOCK_M);
 *   tiles              the GEMM tiles: tiles[0] = their count, tiles[1] = tile_m,
 *                      tiles[2 + i] = the first row of tile i (tiles cut each
 *                      expert's run into pieces of at most tile_m rows).
 * Pairs whose expert id is outside [0, num_experts) are dropped. Positions past
 * the padded total are left unwritten. Phases: 0 counts and writes offsets, block
 * experts, tiles and padding (one block); 1 scatters the pairs (one block per
 * expert); 2 does both in one block (small batches). Instance parameter: BLOCK_M.
 */
typedef struct msgl_moe_align_params {
  const int32_t* topk_ids;     /* device, [num_pairs] */
  int32_t* sorted_ids;         /* device, [>= num_pairs + min(num_pairs, num_experts) * (BLOCK_M - 1)] */
  int32_t* block_experts;      /* device, [sorted_ids length / BLOCK_M] */
  int32_t* expert_offsets;     /* device, [num_experts + 1] */
  int32_t* tiles;              /* device, [2 + max tiles] */
  int64_t num_pairs;
  int32_t num_experts;         /* 1..MSGL_MOE_MAX_EXPERTS */
  int32_t tile_m;              /* rows per GEMM tile, a positive multiple of BLOCK_M */
  int32_t phase;
  int32_t reserved;
} msgl_moe_align_params;

/*
 * moe_route: for each token, the top_k experts by router logit (the largest
 * softmax probabilities; ties go to the lower expert index), their softmax
 * probabilities over all experts in f32, renormalised to sum to 1 over the chosen
 * experts when `renormalize` is set (Qwen3-MoE's norm_topk_prob). Phase 0: one
 * warp per token. Phase 1 (small batches): one block routes every token, then
 * runs moe_align's single-block sort on the result (`align`, whose topk_ids is
 * this op's). Phase 2 (moe_router_route, at most MSGL_MOE_ROUTER_MAX_TOKENS
 * tokens): the router's logits in the same launch, logits[t, e] = x[t] . w[e]
 * rounded to the dtype as the router GEMM's output would be, one block per expert
 * (f32 sums, fixed order), into the f32 scratch `logits_f32`; the last block to
 * finish (counted in `ticket`, which it sets back to zero) routes every token as
 * phase 0 does. Instance parameter: DTYPE (of the logits; phase 2: of x and w).
 */
#define MSGL_MOE_ROUTER_MAX_TOKENS 8
typedef struct msgl_moe_route_params {
  const void* logits;          /* device, [num_tokens, num_experts], rows logits_stride elements apart */
  int32_t* topk_ids;           /* device, [num_tokens, top_k] contiguous */
  float* topk_weights;         /* device, [num_tokens, top_k] contiguous */
  msgl_moe_align_params align; /* phase 1 only */
  int64_t num_tokens;
  int64_t logits_stride;       /* elements */
  int32_t num_experts;         /* 1..MSGL_MOE_MAX_EXPERTS */
  int32_t top_k;               /* 1..min(num_experts, MSGL_MOE_MAX_TOP_K) */
  int32_t renormalize;
  int32_t phase;
  /* Phase 2 only: */
  const void* x;               /* device, [num_tokens, hidden], rows x_stride elements apart, 16-byte aligned */
  const void* router_w;        /* device, [num_experts, hidden] contiguous, 16-byte aligned */
  float* logits_f32;           /* device, [num_tokens, num_experts] contiguous scratch */
  int32_t* ticket;             /* device, one int32: zero before the launch, left zero */
  int64_t x_stride;            /* elements */
  int32_t hidden;              /* a multiple of 16 bytes of elements */
  int32_t reserved;
} msgl_moe_route_params;

/*
 * moe_gemm: one grouped GEMM over the tiles of moe_align's sorted list. Tile i
 * covers rows [r0, r0 + rows) of the list, r0 = tiles[2 + i], all of expert
 * e = block_experts[r0 / block_m], rows = min(BM, expert_offsets[e + 1] - r0); it
 * multiplies its A rows by expert e's weights w[e] ([n_w, k], the HF Linear
 * layout):
 *   GATE_UP = 1: A row r = x[sorted_ids[r] / top_k] (zero for padding), w = the
 *     packed gate_up [num_experts, 2 n, k] (gate rows first), and
 *     out[r, j] = silu(A_r . w_gate[j]) * (A_r . w_up[j]) for j < n (out is the
 *     activation, [sorted rows, n], in sorted order);
 *   GATE_UP = 0: A row r = a[r] (the activation), w = down [num_experts, n, k], and
 *     out[sorted_ids[r], j] = topk_weights[sorted_ids[r]] * (A_r . w[j]) for
 *     non-padding rows (out is [num_pairs, n], by pair).
 * Tiles past tiles[0] do nothing, so the grid is sized from a bound (max_tiles)
 * and the launch needs no host copy of the counts. Instance parameters: DTYPE
 * (bf16 or f16, of a, w and out), TILE (the tile configuration, moe_gemm.cu's
 * table, whose BM must be the tile_m of `tiles`), GATE_UP.
 */
typedef struct msgl_moe_gemm_params {
  const void* a;               /* device: GATE_UP x [num_tokens, k]; else act [sorted rows, k]; rows a_stride apart */
  const void* w;               /* device, [num_experts, GATE_UP ? 2 n : n, k] contiguous */
  void* out;                   /* device: GATE_UP act [sorted rows, n]; else [num_pairs, n]; rows out_stride apart */
  const int32_t* sorted_ids;   /* device, moe_align's sorted list */
  const int32_t* block_experts;  /* device, moe_align's block experts */
  const int32_t* expert_offsets; /* device, [num_experts + 1] */
  const int32_t* tiles;        /* device, moe_align's tiles */
  const float* topk_weights;   /* device, [num_pairs] (GATE_UP = 0) */
  int64_t a_stride;            /* elements */
  int64_t out_stride;          /* elements */
  int64_t num_pairs;
  int32_t num_experts;
  int32_t top_k;
  int32_t n;                   /* output columns (GATE_UP: the intermediate size) */
  int32_t k;                   /* reduction length, a multiple of 64 */
  int32_t max_tiles;           /* tiles the grid covers (a bound on tiles[0]) */
  int32_t block_m;             /* moe_align's BLOCK_M */
} msgl_moe_gemm_params;

/*
 * moe_sum: out[t, h] = sum over slots s < top_k of w[t, s] * part[t * top_k + s, h]
 * in f32 (w = topk_weights, or 1 when NULL: the fused path applies the weights in
 * the down GEMM), skipping pairs whose expert id is outside [0, num_experts)
 * (dropped by moe_align). Instance parameter: DTYPE (of out and part).
 */
typedef struct msgl_moe_sum_params {
  void* out;                   /* device, [num_tokens, hidden] contiguous */
  const void* part;            /* device, [num_tokens * top_k, hidden] contiguous */
  const int32_t* topk_ids;     /* device, [num_tokens * top_k] */
  const float* topk_weights;   /* device, [num_tokens * top_k], or NULL */
  int64_t num_tokens;
  int64_t hidden;
  int32_t top_k;
  int32_t num_experts;
  int32_t vectorized;          /* 1: 16-byte vectors (hidden * element size % 16 == 0) */
  int32_t blocks_per_row;      /* blocks of 256 threads across one row of out */
} msgl_moe_sum_params;

/*
 * moe_decode: the experts of a decode step of a few tokens, per (token, slot) pair
 * straight from the routing (no sort), pair p = t * top_k + s, e = topk_ids[p]:
 *   GATE_UP = 1: out[p, j] = silu(a_t . w_gate[e, j]) * (a_t . w_up[e, j]), j < n
 *     (a = x [num_tokens, k], w = the packed gate_up [num_experts, 2 n, k]);
 *   GATE_UP = 0: out[t, j] = sum_s topk_weights[p] (a_p . w[e, j])
 *     (a = the activation [num_tokens * top_k, k], w = down [num_experts, n, k]).
 * Pairs whose expert id is outside [0, num_experts) are skipped. A block owns
 * cols_per_block columns of one pair (GATE_UP) or token. Instance parameters:
 * DTYPE (bf16 or f16, of a, w and out), GATE_UP.
 */
typedef struct msgl_moe_decode_params {
  const void* a;               /* device, rows a_stride elements apart, 16-byte aligned */
  const void* w;               /* device, [num_experts, GATE_UP ? 2 n : n, k] contiguous */
  void* out;                   /* device: GATE_UP [num_pairs, n]; else [num_tokens, n]; rows out_stride apart */
  const int32_t* topk_ids;     /* device, [num_tokens * top_k] */
  const float* topk_weights;   /* device, [num_tokens * top_k] (read by GATE_UP = 0) */
  int64_t a_stride;            /* elements */
  int64_t out_stride;          /* elements */
  int64_t num_tokens;
  int32_t num_experts;
  int32_t top_k;               /* 1..MSGL_MOE_MAX_TOP_K */
  int32_t n;                   /* output columns, a multiple of 8 */
  int32_t k;                   /* reduction length, a multiple of 8 */
  int32_t cols_per_block;
  int32_t bulk;                /* GATE_UP = 0, sm_90: 1 stages the block's weight rows by the copy engine
                                  before the wait; dynamic shared memory: top_k * (cols_per_block + 1) * k
                                  elements (the rows, then the token's act rows) */
  int32_t gate_up_unroll;      /* GATE_UP = 1: 16-byte vectors of a row a lane has in flight, 4 (or 0) or 2
                                  (the AOT library's lighter kernel: fewer registers, more blocks an SM;
                                  the same products in the same order) */
  int32_t reserved;
} msgl_moe_decode_params;

/* moe_align runs its single-block phase 2 up to this many pairs; moe_route fuses
 * the sort into the routing block up to MSGL_MOE_ROUTE_ALIGN_MAX pairs. */
#define MSGL_MOE_ALIGN_SMALL 4096
#define MSGL_MOE_ROUTE_ALIGN_MAX 256

#if !defined(__CUDACC_RTC__)

/* The message of the last failed launcher call on this thread ("" if none). */
MSGL_API const char* msgl_last_error(void);
/* MSGL_ABI_VERSION of the library, checked by the runtime at load. */
MSGL_API int32_t msgl_abi_version(void);

/* store: k/v [num_tokens, row] (row stride free, unit element stride), caches
 * [num_slots, row] contiguous, same dtype; indices [num_tokens] int32/int64. */
MSGL_API int32_t msgl_store_kv(const msgl_tensor* k_cache, const msgl_tensor* v_cache,
                      const msgl_tensor* indices, const msgl_tensor* k, const msgl_tensor* v,
                      msgl_stream stream);

/* index: out [num_tokens, row] contiguous, weight [num_rows, row] contiguous,
 * same dtype; ids [num_tokens] int32/int64. */
MSGL_API int32_t msgl_index(const msgl_tensor* out, const msgl_tensor* weight, const msgl_tensor* ids,
                   int64_t vocab_start, msgl_stream stream);

/* rms_norm: out [t, h] contiguous, x [t, h] unit last stride, weight [h], one dtype.
 * threads_per_row / rows_per_block / vectorized: the launch shape Rust chose. */
MSGL_API int32_t msgl_rms_norm(const msgl_tensor* out, const msgl_tensor* x, const msgl_tensor* weight, float eps,
                      int32_t threads_per_row, int32_t rows_per_block, int32_t vectorized, msgl_stream stream);

/* fused_add_rms_norm: x, residual [t, h] unit last stride (both written), weight [h]. */
MSGL_API int32_t msgl_fused_add_rms_norm(const msgl_tensor* x, const msgl_tensor* residual, const msgl_tensor* weight,
                                float eps, int32_t threads_per_row, int32_t rows_per_block, int32_t vectorized,
                                msgl_stream stream);

/* head_rms_norm: x [t, heads, d] unit last stride (written in place), weight [d]. */
MSGL_API int32_t msgl_head_rms_norm(const msgl_tensor* x, const msgl_tensor* weight, float eps, int32_t threads_per_row,
                           int32_t rows_per_block, int32_t vectorized, msgl_stream stream);

/* rope: q [t, hq, d], k [t, hk, d] (unit last stride, written in place), positions [t]
 * int32/int64, cos_sin [max_positions, rotary_dim] f32 contiguous. grid: blocks of 256. */
MSGL_API int32_t msgl_rope(const msgl_tensor* q, const msgl_tensor* k, const msgl_tensor* positions,
                  const msgl_tensor* cos_sin, int32_t vectorized, int32_t grid, msgl_stream stream);

/* rope_store: q [t, hq, d], k and v [t, hkv, d] (unit last stride; q written in place),
 * k_cache and v_cache [slots, hkv, d] contiguous (any leading shape of that many
 * elements: [pages, page_size, hkv, d]), positions and out_loc [t] int32/int64,
 * cos_sin [max_positions, rotary_dim] f32 contiguous, q_weight and k_weight [d] or
 * both NULL; one float dtype. threads_per_head / vectorized: the launch shape Rust chose;
 * launch_first: msgl_rope_store_params.launch_first. */
MSGL_API int32_t msgl_rope_store(const msgl_tensor* q, const msgl_tensor* k, const msgl_tensor* v,
                                 const msgl_tensor* k_cache, const msgl_tensor* v_cache,
                                 const msgl_tensor* positions, const msgl_tensor* out_loc,
                                 const msgl_tensor* cos_sin, const msgl_tensor* q_weight,
                                 const msgl_tensor* k_weight, float eps, int32_t threads_per_head,
                                 int32_t vectorized, int32_t launch_first, msgl_stream stream);

/* skinny_gemm: out [m, n] contiguous, x [m, k] (unit last stride, 16-byte aligned
 * rows), w [n, k] contiguous, bias [n] or NULL; bf16/f16; m <= 16, k % 32 == 0.
 * m_tiles: the M_TILES instance (1 or 2); k_splits: blocks of a cluster that share
 * one tile's K (1..8, at most k / 32); gated: 1 for the GATED instance (w [2n, k],
 * bias [2n], out [m, n] = silu(gate) * up); prefetch_steps: k-steps of w per warp
 * staged in shared memory before the grid dependency wait (0..12 / m_tiles);
 * bulk_prefetch: 1 (sm_90, prefetch_steps 0) to stage instead the block's whole
 * slice of w with the copy engine (msgl_skinny_gemm_params.bulk_prefetch).
 * residual, residual_out, norm_w: NULL, or all three for the NORM instance (the
 * pre-norm residual step first: residual [m, k] like x, residual_out [m, k]
 * contiguous and not overlapping x or residual, norm_w [k] contiguous; k <= 2048
 * so that the normalised rows fit shared memory), with eps. */
MSGL_API int32_t msgl_skinny_gemm(const msgl_tensor* out, const msgl_tensor* x, const msgl_tensor* w,
                                  const msgl_tensor* bias, const msgl_tensor* residual,
                                  const msgl_tensor* residual_out, const msgl_tensor* norm_w, float eps,
                                  int32_t m_tiles, int32_t k_splits, int32_t gated, int32_t prefetch_steps,
                                  int32_t bulk_prefetch, msgl_stream stream);

/* skinny_tiled: out [m, n] contiguous, x [m, k] (unit last stride, 16-byte aligned
 * rows), w [n, k] contiguous, bias [n] or NULL; bf16/f16; m >= 1, k % 32 == 0.
 * n_tiles: the N_TILES instance (1, 2, 4, 8, 16; m above 8 n_tiles runs row groups);
 * warps_n, chunk, stages: the block shape and pipeline (msgl_skinny_tiled_params);
 * k_splits: blocks of a cluster sharing one tile's K (1..8, at most k / 32). */
MSGL_API int32_t msgl_skinny_tiled(const msgl_tensor* out, const msgl_tensor* x, const msgl_tensor* w,
                                   const msgl_tensor* bias, int32_t n_tiles, int32_t warps_n, int32_t chunk,
                                   int32_t stages, int32_t k_splits, msgl_stream stream);
/* The dynamic shared memory (bytes) one skinny_tiled block takes for a plan, or -1
 * for an invalid plan: max(stages stages of weights and x, the partial tiles). */
MSGL_API int64_t msgl_skinny_tiled_smem_bytes(int32_t n_tiles, int32_t warps_n, int32_t chunk, int32_t stages);

/* stream_gemm: out [m, n] contiguous, x [m, k] (unit last stride, 16-byte aligned
 * rows), w [n, k] contiguous, bias [n] or NULL; bf16/f16; 1 <= m <= 16, k % 32 == 0;
 * sm_90 or newer. w_map, x_map: their tensor maps (msgl_tensor_map: bf16/f16, 2-D,
 * dims {k, rows}, boxes {256, 16} for w and {256, 8 N_TILES} for x, no swizzle,
 * zero fill; or, whole_rows = 1 (k % 256 == 0), 3-D views {256, k / 256, rows} with
 * boxes {256, chunk / 256, 16} and {256, chunk / 256, 8 N_TILES}; gpu/stream_gemm.rs
 * builds them). chunk: k elements a stage (256, 512, 1024); stages: the pipeline
 * depth (2..8, within the shared memory an SM has: msgl_stream_gemm_smem_bytes);
 * blocks: the persistent grid (1..ceil(n / 16), one an SM). */
MSGL_API int32_t msgl_stream_gemm(const msgl_tensor* out, const msgl_tensor* x, const msgl_tensor* w,
                                  const msgl_tensor* bias, const msgl_tensor_map* w_map,
                                  const msgl_tensor_map* x_map, int32_t whole_rows, int32_t chunk,
                                  int32_t stages, int32_t blocks, msgl_stream stream);
/* The dynamic shared memory (bytes) of one stream_gemm block, or -1 for an invalid
 * n_tiles (1, 2), chunk or stage count. */
MSGL_API int64_t msgl_stream_gemm_smem_bytes(int32_t n_tiles, int32_t chunk, int32_t stages);

/* fill_uniform: out [numel] contiguous, f32/f16/bf16; grid blocks of 256 threads
 * (grid-stride loop: any positive grid gives the same values). */
MSGL_API int32_t msgl_fill_uniform(const msgl_tensor* out, uint64_t seed, float center, float half_width,
                                   int32_t grid, msgl_stream stream);

/* silu_mul: out [t, i] contiguous, x [t, 2i] contiguous, same dtype. */
MSGL_API int32_t msgl_silu_mul(const msgl_tensor* out, const msgl_tensor* x, int32_t vectorized, msgl_stream stream);

/* argmax: out [b] int32, x [b, v] unit last stride; partial_value [b, num_splits] f32 and
 * partial_index [b, num_splits] int32 scratch when num_splits > 1 (else may be NULL). */
MSGL_API int32_t msgl_argmax(const msgl_tensor* out, const msgl_tensor* x, const msgl_tensor* partial_value,
                    const msgl_tensor* partial_index, int32_t num_splits, int64_t split_len, int32_t vectorized,
                    msgl_stream stream);

/* sample: logits [rows, vocab] f32/f16/bf16 (unit inner stride), params [rows, 5] f32
 * contiguous, out [rows] int32. */
MSGL_API int32_t msgl_sample(const msgl_tensor* logits, const msgl_tensor* params, const msgl_tensor* out,
                             msgl_stream stream);

/* token_mask: logits [rows, vocab] f32/f16/bf16 (unit inner stride), mask [num_masked, words]
 * int32 (bits) contiguous, rows [num_masked] int32 contiguous (each < logits rows). */
MSGL_API int32_t msgl_token_mask(const msgl_tensor* logits, const msgl_tensor* mask, const msgl_tensor* rows,
                                 msgl_stream stream);

/* penalty_count: counts [num_slots, vocab] int32 contiguous, slots and tokens [n] int32
 * contiguous; mode 0 counts output tokens, mode 1 marks prompt tokens. */
MSGL_API int32_t msgl_penalty_count(const msgl_tensor* counts, const msgl_tensor* slots, const msgl_tensor* tokens,
                                    int32_t mode, msgl_stream stream);

/* apply_penalties: logits [rows, vocab] f32/f16/bf16 (unit inner stride), counts [slots,
 * vocab] int32 contiguous, rows and slots [n] int32, penalties [n, 3] f32, all contiguous
 * (row and slot indices checked by the caller). */
MSGL_API int32_t msgl_apply_penalties(const msgl_tensor* logits, const msgl_tensor* counts, const msgl_tensor* rows,
                                      const msgl_tensor* slots, const msgl_tensor* penalties, msgl_stream stream);

/* logprobs: logits [rows, vocab] f32/f16/bf16 (unit inner stride), rows [n] int32 (each <
 * logits rows, checked by the caller), sampled [logits rows] int32, out [n, >= 2 + 2 *
 * top_n] int32, all contiguous but the logits; top_n <= 20. */
MSGL_API int32_t msgl_logprobs(const msgl_tensor* logits, const msgl_tensor* rows, const msgl_tensor* sampled,
                               const msgl_tensor* out, int64_t top_n, msgl_stream stream);

/* cast: dst and src of one shape (any strides), float dtypes. */
MSGL_API int32_t msgl_cast(const msgl_tensor* dst, const msgl_tensor* src, msgl_stream stream);

/* copy: dst and src of one shape and dtype (any strides). */
MSGL_API int32_t msgl_copy(const msgl_tensor* dst, const msgl_tensor* src, msgl_stream stream);

/* paged_attention: tensors as in msgl_attention_params; `plan` carries the launch
 * decomposition Rust chose (num_warps, num_q_tiles, kv_chunk, max_splits,
 * scale_log2; its pointer, stride and size fields are ignored); mma selects the
 * instance (1: tensor cores). o_partial / lse_partial may be NULL when
 * plan->max_splits == 1. */
MSGL_API int32_t msgl_paged_attention(const msgl_tensor* out, const msgl_tensor* q, const msgl_tensor* k_cache,
                             const msgl_tensor* v_cache, const msgl_tensor* q_indptr, const msgl_tensor* kv_lens,
                             const msgl_tensor* block_table, const msgl_tensor* o_partial,
                             const msgl_tensor* lse_partial, const msgl_attention_params* plan, int32_t mma,
                             msgl_stream stream);

/* prefill_attention: the prefill kernel over the tensors of paged_attention (bf16 or
 * f16), for batches of long query runs; no key splits. `plan` carries num_q_tiles
 * (the batch's q tiles of the instance's query rows: prefill_attention.cu's
 * prefill_rows) and scale_log2, and max_splits = 1; tile selects the instance's
 * tile table entry. The grid is num_q_tiles * num_kv_heads blocks. k_map, v_map:
 * the caches' tensor maps for the tiles that copy K/V by TMA (msgl_prefill_params),
 * NULL for the others; q_map: q's map for those tiles when the group divides the
 * tile's rows, NULL for the rest (Q gathered by cp.async); ranks: the batch's
 * sequences ranked for the instance's rows (msgl_prefill_ranks; its q_start, q_len
 * and kv_len must agree with q_indptr and kv_lens), or NULL (the kernel searches);
 * item_counter: int32 [>= 2] zeros on q's device, which the dynamic tiles (48) draw
 * their items from and leave zero (params.split_counters in the kernel), or NULL for
 * the other tiles. */
MSGL_API int32_t msgl_prefill_attention(const msgl_tensor* out, const msgl_tensor* q, const msgl_tensor* k_cache,
                             const msgl_tensor* v_cache, const msgl_tensor* q_indptr, const msgl_tensor* kv_lens,
                             const msgl_tensor* block_table, const msgl_attention_params* plan,
                             const msgl_tensor_map* k_map, const msgl_tensor_map* v_map,
                             const msgl_tensor_map* q_map, const msgl_prefill_ranks* ranks,
                             const msgl_tensor* item_counter, int32_t tile, msgl_stream stream);

/* decode_attention: the decode kernel over the tensors of paged_attention, for
 * batches whose sequences have q_len * (num_q_heads / num_kv_heads) <= rows query
 * rows each (rows: the instance: 16 for the tensor-core block, bf16/f16; 1, 2, 4
 * or 8 for the CUDA-core block). `plan` carries kv_chunk, max_splits
 * and scale_log2 (num_warps and num_q_tiles are unused); the grid is num_seqs *
 * num_kv_heads * max_splits blocks of 128 threads. split_counters: int32 zeros of at
 * least num_seqs * num_kv_heads elements (left zero), or NULL; with them a split
 * launch merges its splits in its last blocks instead of a combine launch. */
MSGL_API int32_t msgl_decode_attention(const msgl_tensor* out, const msgl_tensor* q, const msgl_tensor* k_cache,
                             const msgl_tensor* v_cache, const msgl_tensor* q_indptr, const msgl_tensor* kv_lens,
                             const msgl_tensor* block_table, const msgl_tensor* o_partial,
                             const msgl_tensor* lse_partial, const msgl_tensor* split_counters,
                             const msgl_attention_params* plan, int32_t rows, msgl_stream stream);

/* moe_route: logits [t, e] (unit last stride; f32/f16/bf16); topk_ids [t, k] int32 and
 * topk_weights [t, k] f32 contiguous (written). */
MSGL_API int32_t msgl_moe_route(const msgl_tensor* topk_ids, const msgl_tensor* topk_weights, const msgl_tensor* logits,
                       int32_t renormalize, msgl_stream stream);

/* moe_route_align: moe_route, then moe_align of its ids, in one block (t k <=
 * MSGL_MOE_ROUTE_ALIGN_MAX); the sort's arguments as in moe_align. */
MSGL_API int32_t msgl_moe_route_align(const msgl_tensor* topk_ids, const msgl_tensor* topk_weights,
                             const msgl_tensor* sorted_ids, const msgl_tensor* block_experts,
                             const msgl_tensor* expert_offsets, const msgl_tensor* tiles, const msgl_tensor* logits,
                             int32_t renormalize, int32_t block_m, int32_t tile_m, msgl_stream stream);

/* moe_router_route: the router and moe_route in one launch (phase 2): x [t, h] (t <=
 * MSGL_MOE_ROUTER_MAX_TOKENS; unit last stride, 16-byte aligned rows), router_w [e, h]
 * contiguous of x's dtype, logits_f32 [t, e] f32 contiguous (scratch), ticket [>= 1]
 * int32 zeros (left zero); topk_ids, topk_weights as in moe_route. */
MSGL_API int32_t msgl_moe_router_route(const msgl_tensor* topk_ids, const msgl_tensor* topk_weights,
                              const msgl_tensor* x, const msgl_tensor* router_w, const msgl_tensor* logits_f32,
                              const msgl_tensor* ticket, int32_t renormalize, msgl_stream stream);

/* moe_align: topk_ids [t, k] int32 contiguous; sorted_ids [L] int32 with
 * L >= round_up(t k + min(t k, e) (block_m - 1), block_m); block_experts [L / block_m] int32;
 * expert_offsets [e + 1] int32; tiles [2 + ceil(L / tile_m) + min(t k, e)] int32 (all written;
 * e = the number of experts). */
MSGL_API int32_t msgl_moe_align(const msgl_tensor* sorted_ids, const msgl_tensor* block_experts,
                       const msgl_tensor* expert_offsets, const msgl_tensor* tiles, const msgl_tensor* topk_ids,
                       int32_t block_m, int32_t tile_m, msgl_stream stream);

/* moe_gemm: gate_up = 1: out = act [L, n], a = x [t, h], w = [e, 2n, h];
 * gate_up = 0: out = [t top_k, n], a = act [L, i], w = [e, n, i], topk_weights [t top_k] f32.
 * sorted_ids, block_experts, expert_offsets and tiles as moe_align wrote them, with tile_m =
 * the BM of `tile`; topk_weights may be NULL when gate_up = 1. pdl = 1 launches with
 * programmatic stream serialization (the kernel may start before the previous one ends;
 * gate_up must follow the sort, down must follow gate_up). */
MSGL_API int32_t msgl_moe_gemm(const msgl_tensor* out, const msgl_tensor* a, const msgl_tensor* w,
                      const msgl_tensor* sorted_ids, const msgl_tensor* block_experts,
                      const msgl_tensor* expert_offsets, const msgl_tensor* tiles,
                      const msgl_tensor* topk_weights, int32_t top_k, int32_t tile, int32_t gate_up,
                      int32_t pdl, msgl_stream stream);

/* moe_sum: out [t, h] and part [t k, h] contiguous, one dtype; topk_ids [t, k] int32;
 * topk_weights [t, k] f32 contiguous or NULL; pdl as in moe_gemm. */
MSGL_API int32_t msgl_moe_sum(const msgl_tensor* out, const msgl_tensor* part, const msgl_tensor* topk_ids,
                     const msgl_tensor* topk_weights, int32_t num_experts, int32_t pdl, msgl_stream stream);

/* moe_decode: out, a, w one dtype (bf16/f16), w [E, n_w, k] contiguous, a rows 16-byte
 * aligned; topk_ids [t, k] int32 and topk_weights [t, k] f32 contiguous; gate_up 1 or 0;
 * cols_per_block > 0; bulk 0, or 1 for the down pass on sm_90, and gate_up_unroll 0, 2 or 4
 * (msgl_moe_decode_params);
 * pdl as in moe_gemm (gate_up after the router, down after gate_up). */
MSGL_API int32_t msgl_moe_decode(const msgl_tensor* out, const msgl_tensor* a, const msgl_tensor* w,
                        const msgl_tensor* topk_ids, const msgl_tensor* topk_weights, int32_t gate_up,
                        int32_t cols_per_block, int32_t bulk, int32_t gate_up_unroll, int32_t pdl,
                        msgl_stream stream);

#endif /* !__CUDACC_RTC__ */

#ifdef __cplusplus
} /* extern "C" */
#endif

#if defined(__cplusplus) && !defined(__CUDACC_RTC__)
static_assert(sizeof(msgl_tensor) == 120, "msgl_tensor layout changed: bump MSGL_ABI_VERSION, run cargo xtask codegen");
static_assert(sizeof(msgl_store_params) == 80, "msgl_store_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_index_params) == 56, "msgl_index_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_norm_params) == 112, "msgl_norm_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_rope_params) == 104, "msgl_rope_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_silu_mul_params) == 40, "msgl_silu_mul_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_argmax_params) == 80, "msgl_argmax_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_sample_params) == 48, "msgl_sample_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_token_mask_params) == 64, "msgl_token_mask_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_penalty_count_params) == 48, "msgl_penalty_count_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_apply_penalties_params) == 72, "msgl_apply_penalties_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_logprobs_params) == 72, "msgl_logprobs_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_convert_params) == 176, "msgl_convert_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_attention_params) == 368, "msgl_attention_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_moe_route_params) == 168, "msgl_moe_route_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_moe_align_params) == 64, "msgl_moe_align_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_moe_gemm_params) == 112, "msgl_moe_gemm_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_moe_sum_params) == 64, "msgl_moe_sum_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_moe_decode_params) == 96, "msgl_moe_decode_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_rope_store_params) == 192, "msgl_rope_store_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_fill_uniform_params) == 32, "msgl_fill_uniform_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_skinny_gemm_params) == 112, "msgl_skinny_gemm_params layout changed: run cargo xtask codegen");
static_assert(sizeof(msgl_skinny_tiled_params) == 80, "msgl_skinny_tiled_params layout changed: run cargo xtask codegen");
#endif

#endif /* MINISGL_TENSOR_H */
