// Merging two JSON Schemas into one that accepts what both accept: how
// allOf, and anyOf/oneOf branches with sibling keywords, become one schema a
// grammar can be built from. Keywords whose conjunction has no single-schema
// form (two patterns, two different formats, additionalProperties against
// another branch's properties, ...) are errors naming them.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace megactx::grammar {

// `path` names the place in error messages. Neither schema may hold $ref or
// allOf (resolve and flatten first).
nlohmann::ordered_json merge_schemas(const nlohmann::ordered_json& a,
                                     const nlohmann::ordered_json& b, const std::string& path);

// JSON Schema equality of instances (1 == 1.0; objects ignore key order).
bool json_equal(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b);

}  // namespace megactx::grammar
