// The HTTP endpoints: openai_chat.cpp, openai_completions.cpp,
// native_generate.cpp, native_admin.cpp (the SGLang admin routes, /v1/models
// and /metrics), rl_control.cpp (what an RL trainer drives), web_api.cpp and web_ui.cpp (the page
// and its JSON), and the table that routes to them (routes.cpp).
#pragma once

#include <memory>

#include "server/http_types.h"
#include "server/router.h"
#include "server/server_state.h"

namespace megactx::server {

void handle_chat_completions(ServerState& state, const HttpRequest& request,
                             std::shared_ptr<ResponseChannel> channel);
void handle_completions(ServerState& state, const HttpRequest& request,
                        std::shared_ptr<ResponseChannel> channel);
void handle_models(ServerState& state, const HttpRequest& request,
                   std::shared_ptr<ResponseChannel> channel);
void handle_generate(ServerState& state, const HttpRequest& request,
                     std::shared_ptr<ResponseChannel> channel);
void handle_abort_request(ServerState& state, const HttpRequest& request,
                          std::shared_ptr<ResponseChannel> channel);
void handle_flush_cache(ServerState& state, const HttpRequest& request,
                        std::shared_ptr<ResponseChannel> channel);
void handle_health(ServerState& state, const HttpRequest& request,
                   std::shared_ptr<ResponseChannel> channel);
void handle_health_generate(ServerState& state, const HttpRequest& request,
                            std::shared_ptr<ResponseChannel> channel);
void handle_model_info(ServerState& state, const HttpRequest& request,
                       std::shared_ptr<ResponseChannel> channel);
void handle_server_info(ServerState& state, const HttpRequest& request,
                        std::shared_ptr<ResponseChannel> channel);
void handle_metrics(ServerState& state, const HttpRequest& request,
                    std::shared_ptr<ResponseChannel> channel);
// RL control (rl_control.cpp).
void handle_pause_generation(ServerState& state, const HttpRequest& request,
                             std::shared_ptr<ResponseChannel> channel);
void handle_continue_generation(ServerState& state, const HttpRequest& request,
                                std::shared_ptr<ResponseChannel> channel);
void handle_loads(ServerState& state, const HttpRequest& request,
                  std::shared_ptr<ResponseChannel> channel);
void handle_update_weights_from_disk(ServerState& state, const HttpRequest& request,
                                     std::shared_ptr<ResponseChannel> channel);
void handle_update_weights_from_safetensors(ServerState& state, const HttpRequest& request,
                                            std::shared_ptr<ResponseChannel> channel);
void handle_get_weight_version(ServerState& state, const HttpRequest& request,
                               std::shared_ptr<ResponseChannel> channel);
void handle_update_weight_version(ServerState& state, const HttpRequest& request,
                                  std::shared_ptr<ResponseChannel> channel);
// SGLang's /get_weights_by_name {"name", "truncate_size"}: the served tensor's
// first rows as nested lists (trainers check that an update landed).
void handle_get_weights_by_name(ServerState& state, const HttpRequest& request,
                                std::shared_ptr<ResponseChannel> channel);
// SGLang's NCCL weight transport: the trainer's torch.distributed group
// (weight_groups.h); the server joins, receives buckets and leaves.
void handle_init_weights_update_group(ServerState& state, const HttpRequest& request,
                                      std::shared_ptr<ResponseChannel> channel);
void handle_update_weights_from_distributed(ServerState& state, const HttpRequest& request,
                                            std::shared_ptr<ResponseChannel> channel);
void handle_destroy_weights_update_group(ServerState& state, const HttpRequest& request,
                                         std::shared_ptr<ResponseChannel> channel);
// SGLang's tensor transport: tensors pickled with torch's multiprocessing
// reductions (CUDA IPC handles on one host), opened by a torch helper.
void handle_update_weights_from_tensor(ServerState& state, const HttpRequest& request,
                                       std::shared_ptr<ResponseChannel> channel);
void handle_release_memory(ServerState& state, const HttpRequest& request,
                           std::shared_ptr<ResponseChannel> channel);
void handle_resume_memory(ServerState& state, const HttpRequest& request,
                          std::shared_ptr<ResponseChannel> channel);

// Every route of the server (OpenAI, native, metrics) bound to `state`.
Router make_router(ServerState& state);

// A JSON response with status 200 (or `status`).
HttpResponse json_response(const nlohmann::json& body, int status = 200);

// Current UNIX time in seconds (OpenAI's `created`).
int64_t unix_time_seconds();

}  // namespace megactx::server
