// The answer to a session turn in OpenAI's chat completion shape, whole or as
// a stream. A turn is generated whole before anything is sent (its tool calls
// are screened first, and an intercepted one is never shown), so a streamed
// turn arrives as a few chunks: the role, the reasoning, the content (with
// its logprobs), one chunk per tool call, the finish, usage when asked, then
// [DONE]. Both carry an extra "gateway" object (session, turn, trace, how the
// history matched, interceptions) that OpenAI clients ignore.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "server/http_types.h"

namespace megactx::gateway {

struct TurnReply {
  std::string id;
  int64_t created = 0;
  std::string model;
  nlohmann::json message;                  // the assistant message
  nlohmann::json finish_reason = nullptr;  // "stop", "tool_calls", "length", "abort"
  nlohmann::json matched_stop = nullptr;
  nlohmann::json logprobs = nullptr;  // {"content": [...]} when asked
  nlohmann::json usage = nlohmann::json::object();
  nlohmann::json gateway = nlohmann::json::object();
};

server::HttpResponse turn_response(const TurnReply& reply);
void stream_turn(server::ResponseChannel& channel, const TurnReply& reply, bool include_usage);

}  // namespace megactx::gateway
