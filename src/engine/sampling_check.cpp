#include <fmt/format.h>

#include <cmath>

#include "engine/request.h"

namespace megactx {

std::optional<SamplingProblem> check_sampling(const SamplingParams& s, int64_t vocab_size) {
  auto problem = [](const char* param, std::string message) {
    return std::optional<SamplingProblem>(SamplingProblem{param, std::move(message)});
  };
  if (!(s.temperature >= 0.0 && std::isfinite(s.temperature)))
    return problem("temperature", fmt::format("temperature must be >= 0, got {}", s.temperature));
  if (!(s.top_p > 0.0 && s.top_p <= 1.0))
    return problem("top_p", fmt::format("top_p must be in (0, 1], got {}", s.top_p));
  if (s.top_k < -1)
    return problem("top_k",
                   fmt::format("top_k must be -1 (off), 0 (off) or >= 1, got {}", s.top_k));
  if (!(s.min_p >= 0.0 && s.min_p <= 1.0))
    return problem("min_p", fmt::format("min_p must be in [0, 1], got {}", s.min_p));
  if (!(s.repetition_penalty > 0.0 && s.repetition_penalty <= 2.0))
    return problem("repetition_penalty", fmt::format("repetition_penalty must be in (0, 2], got {}",
                                                     s.repetition_penalty));
  if (!(s.frequency_penalty >= -2.0 && s.frequency_penalty <= 2.0))
    return problem("frequency_penalty", fmt::format("frequency_penalty must be in [-2, 2], got {}",
                                                    s.frequency_penalty));
  if (!(s.presence_penalty >= -2.0 && s.presence_penalty <= 2.0))
    return problem("presence_penalty",
                   fmt::format("presence_penalty must be in [-2, 2], got {}", s.presence_penalty));
  if (s.max_new_tokens < 0)
    return problem("max_new_tokens",
                   fmt::format("max_new_tokens must be >= 0, got {}", s.max_new_tokens));
  if (s.min_new_tokens < 0 || s.min_new_tokens > s.max_new_tokens)
    return problem("min_new_tokens",
                   fmt::format("min_new_tokens must be in [0, max_new_tokens = {}], got {}",
                               s.max_new_tokens, s.min_new_tokens));
  for (const auto& [id, bias] : s.logit_bias) {
    if (id < 0 || id >= vocab_size)
      return problem("logit_bias", fmt::format("logit_bias token id {} is outside the vocabulary "
                                               "[0, {})",
                                               id, vocab_size));
    if (!(bias >= -100.0f && bias <= 100.0f))
      return problem(
          "logit_bias",
          fmt::format("logit_bias of token {} must be in [-100, 100], got {}", id, bias));
  }
  if (s.grammar) {
    // The grammar ends the output with its stop token: an output that ignores
    // eos, or must run past where the grammar may end, would break it.
    if (s.ignore_eos)
      return problem("ignore_eos",
                     "ignore_eos cannot be combined with structured output (the grammar ends the "
                     "output with the end-of-sequence token)");
    if (s.min_new_tokens > 0)
      return problem("min_new_tokens",
                     "min_new_tokens cannot be combined with structured output (the grammar "
                     "decides where the output ends)");
  }
  return std::nullopt;
}

}  // namespace megactx
