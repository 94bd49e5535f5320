#include "chat/output_grammar.h"

#include <fmt/format.h>

#include <optional>
#include <set>

#include "chat/tool_call_parser_common.h"
#include "core/error.h"
#include "grammar/json_formats.h"
#include "grammar/regex_parser.h"
#include "grammar/text_languages.h"

namespace megactx {

namespace {

using grammar::ExprId;
using grammar::Grammar;
using Json = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

#define MEGACTX_DSML \
  "\xEF\xBD\x9C"     \
  "DSML\xEF\xBD\x9C"
constexpr std::string_view kDsmlInvoke = "<" MEGACTX_DSML "invoke name=\"";
constexpr std::string_view kDsmlInvokeClose = "</" MEGACTX_DSML "invoke>";
constexpr std::string_view kDsmlParameter = "<" MEGACTX_DSML "parameter name=\"";
constexpr std::string_view kDsmlParameterClose = "</" MEGACTX_DSML "parameter>";
#undef MEGACTX_DSML

const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title",   "description", "$comment", "examples",
                                          "default", "deprecated",  "readOnly", "writeOnly",
                                          "$schema", "$id",         "$defs",    "definitions"};
  return k;
}

// Lowers one constraint; `g` is the grammar being built.
class ChatOutputLowering {
 public:
  ChatOutputLowering(Grammar& g, const grammar::Vocabulary& vocabulary,
                     const ChatOutputConstraint& c)
      : g_(g), vocabulary_(vocabulary), c_(c) {}

  void run() {
    const int32_t root = g_.add_rule(g_.fresh_name("chat_output"));
    g_.set_body(root, g_.seq({reasoning(), body()}));
    g_.root = root;
  }

 private:
  ExprId mark(std::string_view text) { return grammar::marker(g_, vocabulary_, text); }

  // Up to two spaces or newlines (what templates put between the parts).
  ExprId ws() { return g_.repeat(g_.bytes({{' ', ' '}, {'\n', '\n'}}), 0, 2); }

  ExprId reasoning() {
    const ExprId text = grammar::text_without(g_, kThinkClose, c_.json_options.limits);
    switch (c_.reasoning) {
      case ReasoningStart::Open:
        return g_.seq({text, mark(kThinkClose), ws()});
      case ReasoningStart::Closed:
        return ws();
      case ReasoningStart::None:
        break;
    }
    return g_.seq({ws(), g_.optional(g_.seq({mark(kThinkOpen), text, mark(kThinkClose), ws()}))});
  }

  ExprId body() {
    const bool tools = !c_.tools.empty();
    if (c_.calls_required) {
      MEGACTX_CHECK(tools, "tool calls are required but no tool is given");
      return calls();
    }
    switch (c_.content) {
      case ChatOutputConstraint::Content::None:
        fail("a constrained chat output needs content or tool calls");
      case ChatOutputConstraint::Content::Free: {
        MEGACTX_CHECK(tools, "free content is constrained only around tool calls");
        const std::string_view start =
            c_.format == ToolCallFormat::Glm ? tool_calls::kGlmStart : tool_calls::kDsmlStart;
        // Content that never starts a block, then optionally the calls.
        return g_.seq(
            {grammar::text_without(g_, start, c_.json_options.limits), g_.optional(calls())});
      }
      case ChatOutputConstraint::Content::JsonObject:
      case ChatOutputConstraint::Content::JsonSchema: {
        const ExprId json = content_json();
        return tools ? g_.alt({json, calls()}) : json;
      }
    }
    fail("unknown chat output content");
  }

  ExprId content_json() {
    if (c_.content == ChatOutputConstraint::Content::JsonObject) {
      grammar::lower_any_json(g_, c_.json_options, /*object_only=*/true);
    } else {
      grammar::lower_json_schema(g_, c_.schema, c_.json_options);
    }
    return g_.rule_ref(g_.root);
  }

