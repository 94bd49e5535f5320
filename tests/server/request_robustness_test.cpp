// Requests that once crashed the server or were answered wrongly, over a fake
// engine: nesting deep enough to exhaust the stack in every place JSON can
// hide (the body, tools, content parts, tool-call argument strings, unknown
// fields), seeds past int64, logit_bias, parallel_tool_calls false, logprobs
// 0 on /v1/completions, and which parameter a too-long prompt names.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/bounded_json.h"
#include "server_fixture.h"

namespace megactx::server::testing {
namespace {

using nlohmann::json;

// `levels` nested arrays around `inner`, as raw JSON text.
std::string nested(size_t levels, const std::string& inner = "1") {
  return std::string(levels, '[') + inner + std::string(levels, ']');
}

const std::string kUser = R"({"role":"user","content":"hi"})";

// Bodies that nest `levels` deep in one place each.
std::vector<std::pair<std::string, std::string>> deep_bodies(size_t levels) {
  const std::string deep = nested(levels);
  std::string arguments;  // the arguments *string* holds the nesting (escaped by json)
  arguments = json(nested(levels)).dump();
  return {
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi","x":)" + deep + R"(}],"max_tokens":2})"},
      {"/v1/chat/completions", R"({"messages":[)" + kUser +
                                   R"(],"tools":[{"type":"function","function":{"name":"f",)"
                                   R"("parameters":{"type":"object","properties":{"a":)" +
                                   deep + R"(}}}}]})"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":[{"type":"text","text":"hi","x":)" + deep +
           R"(}]}]})"},
      {"/v1/chat/completions",
       R"({"messages":[)" + kUser +
           R"(,{"role":"assistant","content":"","tool_calls":[{"id":"c","type":"function",)"
           R"("function":{"name":"f","arguments":)" +
           arguments + R"(}}]}]})"},
      {"/v1/chat/completions", R"({"messages":[)" + kUser + R"(],"unrelated":)" + deep + "}"},
      {"/v1/completions", R"({"prompt":"hi","max_tokens":2,"x":)" + deep + "}"},
      {"/generate", R"({"text":"hi","sampling_params":{"max_new_tokens":2},"x":)" + deep + "}"},
  };
}

TEST(RequestRobustness, NestingFarPastTheLimitIsA400NotACrash) {
  ServerFixture f;
  for (size_t levels : {600u, 12000u, 200000u}) {
    for (const auto& [path, body] : deep_bodies(levels)) {
      auto r = f.start("POST", path, body);
      ASSERT_TRUE(r->wait()) << path;
      // Tool-call arguments that do not decode stay a string, as vLLM keeps
      // them: that request renders and is answered.
      if (body.find(R"("arguments":)") != std::string::npos) {
        EXPECT_EQ(r->status, 200) << path << " " << levels << ": " << r->body.substr(0, 300);
        continue;
      }
      EXPECT_EQ(r->status, 400) << path << " " << levels << ": " << r->body.substr(0, 300);
      EXPECT_NE(r->body.find("nested deeper than"), std::string::npos) << r->body.substr(0, 300);
    }
  }
  // The server still answers.
  EXPECT_EQ(f.call("POST", "/generate", {{"text", "a"}})->status, 200);
}

TEST(RequestRobustness, NestingWithinTheLimitIsServed) {
  ServerFixture f;
  auto r = f.start("POST", "/generate", R"({"text":"hi","x":)" + nested(kMaxJsonDepth - 1) + "}");
  ASSERT_TRUE(r->wait());
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
}

TEST(BoundedJson, LimitIsEnforcedWhileParsing) {
  EXPECT_NO_THROW(parse_json(nested(kMaxJsonDepth - 1)));
  EXPECT_NO_THROW(parse_json("{\"a\":" + nested(kMaxJsonDepth - 2) + "}"));
  EXPECT_THROW(parse_json(nested(kMaxJsonDepth + 1)), Error);
  EXPECT_THROW(parse_json(nested(1000000)), Error);  // would overflow the stack if built
  EXPECT_TRUE(try_parse_json(nested(1000000)).is_discarded());
  EXPECT_TRUE(try_parse_ordered_json(nested(1000000)).is_discarded());
  EXPECT_TRUE(try_parse_json("[1,").is_discarded());
  EXPECT_THROW(parse_json("[1,"), nlohmann::json::parse_error);
  EXPECT_EQ(parse_json(R"({"b":1,"a":[2]})"), json({{"a", {2}}, {"b", 1}}));
  EXPECT_EQ(parse_ordered_json(R"({"b":1,"a":2})").begin().key(), "b");
}

TEST(RequestRobustness, FieldsOfTheWrongTypeAre400s) {
  // Found by the live fuzz loop: tool_choice.type as a list was a 500.
  ServerFixture f;
  json tool = {{"type", "function"}, {"function", {{"name", "f"}}}};
  json base = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", {tool}}};
  for (json extra : {json{{"tool_choice", {{"type", json::array({"x"})}}}},
                     json{{"tool_choice", {{"type", "function"}, {"function", {{"name", 3}}}}}},
                     json{{"response_format", {{"type", 3}}}}, json{{"tools", {{{"type", 5}}}}},
                     json{{"tools", {{{"type", "function"}, {"function", {{"name", {1}}}}}}}}}) {
    json body = base;
    body.update(extra);
    auto r = f.call("POST", "/v1/chat/completions", body);
    EXPECT_EQ(r->status, 400) << extra.dump() << " " << r->body;
  }
}

TEST(RequestRobustness, SeedsPastInt64AreRejected) {
  ServerFixture f;
  const std::string user = R"("messages":[{"role":"user","content":"hi"}])";
  for (const char* seed : {"9223372036854775808", "18446744073709551615"}) {
    auto chat = f.start("POST", "/v1/chat/completions", "{" + user + ",\"seed\":" + seed + "}");
    ASSERT_TRUE(chat->wait());
    EXPECT_EQ(chat->status, 400) << chat->body;
    EXPECT_EQ(chat->json()["error"]["param"], "seed");
    auto native = f.start("POST", "/generate",
                          std::string(R"({"text":"a","sampling_params":{"seed":)") + seed + "}}");
    ASSERT_TRUE(native->wait());
    EXPECT_EQ(native->status, 400) << native->body;
    EXPECT_EQ(native->json()["error"]["param"], "seed");
  }
  // The largest int64 and negative seeds are fine (vLLM's range).
  auto ok = f.start("POST", "/v1/chat/completions",
                    "{" + user + ",\"seed\":9223372036854775807,\"max_tokens\":1}");
  ASSERT_TRUE(ok->wait());
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(*f.engine.submitted().back().sampling.seed, 9223372036854775807ull);
  EXPECT_EQ(
      f.call("POST", "/v1/completions", {{"prompt", "a"}, {"seed", -5}, {"max_tokens", 1}})->status,
      200);
}

TEST(RequestRobustness, LogitBiasReachesTheEngineOrIsRejected) {
  ServerFixture f;
  json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 1}};
  chat["logit_bias"] = {{"72", 5.5}, {"10", -100}};
  auto r = f.call("POST", "/v1/chat/completions", chat);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(f.engine.submitted().back().sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{10, -100.0f}, {72, 5.5f}}));
  auto native = f.call("POST", "/generate",
                       {{"text", "a"}, {"sampling_params", {{"logit_bias", {{"3", 1}}}}}});
  ASSERT_EQ(native->status, 200) << native->body;
  EXPECT_EQ(f.engine.submitted().back().sampling.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{3, 1.0f}}));
  size_t submitted = f.engine.submitted().size();
  // The fake vocabulary has 258 tokens.
  for (json bad : {json{{"258", 1}}, json{{"-1", 1}}, json{{"abc", 1}}, json{{"1x", 1}},
                   json{{"5", 101}}, json{{"5", "up"}}, json(3), json::array({1})}) {
    chat["logit_bias"] = bad;
    auto rejected = f.call("POST", "/v1/chat/completions", chat);
    EXPECT_EQ(rejected->status, 400) << bad.dump() << " " << rejected->body;
    EXPECT_EQ(rejected->json()["error"]["param"], "logit_bias") << bad.dump();
  }
  EXPECT_EQ(f.engine.submitted().size(), submitted);
}

