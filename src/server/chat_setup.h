// How /v1/chat/completions turns messages into a prompt and output back into
// messages: the model's chat template (chat_template.jinja, or
// tokenizer_config.json's chat_template, as transformers picks them), the
// special tokens the template may reference, and the tool-call format of the
// model family.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

#include "chat/chat_template.h"
#include "chat/output_parser.h"

namespace megactx::server {

struct ChatSetup {
  std::shared_ptr<const ChatTemplate> chat_template;  // null: the model has none (chat -> 400)
  nlohmann::json special_tokens = nlohmann::json::object();  // bos_token, eos_token, ...
  ToolCallFormat tool_call_format = ToolCallFormat::Glm;
};

// Reads DIR/chat_template.jinja or DIR/tokenizer_config.json. A missing
// template is not an error (completions still work); a template that does not
// parse is. `model_type` is the HF model_type ("glm_moe_dsa", "deepseek_v32").
ChatSetup load_chat_setup(const std::string& model_dir, const std::string& model_type);

// True when the rendered prompt leaves the model inside a <think> block (the
// template opened it), so the output parser starts in reasoning.
bool prompt_opens_reasoning(const std::string& prompt);

}  // namespace megactx::server
