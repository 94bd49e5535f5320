#include <filesystem>

#include "core/error.h"
#include "engine/engine_config.h"
#include "tokenizer/model_metadata.h"

namespace megactx {

namespace {

void add_unique(std::vector<int32_t>& ids, int64_t id) {
  MEGACTX_CHECK(id >= 0 && id <= INT32_MAX, "invalid eos_token_id {}", id);
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
  // A config file alone (random weights for a benchmark) has no generation config.
  if (!std::filesystem::is_directory(model_dir)) return defaults;
  // The one reader of generation_config.json (tokenizer/model_metadata.h).
  const ModelMetadata metadata = load_model_metadata(model_dir);
  for (const TokenId id : metadata.eos_token_ids) add_unique(defaults.eos_token_ids, id);
  defaults.temperature = metadata.temperature;
  defaults.top_p = metadata.top_p;
  defaults.top_k = metadata.top_k;
  return defaults;
}

}  // namespace megactx