TEST(RequestRobustness, ParallelToolCallsFalseReturnsOneCall) {
  ServerFixture f;
  const std::string call =
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "</tool_call>";
  f.engine.script = call + call;
  json tool = {
      {"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
  json request = {{"messages", {{{"role", "user"}, {"content", "weather?"}}}},
                  {"tools", {tool}},
                  {"chat_template_kwargs", {{"enable_thinking", false}}}};
  json both = f.call("POST", "/v1/chat/completions", request)->json();
  EXPECT_EQ(both["choices"][0]["message"]["tool_calls"].size(), 2u) << both.dump();
  request["parallel_tool_calls"] = false;
  json one = f.call("POST", "/v1/chat/completions", request)->json();
  EXPECT_EQ(one["choices"][0]["message"]["tool_calls"].size(), 1u) << one.dump();
  EXPECT_TRUE(one["choices"][0]["message"]["content"].is_null()) << one.dump();
  EXPECT_EQ(one["choices"][0]["finish_reason"], "tool_calls");
  // Streaming gives the same single call.
  request["stream"] = true;
  auto streamed = f.call("POST", "/v1/chat/completions", request);
  int firsts = 0;
  for (const auto& event : streamed->events())
    for (const auto& delta : event["choices"][0]["delta"].value("tool_calls", json::array()))
      if (delta.contains("id")) ++firsts;
  EXPECT_EQ(firsts, 1);
}

TEST(RequestRobustness, CompletionsLogprobsZeroNamesTheChosenToken) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/completions", {{"prompt", "a"}, {"logprobs", 0}, {"max_tokens", 2}});
  ASSERT_EQ(r->status, 200) << r->body;
  const json logprobs = r->json()["choices"][0]["logprobs"];
  EXPECT_EQ(logprobs["top_logprobs"], json::parse(R"([{"H": -0.5}, {"e": -0.5}])"));
  EXPECT_EQ(logprobs["token_logprobs"], json::parse("[-0.5, -0.5]"));
}

TEST(RequestRobustness, TooLongPromptsNameTheirOwnParameter) {
  ServerFixture f;
  f.engine.context_tokens = 4;
  auto param_of = [&](const std::string& path, const json& body) {
    auto r = f.call("POST", path, body);
    EXPECT_EQ(r->status, 400) << path << " " << r->body;
    return r->json()["error"]["param"];
  };
  EXPECT_EQ(param_of("/v1/completions", {{"prompt", "abcdefgh"}}), "prompt");
  EXPECT_EQ(param_of("/generate", {{"text", "abcdefgh"}}), "text");
  EXPECT_EQ(param_of("/generate", {{"input_ids", {1, 2, 3, 4, 5, 6}}}), "input_ids");
  EXPECT_EQ(param_of("/v1/chat/completions",
                     {{"messages", {{{"role", "user"}, {"content", "abcdefgh"}}}}}),
            "messages");
  EXPECT_EQ(param_of("/v1/completions", {{"prompt", "a"}, {"max_tokens", 50}}), "max_tokens");
}

TEST(RequestRobustness, OneSamplingValidationForServerAndEngine) {
  ServerFixture f;
  // The engine rejects repetition_penalty above 2; the server says so first.
  json native = {{"text", "a"}, {"sampling_params", {{"repetition_penalty", 2.5}}}};
  auto r = f.call("POST", "/generate", native);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(r->json()["error"]["param"], "repetition_penalty");
  json chat = {
      {"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}, {"min_tokens", 3}};
  r = f.call("POST", "/v1/chat/completions", chat);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_EQ(r->json()["error"]["param"], "min_tokens");
  SamplingParams fine;
  EXPECT_FALSE(check_sampling(fine, 10).has_value());
  fine.logit_bias = {{10, 1.0f}};
  ASSERT_TRUE(check_sampling(fine, 10).has_value());
  EXPECT_EQ(check_sampling(fine, 10)->param, "logit_bias");
}

}  // namespace
}  // namespace megactx::server::testing
