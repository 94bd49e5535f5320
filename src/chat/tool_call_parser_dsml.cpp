// DeepSeek-V3.2 "DSML" tool calls, as its chat template teaches them
// (｜ is U+FF5C):
//
//   <｜DSML｜function_calls>
//   <｜DSML｜invoke name="NAME">
//   <｜DSML｜parameter name="K" string="true">raw text</｜DSML｜parameter>
//   <｜DSML｜parameter name="N" string="false">JSON</｜DSML｜parameter>
//   </｜DSML｜invoke>
//   ...more invokes...
//   </｜DSML｜function_calls>
//
// string="true" keeps the value as text; string="false" parses it as JSON
// (falling back to the schema's typing when it does not parse). An invoke whose
// body is a bare JSON object takes it as the whole argument set.
#include <set>

#include "chat/tool_call_parser_common.h"
#include "io/bounded_json.h"

namespace megactx::tool_calls {

namespace {

#define MEGACTX_DSML \
  "<\xEF\xBD\x9C"    \
  "DSML\xEF\xBD\x9C"
#define MEGACTX_DSML_CLOSE \
  "</\xEF\xBD\x9C"         \
  "DSML\xEF\xBD\x9C"
constexpr std::string_view kInvokeOpen = MEGACTX_DSML "invoke";
constexpr std::string_view kInvokeClose = MEGACTX_DSML_CLOSE "invoke>";
constexpr std::string_view kParameterOpen = MEGACTX_DSML "parameter";
constexpr std::string_view kParameterClose = MEGACTX_DSML_CLOSE "parameter>";
#undef MEGACTX_DSML
#undef MEGACTX_DSML_CLOSE

void skip_space(std::string_view text, size_t& position) {
  while (position < text.size() && is_space(text[position])) ++position;
}

// Parses ` name="x" string="true">` (attributes in any order, values without
// quotes inside) up to and including the '>'.
bool read_attributes(std::string_view text, size_t& position,
                     std::vector<std::pair<std::string, std::string>>& attributes) {
  while (true) {
    skip_space(text, position);
    if (position >= text.size()) return false;
    if (text[position] == '>') {
      ++position;
      return true;
    }
    const size_t equals = text.find('=', position);
    if (equals == std::string_view::npos) return false;
    const std::string key(trim(text.substr(position, equals - position)));
    if (key.empty() || key.find_first_of("<>\"") != std::string::npos) return false;
    position = equals + 1;
    if (position >= text.size() || text[position] != '"') return false;
    const size_t close = text.find('"', position + 1);
    if (close == std::string_view::npos) return false;
    attributes.emplace_back(key, std::string(text.substr(position + 1, close - position - 1)));
    position = close + 1;
  }
}

const std::string* attribute(const std::vector<std::pair<std::string, std::string>>& attributes,
                             std::string_view key) {
  for (const auto& [k, v] : attributes)
    if (k == key) return &v;
  return nullptr;
}

std::optional<ParsedCall> parse_invoke(std::string_view text, size_t& position,
                                       const ToolSchemas& schemas) {
  std::vector<std::pair<std::string, std::string>> attributes;
  if (text.substr(position, kInvokeOpen.size()) != kInvokeOpen) return std::nullopt;
  position += kInvokeOpen.size();
  if (!read_attributes(text, position, attributes)) return std::nullopt;
  const std::string* name = attribute(attributes, "name");
  if (name == nullptr || attributes.size() != 1) return std::nullopt;
  ParsedCall call;
  call.name = *name;
  if (!acceptable_name(schemas, call.name)) return std::nullopt;

  const size_t body_end = text.find(kInvokeClose, position);
  if (body_end == std::string_view::npos) return std::nullopt;
  const std::string_view body = text.substr(position, body_end - position);
  position = body_end + kInvokeClose.size();

  if (trim(body).starts_with("{")) {
    nlohmann::ordered_json object = try_parse_ordered_json(trim(body));
    if (object.is_discarded() || !object.is_object()) return std::nullopt;
    for (const auto& [key, value] : object.items())
      call.arguments.emplace_back(key, parse_json(value.dump()));
    return call;
  }

  std::set<std::string> seen;
  size_t at = 0;
  while (true) {
    skip_space(body, at);
    if (at == body.size()) break;
    if (body.substr(at, kParameterOpen.size()) != kParameterOpen) return std::nullopt;
    at += kParameterOpen.size();
    std::vector<std::pair<std::string, std::string>> parameter;
    if (!read_attributes(body, at, parameter)) return std::nullopt;
    const std::string* key = attribute(parameter, "name");
    const std::string* is_string = attribute(parameter, "string");
    if (key == nullptr || key->empty() || !seen.insert(*key).second) return std::nullopt;
    if (is_string != nullptr && *is_string != "true" && *is_string != "false") return std::nullopt;
    const size_t value_end = body.find(kParameterClose, at);
    if (value_end == std::string_view::npos) return std::nullopt;
    const std::string raw(body.substr(at, value_end - at));
    at = value_end + kParameterClose.size();

    nlohmann::json value;
    if (is_string != nullptr && *is_string == "true") {
      value = raw;
    } else if (is_string != nullptr) {
      value = try_parse_json(trim(raw));
      if (value.is_discarded()) value = type_value(schemas.property(call.name, *key), raw);
    } else {
      value = type_value(schemas.property(call.name, *key), raw);
    }
    call.arguments.emplace_back(*key, std::move(value));
  }
  return call;
}

}  // namespace

std::optional<std::vector<ParsedCall>> parse_dsml_block(std::string_view block,
                                                        const ToolSchemas& schemas) {
  if (block.size() < kDsmlStart.size() + kDsmlEnd.size() || !block.starts_with(kDsmlStart) ||
      !block.ends_with(kDsmlEnd))
    return std::nullopt;
  const std::string_view inner =
      block.substr(kDsmlStart.size(), block.size() - kDsmlStart.size() - kDsmlEnd.size());
  std::vector<ParsedCall> calls;
  size_t position = 0;
  while (true) {
    skip_space(inner, position);
    if (position == inner.size()) break;
    auto call = parse_invoke(inner, position, schemas);
    if (!call) return std::nullopt;
    calls.push_back(std::move(*call));
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

}  // namespace megactx::tool_calls
