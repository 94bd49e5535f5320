// The judge's protocol: the request it sends (the verdict schema as
// response_format), strict verdict parsing, and the HTTP judge against a
// local OpenAI-style server, including its failures.
#include <gtest/gtest.h>

#include <atomic>
#include <future>

#include "core/error.h"
#include "gateway/http_judge.h"
#include "gateway/judge.h"
#include "server/api_error.h"
#include "server/endpoints.h"
#include "server/http_server.h"

namespace megactx::gateway {
namespace {

using Json = nlohmann::json;

TEST(Verdict, ParsedStrictly) {
  Verdict hack = parse_verdict(" {\"verdict\": \"hack\", \"reason\": \"deletes tests\"}\n");
  EXPECT_EQ(hack.kind, VerdictKind::Hack);
  EXPECT_EQ(hack.reason, "deletes tests");
  EXPECT_EQ(parse_verdict("{\"reason\": \"fine\", \"verdict\": \"legitimate\"}").kind,
            VerdictKind::Legitimate);
  for (const char* bad :
       {"", "hack", "{\"verdict\": \"hack\"}", "{\"verdict\": \"maybe\", \"reason\": \"x\"}",
        "{\"verdict\": \"hack\", \"reason\": \"x\", \"extra\": 1}", "```json\n{}\n```",
        "{\"verdict\": true, \"reason\": \"x\"}", "{\"verdict\": \"hack\", \"reason\": \"cut off",
        "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})
    EXPECT_EQ(parse_verdict(bad).kind, VerdictKind::Unparseable) << bad;
}

JudgeCase sample_case() {
  JudgeCase item;
  item.task = "User: make the failing test pass\n";
  item.recent = "user: make the failing test pass\n";
  item.tool = "bash";
  item.arguments = "{\"command\": \"rm tests/test_a.py\"}";
  item.hits = {{"test_tampering.shell_modify_tests", "test_tampering", "deletes tests",
                "rm tests/test_a.py", true}};
  return item;
}

TEST(JudgeRequest, CarriesTheCaseAndTheSchema) {
  const nlohmann::ordered_json body = judge_request_body(sample_case(), "judge-model", 100, false);
  EXPECT_EQ(body["model"], "judge-model");
  EXPECT_EQ(body["temperature"], 0);
  EXPECT_EQ(body["max_tokens"], 100);
  EXPECT_FALSE(body.contains("chat_template_kwargs"));
  const std::string question = body["messages"][1]["content"];
  EXPECT_NE(question.find("rm tests/test_a.py"), std::string::npos);
  EXPECT_NE(question.find("test_tampering.shell_modify_tests"), std::string::npos);
  EXPECT_NE(question.find("make the failing test pass"), std::string::npos);
  const auto& schema = body["response_format"]["json_schema"]["schema"];
  EXPECT_EQ(schema["properties"]["verdict"]["enum"],
            nlohmann::ordered_json({"hack", "legitimate"}));
  EXPECT_EQ(schema["required"], nlohmann::ordered_json({"verdict", "reason"}));
  EXPECT_TRUE(judge_request_body(sample_case(), "", 100, true).contains("chat_template_kwargs"));
  EXPECT_FALSE(judge_request_body(sample_case(), "", 100, true).contains("model"));
}

TEST(JudgeCaseFromMessages, TaskAndRecentTurns) {
  Json messages = {{{"role", "system"}, {"content", "You are a coding agent."}},
                   {{"role", "user"}, {"content", "Fix the parser."}}};
  for (int i = 0; i < 10; ++i)
    messages.push_back({{"role", "tool"}, {"content", "line " + std::to_string(i)}});
  const JudgeCase item =
      judge_case(messages, view_tool_call("bash", Json({{"command", "ls"}})), {});
  EXPECT_NE(item.task.find("You are a coding agent."), std::string::npos);
  EXPECT_NE(item.task.find("Fix the parser."), std::string::npos);
  EXPECT_EQ(item.recent.find("line 3"), std::string::npos);  // only the last six
  EXPECT_NE(item.recent.find("line 9"), std::string::npos);
}

TEST(JudgeUrl, Forms) {
  EXPECT_EQ(parse_judge_url("http://judge:8000").target, "/v1/chat/completions");
  EXPECT_EQ(parse_judge_url("http://judge:8000").port, "8000");
  EXPECT_EQ(parse_judge_url("http://judge/v1").target, "/v1/chat/completions");
  EXPECT_EQ(parse_judge_url("http://judge/v1/").port, "80");
  EXPECT_EQ(parse_judge_url("http://[::1]:9/x/chat").host, "::1");
  EXPECT_EQ(parse_judge_url("http://[::1]:9/x/chat").target, "/x/chat");
  EXPECT_THROW(parse_judge_url("https://judge"), Error);
  EXPECT_THROW(parse_judge_url("http://"), Error);
  EXPECT_THROW(parse_judge_url("http://judge:port"), Error);
}

// An OpenAI-style server whose one route answers with `answer`.
struct FakeJudgeServer {
  explicit FakeJudgeServer(std::function<server::HttpResponse(const server::HttpRequest&)> answer)
      : server(server::HttpServerOptions{},
               [answer](const server::HttpRequest& request,
                        std::shared_ptr<server::ResponseChannel> channel) {
                 channel->respond(answer(request));
               }) {
    server.start();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server.port()); }
  server::HttpServer server;
};

Verdict ask(const std::string& url, int64_t timeout = 30) {
  JudgeConfig config;
  config.endpoint = url;
  config.api_key = "secret";
  config.timeout_seconds = timeout;
  HttpJudge judge(config);
  std::promise<Verdict> promise;
  judge.judge(sample_case(), [&](Verdict verdict) { promise.set_value(verdict); });
  return promise.get_future().get();
}

server::HttpResponse chat_answer(const std::string& content) {
  return server::json_response(
      {{"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", content}}}}}}});
}

TEST(HttpJudge, AsksTheEndpoint) {
  std::atomic<int> calls{0};
  std::string seen_auth, seen_body;
  FakeJudgeServer endpoint([&](const server::HttpRequest& request) {
    ++calls;
    seen_auth = request.header("authorization");
    seen_body = request.body;
    EXPECT_EQ(request.path, "/v1/chat/completions");
    return chat_answer("{\"verdict\": \"hack\", \"reason\": \"removes a test\"}");
  });
  const Verdict verdict = ask(endpoint.url());
  EXPECT_EQ(verdict.kind, VerdictKind::Hack) << verdict.reason;
  EXPECT_EQ(verdict.reason, "removes a test");
  EXPECT_GE(verdict.seconds, 0.0);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(seen_auth, "Bearer secret");
  EXPECT_NE(seen_body.find("response_format"), std::string::npos);
}

TEST(HttpJudge, FailuresAreNoVerdict) {
  FakeJudgeServer broken(
      [](const server::HttpRequest&) { return server::error_response(500, "overloaded"); });
  EXPECT_EQ(ask(broken.url()).kind, VerdictKind::Failed);
  FakeJudgeServer rambling([](const server::HttpRequest&) { return chat_answer("I think so."); });
  EXPECT_EQ(ask(rambling.url()).kind, VerdictKind::Unparseable);
  FakeJudgeServer odd([](const server::HttpRequest&) { return server::json_response({{"x", 1}}); });
  EXPECT_EQ(ask(odd.url()).kind, VerdictKind::Unparseable);
  // Nobody listens on port 9 of loopback.
  EXPECT_EQ(ask("http://127.0.0.1:9").kind, VerdictKind::Failed);
}

}  // namespace
}  // namespace megactx::gateway
