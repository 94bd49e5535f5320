#include "server/chat_setup.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace megactx::server {

namespace {

bool read_file(const std::filesystem::path& path, std::string& text) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return false;
  std::ostringstream buffer;
  buffer << file.rdbuf();
  text = buffer.str();
  return true;
}

// tokenizer_config.json spells special tokens as strings or as AddedToken
// objects {"content": "...", ...}.
std::string token_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return {};
}

}  // namespace

ChatSetup load_chat_setup(const std::string& model_dir, const std::string& model_type) {
  namespace fs = std::filesystem;
  ChatSetup setup;
  setup.tool_call_format =
      model_type == "deepseek_v32" ? ToolCallFormat::DeepseekDsml : ToolCallFormat::Glm;

  std::string source;
  std::string config_text;
  nlohmann::json config = nlohmann::json::object();
  if (read_file(fs::path(model_dir) / "tokenizer_config.json", config_text)) {
    config = nlohmann::json::parse(config_text, nullptr, false);
    if (config.is_discarded() || !config.is_object())
      fail("{}/tokenizer_config.json is not a JSON object", model_dir);
    for (const char* name : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      if (config.contains(name)) {
        std::string text = token_text(config[name]);
        if (!text.empty()) setup.special_tokens[name] = text;
      }
    }
    if (config.contains("chat_template")) {
      const auto& value = config["chat_template"];
      if (value.is_string()) {
        source = value.get<std::string>();
      } else if (value.is_array()) {
        // [{"name": "default", "template": "..."}, ...]: transformers uses "default".
        for (const auto& entry : value)
          if (entry.is_object() && entry.value("name", "") == "default" &&
              entry.contains("template") && entry["template"].is_string())
            source = entry["template"].get<std::string>();
      }
    }
  }
  // chat_template.jinja takes precedence, as in transformers.
  std::string jinja;
  if (read_file(fs::path(model_dir) / "chat_template.jinja", jinja)) source = jinja;
  if (source.empty()) {
    spdlog::warn("{} has no chat template; /v1/chat/completions will answer 400", model_dir);
    return setup;
  }
  try {
    setup.chat_template = std::make_shared<const ChatTemplate>(source);
  } catch (const Error& error) {
    fail("the chat template of {} does not parse: {}", model_dir, error.what());
  }
  return setup;
}

bool prompt_opens_reasoning(const std::string& prompt) {
  size_t open = prompt.rfind("<think>");
  if (open == std::string::npos) return false;
  size_t close = prompt.rfind("</think>");
  return close == std::string::npos || close < open;
}

}  // namespace megactx::server
