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
  // Errors raised by the template (raise_exception) become megactx::Error
  // carrying the template's message unchanged; other runtime errors name the
  // line and column. Pass an ordered_json (parsed with
  // nlohmann::ordered_json::parse) to keep the request's key order: Python
  // dicts keep it and `tojson` output must match HF's byte for byte.
  std::string render(const nlohmann::json& context) const;
  std::string render(const nlohmann::ordered_json& context) const;

  // Bound on loop iterations + calls + filters of one render (default 10M,
  // far above what real templates need even for O(n^2) loops over thousands of
  // messages); exceeding it is an Error, so hostile templates stay bounded.
  void set_step_limit(size_t steps);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Builds the render context from an OpenAI chat request (messages, tools,
// add_generation_prompt defaulting to true, chat_template_kwargs spread into
// the globals) plus special tokens from tokenizer_config.json.
// `special_tokens` is tokenizer_config.json (or any object): every "*_token"
// key (string or {"content": ...}) and additional_special_tokens become globals,
// as HF's special_tokens_map. Throws megactx::Error for a malformed request.
nlohmann::json chat_template_context(const nlohmann::json& request,
                                     const nlohmann::json& special_tokens);
nlohmann::ordered_json chat_template_context(const nlohmann::ordered_json& request,
                                             const nlohmann::ordered_json& special_tokens);

// OpenAI clients send an assistant message's tool_calls[].function.arguments
// as a JSON string, while chat templates expect an object (GLM iterates
// `arguments.items()`, DeepSeek tests `arguments is mapping`). Servers call this
// before chat_template_context, as vLLM does: every string that parses as a
// JSON object is replaced by that object; other strings are left unchanged.
void decode_tool_call_arguments(nlohmann::ordered_json& request);

}  // namespace megactx
