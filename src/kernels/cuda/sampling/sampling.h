// Device sampling over float32 logits [rows, vocab] with the semantics of
// engine/sampler.h (the CPU sampler): greedy when temperature < 1e-5 or
// top_k == 1 (lowest id on ties); otherwise softmax(logits / T), top_k
// (prob desc, id asc), top_p over the renormalised top-k (keep while the mass
// before a token is <= top_p), min_p (p >= min_p * p_max), then one inverse-CDF
// draw in id order with the caller's uniform u (sampling_uniform(seed, i) on
// the host, so both backends draw the same token). Logprobs are log_softmax of
// the unmodified logits. A row may carry a token bitmask (structured output):
// tokens whose bit is clear get probability 0 and are never the greedy pick,
// exactly as the CPU sampler's -inf logits; the logprobs stay those of the
// unmodified logits. Penalties are applied to the logits before (not here).
// The host reads back only SampleOut rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

constexpr int kMaxTopLogprobs = 20;

struct SampleRowParams {
  int64_t logits_row = 0;
  float temperature = 1.0f;
  int32_t top_k = 0;  // <= 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  double uniform = 0.0;      // in [0, 1)
  int32_t top_logprobs = 0;  // <= kMaxTopLogprobs
  // Word offset of this row's mask in `masks` ([ceil(vocab / 32)] words, bit
  // i % 32 of word i / 32 set when token i is allowed; at least one is); -1: none.
  int64_t mask_offset = -1;
};

struct SampleOut {
  int32_t token = 0;
  float logprob = 0.0f;  // of `token` under log_softmax(logits)
  int32_t top_ids[kMaxTopLogprobs];
  float top_logprobs[kMaxTopLogprobs];
};

// rows/out are device arrays of `count` entries; one thread block per row.
// `masks`: the device words the rows' mask_offset point into (null when no row has one).
void sample_rows(const float* logits, int64_t vocab, const SampleRowParams* rows, int64_t count,
                 const uint32_t* masks, SampleOut* out, cudaStream_t stream);

}  // namespace megactx::cuda
