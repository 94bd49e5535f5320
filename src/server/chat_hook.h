// The one seam between the HTTP server and the agent gateway (src/gateway/):
// the server asks the hook whether it takes a chat request (the gateway takes
// those of a recorded session, X-Session-Id) and appends the hook's counters
// to /metrics. The server never depends on the gateway; the composition root
// (megactx serve) installs it with ServerState::set_chat_hook.
#pragma once

#include <memory>
#include <string>

#include "server/http_types.h"

namespace megactx::server {

class ServerState;

class ChatSessionHook {
 public:
  virtual ~ChatSessionHook() = default;
  // True when handle_chat answers this /v1/chat/completions request.
  virtual bool claims(const HttpRequest& request) const = 0;
  // Answers it on `channel`, like handle_chat_completions; may throw ApiError
  // before any work (the router turns it into the error response).
  virtual void handle_chat(ServerState& state, const HttpRequest& request,
                           std::shared_ptr<ResponseChannel> channel) = 0;
  // Prometheus text appended to /metrics.
  virtual std::string metrics_text() const = 0;
  // Server shutdown (ServerState::drain, while the workers still run): stop
  // the hook's own threads; work they had not started is dropped.
  virtual void shutdown() {}
};

}  // namespace megactx::server
