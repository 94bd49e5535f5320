// GLM tool calls, as the GLM-4.x/5 chat template teaches the model to write them:
//
//   <tool_call>NAME
//   <arg_key>K1</arg_key>
//   <arg_value>V1</arg_value>
//   ...
//   </tool_call>
//
// Whitespace between the parts is free. Values are raw text (strings are not
// quoted; other types are written as JSON). A JSON object on the line after the
// name is accepted as the whole argument set (older GLM releases wrote that).
#include <set>

#include "chat/tool_call_parser_common.h"
#include "io/bounded_json.h"

namespace megactx::tool_calls {

namespace {

constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>";

void skip_space(std::string_view text, size_t& position) {
  while (position < text.size() && is_space(text[position])) ++position;
}

bool consume(std::string_view text, size_t& position, std::string_view token) {
  if (text.substr(position, token.size()) != token) return false;
  position += token.size();
  return true;
}

// Reads up to `close`; the text in between goes to `out`.
bool read_until(std::string_view text, size_t& position, std::string_view close,
                std::string_view& out) {
  const size_t end = text.find(close, position);
  if (end == std::string_view::npos) return false;
  out = text.substr(position, end - position);
  position = end + close.size();
  return true;
}

}  // namespace

std::optional<std::vector<ParsedCall>> parse_glm_block(std::string_view block,
                                                       const ToolSchemas& schemas) {
  if (block.size() < kGlmStart.size() + kGlmEnd.size() || !block.starts_with(kGlmStart) ||
      !block.ends_with(kGlmEnd))
    return std::nullopt;
  const std::string_view inner =
      block.substr(kGlmStart.size(), block.size() - kGlmStart.size() - kGlmEnd.size());

  // The name runs to the end of its line or to the first <arg_key>.
  size_t name_end = std::min(inner.find('\n'), inner.find(kKeyOpen));
  if (name_end == std::string_view::npos) name_end = inner.size();
  ParsedCall call;
  call.name = std::string(trim(inner.substr(0, name_end)));
  if (!acceptable_name(schemas, call.name)) return std::nullopt;

  std::string_view rest = inner.substr(name_end);
  if (trim(rest).starts_with("{")) {
    nlohmann::ordered_json object = try_parse_ordered_json(trim(rest));
    if (object.is_discarded() || !object.is_object()) return std::nullopt;
    for (const auto& [key, value] : object.items())
      call.arguments.emplace_back(key, parse_json(value.dump()));
    return std::vector<ParsedCall>{std::move(call)};
  }

  std::set<std::string> seen;
  size_t position = 0;
  while (true) {
    skip_space(rest, position);
    if (position == rest.size()) break;
    std::string_view key, value;
    if (!consume(rest, position, kKeyOpen) || !read_until(rest, position, kKeyClose, key))
      return std::nullopt;
    skip_space(rest, position);
    if (!consume(rest, position, kValueOpen) || !read_until(rest, position, kValueClose, value))
      return std::nullopt;
    const std::string name(trim(key));
    // An empty or repeated key, or a marker inside a key, means the text is not a clean call.
    if (name.empty() || !seen.insert(name).second || name.find('<') != std::string::npos)
      return std::nullopt;
    call.arguments.emplace_back(name,
                                type_value(schemas.property(call.name, name), std::string(value)));
  }
  return std::vector<ParsedCall>{std::move(call)};
}

}  // namespace megactx::tool_calls
