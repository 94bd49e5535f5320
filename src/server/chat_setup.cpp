#include "server/chat_setup.h"

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "tokenizer/model_metadata.h"

namespace megactx::server {

ChatSetup load_chat_setup(const std::string& model_dir, const std::string& model_type) {
  ChatSetup setup;
  setup.tool_call_format =
      model_type == "deepseek_v32" ? ToolCallFormat::DeepseekDsml : ToolCallFormat::Glm;
  // chat_template.jinja over tokenizer_config.json's chat_template, list form
  // resolved to "default", as transformers does (ModelMetadata knows the rules).
  ModelMetadata metadata = load_model_metadata(model_dir);
  for (auto [name, value] :
       {std::pair{"bos_token", &metadata.bos_token}, std::pair{"eos_token", &metadata.eos_token},
        std::pair{"pad_token", &metadata.pad_token}, std::pair{"unk_token", &metadata.unk_token}})
    if (*value) setup.special_tokens[name] = **value;
  if (metadata.chat_template.empty()) {
    spdlog::warn("{} has no chat template; /v1/chat/completions will answer 400", model_dir);
    return setup;
  }
  try {
    setup.chat_template = std::make_shared<const ChatTemplate>(metadata.chat_template);
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
