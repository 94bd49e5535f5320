#include "gateway/message_fingerprint.h"

#include <functional>
#include <string>
#include <string_view>

#include "io/bounded_json.h"

namespace megactx::gateway {

namespace {

constexpr char kSeparator = '\x1f';

std::string_view trimmed(std::string_view text) {
  const char* space = " \t\r\n";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

// The text a content stands for: a string, the text parts of a list, or "".
std::string content_text(const nlohmann::json& message) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  std::string text;
  if (it->is_array()) {
    for (const auto& part : *it) {
      if (part.is_string()) {
        text += part.get<std::string>();
      } else if (part.is_object()) {
        auto part_text = part.find("text");
        if (part_text != part.end() && part_text->is_string())
          text += part_text->get<std::string>();
      }
    }
    return text;
  }
  return it->dump();
}

// Arguments as canonical JSON (nlohmann's objects sort their keys) when they
// parse, else as written.
std::string canonical_arguments(const nlohmann::json& arguments) {
  if (arguments.is_string()) {
    const std::string text = arguments.get<std::string>();
    nlohmann::json parsed = try_parse_json(text);
    if (!parsed.is_discarded()) return parsed.dump();
    return text;
  }
  if (arguments.is_null()) return "{}";
  return arguments.dump();
}

}  // namespace

uint64_t message_fingerprint(const nlohmann::json& message) {
  if (!message.is_object()) return std::hash<std::string>{}(message.dump());
  std::string key;
  auto role = message.find("role");
  if (role != message.end() && role->is_string()) key += role->get<std::string>();
  key += kSeparator;
  key += trimmed(content_text(message));
  auto calls = message.find("tool_calls");
  if (calls != message.end() && calls->is_array()) {
    for (const auto& call : *calls) {
      key += kSeparator;
      if (!call.is_object()) {
        key += call.dump();
        continue;
      }
      // {"function": {"name", "arguments"}}, or the flat form some clients send.
      const nlohmann::json& function =
          call.contains("function") && call["function"].is_object() ? call["function"] : call;
      auto name = function.find("name");
      if (name != function.end() && name->is_string()) key += name->get<std::string>();
      key += kSeparator;
      auto arguments = function.find("arguments");
      key += canonical_arguments(arguments == function.end() ? nlohmann::json() : *arguments);
    }
  }
  return std::hash<std::string>{}(key);
}

uint64_t header_fingerprint(const nlohmann::json& body) {
  std::string key = "header";
  for (const char* name : {"tools", "chat_template_kwargs"}) {
    key += kSeparator;
    auto it = body.find(name);
    if (it != body.end() && !it->is_null()) key += it->dump();
  }
  return std::hash<std::string>{}(key);
}

std::vector<uint64_t> history_fingerprints(const nlohmann::json& body) {
  std::vector<uint64_t> out{header_fingerprint(body)};
  auto messages = body.find("messages");
  if (messages != body.end() && messages->is_array())
    for (const auto& message : *messages) out.push_back(message_fingerprint(message));
  return out;
}

}  // namespace megactx::gateway
