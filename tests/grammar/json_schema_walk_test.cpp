// Constrained generation property test: random walks through the token mask
// (the default model's vocabulary) always produce JSON that the independent
// validator (json_validator.h, written from the specification) accepts.
#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar_compiler.h"
#include "json_validator.h"
#include "walk_util.h"

namespace megactx::grammar {
namespace {

using Json = nlohmann::ordered_json;

const std::vector<std::string>& schemas() {
  static const std::vector<std::string> s = {
      // nested objects, bounded strings and integers, array of patterned strings
      R"({"type":"object","properties":{"user":{"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":150}},"required":["name"]},"tags":{"type":"array","items":{"type":"string","pattern":"^[a-z]+$"},"maxItems":3}},"required":["user"]})",
      // enums and const of every kind
      R"({"type":"object","properties":{"color":{"enum":["red","green","blue"]},"size":{"enum":[1,2.5,null,"x\"y"]},"v":{"const":{"k":[1,true]}}},"required":["color","v"]})",
      // a tool call's arguments
      R"({"type":"object","properties":{"location":{"type":"string","minLength":1},"unit":{"type":"string","enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14},"when":{"type":"string","format":"date"}},"required":["location","unit"],"additionalProperties":false})",
      // recursion through $ref, decimal bounds
      R"({"$defs":{"node":{"type":"object","properties":{"value":{"type":"number","exclusiveMinimum":-1.5,"maximum":1e3},"children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["value"]}},"$ref":"#/$defs/node"})",
      // exact oneOf on overlapping numbers
      R"({"oneOf":[{"type":"integer","maximum":20},{"type":"number","minimum":2,"exclusiveMaximum":30}]})",
      // anyOf over formats and types
      R"({"anyOf":[{"type":"string","format":"uuid"},{"type":"string","format":"ipv4"},{"type":"boolean"},{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":false,"minItems":1}]})",
      // additional properties with a schema
      R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"boolean"}})",
      // allOf merged
      R"({"allOf":[{"type":"object","properties":{"x":{"type":"string"}},"required":["x"]},{"properties":{"x":{"maxLength":3},"y":{"type":"null"}}}]})",
  };
  return s;
}

void check_walks(GrammarCompiler& compiler, const JsonSchemaOptions& options, uint32_t seed) {
  std::mt19937 rng(seed);
  for (const std::string& text : schemas()) {
    SCOPED_TRACE(text);
    const Json schema = Json::parse(text);
    test::JsonValidator validator(schema);
    auto g = compiler.compile_json_schema(text, options);
    int terminated = 0;
    for (int i = 0; i < 25; ++i) {
      const test::Walk walk = test::random_walk(g, rng, 300, 0.9);
      if (!walk.terminated) continue;
      ++terminated;
      Json value;
      try {
        value = Json::parse(walk.text);
      } catch (const nlohmann::json::out_of_range&) {
        // Valid JSON whose number (e.g. 1e99999) overflows a double: the
        // parser cannot represent it, the walk is not checkable.
        continue;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "not JSON (" << e.what() << "): " << walk.text;
        continue;
      }
      EXPECT_TRUE(validator.valid(value)) << "invalid: " << walk.text;
      if (!options.any_whitespace) {
        EXPECT_EQ(walk.text.find_first_of(" \n\t\r") == std::string::npos ||
                      walk.text.find('"') != std::string::npos,
                  true)
            << "whitespace outside strings: " << walk.text;
      }
    }
    EXPECT_GT(terminated, 0) << "no walk finished";
  }
}

TEST(JsonSchemaWalk, OutputsValidateWithWhitespace) {
  GrammarCompiler compiler(test::default_model_vocab());
  JsonSchemaOptions options;
  options.max_whitespace = 3;
  check_walks(compiler, options, 1);
}

TEST(JsonSchemaWalk, OutputsValidateCompactAndNonStrict) {
  GrammarCompiler compiler(test::default_model_vocab());
  JsonSchemaOptions options;
  options.any_whitespace = false;
  options.strict = false;
  check_walks(compiler, options, 2);
}

TEST(JsonSchemaWalk, AnyPropertyOrder) {
  GrammarCompiler compiler(test::default_model_vocab());
  JsonSchemaOptions options;
  options.any_property_order = true;
  options.any_whitespace = false;
  check_walks(compiler, options, 3);
}

TEST(JsonSchemaWalk, JsonObjectMode) {
  GrammarCompiler compiler(test::default_model_vocab());
  JsonSchemaOptions options;
  options.max_whitespace = 2;
  auto g = compiler.compile_json_object(options);
  std::mt19937 rng(4);
  int terminated = 0;
  for (int i = 0; i < 40; ++i) {
    const test::Walk walk = test::random_walk(g, rng, 300, 0.9);
    if (!walk.terminated) continue;
    ++terminated;
    try {
      const auto value = nlohmann::json::parse(walk.text);
      EXPECT_TRUE(value.is_object());
    } catch (const nlohmann::json::out_of_range&) {
      continue;  // a number past double range: valid JSON the parser cannot hold
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what() << ": " << walk.text;
    }
    EXPECT_EQ(walk.text.front(), '{');
  }
  EXPECT_GT(terminated, 3);
}

TEST(JsonSchemaWalk, PropertyOrderFollowsTheSchema) {
  GrammarCompiler compiler(test::default_model_vocab());
  JsonSchemaOptions options;
  options.any_whitespace = false;
  auto g = compiler.compile_json_schema(
      R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"integer"}},"required":["zeta","alpha"]})",
      options);
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept_string(R"({"zeta":1,"alpha":2})"));
  EXPECT_TRUE(m.can_terminate());
  GrammarMatcher other(g);
  EXPECT_FALSE(other.accept_string(R"({"alpha":2)"));
}

}  // namespace
}  // namespace megactx::grammar
