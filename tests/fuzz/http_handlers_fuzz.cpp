// Fuzzes every HTTP route's handler with the router in front, over the fake
// engine of tests/server (a byte tokenizer that "generates" a fixed script).
// The first byte picks the route and the method, the rest is the body. Every
// request must end in one complete answer (a whole response or a finished
// stream) within the deadline, with a status the API documents, and a 4xx/5xx
// answer must be an OpenAI-style error object. Anything else aborts.
// tests/fuzz/http_handlers.dict gives libFuzzer the API's field names.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "../server/fake_channel.h"
#include "../server/fake_engine.h"
#include "gateway/gateway.h"
#include "server/endpoints.h"

namespace {

using namespace megactx::server;
using megactx::server::testing::FakeEngine;
using megactx::server::testing::RecordingChannel;

struct Route {
  const char* method;
  const char* path;
  bool session = false;  // a gateway session turn (X-Session-Id and a parent)
};
// Every route a client can reach, and two it cannot.
constexpr Route kRoutes[] = {
    {"POST", "/v1/chat/completions"},
    {"POST", "/v1/completions"},
    {"GET", "/v1/models"},
    {"POST", "/generate"},
    {"POST", "/abort_request"},
    {"POST", "/flush_cache"},
    {"GET", "/get_model_info"},
    {"GET", "/get_server_info"},
    {"GET", "/health_generate"},
    {"GET", "/health"},
    {"GET", "/metrics"},
    {"GET", "/"},
    {"POST", "/tokenize"},
    {"GET", "/ui/stats"},
    {"GET", "/ui/model"},
    {"POST", "/pause_generation"},
    {"POST", "/continue_generation"},
    {"GET", "/v1/loads"},
    {"POST", "/update_weights_from_disk"},
    {"POST", "/update_weights_from_safetensors"},
    {"GET", "/get_weight_version"},
    {"POST", "/update_weight_version"},
    {"POST", "/get_weights_by_name"},
    {"POST", "/init_weights_update_group"},
    {"POST", "/update_weights_from_distributed"},
    {"POST", "/destroy_weights_update_group"},
    {"POST", "/update_weights_from_tensor"},
    {"POST", "/release_memory_occupation"},
    {"POST", "/resume_memory_occupation"},
    {"POST", "/v1/chat/completions", true},
    {"GET", "/gateway/sessions"},
    {"GET", "/gateway/session?session_id=fuzz"},
    {"GET", "/gateway/session?session_id=fuzz&prompt_ids=1"},
    {"GET", "/gateway/samples?session_id=fuzz&text=1"},
    {"GET", "/gateway/samples?rollout_id=fuzz-rollout&finish=1"},
    {"POST", "/gateway/finish"},
    {"POST", "/gateway/delete"},
    {"POST", "/gateway/screen"},
    {"GET", "/gateway/rules"},
    {"PUT", "/generate"},
    {"GET", "/nope"},
};

const char* kTemplate =
    "{% if tools %}<tools>{% for tool in tools %}{{ tool.function.name }};{% endfor %}</tools>"
    "{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|><think>{% endif %}";

struct Server {
  Server() : state(engine, config(), chat()), router(make_router(state)) {
    // The gateway intercepts what its rules confirm and asks this engine to
    // judge the rest, so both paths run on fuzzed turns.
    megactx::gateway::GatewayConfig gateway_config;
    gateway_config.mode = megactx::gateway::GuardMode::Intercept;
    gateway_config.limits.max_sessions = 64;  // the fuzzer makes many: eviction runs too
    gateway_config.limits.idle_seconds = 1;
    megactx::gateway::install_gateway(state, router, gateway_config);
    engine.keep_submitted = false;
    engine.context_tokens = 256;  // bounds max_tokens, so every request ends quickly
    engine.script =
        "Hi <think>x</think><tool_call>f\n<arg_key>a</arg_key>\n"
        "<arg_value>1</arg_value>\n</tool_call>";
  }
  static ServerConfig config() {
    ServerConfig c;
    c.served_model_name = "fuzz";
    c.max_waiting_requests = 1 << 20;
    // A group or tensor payload that passes the checks starts its torch helper
    // with this interpreter, which does not exist: an answer at once, never a
    // process per input.
    c.weight_groups.python = "/nonexistent/megactx-fuzz-python";
    return c;
  }
  static ChatSetup chat() {
    ChatSetup setup;
    setup.chat_template = std::make_shared<const megactx::ChatTemplate>(kTemplate);
    setup.special_tokens = {{"bos_token", "<bos>"}, {"eos_token", "<eos>"}};
    return setup;
  }
  FakeEngine engine;  // first: outlives the state's workers
  ServerState state;
  Router router;
};

bool documented_status(int status) {
  switch (status) {
    case 200:
    case 304:
    case 400:
    case 401:
    case 404:
    case 405:
    case 413:
    case 503:
      return true;
    default:
      return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Server* server = new Server();  // never destroyed: libFuzzer exits without unwinding
  if (size == 0) return 0;
  const Route& route = kRoutes[data[0] % (sizeof(kRoutes) / sizeof(kRoutes[0]))];
  HttpRequest request;
  request.method = route.method;
  request.target = route.path;
  request.path = request.target.substr(0, request.target.find('?'));
  if (route.session) {
    // One of a few sessions, so turns build on each other.
    request.headers["x-session-id"] = size > 1 && data[1] % 2 ? "fuzz" : "fuzz-sub";
    if (size > 1 && data[1] % 3 == 0) request.headers["x-parent-session-id"] = "fuzz";
    request.headers["x-rollout-id"] = "fuzz-rollout";
  }
  request.body.assign(reinterpret_cast<const char*>(data) + 1, size - 1);
  request.headers["content-type"] = "application/json";
  auto channel = std::make_shared<RecordingChannel>();
  server->router.handle(request, channel);
  if (!channel->wait(std::chrono::seconds(8))) std::abort();  // a request never answered
  if (channel->misuse != 0) std::abort();                     // two answers, or a write after one
  if (!documented_status(channel->status)) std::abort();
  if (channel->status >= 400) {
    nlohmann::json error = nlohmann::json::parse(channel->body, nullptr, false);
    if (error.is_discarded() || !error.contains("error") || !error["error"].is_object() ||
        !error["error"]["message"].is_string())
      std::abort();
  }
  return 0;
}
