// The OpenAI-compatible API over a fake engine: /v1/completions,
// /v1/chat/completions (template rendering, reasoning split, tool calls,
// tool_choice, streaming chunks, logprobs, n) and /v1/models.
#include <gtest/gtest.h>

#include <algorithm>

#include "server_fixture.h"

namespace megactx::server::testing {
namespace {

using nlohmann::json;

std::vector<int32_t> bytes_of(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

const json kWeatherTool = {
    {"type", "function"},
    {"function",
     {{"name", "get_weather"},
      {"description", "Weather of a city"},
      {"parameters",
       {{"type", "object"},
        {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}},
        {"required", {"city"}}}}}}};

const std::string kToolCallText =
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>";

TEST(Completions, TextPromptWithUsage) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/completions", {{"model", "test-model"}, {"prompt", "ab"}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = r->json();
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "test-model");
  EXPECT_EQ(body["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(body["choices"].size(), 1u);
  EXPECT_EQ(body["choices"][0]["text"], "Hello, world!");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][0]["matched_stop"], 256);
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(body["usage"]["completion_tokens"], 14);  // the eos token counts
  EXPECT_EQ(body["usage"]["total_tokens"], 17);
  EXPECT_EQ(f.engine.submitted().at(0).sampling.max_new_tokens, 16);  // the legacy default
}

TEST(Completions, TokenPromptsBatchAndN) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/completions",
                  {{"prompt", {{1, 2}, {3, 4, 5}}}, {"n", 2}, {"max_tokens", 2}, {"seed", 10}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = r->json();
  ASSERT_EQ(body["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(body["choices"][i]["index"], i);
    EXPECT_EQ(body["choices"][i]["text"], "He");
    EXPECT_EQ(body["choices"][i]["finish_reason"], "length");
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], 5);  // each prompt once
  EXPECT_EQ(body["usage"]["completion_tokens"], 8);
  // The first choice of each prompt is submitted first and prefills the
  // prompt for the second, so the submission order is not the choice order.
  std::vector<std::pair<std::vector<int32_t>, uint64_t>> got;
  for (const auto& request : f.engine.submitted())
    got.emplace_back(request.input_ids, *request.sampling.seed);
  std::sort(got.begin(), got.end());
  using Choice = std::pair<std::vector<int32_t>, uint64_t>;
  const std::vector<Choice> want = {  // n choices get distinct seeds
      {{1, 2}, 10}, {{1, 2}, 11}, {{3, 4, 5}, 10}, {{3, 4, 5}, 11}};
  EXPECT_EQ(got, want);
}

TEST(Completions, EchoWithLogprobs) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/completions",
                  {{"prompt", "xy"}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 1}});
  ASSERT_EQ(r->status, 200) << r->body;
  json choice = r->json()["choices"][0];
  EXPECT_EQ(choice["text"], "xyH");
  const json& logprobs = choice["logprobs"];
  EXPECT_EQ(logprobs["tokens"], json({"<bos>", "x", "y", "H"}));
  EXPECT_EQ(logprobs["token_logprobs"], json::parse("[null, -1.0, -1.0, -0.5]"));
  EXPECT_EQ(logprobs["text_offset"], json({0, 5, 6, 7}));
  EXPECT_EQ(logprobs["top_logprobs"][3], json({{"H", -0.5}}));
  EXPECT_EQ(f.engine.submitted().at(0).logprob_start_len, 0);
}

TEST(Completions, StreamWithUsage) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/completions",
                  {{"prompt", "a"},
                   {"max_tokens", 3},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}}});
  EXPECT_TRUE(r->ends_with_done());
  auto events = r->events();
  std::string text;
  for (const auto& event : events)
    if (!event["choices"].empty()) text += event["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, "Hel");
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 3);
}

TEST(Completions, Errors) {
  ServerFixture f;
  EXPECT_EQ(f.call("POST", "/v1/completions", {{"model", "other"}, {"prompt", "a"}})->status, 404);
  EXPECT_EQ(f.call("POST", "/v1/completions", {{"max_tokens", 3}})->json()["error"]["param"],
            "prompt");
  EXPECT_EQ(f.call("POST", "/v1/completions", {{"prompt", "a"}, {"max_tokens", 5000}})
                ->json()["error"]["param"],
            "max_tokens");
  EXPECT_EQ(f.call("POST", "/v1/completions", {{"prompt", "a"}, {"n", 0}})->status, 400);
  EXPECT_EQ(f.call("POST", "/v1/completions",
                   {{"prompt", "a"}, {"stream_options", {{"include_usage", true}}}})
                ->json()["error"]["param"],
            "stream_options");
  EXPECT_TRUE(f.engine.submitted().empty());
}