  // ---- tool calls ----

  ExprId calls() {
    std::vector<ExprId> each;
    for (const Json& tool : c_.tools) each.push_back(call(tool));
    const ExprId one = g_.alt(std::move(each));
    if (c_.format == ToolCallFormat::Glm) {
      // One block per call.
      return c_.parallel_calls ? g_.seq({one, g_.star(g_.seq({g_.byte('\n'), one}))}) : one;
    }
    // DSML: one block, one invoke per call.
    const ExprId invokes =
        c_.parallel_calls ? g_.seq({one, g_.star(g_.seq({g_.byte('\n'), one}))}) : one;
    return g_.seq({mark(tool_calls::kDsmlStart), g_.byte('\n'), invokes, g_.byte('\n'),
                   mark(tool_calls::kDsmlEnd)});
  }

  [[noreturn]] void error(const std::string& where, const std::string& message) const {
    fail("tool '{}': {}", where, message);
  }

  ExprId call(const Json& tool) {
    const Json& function = tool.contains("function") ? tool["function"] : tool;
    const std::string name = function.value("name", "");
    if (name.empty()) fail("a tool has no function name");
    tool_ = name;
    strict_ = function.contains("strict") && function["strict"].is_boolean() &&
              function["strict"].get<bool>();
    parameters_ = function.contains("parameters") ? function["parameters"] : Json::object();
    if (parameters_.is_null()) parameters_ = Json::object();
    const bool glm = c_.format == ToolCallFormat::Glm;
    if (glm && (name.find_first_of(" \t\r\n<>") != std::string::npos))
      error(name, "GLM's tool-call format cannot write a function name with spaces or '<'");
    if (!glm && name.find_first_of("\"<>") != std::string::npos)
      error(name, "the DSML tool-call format cannot write a function name with '\"', '<' or '>'");
    const ExprId arguments = this->arguments();
    if (glm) {
      return g_.seq({mark(tool_calls::kGlmStart), g_.literal(name), arguments, g_.byte('\n'),
                     mark(tool_calls::kGlmEnd)});
    }
    return g_.seq({g_.literal(kDsmlInvoke), g_.literal(name), g_.literal("\">"), arguments,
                   g_.repeat(g_.byte('\n'), 1, 2), g_.literal(kDsmlInvokeClose)});
  }

  // The argument pairs of the current tool, each starting with "\n".
  ExprId arguments() {
    if (!parameters_.is_object()) error(tool_, "'parameters' must be a JSON Schema object");
    for (const auto& [key, value] : parameters_.items()) {
      if (annotations().count(key) || key == "type" || key == "properties" || key == "required" ||
          key == "additionalProperties")
        continue;
      error(tool_, "keyword '" + key + "' of 'parameters' is not supported in tool calls");
    }
    if (parameters_.contains("type") && parameters_["type"] != "object")
      error(tool_, "'parameters' must be of type object");
    const Json properties =
        parameters_.contains("properties") ? parameters_["properties"] : Json::object();
    if (!properties.is_object()) error(tool_, "'properties' must be an object");
    std::set<std::string> required;
    if (parameters_.contains("required")) {
      if (!parameters_["required"].is_array()) error(tool_, "'required' must be a list");
      for (const auto& key : parameters_["required"]) {
        if (!key.is_string()) error(tool_, "'required' must list property names");
        if (!properties.contains(key.get<std::string>()))
          error(tool_, "required property '" + key.get<std::string>() + "' is not in 'properties'");
        required.insert(key.get<std::string>());
      }
    }
    std::vector<ExprId> parts;
    std::vector<std::string> names;
    for (const auto& [key, schema] : properties.items()) {
      check_key(key);
      names.push_back(key);
      const ExprId member = argument(g_.literal(key), schema, key);
      parts.push_back(required.count(key) ? member : g_.optional(member));
    }
    // Other properties: JSON Schema allows any unless additionalProperties
    // says otherwise; strict (OpenAI) allows none unless it says so.
    Json extra = strict_ ? Json(false) : Json(true);
    if (parameters_.contains("additionalProperties")) extra = parameters_["additionalProperties"];
    if (!(extra.is_boolean() && !extra.get<bool>())) {
      parts.push_back(g_.star(argument(
          extra_key(names), extra.is_boolean() ? Json::object() : extra, "additionalProperties")));
    }
    return g_.seq(std::move(parts));
  }

