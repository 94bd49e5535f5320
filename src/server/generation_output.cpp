#include "server/generation_output.h"

namespace megactx::server {

void GenerationOutput::add(const RequestUpdate& update) {
  text += update.new_text;
  output_ids.insert(output_ids.end(), update.new_token_ids.begin(), update.new_token_ids.end());
  output_logprobs.insert(output_logprobs.end(), update.new_logprobs.begin(),
                         update.new_logprobs.end());
  if (!update.input_logprobs.empty()) input_logprobs = update.input_logprobs;
  // Counters are totals so far; the engine may send 0 before it knows them.
  if (update.prompt_tokens > 0) prompt_tokens = update.prompt_tokens;
  completion_tokens =
      std::max<int64_t>(update.completion_tokens, static_cast<int64_t>(output_ids.size()));
  if (update.cached_tokens > 0) cached_tokens = update.cached_tokens;
  spec_accept_token_num = std::max(spec_accept_token_num, update.spec_accept_token_num);
  spec_draft_token_num = std::max(spec_draft_token_num, update.spec_draft_token_num);
  spec_verify_ct = std::max(spec_verify_ct, update.spec_verify_ct);
  if (!update.weight_version.empty() &&
      (weight_versions.empty() || weight_versions.back() != update.weight_version))
    weight_versions.push_back(update.weight_version);
  if (update.finish != FinishReason::None) {
    finish = update.finish;
    finish_detail = update.finish_detail;
    server_error = update.server_error;
    matched_stop_token = update.matched_stop_token;
    routed_experts = update.routed_experts;
    hidden_states = update.hidden_states;
  }
}

}  // namespace megactx::server
