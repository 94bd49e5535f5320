#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <map>
#include <optional>
#include <set>

#include "core/error.h"
#include "grammar/json_builder.h"
#include "grammar/json_formats.h"
#include "grammar/json_number_bounds.h"
#include "grammar/json_schema_merge.h"
#include "grammar/regex_parser.h"

namespace megactx::grammar {

using Json = nlohmann::ordered_json;

namespace {

constexpr int64_t kMaxStringLength = 10'000;

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {
      "title",    "description", "$schema", "$comment",    "examples", "default", "deprecated",
      "readOnly", "writeOnly",   "$defs",   "definitions", "$id",      "id"};
  return k;
}

const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> k = {"type",
                                          "enum",
                                          "const",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "prefixItems",
                                          "additionalItems",
                                          "minItems",
                                          "maxItems",
                                          "uniqueItems",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "format",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref"};
  return k;
}

std::string escape_pointer_token(const std::string& token) {
  std::string out;
  for (char c : token) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The rule name for a schema path: readable, only name characters.
std::string rule_name_for(const std::string& path) {
  std::string name;
  for (char c : path) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      name += c;
    } else if (!name.empty() && name.back() != '_') {
      name += '_';
    }
  }
  while (!name.empty() && name.back() == '_') name.pop_back();
  return name.empty() ? "root" : name;
}

class SchemaLowering {
 public:
  SchemaLowering(Grammar& grammar, const Json& root, const JsonSchemaOptions& options)
      : g_(grammar), root_(root), options_(options), json_(grammar, options) {
    draft_ = options.draft;
    if (root.is_object()) {
      auto it = root.find("$schema");
      if (it != root.end() && it->is_string()) {
        const std::string uri = it->get<std::string>();
        if (uri.find("draft-04") != std::string::npos) draft_ = JsonSchemaDraft::draft4;
        if (uri.find("draft-06") != std::string::npos) draft_ = JsonSchemaDraft::draft6;
        if (uri.find("draft-07") != std::string::npos) draft_ = JsonSchemaDraft::draft7;
        if (uri.find("2019-09") != std::string::npos) draft_ = JsonSchemaDraft::draft2019_09;
        if (uri.find("2020-12") != std::string::npos) draft_ = JsonSchemaDraft::draft2020_12;
      }
    }
  }

  void run() { g_.root = rule_for(root_, "#", 0); }

 private:
  [[noreturn]] void error(const std::string& path, const std::string& message) {
    fail("JSON Schema at {}: {}", path, message);
  }

  // `e` itself; when it matches nothing, `why` is kept in the grammar so
  // that a schema no value satisfies gets an error naming the contradiction
  // rather than only "matches no string".
  ExprId noted(ExprId e, const std::string& path, const std::string& why) {
    if (g_.expr(e).kind != ExprKind::Nothing) return e;
    const std::string note = fmt::format("JSON Schema at {}: {}", path, why);
    if (std::find(g_.unsatisfiable.begin(), g_.unsatisfiable.end(), note) == g_.unsatisfiable.end())
      g_.unsatisfiable.push_back(note);
    return e;
  }

  // The bounds of an array, or else what its items are.
  static std::string array_keywords_text(const Json& schema) {
    const std::string bounds = keywords_text(schema, {"minItems", "maxItems"});
    return bounds.empty() ? keywords_text(schema, {"prefixItems", "items", "additionalItems"})
                          : bounds;
  }

  // "minimum 5, maximum 3": the schema's values of `keys`, for notes.
  static std::string keywords_text(const Json& schema, std::initializer_list<const char*> keys) {
    std::string out;
    for (const char* key : keys) {
      if (!schema.contains(key)) continue;
      if (!out.empty()) out += ", ";
      out += std::string(key) + " " + schema[key].dump();
    }
    return out;
  }

