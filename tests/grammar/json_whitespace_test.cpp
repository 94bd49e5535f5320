// Whitespace in generated JSON: with JsonSchemaOptions::max_whitespace, at
// most that many whitespace characters in each gap between tokens, empty
// objects and arrays included (their inside is one gap, not two), so a model
// cannot spend more tokens on spaces than the bound says.
#include <gtest/gtest.h>

#include "grammar/grammar_compiler.h"
#include "grammar/matcher.h"
#include "test_vocab.h"

namespace megactx::grammar {
namespace {

bool accepts(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_string(text) && m.can_terminate();
}

// `open` + n spaces + `close` is allowed exactly when n <= max_whitespace.
void expect_one_gap(const std::shared_ptr<const CompiledGrammar>& g, const std::string& open,
                    const std::string& close, int max_whitespace) {
  for (int n = 0; n <= 2 * max_whitespace + 1; ++n) {
    const std::string text = open + std::string(n, ' ') + close;
    EXPECT_EQ(accepts(g, text), n <= max_whitespace) << "'" << text << "'";
  }
}

TEST(JsonWhitespace, EmptyContainersAreOneGap) {
  GrammarCompiler compiler(test::make_test_vocab().vocab);
  JsonSchemaOptions options;
  options.max_whitespace = 3;
  // json_object, and any JSON value (its arrays).
  expect_one_gap(compiler.compile_json_object(options), "{", "}", 3);
  expect_one_gap(compiler.compile_json_schema(R"({"type":"array"})", options), "[", "]", 3);
  // Schema objects whose properties are all optional, in schema order and in any order.
  const std::string optional_members =
      R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}}})";
  expect_one_gap(compiler.compile_json_schema(optional_members, options), "{", "}", 3);
  JsonSchemaOptions any_order = options;
  any_order.any_property_order = true;
  expect_one_gap(compiler.compile_json_schema(optional_members, any_order), "{", "}", 3);
  // An object that allows no member at all, and schema arrays that may be empty.
  expect_one_gap(
      compiler.compile_json_schema(R"({"type":"object","additionalProperties":false})", options),
      "{", "}", 3);
  expect_one_gap(compiler.compile_json_schema(
                     R"({"type":"array","items":{"type":"integer"},"maxItems":2})", options),
                 "[", "]", 3);
  expect_one_gap(compiler.compile_json_schema(R"({"type":"array","items":false})", options), "[",
                 "]", 3);
}

TEST(JsonWhitespace, MembersKeepTheirGaps) {
  GrammarCompiler compiler(test::make_test_vocab().vocab);
  JsonSchemaOptions options;
  options.max_whitespace = 2;
  const auto object = compiler.compile_json_schema(
      R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false})",
      options);
  EXPECT_TRUE(accepts(object, "{  \"a\"  :  1  }"));
  EXPECT_FALSE(accepts(object, "{   \"a\":1}"));
  EXPECT_FALSE(accepts(object, "{\"a\":1   }"));
  EXPECT_TRUE(accepts(object, "{}"));
  const auto required = compiler.compile_json_schema(
      R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})", options);
  EXPECT_TRUE(accepts(required, "{ \"a\":1 }"));
  EXPECT_FALSE(accepts(required, "{}"));
  EXPECT_FALSE(accepts(required, "{  }"));
  const auto array = compiler.compile_json_schema(
      R"({"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":3})", options);
  EXPECT_TRUE(accepts(array, "[  1  ,  2  ]"));
  EXPECT_FALSE(accepts(array, "[1   ]"));
  EXPECT_FALSE(accepts(array, "[  ]"));
  const auto any = compiler.compile_json_object(options);
  EXPECT_TRUE(accepts(any, "{  \"k\"  :  [  ]  }"));
  EXPECT_FALSE(accepts(any, "{\"k\":[   ]}"));
}

}  // namespace
}  // namespace megactx::grammar
