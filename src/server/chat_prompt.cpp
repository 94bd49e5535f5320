#include "server/chat_prompt.h"

#include "chat/chat_template.h"
#include "io/bounded_json.h"
#include "server/api_error.h"
#include "server/request_fields.h"

namespace megactx::server {

namespace {

void validate_messages(const nlohmann::json& body) {
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    throw_invalid("messages", "'messages' must be a non-empty list");
  for (const auto& message : body["messages"]) {
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string())
      throw_invalid("messages", "every message must be an object with a string 'role'");
    const std::string role = message["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" &&
        role != "developer")
      throw_invalid("messages", "unknown message role '" + role + "'");
    if (message.contains("content") && !message["content"].is_null() &&
        !message["content"].is_string() && !message["content"].is_array())
      throw_invalid("messages", "message 'content' must be a string, a list of parts or null");
  }
}

// Applies tool_choice to the tools the template sees: "none" drops them,
// a named choice keeps only that function. Returns the tools to render.
nlohmann::json select_tools(const nlohmann::json& body) {
  nlohmann::json tools = nlohmann::json::array();
  if (has_field(body, "tools")) {
    if (!body["tools"].is_array()) throw_invalid("tools", "'tools' must be a list");
    for (const auto& tool : body["tools"]) {
      if (!tool.is_object() || string_or_empty(tool, "type") != "function" ||
          !tool.contains("function") || !tool["function"].is_object() ||
          !tool["function"].contains("name") || !tool["function"]["name"].is_string())
        throw_invalid("tools",
                      "every tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
      tools.push_back(tool);
    }
  }
  if (!has_field(body, "tool_choice")) return tools;
  const auto& choice = body["tool_choice"];
  if (choice.is_string()) {
    std::string mode = choice.get<std::string>();
    if (mode == "none") return nlohmann::json::array();
    if (mode == "auto") return tools;
    if (mode == "required") {
      if (tools.empty()) throw_invalid("tool_choice", "tool_choice 'required' needs 'tools'");
      return tools;
    }
    throw_invalid("tool_choice", "'tool_choice' must be none, auto, required or a named function");
  }
  if (choice.is_object() && string_or_empty(choice, "type") == "function" &&
      choice.contains("function") && choice["function"].is_object() &&
      choice["function"].contains("name") && choice["function"]["name"].is_string()) {
    std::string name = choice["function"]["name"].get<std::string>();
    for (const auto& tool : tools)
      if (tool["function"]["name"] == name) return nlohmann::json::array({tool});
    throw_invalid("tool_choice", "tool_choice names '" + name + "', which is not in 'tools'");
  }
  throw_invalid("tool_choice", "'tool_choice' must be none, auto, required or a named function");
}

}  // namespace

ChatPrompt render_chat_prompt(const ChatSetup& chat, const nlohmann::json& body,
                              std::string_view raw_body) {
  validate_messages(body);
  if (!chat.chat_template)
    throw ApiError(400, "this model has no chat template; use /v1/completions or /generate");
  if (has_field(body, "chat_template_kwargs") && !body["chat_template_kwargs"].is_object())
    throw_invalid("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  ChatPrompt prompt;
  prompt.tools = select_tools(body);
  nlohmann::ordered_json request = parse_ordered_json(raw_body);
  if (prompt.tools.empty()) {
    request.erase("tools");
  } else if (prompt.tools.size() != body["tools"].size()) {  // a named tool_choice kept one
    nlohmann::ordered_json kept = nlohmann::ordered_json::array();
    for (const auto& tool : request["tools"])
      if (tool.contains("function") &&
          tool["function"].value("name", "") == prompt.tools[0]["function"].value("name", ""))
        kept.push_back(tool);
    request["tools"] = std::move(kept);
  }
  decode_tool_call_arguments(request);
  const nlohmann::ordered_json special_tokens = parse_ordered_json(chat.special_tokens.dump());
  prompt.text = chat.chat_template->render(chat_template_context(request, special_tokens));
  return prompt;
}

}  // namespace megactx::server
