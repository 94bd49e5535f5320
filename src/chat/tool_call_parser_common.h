// Shared pieces of the tool-call parsers: the request's tool schemas, one
// parsed call, typing of argument values by JSON schema, and the JSON text of
// the arguments cut into the pieces a stream emits.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megactx::tool_calls {

// name -> the function's "parameters" JSON schema (null when it has none).
class ToolSchemas {
 public:
  // `tools`: OpenAI tools ([{type: "function", function: {name, parameters}}]);
  // flat {name, parameters} entries are accepted too; anything else is ignored.
  // known_only: only these tools may be called, even when there are none.
  explicit ToolSchemas(const nlohmann::json& tools, bool known_only = false);
  bool empty() const { return schemas_.empty(); }
  bool known_only() const { return known_only_; }
  bool has(const std::string& name) const { return schemas_.count(name) > 0; }
  // The schema of one parameter (a "$ref" into the tool's parameters
  // resolved), or null when the tool or the parameter is unknown.
  const nlohmann::json* property(const std::string& tool, const std::string& key) const;

 private:
  std::map<std::string, nlohmann::json> schemas_;
  bool known_only_ = false;
};

struct ParsedCall {
  std::string name;
  std::vector<std::pair<std::string, nlohmann::json>> arguments;  // in the model's order
};

// Whether a call to `name` may be accepted: any non-empty name without
// whitespace or angle brackets when no tools were given (and the schemas are
// not known_only), else a known tool.
bool acceptable_name(const ToolSchemas& schemas, const std::string& name);

// A raw argument value typed by its schema: "string" parameters stay text;
// integer/number/boolean/object/array/null values are parsed as JSON (Python's
// True/False/None accepted for booleans and null); where strings are allowed
// too, only a JSON value of an allowed type replaces the text; a value that
// does not parse stays a string, so nothing is lost. Without a schema the
// value is parsed as JSON when it is a non-string JSON value, else kept as text.
nlohmann::json type_value(const nlohmann::json* schema, const std::string& raw);

// The JSON types a parameter schema allows, as type_value reads them: "type"
// (a name or a list), else the values of "enum" / "const" ("string" or
// "json" for any other value), and the branches of anyOf/oneOf. Empty: the
// schema names none.
std::vector<std::string> schema_types(const nlohmann::json& schema);
std::vector<std::string> schema_types(const nlohmann::ordered_json& schema);

// How a value of a parameter is written in markup, so that type_value reads
// it back as what was meant: Text: only strings are allowed (the raw text);
// Json: no string is allowed (JSON text); Mixed: strings and other types, or
// no type named (raw text that may also read as JSON).
enum class ValueForm { Text, Json, Mixed };
ValueForm value_form(const nlohmann::json* schema);
ValueForm value_form(const nlohmann::ordered_json* schema);

// `schema` with a top-level "$ref" ("#/..." pointers into `root`, followed a
// few levels) replaced by its target; `schema` itself otherwise, or null for
// a reference that does not resolve.
template <typename Json>
const Json* resolve_local_ref(const Json& root, const Json& schema) {
  const Json* at = &schema;
  for (int hops = 0; hops < 8; ++hops) {
    if (!at->is_object()) return at;
    auto ref = at->find("$ref");
    if (ref == at->end()) return at;
    if (!ref->is_string() || !ref->template get<std::string>().starts_with("#")) return nullptr;
    try {
      const typename Json::json_pointer pointer(ref->template get<std::string>().substr(1));
      if (!root.contains(pointer)) return nullptr;
      at = &root.at(pointer);
    } catch (const nlohmann::json::exception&) {
      return nullptr;
    }
  }
  return nullptr;  // a cycle of references
}

// The arguments as compact JSON text, cut into pieces: `{"a":1` `,"b":2` `}`
// (just `{}` without arguments). Their concatenation is the full JSON object.
std::vector<std::string> argument_pieces(const ParsedCall& call);

// JSON text of a value; invalid UTF-8 is replaced rather than thrown on.
std::string dump_json(const nlohmann::json& value);

// Helpers for the hand-written scanners.
bool is_space(char c);
std::string_view trim(std::string_view text);
bool all_space(std::string_view text);

// Format-specific parsers of one complete block (start marker .. end marker
// inclusive). nullopt: malformed, the caller keeps the block as text.
std::optional<std::vector<ParsedCall>> parse_glm_block(std::string_view block,
                                                       const ToolSchemas& schemas);
std::optional<std::vector<ParsedCall>> parse_dsml_block(std::string_view block,
                                                        const ToolSchemas& schemas);

inline constexpr std::string_view kGlmStart = "<tool_call>";
inline constexpr std::string_view kGlmEnd = "</tool_call>";
// "｜" is U+FF5C FULLWIDTH VERTICAL LINE, as in DeepSeek-V3.2's template.
inline constexpr std::string_view kDsmlStart =
    "<\xEF\xBD\x9C"
    "DSML\xEF\xBD\x9C"
    "function_calls>";
inline constexpr std::string_view kDsmlEnd =
    "</\xEF\xBD\x9C"
    "DSML\xEF\xBD\x9C"
    "function_calls>";

}  // namespace megactx::tool_calls
