// The JSON endpoints the web UI reads beside the OpenAI API:
//  * GET /ui/stats: server_stats_json (open like /metrics, which says the same).
//  * GET /ui/model: the model card, what `megactx inspect` prints (layer
//    schedule, IndexShare full/shared layers, KV bytes per token, tokens that
//    fit the KV budget) plus the running server's pool and settings.
//  * POST /tokenize: vLLM's shape ({"prompt"} or {"messages", "tools",
//    "chat_template_kwargs", "add_generation_prompt"} -> {"count",
//    "max_model_len", "tokens", "token_strs"}); for messages it also returns
//    the "prompt" the chat template rendered, so the page can show exactly
//    what the model reads.
#include <chrono>
#include <optional>

#include "io/bounded_json.h"
#include "io/model_config.h"
#include "io/model_summary.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/endpoints.h"
#include "server/json_text.h"
#include "server/openai_common.h"
#include "server/request_fields.h"
#include "server/server_stats_json.h"
#include "server/web_ui.h"
#include "tokenizer/tokenizer.h"

namespace megactx::server {

namespace {

void handle_ui_stats(ServerState& state, const HttpRequest&,
                     std::shared_ptr<ResponseChannel> channel) {
  using namespace std::chrono;
  const double monotonic_ms =
      duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
  const double unix_seconds = duration<double>(system_clock::now().time_since_epoch()).count();
  HttpResponse response =
      json_response(server_stats_json(state.metrics(), state.engine().stats(),
                                      state.config().server_info, monotonic_ms, unix_seconds));
  response.headers["Cache-Control"] = "no-store";
  channel->respond(std::move(response));
}

// The KV budget the server was started with ("2GiB", "1536MiB"), if it reads as one.
std::optional<uint64_t> kv_budget(const nlohmann::json& server_info) {
  if (!server_info.contains("kv_memory") || !server_info["kv_memory"].is_string())
    return std::nullopt;
  try {
    return parse_memory_size(server_info["kv_memory"].get<std::string>());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void handle_ui_model(ServerState& state, const HttpRequest&,
                     std::shared_ptr<ResponseChannel> channel) {
  const EngineStats stats = state.engine().stats();
  const nlohmann::json& info = state.config().server_info;
  nlohmann::json card = {{"served_model_name", state.config().served_model_name},
                         {"model_path", state.config().model_path},
                         {"max_context_tokens", state.engine().max_context_tokens()},
                         {"vocab_size", state.engine().tokenizer().vocab_size()},
                         {"api_key_required", !state.config().api_key.empty()},
                         {"server", info},
                         {"kv_pool",
                          {{"pages_total", stats.kv_pages_total},
                           {"page_size", stats.kv_page_size},
                           {"tokens", stats.kv_pages_total * stats.kv_page_size},
                           {"host_pages_total", stats.host_kv_pages_total},
                           {"host_tokens", stats.host_kv_pages_total * stats.kv_page_size}}}};
  // A config the summary cannot describe (a test double, a future family)
  // still gets the rest of the card.
  try {
    ModelSummary summary = summarize_model(state.engine().model_config());
    const std::optional<uint64_t> budget = kv_budget(info);
    if (budget && summary.kv_bytes_per_token_fp8 > 0 && summary.kv_bytes_per_token_bf16 > 0)
      summary = summarize_model(state.engine().model_config(), budget);
    card["summary"] = summary_to_json(summary);
    card["summary_text"] = summary_to_text(summary);
  } catch (const std::exception& error) {
    card["summary"] = nullptr;
    card["summary_error"] = error.what();
  }
  channel->respond(json_response(card));
}

void handle_tokenize(ServerState& state, const HttpRequest& request,
                     std::shared_ptr<ResponseChannel> channel) {
  nlohmann::json body = parse_request_json(request.body);
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_model_name(state, body);
  const Tokenizer& tokenizer = state.engine().tokenizer();
  nlohmann::json out = nlohmann::json::object();
  std::string text;
  bool add_special_tokens = false;
  if (has_field(body, "messages")) {
    if (has_field(body, "prompt"))
      throw_invalid("prompt", "give either 'prompt' or 'messages', not both");
    text = render_chat_prompt(state.chat(), body, request.body).text;
    // The rendered prompt already holds the template's special tokens.
    add_special_tokens = get_bool(body, "add_special_tokens").value_or(false);
    out["prompt"] = sanitize_utf8(text);
  } else {
    auto prompt = get_string(body, "prompt");
    if (!prompt) throw_invalid("prompt", "give 'prompt' (a string) or 'messages'");
    text = std::move(*prompt);
    add_special_tokens = get_bool(body, "add_special_tokens").value_or(true);
  }
  const std::vector<int32_t> ids = tokenizer.encode(text, add_special_tokens);
  out["count"] = ids.size();
  out["max_model_len"] = state.engine().max_context_tokens();
  // A long document's ids are large; the page asks only for the count.
  out["tokens"] =
      get_bool(body, "return_tokens").value_or(true) ? nlohmann::json(ids) : nlohmann::json();
  out["token_strs"] = nullptr;
  if (get_bool(body, "return_token_strs").value_or(false)) {
    // The text each token stands for (a piece of a character becomes U+FFFD).
    nlohmann::json pieces = nlohmann::json::array();
    for (int32_t id : ids) pieces.push_back(sanitize_utf8(tokenizer.token_bytes(id)));
    out["token_strs"] = std::move(pieces);
  }
  channel->respond(json_response(out));
}

}  // namespace

void add_web_api_routes(Router& router, ServerState& state) {
  auto bind = [&state](void (*handler)(ServerState&, const HttpRequest&,
                                       std::shared_ptr<ResponseChannel>)) {
    return [&state, handler](const HttpRequest& request, std::shared_ptr<ResponseChannel> channel) {
      handler(state, request, std::move(channel));
    };
  };
  router.add("GET", "/ui/stats", bind(handle_ui_stats), /*requires_auth=*/false);
  router.add("GET", "/ui/model", bind(handle_ui_model));
  router.add("POST", "/tokenize", bind(handle_tokenize));
}

}  // namespace megactx::server
