/*
 * minisgl/attention_host.h: the host-side argument checks both attention launchers
 * share (msgl_paged_attention and msgl_decode_attention take the same tensors and
 * the same msgl_attention_params), and the filling of the params from the tensors.
 *
 * Host code only (check.h): never included by device sources compiled with NVRTC.
 */
#ifndef MINISGL_ATTENTION_HOST_H
#define MINISGL_ATTENTION_HOST_H

#include "minisgl/check.h"

namespace msgl {

/* Validates the tensors of a paged attention call (shapes, dtypes, contiguity,
 * 16-byte rows, GQA, the split scratch when plan->max_splits > 1) and fills
 * `params` from `plan` (kv_chunk, max_splits, scale_log2 and the launch fields the
 * caller's kernel uses) and the tensors. Returns MSGL_OK or the error it recorded. */
inline int32_t attention_check_and_fill(const char* op, const msgl_tensor* out, const msgl_tensor* q,
                                        const msgl_tensor* k_cache, const msgl_tensor* v_cache,
                                        const msgl_tensor* q_indptr, const msgl_tensor* kv_lens,
                                        const msgl_tensor* block_table, const msgl_tensor* o_partial,
                                        const msgl_tensor* lse_partial, const msgl_attention_params* plan,
                                        msgl_attention_params* params) {
  constexpr uint32_t floats = dtype_bit(MSGL_F32) | dtype_bit(MSGL_F16) | dtype_bit(MSGL_BF16);
  MSGL_TRY(expect_tensor(out, op, "out", 3, floats));
  MSGL_TRY(expect_tensor(q, op, "q", 3, floats));
  MSGL_TRY(expect_tensor(k_cache, op, "k_cache", 4, floats));
  MSGL_TRY(expect_tensor(v_cache, op, "v_cache", 4, floats));
  MSGL_TRY(expect_tensor(q_indptr, op, "q_indptr", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(kv_lens, op, "kv_lens", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(block_table, op, "block_table", 2, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_same(q, "q", out, "out", op));
  MSGL_TRY(expect_same(q, "q", k_cache, "k_cache", op));
  MSGL_TRY(expect_same(q, "q", v_cache, "v_cache", op));
  for (const msgl_tensor* t : {q_indptr, kv_lens, block_table})
    if (t->device != q->device)
      return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: the batch layout tensors must be on the device of `q`", op);
  if (plan == nullptr) return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `plan` is null", op);
  const int64_t num_tokens = q->shape[0], num_q_heads = q->shape[1], head_dim = q->shape[2];
  const int64_t num_kv_heads = k_cache->shape[2];
  const int64_t num_seqs = kv_lens->shape[0];
  for (int d = 0; d < 4; ++d) MSGL_TRY(expect_dim(v_cache, op, "v_cache", d, k_cache->shape[d]));
  MSGL_TRY(expect_dim(k_cache, op, "k_cache", 3, head_dim));
  MSGL_TRY(expect_dim(out, op, "out", 0, num_tokens));
  MSGL_TRY(expect_dim(out, op, "out", 1, num_q_heads));
  MSGL_TRY(expect_dim(out, op, "out", 2, head_dim));
  MSGL_TRY(expect_dim(q_indptr, op, "q_indptr", 0, num_seqs + 1));
  MSGL_TRY(expect_contiguous(out, op, "out"));
  MSGL_TRY(expect_contiguous(k_cache, op, "k_cache"));
  MSGL_TRY(expect_contiguous(v_cache, op, "v_cache"));
  MSGL_TRY(expect_contiguous(q_indptr, op, "q_indptr"));
  MSGL_TRY(expect_contiguous(kv_lens, op, "kv_lens"));
  MSGL_TRY(expect_contiguous(block_table, op, "block_table"));
  MSGL_TRY(expect_rows(q, op, "q", 16));
  MSGL_TRY(expect_rows(out, op, "out", 16));
  MSGL_TRY(expect_rows(k_cache, op, "k_cache", 16));
  MSGL_TRY(expect_rows(v_cache, op, "v_cache", 16));
  if (num_kv_heads <= 0 || num_q_heads % num_kv_heads != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: query heads %lld are not a multiple of kv heads %lld", op,
                     static_cast<long long>(num_q_heads), static_cast<long long>(num_kv_heads));
  if (block_table->shape[0] < num_seqs)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: argument `block_table` has %lld rows for %lld sequences", op,
                     static_cast<long long>(block_table->shape[0]), static_cast<long long>(num_seqs));
  /* kv_chunk 0: per-sequence equal chunks (attention_row_chunk); the tile
   * launcher requires a fixed chunk and checks it itself. */
  if (plan->kv_chunk < 0 || plan->max_splits < 1 || plan->min_chunk < 0 || plan->min_chunk % 64 != 0)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: bad plan (kv_chunk %d, max_splits %d, min_chunk %d)", op,
                     plan->kv_chunk, plan->max_splits, plan->min_chunk);
  msgl_attention_params& p = *params;
  p = *plan;
  if (p.max_splits > 1) {
    MSGL_TRY(expect_tensor(o_partial, op, "o_partial", 4, dtype_bit(MSGL_F32)));
    MSGL_TRY(expect_tensor(lse_partial, op, "lse_partial", 3, dtype_bit(MSGL_F32)));
    const int64_t o_shape[4] = {num_tokens, num_q_heads, p.max_splits, head_dim};
    for (int d = 0; d < 4; ++d) MSGL_TRY(expect_dim(o_partial, op, "o_partial", d, o_shape[d]));
    for (int d = 0; d < 3; ++d) MSGL_TRY(expect_dim(lse_partial, op, "lse_partial", d, o_shape[d]));
    MSGL_TRY(expect_contiguous(o_partial, op, "o_partial"));
    MSGL_TRY(expect_contiguous(lse_partial, op, "lse_partial"));
    p.o_partial = static_cast<float*>(o_partial->data);
    p.lse_partial = static_cast<float*>(lse_partial->data);
  } else {
    p.o_partial = nullptr;
    p.lse_partial = nullptr;
  }
  p.split_counters = nullptr; /* the decode launcher sets it from its own argument */
  p.out = out->data;
  p.q = q->data;
  p.k_cache = k_cache->data;
  p.v_cache = v_cache->data;
  p.q_indptr = static_cast<const int32_t*>(q_indptr->data);
  p.kv_lens = static_cast<const int32_t*>(kv_lens->data);
  p.block_table = static_cast<const int32_t*>(block_table->data);
  p.q_token_stride = q->strides[0];
  p.q_head_stride = q->strides[1];
  p.num_tokens = num_tokens;
  p.num_pages = k_cache->shape[0];
  p.num_seqs = static_cast<int32_t>(num_seqs);
  p.num_q_heads = static_cast<int32_t>(num_q_heads);
  p.num_kv_heads = static_cast<int32_t>(num_kv_heads);
  p.page_size = static_cast<int32_t>(k_cache->shape[1]);
  p.max_pages = static_cast<int32_t>(block_table->shape[1]);
  p.phase = 0;
  return MSGL_OK;
}

}  // namespace msgl

#endif /* MINISGL_ATTENTION_HOST_H */