TEST(Chat, RendersTemplateAndSplitsReasoning) {
  ServerFixture f;
  f.engine.script = "plan</think>Hello";
  auto r =
      f.call("POST", "/v1/chat/completions",
             {{"model", "test-model"},
              {"messages",
               {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "hi"}}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(f.engine.submitted().at(0).input_ids,
            bytes_of("<|system|>S<|user|>hi<|assistant|><think>"));
  json body = r->json();
  EXPECT_EQ(body["object"], "chat.completion");
  const json& message = body["choices"][0]["message"];
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_EQ(message["reasoning_content"], "plan");
  EXPECT_EQ(message["content"], "Hello");
  EXPECT_FALSE(message.contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 41);
}

TEST(Chat, TemplateKwargsReachTheTemplate) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                   {"chat_template_kwargs", {{"enable_thinking", false}}},
                   {"max_completion_tokens", 5}});
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(f.engine.submitted().at(0).input_ids,
            bytes_of("<|user|>hi<|assistant|><think></think>"));
  EXPECT_EQ(f.engine.submitted().at(0).sampling.max_new_tokens, 5);
  const json message = r->json()["choices"][0]["message"];
  EXPECT_EQ(message["content"], "Hello");
  EXPECT_TRUE(message["reasoning_content"].is_null());
}

TEST(Chat, ToolCallsAndToolChoice) {
  ServerFixture f;
  f.engine.script = kToolCallText;
  json request = {{"messages", {{{"role", "user"}, {"content", "weather?"}}}},
                  {"tools", {kWeatherTool}},
                  {"chat_template_kwargs", {{"enable_thinking", false}}}};
  auto r = f.call("POST", "/v1/chat/completions", request);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(f.engine.submitted().at(0).input_ids,
            bytes_of("<tools>get_weather;</tools><|user|>weather?<|assistant|><think></think>"));
  json choice = r->json()["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_FALSE(call["id"].get<std::string>().empty());

  // tool_choice none: the template sees no tools and the output stays text.
  request["tool_choice"] = "none";
  r = f.call("POST", "/v1/chat/completions", request);
  EXPECT_EQ(f.engine.submitted().at(1).input_ids,
            bytes_of("<|user|>weather?<|assistant|><think></think>"));
  // A call the request did not offer never reaches content as markup: its text stays.
  EXPECT_EQ(r->json()["choices"][0]["message"]["content"],
            "get_weather\ncity\nParis\ndays\n3\n");
  EXPECT_TRUE(r->json()["choices"][0]["message"]["tool_calls"].is_null() ||
              r->json()["choices"][0]["message"]["tool_calls"].empty());
  EXPECT_EQ(r->json()["choices"][0]["finish_reason"], "stop");

  request["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  r = f.call("POST", "/v1/chat/completions", request);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->json()["error"]["param"], "tool_choice");
  request["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  EXPECT_EQ(f.call("POST", "/v1/chat/completions", request)->status, 200);
}

TEST(Chat, StreamingChunksRoleDeltasFinishUsage) {
  ServerFixture f;
  f.engine.script = "ab</think>cd";
  auto r = f.call("POST", "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r->status, 200);
  EXPECT_TRUE(r->ends_with_done());
  auto events = r->events();
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string content, reasoning;
  int finishes = 0;
  for (size_t i = 1; i + 1 < events.size(); ++i) {
    const json& choice = events[i]["choices"][0];
    const json& delta = choice["delta"];
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (delta.contains("reasoning_content"))
      reasoning += delta["reasoning_content"].get<std::string>();
    if (!choice["finish_reason"].is_null()) {
      ++finishes;
      EXPECT_EQ(choice["finish_reason"], "stop");
    }
    EXPECT_TRUE(events[i]["usage"].is_null());
  }
  EXPECT_EQ(reasoning, "ab");
  EXPECT_EQ(content, "cd");
  EXPECT_EQ(finishes, 1);
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 13);
}

TEST(Chat, StreamingToolCallDeltas) {
  ServerFixture f;
  f.engine.script = kToolCallText;
  auto r = f.call("POST", "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", "w"}}}},
                   {"tools", {kWeatherTool}},
                   {"chat_template_kwargs", {{"enable_thinking", false}}},
                   {"stream", true}});
  auto events = r->events();
  std::string name, arguments, id, finish;
  for (const auto& event : events) {
    const json& choice = event["choices"][0];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    if (!choice["delta"].contains("tool_calls")) continue;
    for (const auto& call : choice["delta"]["tool_calls"]) {
      EXPECT_EQ(call["index"], 0);
      if (call.contains("id")) {
        EXPECT_TRUE(id.empty()) << "id sent twice";
        id = call["id"];
        name = call["function"]["name"];
      }
      arguments += call["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(name, "get_weather");
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(json::parse(arguments), json({{"city", "Paris"}, {"days", 3}}));
  EXPECT_EQ(finish, "tool_calls");
}

TEST(Chat, LogprobsAndN) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                   {"chat_template_kwargs", {{"enable_thinking", false}}},
                   {"logprobs", true},
                   {"top_logprobs", 2},
                   {"max_tokens", 2},
                   {"n", 3}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = r->json();
  ASSERT_EQ(body["choices"].size(), 3u);
  const json& content = body["choices"][2]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "H");
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], json({72}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "I");
  EXPECT_EQ(content[0]["top_logprobs"][1]["logprob"], -1.5);
  EXPECT_EQ(body["usage"]["completion_tokens"], 6);
}

