// The routes an RL trainer drives between rollouts, as SGLang names them
// (slime, verl): /pause_generation, /continue_generation, /v1/loads,
// /update_weights_from_disk, /update_weights_from_safetensors (megactx's
// in-memory transport: one safetensors bucket per call, in the body or as a
// file such as /dev/shm/bucket.safetensors; the last one commits),
// /get_weight_version, /release_memory_occupation and
// /resume_memory_occupation; SGLang's NCCL and CUDA-IPC transports answer
// 501. Calls that block (updates, memory) run on the state's control thread; a failure answers
// {"success": false, "message"} with status 400 beside the usual error object, and changes nothing.
// That holds for requests refused before they reach the engine too (a bucket that is no safetensors
// file, a tensor of an integer dtype, a bad option): trainers read `success` of every answer.
#include <map>
#include <memory>

#include "io/weight_update.h"
#include "server/api_error.h"
#include "server/endpoints.h"
#include "server/json_text.h"
#include "server/request_fields.h"

namespace megactx::server {

namespace {

// The body's JSON object; an empty body counts as {}.
nlohmann::json body_object(const HttpRequest& request) {
  if (request.body.empty()) return nlohmann::json::object();
  return parse_request_json(request.body);
}

bool query_bool(const std::map<std::string, std::string>& fields, const std::string& name,
                bool fallback) {
  auto it = fields.find(name);
  if (it == fields.end()) return fallback;
  if (it->second == "true" || it->second == "1") return true;
  if (it->second == "false" || it->second == "0") return false;
  throw_invalid(name, "'" + name + "' must be true or false");
}

HttpResponse failure(const std::string& message, const std::string& param = "", int status = 400) {
  nlohmann::json body = error_json(status, message, param);
  body["success"] = false;
  body["message"] = message;
  return json_response(body, status);
}

// Runs a handler's checks and answers an ApiError they throw with failure().
void answer_failures(const std::shared_ptr<ResponseChannel>& channel,
                     const std::function<void()>& handler) {
  try {
    handler();
  } catch (const ApiError& error) {
    channel->respond(failure(error.what(), error.param(), error.status()));
  }
}

// Runs `work` on the control thread and answers with its result or failure.
void on_control_thread(ServerState& state, std::shared_ptr<ResponseChannel> channel,
                       std::function<nlohmann::json()> work) {
  state.run_control([channel, work = std::move(work)] {
    try {
      channel->respond(json_response(work()));
    } catch (const std::exception& error) {
      channel->respond(failure(error.what()));
    }
  });
}

MemoryTags parse_tags(const nlohmann::json& body) {
  MemoryTags tags;
  if (!has_field(body, "tags")) return MemoryTags{true, true};
  if (!body["tags"].is_array()) throw_invalid("tags", "'tags' must be a list of strings");
  for (const auto& tag : body["tags"]) {
    const std::string name = tag.is_string() ? tag.get<std::string>() : "";
    if (name == "weights")
      tags.weights = true;
    else if (name == "kv_cache")
      tags.kv_cache = true;
    else
      throw_invalid("tags", "unknown memory tag " + tag.dump() + " (weights or kv_cache)");
  }
  return tags;
}

WeightUpdateRequest update_fields(const nlohmann::json& body) {
  WeightUpdateRequest update;
  if (auto version = get_string(body, "weight_version")) update.weight_version = *version;
  if (auto flush = get_bool(body, "flush_cache")) update.flush_cache = *flush;
  return update;
}

}  // namespace

void handle_pause_generation(ServerState& state, const HttpRequest& request,
                             std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    const nlohmann::json body = body_object(request);
    const std::string mode = get_string(body, "mode").value_or("abort");
    PauseMode pause;
    if (mode == "abort")
      pause = PauseMode::Abort;
    else if (mode == "retract")
      pause = PauseMode::Retract;
    else if (mode == "in_place")
      pause = PauseMode::InPlace;
    else
      throw_invalid("mode", "'mode' must be abort, retract or in_place");
    on_control_thread(state, channel, [&state, pause, mode] {
      state.engine().pause(pause);
      return nlohmann::json{{"success", true}, {"message", "generation paused (" + mode + ")"}};
    });
  });
}

void handle_continue_generation(ServerState& state, const HttpRequest&,
                                std::shared_ptr<ResponseChannel> channel) {
  state.engine().resume();
  channel->respond(json_response({{"success", true}, {"message", "generation continues"}}));
}

