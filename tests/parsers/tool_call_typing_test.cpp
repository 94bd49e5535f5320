// Typing of raw argument values by JSON schema (tool_calls::type_value) and
// the tool-schema table built from OpenAI `tools`.
#include <gtest/gtest.h>

#include "chat/tool_call_parser_common.h"

namespace megactx::tool_calls {
namespace {

using nlohmann::json;

TEST(ToolCallTyping, BySchemaType) {
  const json string_schema = {{"type", "string"}};
  EXPECT_EQ(type_value(&string_schema, "42"), json("42"));
  EXPECT_EQ(type_value(&string_schema, " true "), json(" true "));
  const json integer = {{"type", "integer"}};
  EXPECT_EQ(type_value(&integer, " 42\n"), json(42));
  EXPECT_EQ(type_value(&integer, "forty"), json("forty"));  // kept, never dropped
  const json boolean = {{"type", "boolean"}};
  EXPECT_EQ(type_value(&boolean, "false"), json(false));
  EXPECT_EQ(type_value(&boolean, "True"), json(true));  // Python spelling
  const json number_or_null = {{"type", json::array({"number", "null"})}};
  EXPECT_EQ(type_value(&number_or_null, "None"), json(nullptr));
  EXPECT_EQ(type_value(&number_or_null, "2.5"), json(2.5));
  const json object = {{"type", "object"}};
  EXPECT_EQ(type_value(&object, R"({"a": [1, 2]})"), json({{"a", {1, 2}}}));
  const json array = {{"type", "array"}};
  EXPECT_EQ(type_value(&array, "[1, \"x\"]"), json::parse(R"([1, "x"])"));
  // A string-or-integer union: integers parse, other text stays a string.
  const json any_of = {{"anyOf", json::array({{{"type", "integer"}}, {{"type", "string"}}})}};
  EXPECT_EQ(type_value(&any_of, "7"), json(7));
  EXPECT_EQ(type_value(&any_of, "seven"), json("seven"));
  EXPECT_EQ(type_value(&any_of, "\"7\""), json("\"7\""));
  // With strings allowed, JSON of a type the schema does not allow stays text.
  EXPECT_EQ(type_value(&any_of, "2.5"), json("2.5"));
  const json string_or_null = {{"type", json::array({"string", "null"})}};
  EXPECT_EQ(type_value(&string_or_null, "42"), json("42"));
  EXPECT_EQ(type_value(&string_or_null, "null"), json(nullptr));
  const json string_enum = {{"enum", json::array({"1", "2"})}};
  EXPECT_EQ(type_value(&string_enum, "1"), json("1"));
  // No schema: JSON values as such, other text as text.
  EXPECT_EQ(type_value(nullptr, "3"), json(3));
  EXPECT_EQ(type_value(nullptr, "[1]"), json::parse("[1]"));
  EXPECT_EQ(type_value(nullptr, "Paris"), json("Paris"));
  EXPECT_EQ(type_value(nullptr, "\"quoted\""), json("\"quoted\""));
}

TEST(ToolCallTyping, SchemasFromOpenAiTools) {
  const ToolSchemas schemas(json::parse(R"([
    {"type": "function", "function": {"name": "a", "parameters": {"properties": {"x": {"type": "integer"}}}}},
    {"name": "flat", "parameters": {}},
    {"type": "function", "function": {"description": "no name"}},
    42
  ])"));
  EXPECT_TRUE(schemas.has("a"));
  EXPECT_TRUE(schemas.has("flat"));
  EXPECT_FALSE(schemas.has("b"));
  ASSERT_NE(schemas.property("a", "x"), nullptr);
  EXPECT_EQ(schemas.property("a", "y"), nullptr);
  EXPECT_EQ(schemas.property("flat", "x"), nullptr);
  EXPECT_TRUE(acceptable_name(schemas, "a"));
  EXPECT_FALSE(acceptable_name(schemas, "b"));
  const ToolSchemas none(json::array());
  EXPECT_TRUE(acceptable_name(none, "anything_goes"));
  EXPECT_FALSE(acceptable_name(none, "two words"));
  EXPECT_FALSE(acceptable_name(none, ""));
}

TEST(ToolCallTyping, ValueFormsAndLocalReferences) {
  const json parameters = json::parse(R"({"type": "object", "properties": {
      "a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": ["string", "null"]},
      "d": {}, "e": {"$ref": "#/$defs/unit"}, "f": {"const": "x"}, "g": {"$ref": "#/nope"}},
    "$defs": {"unit": {"enum": ["c", "f"]}}})");
  const json& p = parameters["properties"];
  EXPECT_EQ(value_form(&p["a"]), ValueForm::Text);
  EXPECT_EQ(value_form(&p["b"]), ValueForm::Json);
  EXPECT_EQ(value_form(&p["c"]), ValueForm::Mixed);
  EXPECT_EQ(value_form(&p["d"]), ValueForm::Mixed);
  EXPECT_EQ(value_form(&p["f"]), ValueForm::Text);
  const json* unit = resolve_local_ref(parameters, p["e"]);
  ASSERT_NE(unit, nullptr);
  EXPECT_EQ(value_form(unit), ValueForm::Text);
  EXPECT_EQ(resolve_local_ref(parameters, p["g"]), nullptr);
  // The parser reads a referenced parameter by its target's types.
  const ToolSchemas schemas(json::array({{{"name", "t"}, {"parameters", parameters}}}));
  EXPECT_EQ(type_value(schemas.property("t", "e"), "1"), json("1"));
}

TEST(ToolCallTyping, ArgumentPieces) {
  ParsedCall call{"f", {{"a", 1}, {"b", "x"}}};
  const auto pieces = argument_pieces(call);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0], R"({"a":1)");
  EXPECT_EQ(pieces[1], R"(,"b":"x"})");
  EXPECT_EQ(argument_pieces(ParsedCall{"f", {}}), std::vector<std::string>{"{}"});
}

}  // namespace
}  // namespace megactx::tool_calls
