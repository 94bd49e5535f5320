#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "engine/engine_config.h"
#include "io/bounded_json.h"

namespace megactx {

namespace {

void add_unique(std::vector<int32_t>& ids, int64_t id) {
  MEGACTX_CHECK(id >= 0 && id <= INT32_MAX, "generation_config.json: invalid eos_token_id {}", id);
  for (const int32_t existing : ids) {
    if (existing == id) return;
  }
  ids.push_back(static_cast<int32_t>(id));
}

}  // namespace

GenerationDefaults load_generation_defaults(const std::string& model_dir,
                                            const std::vector<int64_t>& config_eos_ids) {
  GenerationDefaults defaults;
  for (const int64_t id : config_eos_ids) add_unique(defaults.eos_token_ids, id);
  const auto path = std::filesystem::path(model_dir) / "generation_config.json";
  if (!std::filesystem::exists(path)) return defaults;
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  nlohmann::json json = try_parse_json(text.str());
  MEGACTX_CHECK(json.is_object(), "{}: not a JSON object", path.string());
  try {
    if (json.contains("eos_token_id")) {
      const auto& eos = json["eos_token_id"];
      if (eos.is_array()) {
        for (const auto& id : eos) add_unique(defaults.eos_token_ids, id.get<int64_t>());
      } else if (!eos.is_null()) {
        add_unique(defaults.eos_token_ids, eos.get<int64_t>());
      }
    }
    if (json.contains("temperature") && json["temperature"].is_number()) {
      defaults.temperature = json["temperature"].get<double>();
    }
    if (json.contains("top_p") && json["top_p"].is_number()) {
      defaults.top_p = json["top_p"].get<double>();
    }
    if (json.contains("top_k") && json["top_k"].is_number_integer()) {
      defaults.top_k = json["top_k"].get<int64_t>();
    }
  } catch (const nlohmann::json::exception& error) {
    fail("{}: {}", path.string(), error.what());
  }
  return defaults;
}

}  // namespace megactx