  // A rule per distinct subschema: shared subschemas share their rule (and
  // its token classes), and recursion through $ref needs rules anyway.
  int32_t rule_for(const Json& schema, const std::string& path, int depth) {
    const std::string key = schema.dump();
    auto it = rules_.find(key);
    if (it != rules_.end()) return it->second;
    const int32_t rule = g_.add_rule(g_.fresh_name(rule_name_for(path)));
    rules_.emplace(key, rule);
    g_.set_body(rule, expr_for(schema, path, depth));
    return rule;
  }

  ExprId rule_ref_for(const Json& schema, const std::string& path, int depth) {
    return g_.rule_ref(rule_for(schema, path, depth));
  }

  const Json& resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#') {
      error(path, "$ref '" + ref +
                      "' points outside this schema; only local references (#...) "
                      "are supported");
    }
    const std::string pointer = percent_decode(ref.substr(1));
    if (!pointer.empty() && pointer[0] != '/') {
      error(path, "$ref '" + ref + "' uses an anchor; only JSON pointers are supported");
    }
    const Json* at = &root_;
    size_t pos = 1;
    while (pos <= pointer.size() && !pointer.empty()) {
      size_t end = pointer.find('/', pos);
      if (end == std::string::npos) end = pointer.size();
      std::string token = pointer.substr(pos, end - pos);
      std::string unescaped;
      for (size_t i = 0; i < token.size(); ++i) {
        if (token[i] == '~' && i + 1 < token.size() &&
            (token[i + 1] == '0' || token[i + 1] == '1')) {
          unescaped += token[i + 1] == '0' ? '~' : '/';
          ++i;
        } else {
          unescaped += token[i];
        }
      }
      if (at->is_object() && at->contains(unescaped)) {
        at = &(*at)[unescaped];
      } else if (at->is_array() && !unescaped.empty() &&
                 unescaped.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoull(unescaped) < at->size()) {
        at = &(*at)[std::stoull(unescaped)];
      } else {
        error(path, "$ref '" + ref + "' does not resolve");
      }
      pos = end + 1;
    }
    return *at;
  }

  int32_t ref_rule(const std::string& ref, const std::string& path, int depth) {
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return it->second;
    const Json& target = resolve(ref, path);
    const std::string key = target.dump();
    auto known = rules_.find(key);
    if (known != rules_.end()) {
      ref_rules_.emplace(ref, known->second);
      return known->second;
    }
    const int32_t rule = g_.add_rule(g_.fresh_name(rule_name_for(ref)));
    ref_rules_.emplace(ref, rule);
    rules_.emplace(key, rule);
    g_.set_body(rule, expr_for(target, ref, depth + 1));
    return rule;
  }

  // `schema` with its $ref replaced by the referenced schema merged in.
  Json inline_ref(const Json& schema, const std::string& path, int depth) {
    if (!schema.is_object() || !schema.contains("$ref")) return schema;
    if (depth > options_.max_schema_depth) error(path, "$ref chain too deep (or cyclic)");
    const Json& target = resolve(schema["$ref"].get<std::string>(), path);
    Json rest = schema;
    rest.erase("$ref");
    if (draft_ < JsonSchemaDraft::draft2019_09) rest = Json::object();
    return merge_schemas(flatten(target, path, depth + 1), flatten(rest, path, depth + 1), path);
  }

  // $ref and allOf folded into one schema.
  Json flatten(const Json& schema, const std::string& path, int depth) {
    if (depth > options_.max_schema_depth) error(path, "schema nested too deeply");
    Json s = inline_ref(schema, path, depth);
    if (!s.is_object() || !s.contains("allOf")) return s;
    const Json parts = s["allOf"];
    s.erase("allOf");
    if (!parts.is_array() || parts.empty()) error(path, "allOf must be a non-empty array");
    for (size_t i = 0; i < parts.size(); ++i) {
      s = merge_schemas(s, flatten(parts[i], path + "/allOf/" + std::to_string(i), depth + 1),
                        path);
    }
    return flatten(s, path, depth + 1);
  }

  static bool has_assertions(const Json& schema) {
    for (const auto& [key, value] : schema.items()) {
      if (!annotation_keywords().count(key)) return true;
    }
    return false;
  }

  ExprId expr_for(const Json& input, const std::string& path, int depth) {
    if (depth > options_.max_schema_depth) {
      error(path, fmt::format("schema nested deeper than {}", options_.max_schema_depth));
    }
    if (input.is_boolean()) {
      return input.get<bool>() ? json_.any_value()
                               : noted(g_.nothing(), path, "the schema false allows no value");
    }
    if (!input.is_object()) error(path, "a schema must be an object or a boolean");
    for (const auto& [key, value] : input.items()) {
      if (annotation_keywords().count(key)) {
        if ((key == "$id" || key == "id") && depth > 0 && value.is_string() &&
            !(draft_ < JsonSchemaDraft::draft2019_09 && input.contains("$ref"))) {
          error(path, "'" + key + "' in a subschema (a new base URI) is not supported");
        }
        continue;
      }
      if (supported_keywords().count(key)) continue;
      const auto& unsupported = unsupported_json_schema_keywords();
      if (std::find(unsupported.begin(), unsupported.end(), key) != unsupported.end()) {
        error(path, "keyword '" + key + "' is not supported");
      }
      if (!options_.allow_unknown_keywords) {
        error(path, "unknown keyword '" + key + "' (allow_unknown_keywords ignores it)");
      }
    }
    // $ref: alone (or, before 2019-09, with siblings that do not apply) it is
    // a rule reference, which keeps recursion finite.
    if (input.contains("$ref")) {
      const Json& ref = input["$ref"];
      if (!ref.is_string()) error(path, "$ref must be a string");
      Json rest = input;
      rest.erase("$ref");
      if (draft_ < JsonSchemaDraft::draft2019_09 || !has_assertions(rest)) {
        return g_.rule_ref(ref_rule(ref.get<std::string>(), path, depth));
      }
      return expr_for(flatten(input, path, depth), path, depth + 1);
    }
    if (input.contains("allOf")) return expr_for(flatten(input, path, depth), path, depth + 1);
    if (input.contains("anyOf") && input.contains("oneOf")) {
      error(path, "anyOf together with oneOf is not supported");
    }
    if (input.contains("oneOf") && options_.exact_one_of) return one_of_expr(input, path, depth);
    if (input.contains("anyOf") || input.contains("oneOf")) {
      const char* key = input.contains("anyOf") ? "anyOf" : "oneOf";
      const Json& branches = input[key];
      if (!branches.is_array() || branches.empty()) {
        error(path, std::string(key) + " must be a non-empty array");
      }
      Json base = input;
      base.erase(key);
      std::vector<ExprId> options;
      for (size_t i = 0; i < branches.size(); ++i) {
        const std::string branch_path = path + "/" + key + "/" + std::to_string(i);
        if (has_assertions(base)) {
          const Json merged =
              merge_schemas(flatten(base, path, depth + 1),
                            flatten(branches[i], branch_path, depth + 1), branch_path);
          options.push_back(rule_ref_for(merged, branch_path, depth + 1));
        } else {
          options.push_back(rule_ref_for(branches[i], branch_path, depth + 1));
        }
      }
      return g_.alt(std::move(options));
    }
    return typed_expr(input, path, depth);
  }

  ExprId any_of_type(const std::string& type) {
    if (type == "null") return json_.null();
    if (type == "boolean") return json_.boolean();
    if (type == "object") return json_.any_object();
    if (type == "array") return json_.any_array();
    if (type == "string") return json_.any_string();
    return json_.any_number();
  }

  // The values of one JSON type a (flattened) schema accepts.
  ExprId restricted_expr(const Json& schema, const std::string& type, const std::string& path,
                         int depth) {
    if (depth > options_.max_schema_depth) error(path, "schema nested too deeply");
    if (schema.is_boolean()) return schema.get<bool>() ? any_of_type(type) : g_.nothing();
    if (schema.contains("oneOf")) error(path, "oneOf nested in a oneOf branch is not supported");
    if (schema.contains("anyOf")) {
      const Json& branches = schema["anyOf"];
      if (!branches.is_array() || branches.empty()) error(path, "anyOf must be a non-empty array");
      Json base = schema;
      base.erase("anyOf");
      std::vector<ExprId> options;
      for (size_t i = 0; i < branches.size(); ++i) {
        const std::string branch_path = path + "/anyOf/" + std::to_string(i);
        Json branch = flatten(branches[i], branch_path, depth + 1);
        if (has_assertions(base)) branch = merge_schemas(base, branch, branch_path);
        options.push_back(restricted_expr(branch, type, branch_path, depth + 1));
      }
      return g_.alt(std::move(options));
    }
    return typed_expr(schema, path, depth, &type);
  }

  // oneOf: per JSON type, a value one branch accepts and no other does.
  ExprId one_of_expr(const Json& input, const std::string& path, int depth) {
    const Json& branches = input["oneOf"];
    if (!branches.is_array() || branches.empty()) error(path, "oneOf must be a non-empty array");
    Json base = input;
    base.erase("oneOf");
    const bool has_base = has_assertions(base);
    const Json flat_base = has_base ? flatten(base, path, depth + 1) : Json::object();
    std::vector<Json> merged;
    for (size_t i = 0; i < branches.size(); ++i) {
      const std::string branch_path = path + "/oneOf/" + std::to_string(i);
      Json branch = flatten(branches[i], branch_path, depth + 1);
      merged.push_back(has_base ? merge_schemas(flat_base, branch, branch_path) : branch);
    }
    std::vector<ExprId> options;
    for (const std::string type : {"null", "boolean", "object", "array", "string", "number"}) {
      std::vector<ExprId> parts;
      for (size_t i = 0; i < merged.size(); ++i) {
        const ExprId e =
            restricted_expr(merged[i], type, path + "/oneOf/" + std::to_string(i), depth + 1);
        if (g_.expr(e).kind != ExprKind::Nothing) parts.push_back(e);
      }
      if (parts.size() == 1) options.push_back(parts[0]);
      if (parts.size() < 2) continue;
      // Two branches accept this type: subtract the others from each.
      std::vector<Dfa> dfas;
      try {
        for (ExprId part : parts)
          dfas.push_back(build_dfa(g_, part, options_.limits, path, inline_all_rules));
        for (size_t i = 0; i < dfas.size(); ++i) {
          Dfa only = dfas[i];
          for (size_t j = 0; j < dfas.size(); ++j) {
            if (j != i) only = subtract(only, dfas[j]);
          }
          options.push_back(dfa_to_expr(g_, only));
        }
      } catch (const Error& e) {
        error(path, "oneOf branches that all accept " + type +
                        " values cannot be made "
                        "exclusive (" +
                        e.what() + "); exact_one_of = false treats oneOf as anyOf");
      }
    }
    return g_.alt(std::move(options));
  }

  // The JSON types the schema allows.
  std::vector<std::string> allowed_types(const Json& schema, const std::string& path) {
    static const std::vector<std::string> all = {"null",  "boolean", "object",
                                                 "array", "string",  "number"};
    auto it = schema.find("type");
    if (it == schema.end()) return all;
    std::vector<std::string> types;
    auto add = [&](const Json& t) {
      if (!t.is_string()) error(path, "type must be a string or an array of strings");
      const std::string name = t.get<std::string>();
      if (name != "integer" && std::find(all.begin(), all.end(), name) == all.end()) {
        error(path, "unknown type '" + name + "'");
      }
      types.push_back(name);
    };
    if (it->is_array()) {
      for (const Json& t : *it) add(t);
    } else {
      add(*it);
    }
    const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
    if (has_number) {
      types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
    }
    return types;
  }

  static bool value_has_type(const Json& v, const std::string& type) {
    if (type == "null") return v.is_null();
    if (type == "boolean") return v.is_boolean();
    if (type == "object") return v.is_object();
    if (type == "array") return v.is_array();
    if (type == "string") return v.is_string();
    if (type == "number") return v.is_number();
    if (type == "integer") {
      if (v.is_number_integer()) return true;
      if (!v.is_number_float()) return false;
      return parse_decimal(v.dump()).fraction.empty();
    }
    return false;
  }

  // only_type: the JSON type to keep (nullptr: all the schema allows).
  ExprId typed_expr(const Json& schema, const std::string& path, int depth,
                    const std::string* only_type = nullptr) {
    std::vector<std::string> types = allowed_types(schema, path);
    if (only_type != nullptr) {
      std::vector<std::string> kept;
      for (const std::string& t : types) {
        if (t == *only_type || (*only_type == "number" && t == "integer")) kept.push_back(t);
      }
      types = std::move(kept);
    }
    if (schema.contains("enum") || schema.contains("const")) {
      const ExprId e = enum_expr(schema, types, path);
      // Restricted to one type (a oneOf split), no value of it is expected.
      return only_type != nullptr
                 ? e
                 : noted(e, path, "no value of enum/const has a type the schema allows");
    }
    std::vector<ExprId> options;
    for (const std::string& type : types) {
      if (type == "null") {
        options.push_back(json_.null());
      } else if (type == "boolean") {
        options.push_back(json_.boolean());
      } else if (type == "object") {
        options.push_back(object_expr(schema, path, depth));
      } else if (type == "array") {
        options.push_back(noted(array_expr(schema, path, depth), path,
                                "no array satisfies " + array_keywords_text(schema)));
      } else if (type == "string") {
        options.push_back(
            noted(string_expr(schema, path), path,
                  "no string satisfies " +
                      keywords_text(schema, {"minLength", "maxLength", "pattern", "format"})));
      } else {
        options.push_back(
            noted(number_expr(schema, path, type == "integer"), path,
                  fmt::format("no {} satisfies {}", type,
                              keywords_text(schema, {"minimum", "exclusiveMinimum", "maximum",
                                                     "exclusiveMaximum"}))));
      }
    }
    if (types.empty() && only_type == nullptr) {
      return noted(g_.nothing(), path, "'type' lists no type");
    }
    return g_.alt(std::move(options));
  }

  ExprId enum_expr(const Json& schema, const std::vector<std::string>& types,
                   const std::string& path) {
    for (const auto& [key, value] : schema.items()) {
      if (key != "enum" && key != "const" && key != "type" && !annotation_keywords().count(key)) {
        error(path, "'" + key + "' beside enum/const is not supported");
      }
    }
    Json values = Json::array();
    if (schema.contains("enum")) {
      if (!schema["enum"].is_array()) error(path, "enum must be an array");
      values = schema["enum"];
    }
    if (schema.contains("const")) {
      const Json& c = schema["const"];
      if (schema.contains("enum")) {
        Json kept = Json::array();
        for (const Json& v : values) {
          if (json_equal(v, c)) kept.push_back(v);
        }
        values = kept;
      } else {
        values = Json::array({c});
      }
    }
    std::vector<ExprId> options;
    for (const Json& v : values) {
      bool typed = false;
      for (const std::string& t : types) typed |= value_has_type(v, t);
      if (typed) options.push_back(literal_expr(v));
    }
    return g_.alt(std::move(options));
  }

  // Exactly the JSON value v (numbers by value, objects in any key order when
  // any_property_order).
  ExprId literal_expr(const Json& v) {
    if (v.is_number()) {
      const NumberBound b{parse_decimal(v.dump()), false};
      return bounded_number(g_, b, b, false, options_.limits);
    }
    if (v.is_string()) return json_.string_literal(v.get<std::string>());
    if (v.is_array()) {
      if (v.empty()) return g_.seq({g_.byte('['), json_.ws(), g_.byte(']')});
      std::vector<ExprId> items = {g_.byte('['), json_.ws()};
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) items.push_back(json_.item_separator());
        items.push_back(literal_expr(v[i]));
      }
      items.push_back(json_.ws());
      items.push_back(g_.byte(']'));
      return g_.seq(std::move(items));
    }
    if (v.is_object()) {
      std::vector<JsonBuilder::Member> members;
      for (const auto& [key, value] : v.items()) {
        members.push_back({json_.string_literal(key), literal_expr(value), true});
      }
      return json_.object(members, -1, -1, options_.any_property_order);
    }
    return g_.literal(v.dump());  // null, true, false
  }

  ExprId object_expr(const Json& schema, const std::string& path, int depth) {
    const Json empty = Json::object();
    const Json& properties = schema.contains("properties") ? schema["properties"] : empty;
    if (!properties.is_object()) error(path, "properties must be an object");
    std::set<std::string> required;
    if (schema.contains("required")) {
      if (!schema["required"].is_array()) error(path, "required must be an array");
      for (const Json& name : schema["required"]) {
        if (!name.is_string()) error(path, "required must list strings");
        required.insert(name.get<std::string>());
      }
    }
    // No additionalProperties: strict mode allows no others where
    // properties are listed; an object schema without any stays open.
    Json extra = options_.strict && (schema.contains("properties") || !required.empty())
                     ? Json(false)
                     : Json(true);
    if (schema.contains("additionalProperties")) extra = schema["additionalProperties"];
    const bool extras_allowed = !(extra.is_boolean() && !extra.get<bool>());
    if (!schema.contains("properties") && required.empty() && extras_allowed &&
        extra.is_boolean()) {
      return json_.any_object();
    }
    std::vector<JsonBuilder::Member> members;
    std::vector<std::string> names;
    for (const auto& [name, sub] : properties.items()) {
      const std::string sub_path = path + "/properties/" + escape_pointer_token(name);
      members.push_back({json_.string_literal(name), rule_ref_for(sub, sub_path, depth + 1),
                         required.count(name) != 0});
      names.push_back(name);
    }
    // Required names without a property schema take additionalProperties'.
    for (const std::string& name : required) {
      if (properties.contains(name)) continue;
      if (!extras_allowed) {
        return noted(g_.nothing(), path,
                     "required property '" + name +
                         "' is not in properties and additionalProperties allows no other");
      }
      members.push_back({json_.string_literal(name),
                         rule_ref_for(extra, path + "/additionalProperties", depth + 1), true});
      names.push_back(name);
    }
    ExprId extra_key = -1;
    ExprId extra_value = -1;
    if (extras_allowed) {
      extra_key = names.empty() ? json_.any_string() : json_.string_not_in(names);
      extra_value = rule_ref_for(extra, path + "/additionalProperties", depth + 1);
    }
    return json_.object(members, extra_key, extra_value, options_.any_property_order);
  }

  ExprId array_expr(const Json& schema, const std::string& path, int depth) {
    std::vector<ExprId> prefix;
    Json rest = true;
    if (schema.contains("uniqueItems") && schema["uniqueItems"] != Json(false)) {
      error(path, "uniqueItems true is not supported");
    }
    auto count = [&](const char* key, int64_t fallback) -> int64_t {
      if (!schema.contains(key)) return fallback;
      const Json& v = schema[key];
      if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
        error(path, std::string(key) + " must be a non-negative integer");
      }
      return v.get<int64_t>();
    };
    if (schema.contains("prefixItems")) {
      const Json& items = schema["prefixItems"];
      if (!items.is_array()) error(path, "prefixItems must be an array");
      for (size_t i = 0; i < items.size(); ++i) {
        prefix.push_back(
            rule_ref_for(items[i], path + "/prefixItems/" + std::to_string(i), depth + 1));
      }
      if (schema.contains("items")) rest = schema["items"];
      if (schema.contains("additionalItems")) error(path, "additionalItems beside prefixItems");
    } else if (schema.contains("items") && schema["items"].is_array()) {
      const Json& items = schema["items"];
      for (size_t i = 0; i < items.size(); ++i) {
        prefix.push_back(rule_ref_for(items[i], path + "/items/" + std::to_string(i), depth + 1));
      }
      if (schema.contains("additionalItems")) rest = schema["additionalItems"];
    } else if (schema.contains("items")) {
      rest = schema["items"];
    }
    ExprId rest_expr = -1;
    if (!(rest.is_boolean() && !rest.get<bool>())) {
      rest_expr =
          rest.is_boolean() ? json_.any_value() : rule_ref_for(rest, path + "/items", depth + 1);
    }
    const int64_t min_items = count("minItems", 0);
    const int64_t max_items = count("maxItems", -1);
    if (prefix.empty() && min_items == 0 && max_items < 0 && rest.is_boolean() &&
        rest.get<bool>()) {
      return json_.any_array();
    }
    return json_.array(prefix, rest_expr, min_items, max_items);
  }

  ExprId string_expr(const Json& schema, const std::string& path) {
    // Each constraint is a language of string contents; several intersect.
    std::vector<ExprId> parts;
    auto count = [&](const char* key) -> std::optional<int64_t> {
      if (!schema.contains(key)) return std::nullopt;
      const Json& v = schema[key];
      if (!v.is_number_integer() || v.get<int64_t>() < 0) {
        error(path, std::string(key) + " must be a non-negative integer");
      }
      if (v.get<int64_t>() > kMaxStringLength) {
        error(path, fmt::format("{} {} is larger than the supported {}", key, v.get<int64_t>(),
                                kMaxStringLength));
      }
      return v.get<int64_t>();
    };
    const auto min_length = count("minLength");
    const auto max_length = count("maxLength");
    if (min_length || max_length) {
      if (max_length && min_length && *max_length < *min_length) return g_.nothing();
      parts.push_back(g_.repeat(json_.string_char(), static_cast<int32_t>(min_length.value_or(0)),
                                static_cast<int32_t>(max_length.value_or(-1))));
    }
    RegexOptions regex;
    regex.ecma = true;
    regex.encode = [this](Grammar&, const std::vector<CodeRange>& r) {
      return json_.canonical_chars(r);
    };
    if (schema.contains("pattern")) {
      if (!schema["pattern"].is_string()) error(path, "pattern must be a string");
      regex.search = true;
      parts.push_back(parse_regex(g_, schema["pattern"].get<std::string>(), regex));
    }
    if (schema.contains("format")) {
      if (!schema["format"].is_string()) error(path, "format must be a string");
      const std::string format = schema["format"].get<std::string>();
      auto pattern = format_regex(format);
      if (!pattern) error(path, "format '" + format + "' is not supported");
      regex.search = false;
      parts.push_back(parse_regex(g_, *pattern, regex));
    }
    if (parts.empty()) return json_.any_string();
    ExprId content = parts[0];
    if (parts.size() > 1) {
      Dfa dfa = build_dfa(g_, parts[0], options_.limits, path);
      for (size_t i = 1; i < parts.size(); ++i) {
        dfa = intersect(dfa, build_dfa(g_, parts[i], options_.limits, path));
      }
      content = dfa_to_expr(g_, dfa);
    }
    return g_.seq({g_.byte('"'), content, g_.byte('"')});
  }

  std::optional<NumberBound> bound(const Json& schema, const char* inclusive, const char* exclusive,
                                   bool lower, const std::string& path) {
    std::optional<NumberBound> best;
    auto consider = [&](const Json& v, bool is_exclusive) {
      if (!v.is_number()) error(path, std::string(inclusive) + " bounds must be numbers");
      NumberBound b{parse_decimal(v.dump()), is_exclusive};
      if (!best) {
        best = b;
        return;
      }
      const Decimal& x = b.value;
      const Decimal& y = best->value;
      const int c = compare(x, y);
      const bool tighter =
          lower ? (c > 0 || (c == 0 && is_exclusive)) : (c < 0 || (c == 0 && is_exclusive));
      if (tighter) best = b;
    };
    const bool draft4_flag = schema.contains(exclusive) && schema[exclusive].is_boolean();
    if (schema.contains(inclusive)) {
      consider(schema[inclusive], draft4_flag && schema[exclusive].get<bool>());
    }
    if (schema.contains(exclusive) && !draft4_flag) consider(schema[exclusive], true);
    return best;
  }

  static int compare(const Decimal& a, const Decimal& b) {
    if (a.negative != b.negative) return a.negative ? -1 : 1;
    int m;
    if (a.integer.size() != b.integer.size()) {
      m = a.integer.size() < b.integer.size() ? -1 : 1;
    } else if (a.integer != b.integer) {
      m = a.integer < b.integer ? -1 : 1;
    } else {
      m = a.fraction == b.fraction ? 0 : (a.fraction < b.fraction ? -1 : 1);
    }
    return a.negative ? -m : m;
  }

  ExprId number_expr(const Json& schema, const std::string& path, bool integer) {
    const auto lower = bound(schema, "minimum", "exclusiveMinimum", true, path);
    const auto upper = bound(schema, "maximum", "exclusiveMaximum", false, path);
    if (!lower && !upper) return integer ? json_.any_integer() : json_.any_number();
    return bounded_number(g_, lower, upper, integer, options_.limits);
  }

  Grammar& g_;
  const Json& root_;
  const JsonSchemaOptions& options_;
  JsonBuilder json_;
  JsonSchemaDraft draft_;
  std::map<std::string, int32_t> rules_;
  std::map<std::string, int32_t> ref_rules_;
};

}  // namespace

