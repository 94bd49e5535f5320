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
  explicit ToolSchemas(const nlohmann::json& tools);
  bool empty() const { return schemas_.empty(); }
  bool has(const std::string& name) const { return schemas_.count(name) > 0; }
  // The schema of one parameter, or null when the tool or the parameter is unknown.
  const nlohmann::json* property(const std::string& tool, const std::string& key) const;

 private:
  std::map<std::string, nlohmann::json> schemas_;
};

struct ParsedCall {
  std::string name;
  std::vector<std::pair<std::string, nlohmann::json>> arguments;  // in the model's order
};

// Whether a call to `name` may be accepted: any non-empty name without
// whitespace or angle brackets when no tools were given, else a known tool.
bool acceptable_name(const ToolSchemas& schemas, const std::string& name);

// A raw argument value typed by its schema: "string" parameters stay text;
// integer/number/boolean/object/array/null values are parsed as JSON (Python's
// True/False/None accepted for booleans and null); a value that does not parse
// stays a string, so nothing is lost. Without a schema the value is parsed as
// JSON when it is a non-string JSON value, else kept as text.
nlohmann::json type_value(const nlohmann::json* schema, const std::string& raw);

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