  void check_key(const std::string& key) const {
    const bool glm = c_.format == ToolCallFormat::Glm;
    if (key.empty()) error(tool_, "a property has an empty name");
    if (glm && (key.find('<') != std::string::npos || tool_calls::trim(key) != key))
      error(tool_, "GLM's tool-call format cannot write the property name '" + key + "'");
    if (!glm && key.find_first_of("\"<>") != std::string::npos)
      error(tool_, "the DSML tool-call format cannot write the property name '" + key + "'");
  }

  // A property name outside `declared` (GLM: no '<', no outer spaces; DSML: no '"<>').
  ExprId extra_key(const std::vector<std::string>& declared) {
    const bool glm = c_.format == ToolCallFormat::Glm;
    const auto outside = [](std::vector<grammar::CodeRange> excluded) {
      return grammar::normalize_ranges(std::move(excluded), /*negate=*/true);
    };
    ExprId key;
    if (glm) {
      const ExprId edge =
          g_.code_points(outside({{'<', '<'}, {' ', ' '}, {'\t', '\n'}, {'\r', '\r'}}));
      const ExprId inner = g_.code_points(outside({{'<', '<'}}));
      key = g_.seq({edge, g_.optional(g_.seq({g_.star(inner), edge}))});
    } else {
      key = g_.plus(g_.code_points(outside({{'"', '"'}, {'<', '<'}, {'>', '>'}})));
    }
    if (declared.empty()) return key;
    std::vector<ExprId> names;
    for (const std::string& name : declared) names.push_back(g_.literal(name));
    return grammar::subtract_text(g_, key, g_.alt(std::move(names)), "property names",
                                  c_.json_options.limits);
  }

  // One "\n" + key/value pair in the format; `key` is the name's expression.
  ExprId argument(ExprId key, const Json& input, const std::string& name) {
    const Json* resolved = tool_calls::resolve_local_ref(parameters_, input);
    if (resolved == nullptr) error(tool_, "property '" + name + "': its $ref does not resolve");
    const Json& schema = *resolved;
    const bool glm = c_.format == ToolCallFormat::Glm;
    const tool_calls::ValueForm form = tool_calls::value_form(&schema);
    ExprId value = -1;
    bool raw = true;
    if (form == tool_calls::ValueForm::Text) {
      value = raw_string(schema, name);
    } else if (form == tool_calls::ValueForm::Json || !glm) {
      // DSML marks the value string="false" and reads it as JSON: exact for any schema.
      value = json_value(schema, name);
      raw = false;
    } else {
      value = mixed_value(schema, name);
    }
    if (glm) {
      return g_.seq({g_.byte('\n'), mark("<arg_key>"), key, mark("</arg_key>"), g_.byte('\n'),
                     mark("<arg_value>"), value, mark("</arg_value>")});
    }
    return g_.seq({g_.byte('\n'), g_.literal(kDsmlParameter), key,
                   g_.literal(raw ? "\" string=\"true\">" : "\" string=\"false\">"), value,
                   g_.literal(kDsmlParameterClose)});
  }

