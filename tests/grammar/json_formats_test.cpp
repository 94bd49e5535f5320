// String formats of JSON Schema as the grammar writes them, checked against
// the decisions of the validators that consumers of structured outputs run
// (ajv-formats' full mode, which the end-to-end tests validate with): every
// string the grammar allows must pass them, so where RFCs and validators
// disagree the grammar takes the stricter reading.
#include <gtest/gtest.h>

#include "grammar/grammar_compiler.h"
#include "grammar/matcher.h"
#include "test_vocab.h"

namespace megactx::grammar {
namespace {

// Whether the JSON string "text" is allowed under {"type": "string", "format": format}.
bool allows(GrammarCompiler& compiler, const std::string& format, const std::string& text) {
  const auto g = compiler.compile_json_schema(R"({"type":"string","format":")" + format + "\"}");
  GrammarMatcher m(g);
  return m.accept_string(nlohmann::json(text).dump()) && m.can_terminate();
}

TEST(JsonFormats, EmailNeedsADottedDomain) {
  GrammarCompiler compiler(test::make_test_vocab().vocab);
  for (const char* ok :
       {"joe.bloggs@example.com", "a@b.co", "x-1+tag@mail.example.org", "-1.0@2.io", "q@a-b.c-d"}) {
    EXPECT_TRUE(allows(compiler, "email", ok)) << ok;
  }
  // A single-label domain is an RFC 5321 mailbox, but ajv-formats (full)
  // rejects it, and a model once wrote "-1.0.0@2" under this format.
  for (const char* bad : {"a@localhost", "-1.0.0@2", "x@w", "a@", "@b.c", "a@b.", "a@.b",
                          "a..b@c.d", "a@-b.c", "a@b-.c", "two@@b.c"}) {
    EXPECT_FALSE(allows(compiler, "email", bad)) << bad;
  }
}

TEST(JsonFormats, DatesHaveRealMonthLengths) {
  GrammarCompiler compiler(test::make_test_vocab().vocab);
  for (const char* ok : {"2024-02-29", "2000-02-29", "1999-12-31", "5622-12-31", "0001-01-01"}) {
    EXPECT_TRUE(allows(compiler, "date", ok)) << ok;
  }
  for (const char* bad : {"2023-02-29", "1900-02-29", "2024-04-31", "2024-13-01", "2024-00-10",
                          "2024-1-01", "24-01-01"}) {
    EXPECT_FALSE(allows(compiler, "date", bad)) << bad;
  }
}

}  // namespace
}  // namespace megactx::grammar
