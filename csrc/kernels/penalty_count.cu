/*
 * penalty_count.cu: the counters behind penalties on the GPU (tensor.h:
 * msgl_penalty_count_params). Each request with penalties owns a slot: a row of
 * `vocab` int32 counters, bit 30 set for the tokens of its prompt, the low 30 bits
 * counting its output tokens. MODE 1 marks prompt tokens when a slot is set up;
 * MODE 0 counts output tokens, both when a slot is set up (outputs known then) and
 * after every step's sampling, from the sampled ids on the device: the next step's
 * penalties see the token this one drew without the host knowing it yet.
 *
 * Decomposition: one thread per (slot, token) entry, atomics (a prompt repeats
 * tokens; two entries may name one counter).
 */
#include "minisgl/device.cuh"

namespace msgl {

constexpr int kPenaltyCountThreads = 256;
constexpr int kPromptBit = 1 << 30;

template <int MODE>
__device__ __forceinline__ void penalty_count_impl(const msgl_penalty_count_params& p) {
  const long long i = static_cast<long long>(blockIdx.x) * kPenaltyCountThreads + threadIdx.x;
  if (i >= p.n) return;
  const long long slot = p.slots[i];
  const long long token = p.tokens[i];
  if (slot < 0 || slot >= p.num_slots || token < 0 || token >= p.vocab) return;
  int* counter = p.counts + slot * p.vocab + token;
  if (MODE == 1) {
    atomicOr(counter, kPromptBit);
  } else {
    atomicAdd(counter, 1);
  }
}

}  // namespace msgl

#if defined(MSGL_JIT_INSTANCE)
/* One instance; launched from Rust with grid = ceil(n / 256), block = 256. */
extern "C" __global__ void __launch_bounds__(256) msgl_penalty_count_kernel(const msgl_penalty_count_params p) {
  msgl::penalty_count_impl<MSGL_MODE>(p);
}
#endif

#if !defined(__CUDACC_RTC__)
#include "minisgl/check.h"
#include "msgl_instances.inc" /* MSGL_FOR_EACH_INSTANCE(X): X(MODE) for each AOT instance */

namespace msgl {
template <int MODE>
__global__ void __launch_bounds__(256) penalty_count_kernel(const msgl_penalty_count_params p) {
  penalty_count_impl<MODE>(p);
}
}  // namespace msgl

extern "C" int32_t msgl_penalty_count(const msgl_tensor* counts, const msgl_tensor* slots, const msgl_tensor* tokens,
                                      int32_t mode, msgl_stream stream) {
  using namespace msgl;
  const char* op = "penalty_count";
  MSGL_TRY(expect_tensor(counts, op, "counts", 2, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(slots, op, "slots", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_tensor(tokens, op, "tokens", 1, dtype_bit(MSGL_I32)));
  MSGL_TRY(expect_dim(tokens, op, "tokens", 0, slots->shape[0]));
  MSGL_TRY(expect_contiguous(counts, op, "counts"));
  MSGL_TRY(expect_contiguous(slots, op, "slots"));
  MSGL_TRY(expect_contiguous(tokens, op, "tokens"));
  if (slots->device != counts->device || tokens->device != counts->device)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: arguments `counts`, `slots` and `tokens` must be on one device", op);
  const int64_t n = slots->shape[0];
  if (n == 0) return MSGL_OK;
  if (n > 0x7fffffffLL * kPenaltyCountThreads)
    return set_error(MSGL_ERR_INVALID_ARGUMENT, "%s: %lld entries exceed the grid limit", op, static_cast<long long>(n));
  msgl_penalty_count_params p{};
  p.counts = static_cast<int32_t*>(counts->data);
  p.slots = static_cast<const int32_t*>(slots->data);
  p.tokens = static_cast<const int32_t*>(tokens->data);
  p.vocab = counts->shape[1];
  p.num_slots = counts->shape[0];
  p.n = n;
  const unsigned grid = static_cast<unsigned>((n + kPenaltyCountThreads - 1) / kPenaltyCountThreads);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (mode) {
#define MSGL_CASE(M) \
  case M: penalty_count_kernel<M><<<grid, kPenaltyCountThreads, 0, s>>>(p); break;
    MSGL_FOR_EACH_INSTANCE(MSGL_CASE)
#undef MSGL_CASE
    default:
      return set_error(MSGL_ERR_NO_INSTANCE, "penalty_count: no AOT instance MODE=%d", mode);
  }
  return check_launch(op);
}
#endif