  // JSON text valid under `schema`, a subschema of the tool's parameters:
  // lowered with the parameters' $defs beside it so its references resolve.
  ExprId json_value(const Json& schema, const std::string& name) {
    Json standalone = schema;
    if (standalone.is_object()) {
      for (const char* defs : {"$defs", "definitions"})
        if (parameters_.contains(defs) && !standalone.contains(defs))
          standalone[defs] = parameters_[defs];
    }
    grammar::JsonSchemaOptions options = c_.json_options;
    options.strict = strict_;
    try {
      grammar::lower_json_schema(g_, standalone, options);
    } catch (const Error& e) {
      error(tool_, "property '" + name + "': " + e.what());
    }
    return g_.rule_ref(g_.root);
  }

  // Raw text inside a value: never a marker the parser looks for before the
  // value's end (its closing marker, the end of the invoke or block, a new block).
  std::vector<std::string_view> value_markers() const {
    if (c_.format == ToolCallFormat::Glm)
      return {"</arg_value>", tool_calls::kGlmEnd, tool_calls::kGlmStart};
    return {kDsmlParameterClose, kDsmlInvokeClose, tool_calls::kDsmlEnd, tool_calls::kDsmlStart};
  }
  ExprId raw_text() {
    return grammar::text_without_any(g_, value_markers(), c_.json_options.limits);
  }

