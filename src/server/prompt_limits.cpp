#include "server/prompt_limits.h"

#include <fmt/format.h>

#include <algorithm>

#include "server/api_error.h"

namespace megactx::server {

int64_t resolve_max_new_tokens(int64_t prompt_tokens, std::optional<int64_t> requested,
                               int64_t max_context_tokens, bool clamp, const PromptParams& params) {
  if (prompt_tokens == 0) throw ApiError(400, "the prompt is empty", params.prompt);
  if (requested && *requested < 0)
    throw ApiError(400, fmt::format("'{}' must be >= 0, got {}", params.max_tokens, *requested),
                   params.max_tokens);
  if (max_context_tokens <= 0) return requested.value_or(128);
  // Scoring (max_new_tokens 0) may use the whole context; generation needs one more slot.
  bool scoring = requested && *requested == 0;
  if (prompt_tokens > max_context_tokens || (!scoring && prompt_tokens >= max_context_tokens))
    throw ApiError(400,
                   fmt::format("the prompt has {} tokens; this server's maximum context "
                               "length is {} tokens",
                               prompt_tokens, max_context_tokens),
                   params.prompt);
  int64_t room = max_context_tokens - prompt_tokens;
  if (!requested) return room;
  if (*requested <= room) return *requested;
  if (clamp) return room;
  throw ApiError(400,
                 fmt::format("this server's maximum context length is {} tokens; the prompt has {} "
                             "tokens and {} = {} asks for {} more",
                             max_context_tokens, prompt_tokens, params.max_tokens, *requested,
                             prompt_tokens + *requested - max_context_tokens),
                 params.max_tokens);
}

}  // namespace megactx::server
