// A /v1/chat/completions body parsed, checked and rendered once: the prompt
// text and ids, the sampling parameters (max_tokens resolved against the
// prompt, the structured-output grammar), the streaming and logprob flags and
// the output parser's options. The OpenAI endpoint (openai_chat.cpp) and the
// agent gateway (src/gateway/, which swaps in the ids it recorded for the
// session) both start here, so a session turn is validated exactly like a
// plain request; chat_message_json formats what both return.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "engine/request.h"
#include "server/chat_prompt.h"
#include "server/http_types.h"
#include "server/server_state.h"

namespace megactx::server {

struct ChatRequestPlan {
  nlohmann::json body;  // the request, parsed
  ChatPrompt rendered;  // prompt text and the tools the template saw
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;            // max_new_tokens resolved for prompt_ids
  std::optional<int64_t> max_tokens;  // as the request gave it
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int64_t top_logprobs = 0;
  size_t n = 1;
  bool skip_special_tokens_given = false;  // the request set skip_special_tokens
  OutputParserOptions parser_options;
};

// Throws ApiError (400 naming the field, 404 for an unknown model) before any
// engine work.
ChatRequestPlan plan_chat_request(ServerState& state, const HttpRequest& request);

// Replaces the prompt ids (the gateway's recorded ones) and resolves
// max_new_tokens again for their length; throws ApiError 400 when they leave
// no room.
void set_plan_prompt_ids(ServerState& state, ChatRequestPlan& plan, std::vector<int32_t> ids);

// The engine request of choice `k` (seed + k; special tokens kept in the text
// unless the request says otherwise, so the parser sees the markup).
GenerationRequest chat_generation_request(const ChatRequestPlan& plan, size_t k,
                                          const std::string& rid);

// OpenAI's assistant message: content (null when only tool calls),
// reasoning_content, tool_calls.
nlohmann::json chat_message_json(const ParsedMessage& parsed);

}  // namespace megactx::server
