// A server with the gateway installed over the fake engine of tests/server,
// called without sockets, and a GLM-like chat template: reasoning kept only
// after the last user turn (as GLM templates do, so a new user turn
// re-renders earlier assistant turns differently), tool calls in GLM markup,
// tool results after <|observation|>.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "../server/fake_channel.h"
#include "../server/fake_engine.h"
#include "../server/router_calls.h"
#include "gateway/gateway.h"
#include "gateway/gateway_routes.h"
#include "server/endpoints.h"

namespace megactx::gateway::testing {

using server::testing::FakeEngine;
using server::testing::RecordingChannel;

inline const char* kGlmLikeTemplate =
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if tools -%}<tools>{% for tool in tools %}{{ tool.function.name }};{% endfor %}</tools>"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}<|assistant|>"
    "{%- if m.reasoning_content and loop.index0 > ns.last_user -%}<think>{{ m.reasoning_content }}"
    "</think>{%- endif -%}"
    "{%- if m.content -%}{{ m.content }}{%- endif -%}"
    "{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}<tool_call>{{ c.function.name }}"
    "{%- for k, v in c.function.arguments.items() -%}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}"
    "</arg_value>{%- endfor -%}</tool_call>{%- endfor -%}{%- endif -%}"
    "{%- elif m.role == 'tool' -%}<|observation|><tool_response>{{ m.content }}</tool_response>"
    "{%- else -%}<|{{ m.role }}|>{{ m.content }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}";

inline nlohmann::json bash_tool() {
  return nlohmann::json::parse(R"({"type": "function", "function": {"name": "bash",
      "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                     "required": ["command"]}}})");
}

inline std::string tool_call_markup(const std::string& command) {
  return "<tool_call>bash<arg_key>command</arg_key><arg_value>" + command +
         "</arg_value></tool_call>";
}

// A rules file in the test's temporary folder.
inline std::string write_rules(const std::string& name, const nlohmann::json& rules) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("megactx_gateway_" + name + ".json");
  std::ofstream(path) << rules.dump();
  return path.string();
}

struct GatewayFixture {
  explicit GatewayFixture(GatewayConfig config = GatewayConfig(),
                          std::shared_ptr<Judge> judge = nullptr, bool engine_judge = false)
      : state(engine, server_config(), chat_setup()), router(server::make_router(state)) {
    if (engine_judge) {
      config.judge.endpoint = "self";
      gateway = std::make_shared<Gateway>(state, config);
    } else {
      gateway = std::make_shared<Gateway>(state, config, std::move(judge));
    }
    state.set_chat_hook(gateway);
    add_gateway_routes(router, *gateway);
  }

  static server::ServerConfig server_config() {
    server::ServerConfig config;
    config.served_model_name = "test-model";
    config.max_waiting_requests = 64;
    return config;
  }
  static server::ChatSetup chat_setup() {
    server::ChatSetup setup;
    setup.chat_template = std::make_shared<const ChatTemplate>(kGlmLikeTemplate);
    return setup;
  }

  std::shared_ptr<RecordingChannel> start(const std::string& method, const std::string& path,
                                          const std::string& body,
                                          std::map<std::string, std::string> headers = {}) {
    return server::testing::start_request(router, method, path, body, std::move(headers));
  }
  std::shared_ptr<RecordingChannel> call(const std::string& method, const std::string& path,
                                         const nlohmann::json& body = nullptr,
                                         std::map<std::string, std::string> headers = {}) {
    return server::testing::call_request(router, method, path, body, std::move(headers));
  }
  // A chat turn of `session` (and, when given, its parent).
  std::shared_ptr<RecordingChannel> turn(const std::string& session, const nlohmann::json& body,
                                         const std::string& parent = {}) {
    std::map<std::string, std::string> headers = {{"x-session-id", session}};
    if (!parent.empty()) headers["x-parent-session-id"] = parent;
    return call("POST", "/v1/chat/completions", body, headers);
  }
  nlohmann::json trajectory(const std::string& session) {
    auto channel = call("GET", "/gateway/session?session_id=" + session);
    EXPECT_EQ(channel->status, 200) << channel->body;
    return channel->json();
  }

  FakeEngine engine;  // first: outlives the state's workers
  server::ServerState state;
  server::Router router;
  std::shared_ptr<Gateway> gateway;
};

// The text a request's prompt ids stand for (the fake tokenizer is bytes).
inline std::string prompt_text(const GenerationRequest& request) {
  std::string text;
  for (int32_t id : request.input_ids)
    if (id < 256) text += static_cast<char>(id);
  return text;
}

}  // namespace megactx::gateway::testing
