// The agentic rollout gateway (docs/gateway.md): a chat request with an
// X-Session-Id header is a turn of a recorded agent session
// (session_turn.h); the gateway's routes read and export what was recorded
// (gateway_routes.h); its guard screens every tool call the model emits
// (guard.h). Installed into the server through the chat-session hook, so the
// server itself knows nothing of it.
#pragma once

#include <memory>
#include <string>

#include "gateway/gateway_config.h"
#include "gateway/gateway_metrics.h"
#include "gateway/guard.h"
#include "gateway/session_store.h"
#include "server/chat_hook.h"
#include "server/router.h"
#include "server/server_state.h"

namespace megactx::gateway {

// Request headers of a session turn.
inline constexpr const char* kSessionHeader = "x-session-id";
inline constexpr const char* kParentSessionHeader = "x-parent-session-id";
inline constexpr const char* kRolloutHeader = "x-rollout-id";

class Gateway : public server::ChatSessionHook {
 public:
  // Builds the rule filter (a bad rules file is a megactx::Error naming the
  // rule) and the judge the config names (this engine, an endpoint, none).
  Gateway(server::ServerState& state, GatewayConfig config);
  // With a given judge (null: none), for tests.
  Gateway(server::ServerState& state, GatewayConfig config, std::shared_ptr<Judge> judge);
  ~Gateway() override;

  bool claims(const server::HttpRequest& request) const override;
  void handle_chat(server::ServerState& state, const server::HttpRequest& request,
                   std::shared_ptr<server::ResponseChannel> channel) override;
  std::string metrics_text() const override;
  void shutdown() override;

  server::ServerState& state() { return state_; }
  const GatewayConfig& config() const { return config_; }
  SessionStore& store() { return store_; }
  Guard& guard() { return *guard_; }
  GatewayMetrics& metrics() { return metrics_; }

 private:
  server::ServerState& state_;
  GatewayConfig config_;
  GatewayMetrics metrics_;
  SessionStore store_;
  std::unique_ptr<Guard> guard_;
};

// Makes the gateway, installs it as `state`'s chat hook and adds its routes.
std::shared_ptr<Gateway> install_gateway(server::ServerState& state, server::Router& router,
                                         GatewayConfig config);

}  // namespace megactx::gateway
