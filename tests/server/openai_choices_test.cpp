// n > 1 on both OpenAI endpoints, whole and streamed: every choice index
// appears once with its own text, logprobs and finish_reason, in index order
// when whole; usage counts each prompt once and every choice's completion; a
// stream ends with one usage chunk and [DONE]; a failed choice fails the
// whole response (400) or, streamed, becomes an error event.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "server_fixture.h"

namespace megactx::server::testing {
namespace {

using nlohmann::json;

const json kUserHi = {{{"role", "user"}, {"content", "hi"}}};

// Per choice index: the concatenated streamed text (completions) or delta
// content (chat), how many finish chunks it got and its finish reason.
struct StreamedChoice {
  std::string text;
  int finishes = 0;
  json finish_reason;
  int role_chunks = 0;
  std::vector<json> logprobs;
};

std::map<int, StreamedChoice> collect(const std::vector<json>& events, bool chat) {
  std::map<int, StreamedChoice> out;
  for (const auto& event : events) {
    if (event.contains("error")) continue;
    for (const auto& choice : event["choices"]) {
      StreamedChoice& c = out[choice["index"].get<int>()];
      if (chat) {
        const json& delta = choice["delta"];
        if (delta.contains("role")) ++c.role_chunks;
        if (delta.contains("content")) c.text += delta["content"].get<std::string>();
      } else {
        c.text += choice["text"].get<std::string>();
      }
      if (!choice["logprobs"].is_null()) c.logprobs.push_back(choice["logprobs"]);
      if (!choice["finish_reason"].is_null()) {
        ++c.finishes;
        c.finish_reason = choice["finish_reason"];
      }
    }
  }
  return out;
}

// Every chunk but the last carries one choice and "usage": null; the last
// carries the usage.
void expect_one_choice_chunks_then_usage(const std::vector<json>& events,
                                         const std::string& object) {
  ASSERT_FALSE(events.empty());
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i]["object"], object);
    EXPECT_EQ(events[i]["choices"].size(), 1u);
    EXPECT_TRUE(events[i]["usage"].is_null());
  }
  EXPECT_EQ(events.back()["object"], object);
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_TRUE(events.back()["usage"].is_object());
}

TEST(OpenAiChoices, CompletionsWholeTwoPromptsTimesN) {
  ServerFixture f;
  auto r = f.call(
      "POST", "/v1/completions",
      {{"prompt", {"ab", "cde"}}, {"n", 3}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 2}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = r->json();
  EXPECT_EQ(body["object"], "text_completion");
  ASSERT_EQ(body["choices"].size(), 6u);
  for (int i = 0; i < 6; ++i) {
    const json& choice = body["choices"][i];
    EXPECT_EQ(choice["index"], i);
    // Choices are prompt-major: 0..2 answer "ab", 3..5 answer "cde".
    EXPECT_EQ(choice["text"], i < 3 ? "abHe" : "cdeHe");
    EXPECT_EQ(choice["finish_reason"], "length");
    EXPECT_TRUE(choice["matched_stop"].is_null());
    // <bos> + the prompt bytes + 2 generated tokens.
    EXPECT_EQ(choice["logprobs"]["tokens"].size(), i < 3 ? 5u : 6u);
  }
  // <bos>ab (3) + <bos>cde (4), each once; 6 choices of 2 tokens.
  EXPECT_EQ(body["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(body["usage"]["completion_tokens"], 12);
  EXPECT_EQ(body["usage"]["total_tokens"], 19);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 2);  // only the 4-token one
}

TEST(OpenAiChoices, CompletionsStreamedN) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/completions",
                  {{"prompt", "xy"},
                   {"n", 2},
                   {"echo", true},
                   {"logprobs", 0},
                   {"max_tokens", 3},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r->status, 200);
  EXPECT_TRUE(r->ends_with_done());
  auto events = r->events();
  expect_one_choice_chunks_then_usage(events, "text_completion");
  auto choices = collect(events, false);
  ASSERT_EQ(choices.size(), 2u);
  for (auto& [index, choice] : choices) {
    EXPECT_EQ(choice.text, "xyHel") << index;  // the echo once, then the tokens
    EXPECT_EQ(choice.finishes, 1) << index;
    EXPECT_EQ(choice.finish_reason, "length") << index;
    size_t tokens = 0;
    for (const auto& logprobs : choice.logprobs) tokens += logprobs["tokens"].size();
    EXPECT_EQ(tokens, 6u) << index;  // <bos> x y H e l
  }
  const json& last = events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(last["usage"]["completion_tokens"], 6);
  EXPECT_EQ(last["usage"]["total_tokens"], 9);
}

TEST(OpenAiChoices, CompletionsStreamWithoutUsageHasNoUsageKey) {
  ServerFixture f;
  auto r = f.call("POST", "/v1/completions",
                  {{"prompt", "a"}, {"n", 2}, {"max_tokens", 1}, {"stream", true}});
  EXPECT_TRUE(r->ends_with_done());
  auto events = r->events();
  for (const auto& event : events) {
    EXPECT_FALSE(event.contains("usage"));
    EXPECT_EQ(event["choices"].size(), 1u);
  }
  EXPECT_EQ(collect(events, false).size(), 2u);
}

TEST(OpenAiChoices, CompletionsOneFailedChoiceFailsTheResponse) {
  ServerFixture f;
  // The fake engine fails prompts over 1,000 tokens.
  std::vector<int32_t> long_prompt(1001, 'a');
  auto r = f.call("POST", "/v1/completions",
                  {{"prompt", {std::vector<int32_t>{'a'}, long_prompt}}, {"max_tokens", 2}});
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->json()["error"]["message"].get<std::string>().find("too long"), std::string::npos);
}