void handle_loads(ServerState& state, const HttpRequest&,
                  std::shared_ptr<ResponseChannel> channel) {
  const EngineStats stats = state.engine().stats();
  const int64_t total_tokens = stats.kv_pages_total * stats.kv_page_size;
  const int64_t used_tokens = stats.kv_pages_used * stats.kv_page_size;
  nlohmann::json load = {{"dp_rank", 0},
                         {"num_running_reqs", stats.running_requests},
                         {"num_waiting_reqs", stats.waiting_requests},
                         {"num_reqs", stats.running_requests + stats.waiting_requests},
                         {"num_used_tokens", used_tokens},
                         {"max_total_num_tokens", total_tokens},
                         {"token_usage", total_tokens > 0 ? static_cast<double>(used_tokens) /
                                                                static_cast<double>(total_tokens)
                                                          : 0.0},
                         {"paused", state.engine().paused()}};
  nlohmann::json out = load;  // one rank: its fields at the top level too
  out["timestamp"] = unix_time_seconds();
  out["loads"] = nlohmann::json::array({load});
  channel->respond(json_response(out));
}

void handle_update_weights_from_disk(ServerState& state, const HttpRequest& request,
                                     std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    const nlohmann::json body = parse_request_json(request.body);
    WeightUpdateRequest update = update_fields(body);
    auto path = get_string(body, "model_path");
    if (!path || path->empty())
      throw_invalid("model_path", "give 'model_path' (a model directory)");
    update.model_path = *path;
    if (auto format = get_string(body, "load_format");
        format && *format != "auto" && *format != "safetensors")
      throw_invalid("load_format", "'load_format' must be auto or safetensors");
    on_control_thread(state, channel, [&state, update] {
      const WeightUpdateResult result = state.engine().update_weights(update);
      return nlohmann::json{{"success", true},
                            {"message", "weights loaded from " + update.model_path},
                            {"weight_version", result.weight_version},
                            {"num_paused_requests", 0}};
    });
  });
}

void handle_update_weights_from_safetensors(ServerState& state, const HttpRequest& request,
                                            std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    WeightUpdateRequest update;
    std::shared_ptr<TensorBucket> bucket;
    const std::string type = request.header("content-type");
    if (type.rfind("application/json", 0) == 0) {
      // {"path": "/dev/shm/bucket.safetensors", "commit", "weight_version", "flush_cache"}
      const nlohmann::json body = parse_request_json(request.body);
      update = update_fields(body);
      update.commit = get_bool(body, "commit").value_or(true);
      auto path = get_string(body, "path");
      if (!path)
        throw_invalid("path", "give 'path' (a safetensors file) or send the file as the body");
      try {
        bucket = std::make_shared<TensorBucket>(TensorBucket::read_safetensors_file(*path));
      } catch (const Error& error) {
        throw ApiError(400, error.what(), "path");
      }
    } else {
      // The file itself; the options in the query string.
      const auto fields = query_fields(request.target);
      update.commit = query_bool(fields, "commit", true);
      update.flush_cache = query_bool(fields, "flush_cache", true);
      if (auto it = fields.find("weight_version"); it != fields.end())
        update.weight_version = it->second;
      try {
        bucket = std::make_shared<TensorBucket>(
            TensorBucket::from_safetensors(request.body, "the body"));
      } catch (const Error& error) {
        throw ApiError(400, error.what());
      }
    }
    update.bucket = bucket;
    on_control_thread(state, channel, [&state, update] {
      const WeightUpdateResult result = state.engine().update_weights(update);
      return nlohmann::json{{"success", true},
                            {"committed", result.committed},
                            {"tensors", result.tensors},
                            {"weight_version", result.weight_version}};
    });
  });
}

void handle_get_weight_version(ServerState& state, const HttpRequest&,
                               std::shared_ptr<ResponseChannel> channel) {
  channel->respond(json_response({{"weight_version", state.engine().weight_version()}}));
}

void handle_unserved_weight_transport(ServerState&, const HttpRequest& request,
                                      std::shared_ptr<ResponseChannel> channel) {
  const bool nccl = request.path != "/update_weights_from_tensor";
  channel->respond(failure(
      std::string(nccl ? "NCCL weight updates (" : "CUDA-IPC weight updates (") +
          request.path.substr(1) +
          ") are not served by megactx yet: send the weights with /update_weights_from_disk "
          "(slime: --update-weight-transport disk) or as safetensors buckets to "
          "/update_weights_from_safetensors (a path such as /dev/shm/bucket.safetensors, or "
          "the bytes as the body)",
      "", 501));
}

void handle_release_memory(ServerState& state, const HttpRequest& request,
                           std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    const MemoryTags tags = parse_tags(body_object(request));
    on_control_thread(state, channel, [&state, tags] {
      state.engine().release_memory(tags);
      return nlohmann::json{{"success", true}, {"message", "memory released"}};
    });
  });
}

void handle_resume_memory(ServerState& state, const HttpRequest& request,
                          std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    const MemoryTags tags = parse_tags(body_object(request));
    on_control_thread(state, channel, [&state, tags] {
      state.engine().resume_memory(tags);
      return nlohmann::json{{"success", true}, {"message", "memory resumed"}};
    });
  });
}

}  // namespace megactx::server