std::string JsonSchemaOptions::cache_key() const {
  return fmt::format(
      "strict={} ws={} max_ws={} sep={}|{} any_order={} draft={} depth={} "
      "nfa={} dfa={} one_of={} unknown={} lt={}",
      strict, any_whitespace, max_whitespace, nlohmann::json(item_separator).dump(),
      nlohmann::json(key_separator).dump(), any_property_order, static_cast<int>(draft),
      max_schema_depth, limits.max_nfa_nodes, limits.max_dfa_states, exact_one_of,
      allow_unknown_keywords, escape_less_than);
}

void lower_json_schema(Grammar& grammar, const Json& schema, const JsonSchemaOptions& options) {
  SchemaLowering lowering(grammar, schema, options);
  lowering.run();
}

void lower_any_json(Grammar& grammar, const JsonSchemaOptions& options, bool object_only) {
  JsonBuilder json(grammar, options);
  const int32_t root = grammar.add_rule("root");
  grammar.set_body(root, object_only ? json.any_object() : json.any_value());
  grammar.root = root;
}

const std::vector<std::string>& unsupported_json_schema_keywords() {
  static const std::vector<std::string> k = {"not",
                                             "if",
                                             "then",
                                             "else",
                                             "patternProperties",
                                             "propertyNames",
                                             "minProperties",
                                             "maxProperties",
                                             "dependencies",
                                             "dependentRequired",
                                             "dependentSchemas",
                                             "unevaluatedProperties",
                                             "unevaluatedItems",
                                             "contains",
                                             "minContains",
                                             "maxContains",
                                             "multipleOf",
                                             "$anchor",
                                             "$dynamicRef",
                                             "$dynamicAnchor",
                                             "$recursiveRef",
                                             "$recursiveAnchor",
                                             "contentSchema",
                                             "uniqueItems (true)"};
  return k;
}

}  // namespace megactx::grammar
