// The routes an RL trainer drives between rollouts, as SGLang names them
// (slime, verl): /pause_generation, /continue_generation, /v1/loads,
// /update_weights_from_disk, /update_weights_from_safetensors (megactx's
// in-memory transport: one safetensors bucket per call, in the body or as a
// file such as /dev/shm/bucket.safetensors; the last one commits),
// /get_weight_version, /update_weight_version, /release_memory_occupation and
// /resume_memory_occupation, and SGLang's NCCL transport
// (/init_weights_update_group, /update_weights_from_distributed,
// /destroy_weights_update_group) and its tensor transport
// (/update_weights_from_tensor: CUDA IPC handles or shared-memory files in a
// torch pickle), both through torch helpers (weight_groups.h). Calls that block (updates, memory)
// run on the state's control thread; a failure answers
// {"success": false, "message"} with status 400 beside the usual error object, and changes nothing.
// That holds for requests refused before they reach the engine too (a bucket that is no safetensors
// file, a tensor of an integer dtype, a bad option): trainers read `success` of every answer.
#include <functional>
#include <limits>
#include <map>
#include <memory>

#include "io/torch_helper.h"
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

WeightUpdateRequest update_fields(const nlohmann::json& body);

// What a torch helper's tensors go through once received (weight_groups.h):
// `update` with them as its bucket, on the control thread, answered on
// `channel`; a helper's error is the answer instead.
std::function<void(const std::string&, std::shared_ptr<TensorBucket>)> applied_when_received(
    ServerState& state, std::shared_ptr<ResponseChannel> channel, WeightUpdateRequest update) {
  return [&state, channel, update = std::move(update)](
             const std::string& error, std::shared_ptr<TensorBucket> bucket) mutable {
    if (!error.empty()) return channel->respond(failure(error));
    update.bucket = std::move(bucket);
    on_control_thread(state, channel, [&state, update] {
      const WeightUpdateResult result = state.engine().update_weights(update);
      return nlohmann::json{{"success", true},
                            {"message", result.committed ? "weights updated" : "weights staged"},
                            {"committed", result.committed},
                            {"tensors", result.tensors},
                            {"weight_version", result.weight_version}};
    });
  };
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

void handle_update_weight_version(ServerState& state, const HttpRequest& request,
                                  std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    const nlohmann::json body = parse_request_json(request.body);
    const auto version = get_string(body, "new_version");
    if (!version || version->empty())
      throw_invalid("new_version", "give 'new_version' (the weight_version to report)");
    if (get_bool(body, "abort_all_requests").value_or(false)) state.engine().abort_all();
    state.engine().set_weight_version(*version);
    channel->respond(json_response({{"success", true},
                                    {"new_version", *version},
                                    {"message", "weight_version is " + *version}}));
  });
}

void handle_get_weights_by_name(ServerState& state, const HttpRequest& request,
                                std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    const nlohmann::json body = body_object(request);
    const auto name = get_string(body, "name");
    if (!name || name->empty()) throw_invalid("name", "give 'name' (a checkpoint tensor name)");
    const int64_t truncate = get_integer(body, "truncate_size").value_or(100);
    if (truncate < 1) throw_invalid("truncate_size", "'truncate_size' must be 1 or more");
    on_control_thread(state, channel, [&state, name = *name, truncate] {
      // SGLang's answer: the tensor as nested lists, its first `truncate` rows.
      const Tensor tensor = state.engine().weight_by_name(name);
      if (tensor.rank() == 0) return nlohmann::json(tensor.data<float>()[0]);
      std::vector<int64_t> strides(static_cast<size_t>(tensor.rank()), 1);
      for (int axis = tensor.rank() - 2; axis >= 0; --axis)
        strides[static_cast<size_t>(axis)] =
            strides[static_cast<size_t>(axis) + 1] * tensor.dim(axis + 1);
      std::function<nlohmann::json(const float*, int, int64_t)> nested = [&](const float* at,
                                                                             int axis,
                                                                             int64_t count) {
        nlohmann::json list = nlohmann::json::array();
        for (int64_t i = 0; i < count; ++i) {
          const float* item = at + i * strides[static_cast<size_t>(axis)];
          list.push_back(axis + 1 == tensor.rank() ? nlohmann::json(*item)
                                                   : nested(item, axis + 1, tensor.dim(axis + 1)));
        }
        return list;
      };
      nlohmann::json out = nested(tensor.data<float>(), 0, std::min(tensor.dim(0), truncate));
      return out;
    });
  });
}

void handle_get_weight_version(ServerState& state, const HttpRequest&,
                               std::shared_ptr<ResponseChannel> channel) {
  channel->respond(json_response({{"weight_version", state.engine().weight_version()}}));
}

void handle_update_weights_from_tensor(ServerState& state, const HttpRequest& request,
                                       std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    const nlohmann::json body = parse_request_json(request.body);
    WeightUpdateRequest update = update_fields(body);
    update.commit = get_bool(body, "commit").value_or(true);
    std::string load_format = get_string(body, "load_format").value_or("");
    if (load_format == "direct") load_format.clear();  // the same tensors, loaded as named
    if (!load_format.empty() && load_format != "flattened_bucket")
      throw_invalid("load_format", "'load_format' " + load_format +
                                       " is not served: leave it out, or direct or "
                                       "flattened_bucket");
    // One payload per rank of the engine (SGLang's tp ranks), each naming the
    // same weights for its GPU; rank 0's is read and the bucket path hands the
    // tensors to every rank.
    const int ranks = state.weight_groups().settings().ranks;
    if (!has_field(body, "serialized_named_tensors") ||
        !body["serialized_named_tensors"].is_array() ||
        body["serialized_named_tensors"].size() != static_cast<size_t>(ranks) ||
        !body["serialized_named_tensors"][0].is_string())
      throw_invalid("serialized_named_tensors",
                    "give 'serialized_named_tensors': a list of " + std::to_string(ranks) +
                        " base64 string(s), one per rank of this server "
                        "(MultiprocessingSerializer.serialize(..., output_str=True))");
    if (get_bool(body, "abort_all_requests").value_or(false)) state.engine().abort_all();
    state.weight_groups().read_tensors(body["serialized_named_tensors"][0].get<std::string>(),
                                       load_format,
                                       applied_when_received(state, channel, std::move(update)));
  });
}

