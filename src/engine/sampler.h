// Sampler: turns one logits row per sequence into the next token. The CPU
// implementation is cpu_sampler.h; a CUDA one implements the same interface
// over device logits.
//
// Semantics (vLLM / SGLang):
//  * logit_bias added to the raw logits first (OpenAI), then
//  * penalties: repetition (HF/vLLM: tokens of prompt and
//    output -- recent SGLang counts output tokens only; logit / p when
//    positive, * p otherwise), frequency (minus f times
//    the count in the output), presence (minus p once for tokens in the output);
//  * while fewer than min_new_tokens were generated, eos and stop ids are masked;
//  * a structured-output row's grammar mask (SamplingRow::allowed) sets every
//    token it leaves out to -inf, after the penalties, so greedy, top-k/p and
//    min-p all act on the allowed tokens only;
//  * temperature < 1e-5 or top_k == 1: greedy (argmax, lowest id on ties);
//    top_k -1 or 0 means no top-k (vLLM accepts both);
//  * otherwise softmax(logits / T), then top_k, then top_p over the
//    renormalised top-k (keep a token while the mass before it is <= top_p),
//    then min_p (keep p >= min_p * p_max), then one draw by inverse CDF over
//    the kept tokens in id order (no sort needed when no top_p is set).
//  * logprobs: log_softmax of the *unmodified* model logits (before penalties,
//    temperature and masks), as SGLang returns them with
//    SGLANG_RETURN_ORIGINAL_LOGPROB=1 and vLLM with its default raw_logprobs
//    mode. RL trainers compare against these. A request with
//    temp_scaled_logprobs gets log_softmax(logits / temperature) instead
//    (SGLang's default), and token_ids_logprob adds the logprobs of given ids.
//  * randomness: the uniform of output token i of a request is a hash of
//    (seed, i), so a seeded request gives the same tokens in any batch, after
//    preemption, and on any backend that uses the same draw.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "engine/request.h"

namespace megactx {

struct SamplingRow {
  int64_t logits_row = 0;  // which row of the logits tensor
  const SamplingParams* params = nullptr;
  // Output token counts (frequency/presence/repetition penalties); may be null
  // when no penalty is set.
  const std::unordered_map<int32_t, int32_t>* output_counts = nullptr;
  // Distinct prompt tokens (repetition penalty); may be empty otherwise.
  std::span<const int32_t> prompt_tokens;
  // Ids masked while min_new_tokens is not reached (eos + stop ids); empty otherwise.
  std::span<const int32_t> masked_tokens;
  // Structured output: [ceil(vocab / 32)] words, bit i % 32 of word i / 32 set
  // when token i may come next (grammar::GrammarMatcher's bitmask); empty:
  // every token. At least one allowed token.
  std::span<const uint32_t> allowed;
  uint64_t seed = 0;
  uint64_t draw_index = 0;  // number of tokens the request generated before this one
  bool want_logprob = false;
  int64_t top_logprobs = 0;
  // Logprobs of these ids too; and of logits / logprob_temperature.
  std::span<const int32_t> logprob_token_ids;
  double logprob_temperature = 1.0;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                              // under the unmodified distribution
  std::vector<std::pair<int32_t, float>> top;        // top_logprobs alternatives, best first
  std::vector<std::pair<int32_t, float>> token_ids;  // logprob_token_ids, in order
};

// A logprob asked for without sampling (input tokens when scoring).
struct LogprobQuery {
  int64_t logits_row = 0;
  int32_t token = 0;
  int64_t top_logprobs = 0;
  std::span<const int32_t> token_ids;  // as SamplingRow::logprob_token_ids
  double temperature = 1.0;            // as SamplingRow::logprob_temperature
};

// Rejection-sampling verification of one request's sampled drafts where its
// k + 1 target rows are (data-parallel ranks keep their rows;
// engine/rejection_sampler.h's two parts): rows logits_row .. logits_row + k,
// each row's distribution sampling_distribution(params) of its logits after
// its grammar mask (`allowed`: k + 1 masks of ceil(vocab / 32) words, or
// empty), q_at_draft[i] = q_i(d_i) (1 for a greedy draft), and the uniforms
// sampling_uniform(seed, first_draw + j), one per accept test, then one for
// the bonus token.
struct DraftCheck {
  int64_t logits_row = 0;
  const SamplingParams* params = nullptr;
  std::span<const int32_t> drafts;
  std::span<const float> q_at_draft;
  std::span<const uint32_t> allowed;
  uint64_t seed = 0, first_draw = 0;
};

// Drafts that passed (k: all), and with all passed the bonus token drawn from
// row k; -1 when one was rejected (its residual needs the draft's whole
// distribution, which the caller holds: it asks for that row's
// DistributionQuery).
struct DraftVerdict {
  int64_t accepted = 0;
  int32_t bonus = -1;
};

// One row's distribution as DraftCheck computes it (`allowed`: one mask or empty).
struct DistributionQuery {
  int64_t logits_row = 0;
  const SamplingParams* params = nullptr;
  std::span<const uint32_t> allowed;
};

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Rejection-sampling verification where the rows are (DraftCheck,
  // DistributionQuery); the defaults compute on the host from rows_on_host.
  virtual void check_drafts(const Tensor& logits, std::span<const DraftCheck> checks,
                            std::span<DraftVerdict> verdicts);
  virtual void distributions(const Tensor& logits, std::span<const DistributionQuery> queries,
                             std::span<std::vector<float>> out);
  // Rows `rows` of `logits` as host float32 [rows.size(), vocab]; the default
  // copies them from a host tensor.
  virtual Tensor rows_on_host(const Tensor& logits, std::span<const int64_t> rows);
  // log_softmax of the unmodified logits row at the query's token (and the
  // top alternatives); results[i] for queries[i]. Only scoring requests
  // (logprob_start_len >= 0) call it; the default says it is unsupported.
  virtual void score(const Tensor& logits, std::span<const LogprobQuery> queries,
                     std::span<TokenLogprob> results);
  // logits: [rows, vocab] float32 (host for the CPU sampler); results[i] for rows[i].
  virtual void sample(const Tensor& logits, std::span<const SamplingRow> rows,
                      std::span<SampleResult> results) = 0;
};

// The uniform in [0, 1) used for draw `draw_index` of a request seeded `seed`.
double sampling_uniform(uint64_t seed, uint64_t draw_index);

}  // namespace megactx
