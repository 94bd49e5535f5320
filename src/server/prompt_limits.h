// Checks a prompt against the context length before any engine work, and
// picks/clamps the number of new tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace megactx::server {

// Returns the max_new_tokens to use. `requested` absent: what is left of the
// context. `clamp`: a too-large request is shortened (SGLang) instead of
// rejected with 400 (OpenAI/vLLM). Prompts that leave no room: 400 naming
// `prompt_param` (messages, prompt, text or input_ids); a request that asks
// for too many tokens: 400 naming `max_tokens_param`.
struct PromptParams {
  std::string prompt;
  std::string max_tokens;
};
int64_t resolve_max_new_tokens(int64_t prompt_tokens, std::optional<int64_t> requested,
                               int64_t max_context_tokens, bool clamp, const PromptParams& params);

}  // namespace megactx::server
