#include "chat/chat_template.h"

#include <fstream>
#include <sstream>

#include "chat/jinja/builtins.h"
#include "chat/jinja/interpreter.h"
#include "chat/jinja/lexer.h"
#include "chat/jinja/parser.h"
#include "chat/jinja/validate.h"
#include "core/error.h"
#include "io/bounded_json.h"

namespace megactx {

struct ChatTemplate::Impl {
  std::string source;  // normalized (newlines, trailing newline) as jinja2 sees it
  jinja::Body body;
  size_t step_limit = jinja::Interpreter::kDefaultMaxSteps;
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  impl_->source = jinja::normalize_template_source(source);
  impl_->body = jinja::parse_template(impl_->source);
  jinja::validate_template(impl_->body, impl_->source);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

namespace {

template <typename Json>
std::string render_template(const std::string& source, const jinja::Body& body, size_t step_limit,
                            const Json& context) {
  if (!context.is_object()) fail("chat template context must be a JSON object");
  jinja::Dict globals;
  jinja::add_global_functions(globals);
  for (const auto& [key, value] : context.items())
    globals.set(jinja::Value::string(key), jinja::Value::from_json(value));
  jinja::Interpreter interpreter(source, step_limit);
  try {
    return interpreter.render(body, globals);
  } catch (const jinja::TemplateRaised& raised) {
    throw Error(raised.message);
  }
}

}  // namespace

void ChatTemplate::set_step_limit(size_t steps) {
  impl_->step_limit = steps;
}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  return render_template(impl_->source, impl_->body, impl_->step_limit, context);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render_template(impl_->source, impl_->body, impl_->step_limit, context);
}

namespace {

// tokenizer_config.json stores special tokens as strings or as AddedToken
// objects {"content": "...", ...}; templates see the content string.
template <typename Json>
bool special_token_text(const Json& value, std::string& text) {
  if (value.is_string()) {
    text = value.template get<std::string>();
    return true;
  }
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    text = value["content"].template get<std::string>();
    return true;
  }
  return false;
}

template <typename Json>
Json build_context(const Json& request, const Json& special_tokens) {
  if (!request.is_object()) fail("chat request must be a JSON object");
  if (!request.contains("messages") || !request["messages"].is_array())
    fail("chat request needs a \"messages\" array");
  Json context = Json::object();
  // HF passes tokenizer.special_tokens_map first, then the call's kwargs.
  if (special_tokens.is_object()) {
    for (const auto& [key, value] : special_tokens.items()) {
      std::string text;
      bool token_key = key.size() > 6 && key.compare(key.size() - 6, 6, "_token") == 0;
      if (token_key && special_token_text(value, text)) context[key] = text;
      if (key == "additional_special_tokens" && value.is_array()) {
        Json list = Json::array();
        for (const auto& item : value)
          if (special_token_text(item, text)) list.push_back(text);
        context[key] = list;
      }
    }
  }
  if (request.contains("chat_template_kwargs")) {
    const auto& kwargs = request["chat_template_kwargs"];
    if (!kwargs.is_object()) fail("\"chat_template_kwargs\" must be an object");
    for (const auto& [key, value] : kwargs.items()) {
      // The reference passes these as named arguments: Python rejects duplicates.
      if (key == "messages" || key == "tools" || key == "add_generation_prompt")
        fail("chat_template_kwargs may not set \"{}\"; it is a request field", key);
      context[key] = value;
    }
  }
  for (const char* key : {"bos_token", "eos_token"})
    if (request.contains(key)) context[key] = request[key];
  context["messages"] = request["messages"];
  context["tools"] = request.contains("tools") ? request["tools"] : Json();
  context["add_generation_prompt"] =
      request.contains("add_generation_prompt") ? request["add_generation_prompt"] : Json(true);
  return context;
}

}  // namespace

nlohmann::json chat_template_context(const nlohmann::json& request,
                                     const nlohmann::json& special_tokens) {
  return build_context(request, special_tokens);
}

nlohmann::ordered_json chat_template_context(const nlohmann::ordered_json& request,
                                             const nlohmann::ordered_json& special_tokens) {
  return build_context(request, special_tokens);
}

void decode_tool_call_arguments(nlohmann::ordered_json& request) {
  if (!request.is_object() || !request.contains("messages") || !request["messages"].is_array())
    return;
  for (auto& message : request["messages"]) {
    if (!message.is_object() || !message.contains("tool_calls") ||
        !message["tool_calls"].is_array())
      continue;
    for (auto& call : message["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
        continue;
      auto& function = call["function"];
      if (!function.contains("arguments") || !function["arguments"].is_string()) continue;
      auto decoded = try_parse_ordered_json(function["arguments"].get<std::string>());
      if (decoded.is_object()) function["arguments"] = std::move(decoded);
    }
  }
}

}  // namespace megactx
