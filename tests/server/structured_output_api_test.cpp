// Structured-output fields of the OpenAI endpoints over a fake engine: what
// /v1/completions compiles into the request's grammar (response_format, or
// SGLang's json_schema / regex / ebnf), checked by matching text against that
// grammar, and the fields of other servers that are refused with a 400
// rather than silently ignored (an unconstrained answer to a request that
// asked for a constraint is a wrong answer).
#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "server_fixture.h"

namespace megactx::server::testing {
namespace {

using nlohmann::json;

// Whether the grammar the engine was given accepts `text` as a whole output.
bool accepts(const GenerationRequest& request, const std::string& text) {
  EXPECT_NE(request.sampling.grammar, nullptr);
  if (!request.sampling.grammar) return false;
  grammar::GrammarMatcher m(request.sampling.grammar);
  return m.accept_string(text) && m.can_terminate();
}

const json kSchema = {{"type", "object"},
                      {"properties",
                       {{"id", {{"type", "integer"}, {"minimum", 0}, {"maximum", 99}}},
                        {"ok", {{"type", "boolean"}}}}},
                      {"required", {"id", "ok"}},
                      {"additionalProperties", false}};

TEST(CompletionsStructuredOutput, ResponseFormatJsonSchema) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/completions",
                  {{"prompt", "a"},
                   {"max_tokens", 8},
                   {"response_format",
                    {{"type", "json_schema"},
                     {"json_schema", {{"name", "x"}, {"schema", kSchema}, {"strict", true}}}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  const GenerationRequest request = f.engine.submitted().at(0);
  EXPECT_TRUE(accepts(request, R"({"id": 7, "ok": true})"));
  EXPECT_FALSE(accepts(request, R"({"id": 700, "ok": true})"));
  EXPECT_FALSE(accepts(request, R"({"id": 7})"));
  EXPECT_FALSE(accepts(request, R"({"id": 7, "ok": true, "x": 1})"));
}

TEST(CompletionsStructuredOutput, ResponseFormatJsonObjectAndN) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/completions",
                  {{"prompt", {"a", "b"}},
                   {"n", 2},
                   {"max_tokens", 8},
                   {"response_format", {{"type", "json_object"}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  ASSERT_EQ(f.engine.submitted().size(), 4u);
  for (const GenerationRequest& request : f.engine.submitted()) {
    EXPECT_TRUE(accepts(request, R"({"k": [1, "v"]})"));
    EXPECT_FALSE(accepts(request, "[1]"));
    EXPECT_FALSE(accepts(request, "plain text"));
  }
}

TEST(CompletionsStructuredOutput, SglangRegexEbnfAndJsonSchema) {
  ServerFixture f;
  ASSERT_EQ(
      f.call("POST", "/v1/completions", {{"prompt", "a"}, {"max_tokens", 8}, {"regex", "[0-9]{3}"}})
          ->status,
      200);
  ASSERT_EQ(f.call("POST", "/v1/completions",
                   {{"prompt", "a"}, {"max_tokens", 8}, {"ebnf", "root ::= \"yes\" | \"no\""}})
                ->status,
            200);
  ASSERT_EQ(f.call("POST", "/v1/completions",
                   {{"prompt", "a"}, {"max_tokens", 8}, {"json_schema", kSchema.dump()}})
                ->status,
            200);
  const auto submitted = f.engine.submitted();
  ASSERT_EQ(submitted.size(), 3u);
  EXPECT_TRUE(accepts(submitted[0], "123"));
  EXPECT_FALSE(accepts(submitted[0], "12a"));
  EXPECT_TRUE(accepts(submitted[1], "no"));
  EXPECT_FALSE(accepts(submitted[1], "maybe"));
  EXPECT_TRUE(accepts(submitted[2], R"({"id":1,"ok":false})"));
  EXPECT_FALSE(accepts(submitted[2], R"({"ok":false})"));
}

TEST(CompletionsStructuredOutput, ProblemsAre400s) {
  ServerFixture f;
  auto error = [&](const json& extra) {
    json body = {{"prompt", "a"}, {"max_tokens", 8}};
    body.update(extra);
    auto r = f.call("POST", "/v1/completions", body);
    EXPECT_EQ(r->status, 400) << r->body;
    return r->json()["error"];
  };
  const json bounds = {{"type", "integer"}, {"minimum", 3}, {"maximum", 1}};
  const json unsatisfiable = {{"type", "json_schema"}, {"json_schema", {{"schema", bounds}}}};
  json e = error({{"response_format", unsatisfiable}});
  EXPECT_EQ(e["param"], "response_format");
  EXPECT_NE(e["message"].get<std::string>().find("minimum 3, maximum 1"), std::string::npos);
  EXPECT_EQ(error({{"response_format", {{"type", "xml"}}}})["param"], "response_format");
  EXPECT_EQ(error({{"regex", "(a"}})["param"], "regex");
  EXPECT_EQ(error({{"response_format", {{"type", "json_object"}}}, {"regex", "a"}})["param"],
            "response_format");
  EXPECT_EQ(error({{"regex", "[0-9]"}, {"ignore_eos", true}})["param"], "ignore_eos");
  e = error({{"guided_regex", "[0-9]+"}});
  EXPECT_EQ(e["param"], "guided_regex");
  EXPECT_NE(e["message"].get<std::string>().find("response_format"), std::string::npos);
  EXPECT_TRUE(f.engine.submitted().empty());
}

TEST(ChatStructuredOutput, OtherServersFieldsAreRefusedNotIgnored) {
  ServerFixture f;
  for (const char* name : {"guided_json", "guided_choice", "regex", "ebnf", "json_schema"}) {
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
    body[name] = std::string(name) == "guided_choice" ? json::array({"a", "b"}) : json("[0-9]");
    auto r = f.call("POST", "/v1/chat/completions", body);
    EXPECT_EQ(r->status, 400) << name << ": " << r->body;
    EXPECT_EQ(r->json()["error"]["param"], name);
  }
  // null is the same as absent.
  auto r = f.call("POST", "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                   {"max_tokens", 4},
                   {"guided_json", nullptr},
                   {"regex", nullptr}});
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(f.engine.submitted().size(), 1u);
}

}  // namespace
}  // namespace megactx::server::testing
