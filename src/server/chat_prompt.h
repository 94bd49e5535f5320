// The prompt a chat request renders to: the messages checked, tool_choice
// applied to the tools ("none" drops them, a named choice keeps that one),
// and the model's chat template run over the request with its keys in the
// client's order (HF's tojson keeps insertion order) and tool-call arguments
// decoded from JSON strings into objects, as vLLM does. /v1/chat/completions
// and /tokenize render with it, so what the page shows is what runs.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "server/chat_setup.h"

namespace megactx::server {

struct ChatPrompt {
  std::string text;
  nlohmann::json tools = nlohmann::json::array();  // the tools the template saw
};

// `body` is `raw_body` parsed; throws ApiError 400 naming the bad field.
ChatPrompt render_chat_prompt(const ChatSetup& chat, const nlohmann::json& body,
                              std::string_view raw_body);

}  // namespace megactx::server
