// The running totals of one engine request: text, ids, logprobs, counters and
// how it finished. Every endpoint adds engine updates here and formats the
// result in its own dialect.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"

namespace megactx::server {

struct GenerationOutput {
  std::string text;
  std::vector<int32_t> output_ids;
  std::vector<TokenLogprob> output_logprobs;
  std::vector<TokenLogprob> input_logprobs;
  FinishReason finish = FinishReason::None;
  std::string finish_detail;
  bool server_error = false;  // RequestUpdate::server_error of the final update
  std::optional<int32_t> matched_stop_token;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t spec_accept_token_num = 0;
  int64_t spec_draft_token_num = 0;
  int64_t spec_verify_ct = 0;
  // Versions of the weights that produced the tokens, in order, each once
  // (more than one when the weights changed while the request ran).
  std::vector<std::string> weight_versions;
  // return_routed_experts: [tokens - 1, layers, top_k] from the final update.
  std::vector<int32_t> routed_experts;
  // return_hidden_states: [tokens - 1, hidden] from the final update.
  std::vector<float> hidden_states;

  void add(const RequestUpdate& update);
  bool finished() const { return finish != FinishReason::None; }
};

// The HTTP status of a request that finished with FinishReason::Error: 500
// when the engine failed, 400 when the request was refused.
inline int error_status(bool server_error) {
  return server_error ? 500 : 400;
}

}  // namespace megactx::server