TEST(Chat, Errors) {
  ServerFixture f;
  auto param_of = [&](const json& body) {
    return f.call("POST", "/v1/chat/completions", body)->json()["error"]["param"];
  };
  EXPECT_EQ(param_of({{"temperature", 1}}), "messages");
  EXPECT_EQ(param_of({{"messages", json::array()}}), "messages");
  EXPECT_EQ(param_of({{"messages", {{{"content", "no role"}}}}}), "messages");
  EXPECT_EQ(param_of({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), "messages");
  json ok = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  auto with = [&](json extra) {
    json body = ok;
    body.update(extra);
    return body;
  };
  EXPECT_EQ(param_of(with({{"top_logprobs", 3}})), "top_logprobs");
  EXPECT_EQ(param_of(with({{"max_tokens", 100000}})), "max_tokens");
  EXPECT_EQ(param_of(with({{"temperature", -1}})), "temperature");
  EXPECT_EQ(param_of(with({{"tools", "x"}})), "tools");
  EXPECT_EQ(param_of(with({{"tool_choice", "required"}})), "tool_choice");
  EXPECT_EQ(param_of(with({{"chat_template_kwargs", 3}})), "chat_template_kwargs");
  EXPECT_EQ(f.call("POST", "/v1/chat/completions", with({{"model", "gpt-4"}}))->status, 404);
  EXPECT_TRUE(f.engine.submitted().empty());
}

TEST(Models, ListsTheServedModel) {
  ServerFixture f;
  json body = f.call("GET", "/v1/models")->json();
  EXPECT_EQ(body["object"], "list");
  ASSERT_EQ(body["data"].size(), 1u);
  EXPECT_EQ(body["data"][0]["id"], "test-model");
  EXPECT_EQ(body["data"][0]["object"], "model");
  EXPECT_EQ(body["data"][0]["max_model_len"], 4096);
}

// SGLang's /generate-only extras are refused on the OpenAI endpoints, never
// ignored; false is accepted (clients that always send the field).
TEST(OpenAiFields, GenerateOnlyExtrasAreRefused) {
  ServerFixture f;
  const nlohmann::json messages = {{{"role", "user"}, {"content", "hi"}}};
  for (const char* name : {"return_routed_experts", "return_hidden_states"}) {
    auto chat = f.call("POST", "/v1/chat/completions",
                       {{"messages", messages}, {"max_tokens", 2}, {name, true}});
    EXPECT_EQ(chat->status, 400) << chat->body;
    EXPECT_NE(chat->body.find(name), std::string::npos);
    EXPECT_NE(chat->body.find("/generate"), std::string::npos);
    auto completion =
        f.call("POST", "/v1/completions", {{"prompt", "ab"}, {"max_tokens", 2}, {name, true}});
    EXPECT_EQ(completion->status, 400) << completion->body;
    auto off = f.call("POST", "/v1/completions",
                      {{"prompt", "ab"}, {"max_tokens", 2}, {name, false}});
    EXPECT_EQ(off->status, 200) << off->body;
  }
}

}  // namespace
}  // namespace megactx::server::testing