TEST(OpenAiChoices, CompletionsStreamedFailedChoiceIsAnErrorEvent) {
  ServerFixture f;
  std::vector<int32_t> long_prompt(1001, 'a');
  auto r = f.call(
      "POST", "/v1/completions",
      {{"prompt", {std::vector<int32_t>{'a'}, long_prompt}}, {"max_tokens", 2}, {"stream", true}});
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(r->ends_with_done());
  int errors = 0;
  for (const auto& event : r->events()) errors += event.contains("error") ? 1 : 0;
  EXPECT_EQ(errors, 1);
  auto choices = collect(r->events(), false);
  ASSERT_EQ(choices.count(0), 1u);
  EXPECT_EQ(choices[0].text, "He");
  EXPECT_EQ(choices[0].finish_reason, "length");
  EXPECT_EQ(choices.count(1), 0u);
}

TEST(OpenAiChoices, ChatWholeNWithToolCalls) {
  ServerFixture f;
  f.engine.script =
      "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
      "</tool_call>";
  json tool = {
      {"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
  auto single = f.call("POST", "/v1/chat/completions",
                       {{"messages", kUserHi},
                        {"tools", {tool}},
                        {"chat_template_kwargs", {{"enable_thinking", false}}},
                        {"max_tokens", 200}});
  ASSERT_EQ(single->status, 200) << single->body;
  auto r = f.call("POST", "/v1/chat/completions",
                  {{"messages", kUserHi},
                   {"tools", {tool}},
                   {"chat_template_kwargs", {{"enable_thinking", false}}},
                   {"max_tokens", 200},
                   {"n", 2}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = r->json();
  EXPECT_EQ(body["object"], "chat.completion");
  ASSERT_EQ(body["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const json& choice = body["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["finish_reason"], "tool_calls");
    EXPECT_TRUE(choice["message"]["content"].is_null());
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
    EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
    EXPECT_EQ(
        json::parse(choice["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>()),
        json({{"city", "Paris"}}));
    EXPECT_TRUE(choice["logprobs"].is_null());
  }
  // One prompt, counted once; twice the completion of a single choice.
  json one = single->json()["usage"], two = body["usage"];
  EXPECT_EQ(two["prompt_tokens"], one["prompt_tokens"]);
  EXPECT_EQ(two["completion_tokens"], 2 * one["completion_tokens"].get<int>());
}

TEST(OpenAiChoices, ChatStreamedNWithLogprobs) {
  ServerFixture f;
  f.engine.script = "ab</think>cd";
  auto single = f.call("POST", "/v1/chat/completions", {{"messages", kUserHi}});
  auto r = f.call("POST", "/v1/chat/completions",
                  {{"messages", kUserHi},
                   {"n", 3},
                   {"logprobs", true},
                   {"top_logprobs", 1},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r->status, 200);
  EXPECT_TRUE(r->ends_with_done());
  auto events = r->events();
  expect_one_choice_chunks_then_usage(events, "chat.completion.chunk");
  // Each choice's role chunk comes before anything else of that choice.
  std::set<int> seen;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json& choice = events[i]["choices"][0];
    int index = choice["index"].get<int>();
    if (seen.insert(index).second) {
      EXPECT_EQ(choice["delta"]["role"], "assistant");
    }
  }
  auto choices = collect(events, true);
  ASSERT_EQ(choices.size(), 3u);
  for (auto& [index, choice] : choices) {
    EXPECT_EQ(choice.role_chunks, 1) << index;
    EXPECT_EQ(choice.text, "cd") << index;
    EXPECT_EQ(choice.finishes, 1) << index;
    EXPECT_EQ(choice.finish_reason, "stop") << index;
    size_t tokens = 0;
    for (const auto& logprobs : choice.logprobs) {
      tokens += logprobs["content"].size();
      EXPECT_EQ(logprobs["content"][0]["top_logprobs"].size(), 1u);
    }
    EXPECT_EQ(tokens, 12u) << index;  // "ab</think>cd" byte by byte
  }
  const json& last = events.back();
  EXPECT_TRUE(last["choices"].empty());
  json one = single->json()["usage"];
  EXPECT_EQ(last["usage"]["prompt_tokens"], one["prompt_tokens"]);
  EXPECT_EQ(last["usage"]["completion_tokens"], 3 * one["completion_tokens"].get<int>());
}

TEST(OpenAiChoices, ChatFailedChoices) {
  ServerFixture f;
  json long_messages = {{{"role", "user"}, {"content", std::string(1001, 'a')}}};
  auto whole = f.call("POST", "/v1/chat/completions",
                      {{"messages", long_messages}, {"n", 2}, {"max_tokens", 2}});
  EXPECT_EQ(whole->status, 400);
  auto streamed =
      f.call("POST", "/v1/chat/completions",
             {{"messages", long_messages}, {"n", 2}, {"max_tokens", 2}, {"stream", true}});
  EXPECT_EQ(streamed->status, 200);
  EXPECT_TRUE(streamed->ends_with_done());
  auto events = streamed->events();
  ASSERT_EQ(events.size(), 2u);
  for (const auto& event : events) EXPECT_EQ(event["error"]["code"], 400);
  // A single streamed choice that fails before any output is a plain 400.
  auto single = f.call("POST", "/v1/chat/completions",
                       {{"messages", long_messages}, {"max_tokens", 2}, {"stream", true}});
  EXPECT_EQ(single->status, 400);
}

}  // namespace
}  // namespace megactx::server::testing
