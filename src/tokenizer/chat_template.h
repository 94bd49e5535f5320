// Chat templates: a Jinja2 interpreter for the templates that ship in
// tokenizer_config.json / chat_template.jinja, rendering byte for byte what
// HF transformers' apply_chat_template renders (trim_blocks, lstrip_blocks,
// HF's tojson, raise_exception, strftime_now).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>

namespace megactx {

class ChatTemplate {
 public:
  // Parses the template; throws megactx::Error "line L, column C: ..." for
  // syntax errors and unsupported constructs.
  explicit ChatTemplate(const std::string& source);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // Renders with `context` as the global variables (messages, tools,
  // add_generation_prompt, bos_token, eos_token, chat_template_kwargs merged in).
  // Errors raised by the template (raise_exception) become megactx::Error.
  std::string render(const nlohmann::json& context) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Builds the render context from an OpenAI chat request (messages, tools,
// add_generation_prompt defaulting to true, chat_template_kwargs spread into
// the globals) plus special tokens from tokenizer_config.json.
nlohmann::json chat_template_context(const nlohmann::json& request,
                                     const nlohmann::json& special_tokens);

}  // namespace megactx
