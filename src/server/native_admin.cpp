// The native control endpoints: /abort_request, /flush_cache, /health,
// /health_generate, /get_model_info, /get_server_info.
#include <atomic>

#include "io/model_config.h"
#include "server/api_error.h"
#include "server/endpoints.h"
#include "server/json_text.h"
#include "server/request_fields.h"
#include "tokenizer/tokenizer.h"

namespace megactx::server {

void handle_abort_request(ServerState& state, const HttpRequest& request,
                          std::shared_ptr<ResponseChannel> channel) {
  nlohmann::json body = parse_request_json(request.body);
  if (get_bool(body, "abort_all").value_or(false)) {
    state.engine().abort_all();
    channel->respond(json_response({{"success", true}, {"aborted", "all"}}));
    return;
  }
  auto rid = get_string(body, "rid");
  if (!rid) throw_invalid("rid", "give 'rid' (a request id) or 'abort_all': true");
  // Like SGLang, an unknown or finished rid is not an error; `found` says which.
  bool found = state.engine().abort(*rid);
  channel->respond(json_response({{"success", true}, {"found", found}}));
}

void handle_flush_cache(ServerState& state, const HttpRequest&,
                        std::shared_ptr<ResponseChannel> channel) {
  if (!state.engine().flush_cache())
    throw ApiError(400, "cache not flushed: requests are running; retry when the server is idle");
  channel->respond(json_response({{"success", true}, {"message", "Cache flushed."}}));
}

void handle_health(ServerState&, const HttpRequest&, std::shared_ptr<ResponseChannel> channel) {
  HttpResponse response;
  response.content_type = "text/plain";
  channel->respond(std::move(response));
}

void handle_health_generate(ServerState& state, const HttpRequest&,
                            std::shared_ptr<ResponseChannel> channel) {
  // One greedy token through the whole engine: proves the model runs.
  GenerationRequest probe;
  probe.rid = state.new_id("health-");
  const ModelConfig& config = state.engine().model_config();
  int32_t token = config.bos_token_id ? static_cast<int32_t>(*config.bos_token_id) : 0;
  probe.input_ids = {token};
  probe.sampling.temperature = 0.0;
  probe.sampling.max_new_tokens = 1;
  probe.sampling.ignore_eos = true;
  channel->on_disconnect([&state, rid = probe.rid] { state.engine().abort(rid); });
  state.submit(std::move(probe), [channel](const RequestUpdate& update) {
    if (update.finish == FinishReason::None) return;
    if (update.finish == FinishReason::Error)
      channel->respond(
          error_response(503, "health check generation failed: " + update.finish_detail));
    else
      channel->respond(HttpResponse{200, "text/plain", "", {}});
  });
}

void handle_model_info(ServerState& state, const HttpRequest&,
                       std::shared_ptr<ResponseChannel> channel) {
  const ModelConfig& config = state.engine().model_config();
  channel->respond(json_response({{"model_path", state.config().model_path},
                                  {"tokenizer_path", state.config().model_path},
                                  {"served_model_name", state.config().served_model_name},
                                  {"is_generation", true},
                                  {"model_type", config.model_type_name},
                                  {"architectures", nullptr},
                                  {"preferred_sampling_params", nullptr},
                                  {"weight_version", state.engine().weight_version()},
                                  {"has_image_understanding", false},
                                  {"has_audio_understanding", false}}));
}

void handle_server_info(ServerState& state, const HttpRequest&,
                        std::shared_ptr<ResponseChannel> channel) {
  EngineStats stats = state.engine().stats();
  nlohmann::json info = state.config().server_info;
  info["model_path"] = state.config().model_path;
  info["served_model_name"] = state.config().served_model_name;
  info["context_length"] = state.engine().max_context_tokens();
  info["vocab_size"] = state.engine().tokenizer().vocab_size();
  info["num_running_reqs"] = stats.running_requests;
  info["num_waiting_reqs"] = stats.waiting_requests;
  info["kv_pages_total"] = stats.kv_pages_total;
  info["kv_pages_used"] = stats.kv_pages_used;
  info["host_kv_pages_total"] = stats.host_kv_pages_total;
  info["host_kv_pages_used"] = stats.host_kv_pages_used;
  info["api_key_required"] = !state.config().api_key.empty();
  info["weight_version"] = state.engine().weight_version();
  info["paused"] = state.engine().paused();
  channel->respond(json_response(info));
}

void handle_metrics(ServerState& state, const HttpRequest&,
                    std::shared_ptr<ResponseChannel> channel) {
  HttpResponse response;
  response.content_type = "text/plain; version=0.0.4; charset=utf-8";
  response.body = state.metrics().render(state.engine().stats());
  if (const ChatSessionHook* hook = state.chat_hook()) response.body += hook->metrics_text();
  channel->respond(std::move(response));
}

void handle_models(ServerState& state, const HttpRequest&,
                   std::shared_ptr<ResponseChannel> channel) {
  nlohmann::json model = {{"id", state.config().served_model_name},
                          {"object", "model"},
                          {"created", unix_time_seconds()},
                          {"owned_by", "megactx"},
                          {"root", state.config().model_path},
                          {"max_model_len", state.engine().max_context_tokens()}};
  channel->respond(json_response({{"object", "list"}, {"data", nlohmann::json::array({model})}}));
}

}  // namespace megactx::server
