#include "server/sse.h"

#include "server/json_text.h"

namespace megactx::server {

// dump_json never emits a raw newline (it escapes them), so one data line holds
// the whole payload.
std::string sse_event(const nlohmann::json& payload) {
  return "data: " + dump_json(payload) + "\n\n";
}

std::string sse_done() {
  return "data: [DONE]\n\n";
}

}  // namespace megactx::server
