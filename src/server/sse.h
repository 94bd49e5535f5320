// Server-sent events as OpenAI and SGLang stream them: each event is one
// "data: <json>\n\n" line, and the stream ends with "data: [DONE]\n\n".
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace megactx::server {

inline constexpr const char* kEventStreamType = "text/event-stream";

std::string sse_event(const nlohmann::json& payload);
std::string sse_done();

}  // namespace megactx::server