  // Raw text (a string value as written, never containing value_markers())
  // valid under a string-only schema.
  ExprId raw_string(const Json& schema, const std::string& name) {
    const std::string where = "property '" + name + "'";
    if (schema.is_boolean()) return raw_text();
    std::optional<ExprId> alternatives;
    std::vector<ExprId> parts = {raw_text()};
    for (const auto& [key, value] : schema.items()) {
      if (annotations().count(key) || key == "type") continue;
      if (key == "anyOf") {
        if (!value.is_array() || value.empty()) error(tool_, where + ": anyOf must be a list");
        std::vector<ExprId> branches;
        for (const Json& branch : value) {
          const Json* b = tool_calls::resolve_local_ref(parameters_, branch);
          if (b == nullptr) error(tool_, where + ": a $ref does not resolve");
          branches.push_back(raw_string(*b, name));
        }
        alternatives = g_.alt(std::move(branches));
      } else if (key == "enum" || key == "const") {
        std::vector<ExprId> literals;
        for (const Json& v : key == "enum" ? value : Json::array({value})) {
          const std::string text = v.get<std::string>();  // string-only: value_form checked
          for (std::string_view m : value_markers())
            if (text.find(m) != std::string::npos)
              error(tool_, where + ": the value '" + text + "' contains tool-call markup");
          literals.push_back(g_.literal(text));
        }
        alternatives = g_.alt(std::move(literals));
      } else if (key == "minLength" || key == "maxLength") {
        continue;  // below, together
      } else if (key == "pattern") {
        grammar::RegexOptions regex;
        regex.ecma = true;
        regex.search = true;
        parts.push_back(parse_pattern(value, regex, where));
      } else if (key == "format") {
        const auto pattern =
            value.is_string() ? grammar::format_regex(value.get<std::string>()) : std::nullopt;
        if (!pattern) error(tool_, where + ": format " + value.dump() + " is not supported");
        grammar::RegexOptions regex;
        regex.ecma = true;
        parts.push_back(parse_pattern(Json(*pattern), regex, where));
      } else {
        error(tool_, where + ": keyword '" + key + "' is not supported for a string parameter");
      }
    }
    if (alternatives) {
      if (parts.size() > 1 || schema.contains("minLength") || schema.contains("maxLength"))
        error(tool_, where + ": enum, const or anyOf cannot be combined with string constraints");
      return *alternatives;
    }
    auto length = [&](const char* key) -> std::optional<int32_t> {
      if (!schema.contains(key)) return std::nullopt;
      if (!schema[key].is_number_integer() || schema[key].get<int64_t>() < 0 ||
          schema[key].get<int64_t>() > 10'000)
        error(tool_, where + ": " + key + " must be an integer in [0, 10000]");
      return static_cast<int32_t>(schema[key].get<int64_t>());
    };
    const auto min_length = length("minLength");
    const auto max_length = length("maxLength");
    if (min_length || max_length)
      parts.push_back(
          g_.repeat(grammar::any_char(g_), min_length.value_or(0), max_length.value_or(-1)));
    return grammar::intersect_all(g_, parts, where, c_.json_options.limits);
  }

  ExprId parse_pattern(const Json& pattern, const grammar::RegexOptions& regex,
                       const std::string& where) {
    if (!pattern.is_string()) error(tool_, where + ": pattern must be a string");
    try {
      return grammar::parse_regex(g_, pattern.get<std::string>(), regex);
    } catch (const Error& e) {
      error(tool_, where + ": " + e.what());
    }
  }

  // GLM: strings and other types share the raw text, which the parser reads
  // as JSON when that gives an allowed type (tool_calls::type_value). Exact
  // only when nothing constrains the non-string types: raw text valid for
  // the string part, or JSON of the other types.
  ExprId mixed_value(const Json& schema, const std::string& name) {
    const std::string where = "property '" + name + "'";
    const std::vector<std::string> types = tool_calls::schema_types(schema);
    bool only_annotations = true;
    for (const auto& [key, value] : schema.items())
      if (!annotations().count(key)) only_annotations = false;
    if (types.empty()) {
      // No type named: any value is valid only for a schema without assertions.
      if (!schema.is_object() || only_annotations) return raw_text();
      error(tool_, where + ": its schema names no type; GLM's tool-call format needs one");
    }
    // {"type": [string, others...]} with string keywords only.
    if (!schema.contains("type") || !schema["type"].is_array())
      error(tool_, where +
                       ": a schema mixing strings and other types must be a \"type\" list in GLM's "
                       "tool-call format");
    static const std::set<std::string> string_keywords = {"minLength", "maxLength", "pattern",
                                                          "format"};
    Json string_part = Json::object();
    Json other_types = Json::array();
    for (const auto& [key, value] : schema.items()) {
      if (annotations().count(key)) continue;
      if (key == "type") continue;
      if (!string_keywords.count(key))
        error(tool_, where + ": keyword '" + key +
                         "' with a type list that includes string is not supported in GLM's "
                         "tool-call format");
      string_part[key] = value;
    }
    for (const std::string& type : types)
      if (type != "string") other_types.push_back(type);
    const ExprId text = raw_string(string_part, name);
    const ExprId others = json_value(Json{{"type", other_types}}, name);
    return g_.alt({text, others});
  }

  Grammar& g_;
  const grammar::Vocabulary& vocabulary_;
  const ChatOutputConstraint& c_;
  std::string tool_;  // the tool being lowered, for errors
  bool strict_ = false;
  Json parameters_;
};

}  // namespace

std::string ChatOutputConstraint::cache_key() const {
  return fmt::format(
      "format={} reasoning={} content={} calls_required={} parallel={} json={}\n{}\n{}",
      static_cast<int>(format), static_cast<int>(reasoning), static_cast<int>(content),
      calls_required, parallel_calls, json_options.cache_key(), schema.dump(), tools.dump());
}

void lower_chat_output(Grammar& grammar, const grammar::Vocabulary& vocabulary,
                       const ChatOutputConstraint& constraint) {
  ChatOutputLowering(grammar, vocabulary, constraint).run();
}

ReasoningStart reasoning_start(const std::string& prompt) {
  std::string_view tail(prompt);
  while (!tail.empty() && tool_calls::is_space(tail.back())) tail.remove_suffix(1);
  if (tail.ends_with(kThinkClose)) return ReasoningStart::Closed;
  const size_t open = prompt.rfind(kThinkOpen);
  if (open == std::string::npos) return ReasoningStart::None;
  const size_t close = prompt.rfind(kThinkClose);
  return close == std::string::npos || close < open ? ReasoningStart::Open : ReasoningStart::None;
}

}  // namespace megactx
