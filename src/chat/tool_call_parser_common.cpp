#include "chat/tool_call_parser_common.h"

#include <algorithm>
#include <cmath>

#include "io/bounded_json.h"

namespace megactx::tool_calls {

ToolSchemas::ToolSchemas(const nlohmann::json& tools, bool known_only) : known_only_(known_only) {
  if (!tools.is_array()) return;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    const nlohmann::json* function = &tool;
    if (tool.contains("function") && tool["function"].is_object()) function = &tool["function"];
    if (!function->contains("name") || !(*function)["name"].is_string()) continue;
    nlohmann::json parameters = nullptr;
    if (function->contains("parameters")) parameters = (*function)["parameters"];
    schemas_[(*function)["name"].get<std::string>()] = std::move(parameters);
  }
}

const nlohmann::json* ToolSchemas::property(const std::string& tool, const std::string& key) const {
  auto it = schemas_.find(tool);
  if (it == schemas_.end() || !it->second.is_object()) return nullptr;
  auto properties = it->second.find("properties");
  if (properties == it->second.end() || !properties->is_object()) return nullptr;
  auto property = properties->find(key);
  return property == properties->end() ? nullptr : resolve_local_ref(it->second, *property);
}

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

bool all_space(std::string_view text) {
  return trim(text).empty();
}

bool acceptable_name(const ToolSchemas& schemas, const std::string& name) {
  if (name.empty()) return false;
  if (!schemas.empty() || schemas.known_only()) return schemas.has(name);
  for (char c : name)
    if (is_space(c) || c == '<' || c == '>' || c == '"') return false;
  return true;
}

namespace {

// The JSON types a schema allows ("type" as a string or a list, enums of
// strings, anyOf/oneOf alternatives).
void collect_types(const nlohmann::json& schema, std::vector<std::string>& types, int depth = 0) {
  if (!schema.is_object() || depth > 8) return;
  if (auto type = schema.find("type"); type != schema.end()) {
    if (type->is_string()) types.push_back(type->get<std::string>());
    if (type->is_array())
      for (const auto& t : *type)
        if (t.is_string()) types.push_back(t.get<std::string>());
  } else if (auto values = schema.find("enum"); values != schema.end() && values->is_array()) {
    for (const auto& v : *values) types.push_back(v.is_string() ? "string" : "json");
  } else if (auto value = schema.find("const"); value != schema.end()) {
    types.push_back(value->is_string() ? "string" : "json");
  }
  for (const char* combinator : {"anyOf", "oneOf"})
    if (auto options = schema.find(combinator); options != schema.end() && options->is_array())
      for (const auto& option : *options) collect_types(option, types, depth + 1);
}

std::optional<nlohmann::json> parse_json(std::string_view text) {
  nlohmann::json value = try_parse_json(text);
  if (value.is_discarded()) return std::nullopt;
  return value;
}

// Whether a parsed value is of one of `types` ("json": any).
bool type_allowed(const nlohmann::json& value, const std::vector<std::string>& types) {
  for (const std::string& type : types) {
    if (type == "json") return true;
    if (type == "string" && value.is_string()) return true;
    if (type == "boolean" && value.is_boolean()) return true;
    if (type == "null" && value.is_null()) return true;
    if (type == "object" && value.is_object()) return true;
    if (type == "array" && value.is_array()) return true;
    if (type == "number" && value.is_number()) return true;
    if (type == "integer" &&
        (value.is_number_integer() ||
         (value.is_number_float() && value.get<double>() == std::floor(value.get<double>()))))
      return true;
  }
  return false;
}

}  // namespace

std::vector<std::string> schema_types(const nlohmann::json& schema) {
  std::vector<std::string> types;
  collect_types(schema, types);
  return types;
}

std::vector<std::string> schema_types(const nlohmann::ordered_json& schema) {
  return schema_types(nlohmann::json::parse(schema.dump()));
}

ValueForm value_form(const nlohmann::ordered_json* schema) {
  if (schema == nullptr) return value_form(static_cast<const nlohmann::json*>(nullptr));
  const nlohmann::json plain = nlohmann::json::parse(schema->dump());
  return value_form(&plain);
}

ValueForm value_form(const nlohmann::json* schema) {
  const std::vector<std::string> types =
      schema != nullptr ? schema_types(*schema) : std::vector<std::string>{};
  if (types.empty()) return ValueForm::Mixed;
  const auto strings = std::count(types.begin(), types.end(), "string");
  if (strings == static_cast<std::ptrdiff_t>(types.size())) return ValueForm::Text;
  return strings == 0 ? ValueForm::Json : ValueForm::Mixed;
}

nlohmann::json type_value(const nlohmann::json* schema, const std::string& raw) {
  std::vector<std::string> types;
  if (schema != nullptr) collect_types(*schema, types);
  const bool string_only =
      !types.empty() &&
      std::all_of(types.begin(), types.end(), [](const std::string& t) { return t == "string"; });
  if (string_only) return raw;

  const std::string_view text = trim(raw);
  if (types.empty()) {
    // No schema: JSON scalars/objects as such, everything else as the text it is.
    auto parsed = parse_json(text);
    if (parsed && !parsed->is_string()) return *parsed;
    return raw;
  }
  auto allows = [&](const char* type) {
    return std::find(types.begin(), types.end(), type) != types.end();
  };
  if (allows("boolean")) {
    if (text == "True") return true;
    if (text == "False") return false;
  }
  if (allows("null") && text == "None") return nullptr;
  auto parsed = parse_json(text);
  // With strings allowed, text that reads as JSON of a type the schema does
  // not allow ("2.5" for integer-or-string) is the string it was written as.
  if (parsed && !(parsed->is_string() && allows("string")) &&
      (!allows("string") || type_allowed(*parsed, types)))
    return *parsed;
  return raw;
}

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::vector<std::string> argument_pieces(const ParsedCall& call) {
  if (call.arguments.empty()) return {"{}"};
  std::vector<std::string> pieces;
  for (size_t i = 0; i < call.arguments.size(); ++i) {
    const auto& [key, value] = call.arguments[i];
    pieces.push_back((i == 0 ? "{" : ",") + dump_json(key) + ":" + dump_json(value));
  }
  pieces.back() += "}";
  return pieces;
}

}  // namespace megactx::tool_calls
