// CpuSampler: the Sampler over host float32 logits, one row at a time. The
// steps are split into functions so tests can check each transform exactly.
#pragma once

#include <vector>

#include "engine/sampler.h"

namespace megactx {

class CpuSampler : public Sampler {
 public:
  void sample(const Tensor& logits, std::span<const SamplingRow> rows,
              std::span<SampleResult> results) override;
  void score(const Tensor& logits, std::span<const LogprobQuery> queries,
             std::span<TokenLogprob> results) override;
};

// Applies the logit bias, the penalties, the min_new_tokens mask and the
// grammar mask of `row` to `logits` in place.
void apply_penalties(const SamplingRow& row, std::span<float> logits);
// Sets the logits of tokens whose bit in `allowed` is clear to -inf.
void apply_token_mask(std::span<const uint32_t> allowed, std::span<float> logits);
// The distribution a non-greedy draw uses: probabilities after temperature,
// top_k, top_p and min_p, renormalised; masked tokens are exactly 0.
std::vector<float> sampling_distribution(const SamplingParams& params,
                                         std::span<const float> logits);
bool is_greedy(const SamplingParams& params);
// log_softmax of `logits` into `out`.
void log_softmax(std::span<const float> logits, std::span<float> out);
// Top `n` entries of `values` (value desc, id asc).
std::vector<std::pair<int32_t, float>> top_entries(std::span<const float> values, int64_t n);
int32_t argmax(std::span<const float> values);

}  // namespace megactx
