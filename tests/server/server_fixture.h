// A router over a FakeEngine, called without sockets: call() returns the
// recorded response once the handler completed it.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "fake_channel.h"
#include "fake_engine.h"
#include "router_calls.h"
#include "server/endpoints.h"

namespace megactx::server::testing {

// A GLM-like template: enough to check that messages, tools and
// chat_template_kwargs reach the template.
inline const char* kTestTemplate =
    "{% if tools %}<tools>{% for tool in tools %}{{ tool.function.name }};{% endfor %}</tools>"
    "{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not "
    "enable_thinking %}<think></think>{% else %}<think>{% endif %}{% endif %}";

inline ServerConfig test_config(std::string api_key = {}) {
  ServerConfig config;
  config.served_model_name = "test-model";
  config.model_path = "/models/test";
  config.api_key = std::move(api_key);
  config.max_waiting_requests = 8;
  return config;
}

inline ChatSetup test_chat_setup() {
  ChatSetup setup;
  setup.chat_template = std::make_shared<const ChatTemplate>(kTestTemplate);
  setup.special_tokens = {{"bos_token", "<bos>"}, {"eos_token", "<eos>"}};
  return setup;
}

struct ServerFixture {
  explicit ServerFixture(std::string api_key = {})
      : state(engine, test_config(std::move(api_key)), test_chat_setup()),
        router(make_router(state)) {}

  std::shared_ptr<RecordingChannel> start(const std::string& method, const std::string& path,
                                          const std::string& body = {},
                                          std::map<std::string, std::string> headers = {}) {
    return testing::start_request(router, method, path, body, std::move(headers));
  }
  std::shared_ptr<RecordingChannel> call(const std::string& method, const std::string& path,
                                         const nlohmann::json& body = nullptr,
                                         std::map<std::string, std::string> headers = {}) {
    return testing::call_request(router, method, path, body, std::move(headers));
  }

  FakeEngine engine;  // declared first: outlives the state's workers
  ServerState state;
  Router router;
};

}  // namespace megactx::server::testing