namespace {

std::string group_name_of(const nlohmann::json& body) {
  return get_string(body, "group_name").value_or("weight_update_group");
}

int int_field(const nlohmann::json& body, const std::string& name) {
  auto value = get_integer(body, name);
  if (!value) throw_invalid(name, "give '" + name + "' (an integer)");
  if (*value < std::numeric_limits<int>::min() || *value > std::numeric_limits<int>::max())
    throw_invalid(name, "'" + name + "' is out of range");
  return static_cast<int>(*value);
}

// names, dtypes and shapes of /update_weights_from_distributed, checked before
// anything is received (ApiError 400 naming the field).
std::vector<AnnouncedTensor> announced_tensors(const nlohmann::json& body) {
  for (const char* field : {"names", "dtypes", "shapes"})
    if (!has_field(body, field) || !body[field].is_array())
      throw_invalid(field, std::string("give '") + field + "' (a list, one entry per tensor)");
  const auto& names = body["names"];
  const auto& dtypes = body["dtypes"];
  const auto& shapes = body["shapes"];
  if (dtypes.size() != names.size() || shapes.size() != names.size())
    throw_invalid("names", "'names', 'dtypes' and 'shapes' must have one entry per tensor (" +
                               std::to_string(names.size()) + ", " + std::to_string(dtypes.size()) +
                               ", " + std::to_string(shapes.size()) + ")");
  if (names.empty()) throw_invalid("names", "'names' is empty: no tensor to receive");
  std::vector<AnnouncedTensor> tensors;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!names[i].is_string() || !dtypes[i].is_string())
      throw_invalid(names[i].is_string() ? "dtypes" : "names",
                    "'names' and 'dtypes' must be lists of strings");
    Shape shape;
    if (!shapes[i].is_array()) throw_invalid("shapes", "'shapes' must be a list of lists");
    for (const auto& size : shapes[i]) {
      if (!size.is_number_integer() || size.get<int64_t>() < 0)
        throw_invalid("shapes", "the shape of " + names[i].get<std::string>() +
                                    " must list sizes of 0 or more");
      shape.push_back(size.get<int64_t>());
    }
    try {
      tensors.push_back(
          announced_tensor(names[i].get<std::string>(), dtypes[i].get<std::string>(), shape));
    } catch (const Error& error) {
      throw ApiError(400, error.what(), "dtypes");
    }
  }
  return tensors;
}

}  // namespace

void handle_init_weights_update_group(ServerState& state, const HttpRequest& request,
                                      std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    const nlohmann::json body = parse_request_json(request.body);
    WeightGroupJoin join;
    join.group_name = group_name_of(body);
    join.master_address = get_string(body, "master_address").value_or("");
    join.master_port = int_field(body, "master_port");
    join.rank_offset = int_field(body, "rank_offset");
    join.world_size = int_field(body, "world_size");
    join.backend = get_string(body, "backend").value_or("nccl");
    WeightGroups& groups = state.weight_groups();
    groups.check_join(join);
    const std::string name = join.group_name;
    groups.join(std::move(join), [channel, name](const std::string& error) {
      if (!error.empty()) return channel->respond(failure(error));
      channel->respond(json_response(
          {{"success", true}, {"message", "joined weight-update group '" + name + "'"}}));
    });
  });
}

void handle_update_weights_from_distributed(ServerState& state, const HttpRequest& request,
                                            std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    const nlohmann::json body = parse_request_json(request.body);
    const std::string name = group_name_of(body);
    WeightUpdateRequest update = update_fields(body);
    update.commit = get_bool(body, "commit").value_or(true);
    const std::string format = get_string(body, "load_format").value_or("");
    if (!format.empty() && format != "flattened_bucket")
      throw_invalid("load_format", "'load_format' " + format +
                                       " is not served: leave it out (one broadcast per "
                                       "tensor) or flattened_bucket (one of all their bytes)");
    std::vector<AnnouncedTensor> tensors = announced_tensors(body);
    state.weight_groups().check_known(name);
    if (get_bool(body, "abort_all_requests").value_or(false)) state.engine().abort_all();
    state.weight_groups().receive(name, std::move(tensors), format == "flattened_bucket",
                                  applied_when_received(state, channel, std::move(update)));
  });
}

void handle_destroy_weights_update_group(ServerState& state, const HttpRequest& request,
                                         std::shared_ptr<ResponseChannel> channel) {
  answer_failures(channel, [&] {
    const std::string name = group_name_of(body_object(request));
    state.weight_groups().check_known(name);
    state.weight_groups().destroy(name, [channel, name](const std::string& error) {
      if (!error.empty()) return channel->respond(failure(error));
      channel->respond(json_response(
          {{"success", true}, {"message", "left weight-update group '" + name + "'"}}));
    });
  });
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
