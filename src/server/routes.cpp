#include <chrono>

#include "server/endpoints.h"
#include "server/json_text.h"
#include "server/web_ui.h"

namespace megactx::server {

HttpResponse json_response(const nlohmann::json& body, int status) {
  HttpResponse response;
  response.status = status;
  response.body = dump_json(body);
  return response;
}

int64_t unix_time_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Router make_router(ServerState& state) {
  Router router;
  router.set_api_key(state.config().api_key);
  auto bind = [&state](void (*handler)(ServerState&, const HttpRequest&,
                                       std::shared_ptr<ResponseChannel>)) {
    return [&state, handler](const HttpRequest& request, std::shared_ptr<ResponseChannel> channel) {
      handler(state, request, std::move(channel));
    };
  };
  // OpenAI-compatible.
  router.add("POST", "/v1/chat/completions", bind(handle_chat_completions));
  router.add("POST", "/v1/completions", bind(handle_completions));
  router.add("GET", "/v1/models", bind(handle_models));
  // SGLang-compatible native API.
  router.add("POST", "/generate", bind(handle_generate));
  router.add("POST", "/abort_request", bind(handle_abort_request));
  router.add("POST", "/flush_cache", bind(handle_flush_cache));
  router.add("GET", "/flush_cache", bind(handle_flush_cache));
  router.add("GET", "/get_model_info", bind(handle_model_info));
  router.add("GET", "/get_server_info", bind(handle_server_info));
  router.add("GET", "/health_generate", bind(handle_health_generate));
  // RL trainers (slime, verl): pause, weights, memory.
  router.add("POST", "/pause_generation", bind(handle_pause_generation));
  router.add("POST", "/continue_generation", bind(handle_continue_generation));
  router.add("GET", "/v1/loads", bind(handle_loads));
  router.add("POST", "/update_weights_from_disk", bind(handle_update_weights_from_disk));
  router.add("POST", "/update_weights_from_safetensors",
             bind(handle_update_weights_from_safetensors));
  router.add("GET", "/get_weight_version", bind(handle_get_weight_version));
  router.add("POST", "/update_weight_version", bind(handle_update_weight_version));
  router.add("POST", "/get_weights_by_name", bind(handle_get_weights_by_name));
  router.add("GET", "/get_weights_by_name", bind(handle_get_weights_by_name));
  router.add("POST", "/init_weights_update_group", bind(handle_init_weights_update_group));
  router.add("POST", "/update_weights_from_distributed",
             bind(handle_update_weights_from_distributed));
  router.add("POST", "/destroy_weights_update_group", bind(handle_destroy_weights_update_group));
  router.add("POST", "/update_weights_from_tensor", bind(handle_update_weights_from_tensor));
  router.add("POST", "/release_memory_occupation", bind(handle_release_memory));
  router.add("POST", "/resume_memory_occupation", bind(handle_resume_memory));
  // Liveness and scraping stay open so probes need no key.
  router.add("GET", "/health", bind(handle_health), /*requires_auth=*/false);
  router.add("GET", "/metrics", bind(handle_metrics), /*requires_auth=*/false);
  // The browser playground and dashboard at / and the JSON they read.
  add_web_ui_routes(router, state);
  return router;
}

}  // namespace megactx::server
