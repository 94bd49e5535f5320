#include "gateway/gateway.h"

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "gateway/engine_judge.h"
#include "gateway/gateway_routes.h"
#include "gateway/http_judge.h"
#include "gateway/session_turn.h"

namespace megactx::gateway {

namespace {

std::shared_ptr<Judge> make_judge(server::ServerState& state, const JudgeConfig& config) {
  if (config.endpoint == "off" || config.endpoint.empty()) return nullptr;
  if (config.endpoint == "self") return std::make_shared<EngineJudge>(state, config);
  return std::make_shared<HttpJudge>(config);
}

}  // namespace

GuardMode parse_guard_mode(const std::string& text) {
  if (text == "off") return GuardMode::Off;
  if (text == "flag" || text == "flag-only") return GuardMode::FlagOnly;
  if (text == "intercept") return GuardMode::Intercept;
  fail("unknown guard mode '{}' (off, flag or intercept)", text);
}

const char* guard_mode_name(GuardMode mode) {
  switch (mode) {
    case GuardMode::Off:
      return "off";
    case GuardMode::FlagOnly:
      return "flag";
    case GuardMode::Intercept:
      return "intercept";
  }
  return "off";
}

Gateway::Gateway(server::ServerState& state, GatewayConfig config)
    : Gateway(state, config, make_judge(state, config.judge)) {}

Gateway::Gateway(server::ServerState& state, GatewayConfig config, std::shared_ptr<Judge> judge)
    : state_(state), config_(std::move(config)), store_(config_.limits) {
  MEGACTX_CHECK(config_.max_intercepts_per_turn >= 0, "the interception limit must be >= 0");
  guard_ = std::make_unique<Guard>(config_.mode, RuleFilter::load(config_.rules_file),
                                   std::move(judge), metrics_);
}

Gateway::~Gateway() {
  shutdown();
}

bool Gateway::claims(const server::HttpRequest& request) const {
  return request.headers.count(kSessionHeader) > 0;
}

void Gateway::handle_chat(server::ServerState&, const server::HttpRequest& request,
                          std::shared_ptr<server::ResponseChannel> channel) {
  run_session_turn(*this, request, std::move(channel));
}

std::string Gateway::metrics_text() const {
  return metrics_.render(store_.stats());
}

void Gateway::shutdown() {
  if (guard_ && guard_->judge()) guard_->judge()->shutdown();
}

std::shared_ptr<Gateway> install_gateway(server::ServerState& state, server::Router& router,
                                         GatewayConfig config) {
  auto gateway = std::make_shared<Gateway>(state, std::move(config));
  state.set_chat_hook(gateway);
  add_gateway_routes(router, *gateway);
  spdlog::info("gateway: guard {}, {} rules, judge {}", guard_mode_name(gateway->config().mode),
               gateway->guard().filter().rules().size(), gateway->config().judge.endpoint);
  return gateway;
}

}  // namespace megactx::gateway
