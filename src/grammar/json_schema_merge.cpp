#include "grammar/json_schema_merge.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "grammar/json_number_bounds.h"

namespace megactx::grammar {

using Json = nlohmann::ordered_json;

namespace {

// -1, 0, 1 as a < b, a == b, a > b.
int compare_decimals(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  int magnitude;
  if (a.integer.size() != b.integer.size()) {
    magnitude = a.integer.size() < b.integer.size() ? -1 : 1;
  } else if (a.integer != b.integer) {
    magnitude = a.integer < b.integer ? -1 : 1;
  } else {
    magnitude = a.fraction == b.fraction ? 0 : (a.fraction < b.fraction ? -1 : 1);
  }
  return a.negative ? -magnitude : magnitude;
}

Decimal decimal_of(const Json& number) {
  return parse_decimal(number.dump());
}

std::set<std::string> types_of(const Json& type) {
  std::set<std::string> out;
  if (type.is_string()) {
    out.insert(type.get<std::string>());
  } else if (type.is_array()) {
    for (const Json& t : type) {
      if (t.is_string()) out.insert(t.get<std::string>());
    }
  }
  return out;
}

Json intersect_types(const Json& a, const Json& b) {
  const auto x = types_of(a);
  const auto y = types_of(b);
  Json out = Json::array();
  for (const std::string& t : x) {
    if (y.count(t) || (t == "integer" && y.count("number"))) out.push_back(t);
  }
  for (const std::string& t : y) {
    if (t == "integer" && x.count("number") && !x.count("integer")) out.push_back(t);
  }
  return out;
}

bool is_annotation(const std::string& key) {
  static const std::set<std::string> annotations = {
      "title",      "description", "$schema",   "$comment", "examples",   "default",
      "deprecated", "readOnly",    "writeOnly", "$defs",    "definitions"};
  return annotations.count(key) != 0;
}

}  // namespace

bool json_equal(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) {
    return compare_decimals(decimal_of(a), decimal_of(b)) == 0;
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!json_equal(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [key, value] : a.items()) {
      auto it = b.find(key);
      if (it == b.end() || !json_equal(value, *it)) return false;
    }
    return true;
  }
  return a == b;
}

Json merge_schemas(const Json& a, const Json& b, const std::string& path) {
  if (a.is_boolean()) return a.get<bool>() ? b : a;
  if (b.is_boolean()) return b.get<bool>() ? a : b;
  MEGACTX_CHECK(a.is_object() && b.is_object(), "schema at {} is not an object", path);
  Json out = a;
  auto conflict = [&](const std::string& key) {
    fail(
        "JSON Schema at {}: cannot combine two '{}' keywords (allOf / anyOf with sibling "
        "keywords)",
        path, key);
  };
  for (const auto& [key, value] : b.items()) {
    auto it = out.find(key);
    if (it == out.end()) {
      out[key] = value;
      continue;
    }
    Json& mine = *it;
    if (is_annotation(key)) continue;
    if (key == "type") {
      mine = intersect_types(mine, value);
    } else if (key == "required") {
      for (const Json& name : value) {
        if (std::find(mine.begin(), mine.end(), name) == mine.end()) mine.push_back(name);
      }
    } else if (key == "properties") {
      for (const auto& [name, schema] : value.items()) {
        auto p = mine.find(name);
        if (p == mine.end()) {
          mine[name] = schema;
        } else {
          *p = merge_schemas(*p, schema, path + "/properties/" + name);
        }
      }
    } else if (key == "items" && mine.is_object() && value.is_object()) {
      mine = merge_schemas(mine, value, path + "/items");
    } else if (key == "minimum" || key == "minLength" || key == "minItems" ||
               (key == "exclusiveMinimum" && value.is_number() && mine.is_number())) {
      if (compare_decimals(decimal_of(value), decimal_of(mine)) > 0) mine = value;
    } else if (key == "maximum" || key == "maxLength" || key == "maxItems" ||
               (key == "exclusiveMaximum" && value.is_number() && mine.is_number())) {
      if (compare_decimals(decimal_of(value), decimal_of(mine)) < 0) mine = value;
    } else if (key == "enum") {
      Json kept = Json::array();
      for (const Json& v : mine) {
        for (const Json& w : value) {
          if (json_equal(v, w)) {
            kept.push_back(v);
            break;
          }
        }
      }
      mine = kept;
    } else if (key == "const") {
      if (!json_equal(mine, value)) {
        out.erase("const");
        out["enum"] = Json::array();
      }
    } else if (json_equal(mine, value)) {
      continue;  // the same keyword twice (format, pattern, ...)
    } else {
      conflict(key);
    }
  }
  // additionalProperties of one side constrains the other side's properties.
  auto check_extras = [&](const Json& x, const Json& y) {
    auto extra = x.find("additionalProperties");
    if (extra == x.end() || (extra->is_boolean() && extra->get<bool>())) return;
    auto props = y.find("properties");
    if (props == y.end()) return;
    for (const auto& [name, schema] : props->items()) {
      auto own = x.find("properties");
      if (own == x.end() || !own->contains(name)) {
        fail(
            "JSON Schema at {}: cannot combine additionalProperties with property '{}' of "
            "another branch",
            path, name);
      }
    }
  };
  check_extras(a, b);
  check_extras(b, a);
  return out;
}

}  // namespace megactx::grammar
