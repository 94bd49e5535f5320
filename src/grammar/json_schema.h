// JSON Schema to the grammar IR: the subset OpenAI / vLLM / SGLang structured
// outputs support.
//
// Supported: type (one or a list), enum, const, properties, required,
// additionalProperties (bool or schema), items (schema, or a tuple array in
// draft 4-7), prefixItems, additionalItems, minItems, maxItems, uniqueItems
// false, minLength, maxLength, pattern, format (date, time, date-time, email,
// hostname, ipv4, ipv6, uuid, uri), minimum, maximum, exclusiveMinimum,
// exclusiveMaximum (numbers, or draft 4 booleans), anyOf, oneOf (exact, see
// JsonSchemaOptions::exact_one_of), allOf (merged into one schema),
// $ref to this document ("#", "#/$defs/x", JSON pointers; recursion allowed),
// $defs / definitions. Annotations (title, description, $schema, $id at the
// root, $comment, examples, default, deprecated, readOnly, writeOnly) are
// ignored. Any other keyword is an error naming it, never silently ignored
// (unsupported_json_schema_keywords() lists the standard ones).
//
// Output shape: properties in schema order (any order when
// any_property_order), strings with the escapes a JSON serializer writes
// where a pattern, format, enum or property name constrains them (any escape
// elsewhere), integers without fraction or exponent, bounded numbers without
// exponent.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/fsm.h"
#include "grammar/grammar_ir.h"

namespace megactx::grammar {

enum class JsonSchemaDraft { draft4, draft6, draft7, draft2019_09, draft2020_12 };

struct JsonSchemaOptions {
  // Objects whose schema has no additionalProperties allow no other
  // properties (OpenAI strict mode, xgrammar's default); false follows the
  // JSON Schema default (any other property allowed).
  bool strict = true;
  // Whitespace allowed between tokens; otherwise the separators below and no
  // other whitespace.
  bool any_whitespace = true;
  int32_t max_whitespace = -1;  // per gap when any_whitespace; -1: unbounded
  std::string item_separator = ",";
  std::string key_separator = ":";
  // Properties in any order (each once) instead of the schema's order; up to
  // 10 properties per object.
  bool any_property_order = false;
  // Draft when the schema's $schema does not name one: decides whether
  // keywords beside $ref apply (2019-09+) or are ignored (draft 4-7).
  JsonSchemaDraft draft = JsonSchemaDraft::draft2020_12;
  // oneOf exactly (an instance matching two branches is rejected): branches
  // that share a JSON type are made disjoint with automaton products, which
  // needs their values of that type to be non-recursive (an error
  // otherwise). false: oneOf as anyOf, as xgrammar and llguidance do.
  bool exact_one_of = true;
  // Keywords outside JSON Schema are errors (a typo is never ignored);
  // true ignores them as the specification does.
  bool allow_unknown_keywords = false;
  // '<' inside strings only as the escape \u003c, so the JSON text never holds
  // a '<' (a chat model's output parser looks for markup such as <tool_call>
  // in the text; JSON around it must not look like markup).
  bool escape_less_than = false;
  int32_t max_schema_depth = 128;  // nested subschemas, a bound on recursion
  FsmLimits limits;

  // Stable text of every field, for cache keys.
  std::string cache_key() const;
};

// Lowers `schema` into `grammar` and sets its root; throws megactx::Error
// naming the problem and where it is (a JSON pointer into the schema).
void lower_json_schema(Grammar& grammar, const nlohmann::ordered_json& schema,
                       const JsonSchemaOptions& options);

// Any JSON value (object_only: any JSON object), the json_object mode.
void lower_any_json(Grammar& grammar, const JsonSchemaOptions& options, bool object_only);

// Keywords that are errors when used (documentation and tests).
const std::vector<std::string>& unsupported_json_schema_keywords();

}  // namespace megactx::grammar
