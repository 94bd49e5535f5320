#include "tokenizer/model_metadata.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/bounded_json.h"

namespace megactx {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

std::optional<std::string> read_text(const fs::path& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) return std::nullopt;
  std::ifstream file(path, std::ios::binary);
  if (!file) fail("cannot read {}", path.string());
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

std::optional<json> read_json(const fs::path& path) {
  auto text = read_text(path);
  if (!text) return std::nullopt;
  try {
    json value = parse_json(*text);
    if (!value.is_object()) fail("{}: the top level is not an object", path.string());
    return value;
  } catch (const json::exception& error) {
    fail("{} is not valid JSON: {}", path.string(), error.what());
  }
}

// A special token is a string, an AddedToken dict ({"content": ...}), or null.
std::optional<std::string> token_field(const json& config, const char* key,
                                       const std::string& file) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail("{}: '{}' is neither a string nor an AddedToken object", file, key);
}

template <typename T>
std::optional<T> number_field(const json& config, const char* key, const std::string& file) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) fail("{}: '{}' is not a boolean", file, key);
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) fail("{}: '{}' is not an integer", file, key);
  } else {
    if (!it->is_number()) fail("{}: '{}' is not a number", file, key);
  }
  return it->get<T>();
}

TokenId token_id(const json& value, const std::string& file, const char* key) {
  if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
      value.get<int64_t>() > std::numeric_limits<TokenId>::max())
    fail("{}: '{}' holds something that is not a token id", file, key);
  return static_cast<TokenId>(value.get<int64_t>());
}

void read_tokenizer_config(const fs::path& dir, ModelMetadata& out) {
  const std::string file = (dir / "tokenizer_config.json").string();
  auto config = read_json(file);
  if (!config) return;
  out.bos_token = token_field(*config, "bos_token", file);
  out.eos_token = token_field(*config, "eos_token", file);
  out.pad_token = token_field(*config, "pad_token", file);
  out.unk_token = token_field(*config, "unk_token", file);
  out.add_bos_token = number_field<bool>(*config, "add_bos_token", file);
  out.add_eos_token = number_field<bool>(*config, "add_eos_token", file);
  // Some files write 1e30 for "no limit": keep only values that fit.
  if (auto it = config->find("model_max_length"); it != config->end() && it->is_number()) {
    const double value = it->get<double>();
    if (value > 0 && value < 9e18) out.model_max_length = static_cast<int64_t>(value);
  }
  auto it = config->find("chat_template");
  if (it == config->end() || it->is_null()) return;
  if (it->is_string()) {
    out.chat_template = it->get<std::string>();
    return;
  }
  if (!it->is_array()) fail("{}: 'chat_template' is neither a string nor a list", file);
  // List form: [{"name": ..., "template": ...}, ...]; "default" is the default.
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string())
      fail("{}: a 'chat_template' list entry lacks a string name or template", file);
    out.named_chat_templates[entry["name"].get<std::string>()] =
        entry["template"].get<std::string>();
  }
  if (auto named = out.named_chat_templates.find("default");
      named != out.named_chat_templates.end())
    out.chat_template = named->second;
}

void read_template_files(const fs::path& dir, ModelMetadata& out) {
  // transformers: chat_template.jinja wins over tokenizer_config.json.
  if (auto text = read_text(dir / "chat_template.jinja")) {
    out.chat_template = *text;
    out.named_chat_templates["default"] = *text;
  }
  std::error_code error;
  const fs::path extra = dir / "additional_chat_templates";
  if (!fs::is_directory(extra, error)) return;
  for (const auto& entry : fs::directory_iterator(extra, error)) {
    if (entry.path().extension() != ".jinja") continue;
    if (auto text = read_text(entry.path()))
      out.named_chat_templates[entry.path().stem().string()] = *text;
  }
}

void read_generation_config(const fs::path& dir, ModelMetadata& out) {
  const std::string file = (dir / "generation_config.json").string();
  auto config = read_json(file);
  if (!config) return;
  if (auto it = config->find("eos_token_id"); it != config->end() && !it->is_null()) {
    if (it->is_array()) {
      for (const auto& id : *it) out.eos_token_ids.push_back(token_id(id, file, "eos_token_id"));
    } else {
      out.eos_token_ids.push_back(token_id(*it, file, "eos_token_id"));
    }
  }
  for (auto [key, target] : {std::pair{"bos_token_id", &out.bos_token_id},
                             std::pair{"pad_token_id", &out.pad_token_id}}) {
    auto it = config->find(key);
    if (it == config->end() || it->is_null()) continue;
    // A list here (some configs) keeps its first entry.
    const json& value = it->is_array() && !it->empty() ? (*it)[0] : *it;
    *target = token_id(value, file, key);
  }
  out.temperature = number_field<double>(*config, "temperature", file);
  out.top_p = number_field<double>(*config, "top_p", file);
  out.top_k = number_field<int64_t>(*config, "top_k", file);
  out.min_p = number_field<double>(*config, "min_p", file);
  out.repetition_penalty = number_field<double>(*config, "repetition_penalty", file);
  out.do_sample = number_field<bool>(*config, "do_sample", file);
  out.max_new_tokens = number_field<int64_t>(*config, "max_new_tokens", file);
}

}  // namespace

const std::string& ModelMetadata::template_named(const std::string& name) const {
  if (name.empty() || (name == "default" && named_chat_templates.count(name) == 0)) {
    if (chat_template.empty()) fail("the model has no chat template");
    return chat_template;
  }
  auto it = named_chat_templates.find(name);
  if (it != named_chat_templates.end()) return it->second;
  std::string names;
  for (const auto& [known, text] : named_chat_templates)
    names += (names.empty() ? "" : ", ") + known;
  fail("the model has no chat template named '{}' (it has: {})", name,
       names.empty() ? "none" : names);
}

ModelMetadata load_model_metadata(const std::string& model_dir) {
  const fs::path dir(model_dir);
  std::error_code error;
  if (!fs::is_directory(dir, error)) fail("model directory {} does not exist", model_dir);
  ModelMetadata out;
  read_tokenizer_config(dir, out);
  read_template_files(dir, out);
  read_generation_config(dir, out);
  return out;
}

std::vector<TokenId> stop_token_ids(const ModelMetadata& metadata, const Tokenizer& tokenizer) {
  std::vector<TokenId> ids = metadata.eos_token_ids;
  if (metadata.eos_token)
    if (auto id = tokenizer.token_to_id(*metadata.eos_token))
      if (std::find(ids.begin(), ids.end(), *id) == ids.end()) ids.push_back(*id);
  return ids;
}

}  // namespace megactx
