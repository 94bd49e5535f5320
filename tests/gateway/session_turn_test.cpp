// Whole session turns through the router over the fake engine: the ids the
// engine generated are what the next prompt starts with (append, realign),
// forks and compactions start new traces, sub-agents are samples of the same
// rollout, a confirmed hack is answered with a virtual tool result, and
// nothing is recorded for a request that is refused.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "gateway_fixture.h"

namespace megactx::gateway::testing {
namespace {

using Json = nlohmann::json;

std::vector<int32_t> bytes_of(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

bool starts_with(const std::vector<int32_t>& ids, const std::vector<int32_t>& prefix) {
  return ids.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), ids.begin());
}

std::string decoded(const Json& ids, size_t begin, size_t end) {
  std::string text;
  for (size_t i = begin; i < end; ++i) text += static_cast<char>(ids[i].get<int>());
  return text;
}

Json request_with(Json messages) {
  return {{"messages", std::move(messages)},
          {"tools", Json::array({bash_tool()})},
          {"max_tokens", 200}};
}

Json tool_result(const Json& reply, const std::string& content) {
  return {{"role", "tool"}, {"tool_call_id", reply["tool_calls"][0]["id"]}, {"content", content}};
}

// A model that calls `bash ls` (with reasoning) until it sees a tool result.
void script_agent(FakeEngine& engine) {
  engine.script_for = [](const GenerationRequest& request) {
    const std::string prompt = prompt_text(request);
    const size_t user = prompt.rfind("<|user|>");
    const std::string after = prompt.substr(user == std::string::npos ? 0 : user);
    if (after.find("<|observation|>") == std::string::npos)
      return "<think>plan</think>" + tool_call_markup("ls");
    return std::string("done");
  };
}

TEST(GatewaySession, AppendReusesTheGeneratedIds) {
  GatewayFixture f;
  script_agent(f.engine);
  Json messages = {{{"role", "user"}, {"content", "list the files"}}};
  auto first = f.turn("s1", request_with(messages));
  ASSERT_EQ(first->status, 200) << first->body;
  const Json reply = first->json()["choices"][0]["message"];
  ASSERT_EQ(reply["tool_calls"].size(), 1u);
  EXPECT_EQ(reply["reasoning_content"], "plan");
  EXPECT_EQ(first->json()["gateway"]["kind"], "start");
  EXPECT_TRUE(first->json()["choices"][0]["logprobs"].is_null());  // not asked for

  messages.push_back(reply);
  messages.push_back(tool_result(reply, "a.txt b.txt"));
  auto second = f.turn("s1", request_with(messages));
  ASSERT_EQ(second->status, 200) << second->body;
  EXPECT_EQ(second->json()["gateway"]["kind"], "append");
  EXPECT_EQ(second->json()["choices"][0]["message"]["content"], "done");

  const auto submitted = f.engine.submitted();
  ASSERT_EQ(submitted.size(), 2u);
  EXPECT_TRUE(submitted[0].return_logprob);  // logprobs recorded whatever the client asked
  std::vector<int32_t> chain = submitted[0].input_ids;
  const std::vector<int32_t> generated = bytes_of("<think>plan</think>" + tool_call_markup("ls"));
  chain.insert(chain.end(), generated.begin(), generated.end());
  EXPECT_TRUE(starts_with(submitted[1].input_ids, chain));
  EXPECT_EQ(prompt_text(submitted[1]).substr(chain.size()),
            "<|observation|><tool_response>a.txt b.txt</tool_response><|assistant|>");

  const Json trajectory = f.trajectory("s1");
  ASSERT_EQ(trajectory["turns"].size(), 2u);
  ASSERT_EQ(trajectory["samples"].size(), 1u);
  const Json& sample = trajectory["samples"][0];
  std::vector<int32_t> tokens = submitted[1].input_ids;
  for (int32_t id : bytes_of("done")) tokens.push_back(id);
  EXPECT_EQ(sample["tokens"].get<std::vector<int32_t>>(), tokens);
  const size_t prompt = submitted[0].input_ids.size();
  EXPECT_EQ(sample["response_length"], tokens.size() - prompt);
  const auto mask = sample["loss_mask"].get<std::vector<int>>();
  const auto logprobs = sample["rollout_log_probs"].get<std::vector<float>>();
  ASSERT_EQ(mask.size(), tokens.size() - prompt);
  ASSERT_EQ(logprobs.size(), mask.size());
  for (size_t i = 0; i < mask.size(); ++i) {
    const size_t position = prompt + i;
    const bool model = position < chain.size() || position >= submitted[1].input_ids.size();
    EXPECT_EQ(mask[i], model ? 1 : 0) << "position " << position;
    EXPECT_FLOAT_EQ(logprobs[i], model ? -0.5f : 0.0f) << "position " << position;
  }
  std::vector<std::string> kinds;
  for (const auto& span : sample["metadata"]["spans"]) kinds.push_back(span["kind"]);
  EXPECT_EQ(kinds, (std::vector<std::string>{"prompt", "model", "context", "model"}));
  EXPECT_EQ(sample["status"], "completed");
  EXPECT_EQ(sample["weight_versions"], Json({"default", "default"}));
  EXPECT_EQ(sample["metadata"]["rollout_id"], "s1");  // no rollout id given: the session's
  // Turn 0's prompt ids inline on request.
  const Json full = f.call("GET", "/gateway/session?session_id=s1&prompt_ids=1")->json();
  EXPECT_EQ(full["turns"][1]["generations"][0]["prompt_ids"].get<std::vector<int32_t>>(),
            submitted[1].input_ids);
}

TEST(GatewaySession, RealignKeepsTheRecordedReasoning) {
  GatewayFixture f;
  script_agent(f.engine);
  Json messages = {{{"role", "user"}, {"content", "list the files"}}};
  const Json reply = f.turn("s", request_with(messages))->json()["choices"][0]["message"];
  messages.push_back(reply);
  messages.push_back(tool_result(reply, "a.txt"));
  const Json answer = f.turn("s", request_with(messages))->json()["choices"][0]["message"];
  messages.push_back(answer);
  // A new user turn: the template now drops the first turn's reasoning.
  messages.push_back({{"role", "user"}, {"content", "and the hidden ones?"}});
  auto third = f.turn("s", request_with(messages));
  ASSERT_EQ(third->status, 200) << third->body;
  EXPECT_EQ(third->json()["gateway"]["kind"], "realign");
  const auto submitted = f.engine.submitted();
  ASSERT_EQ(submitted.size(), 3u);
  std::vector<int32_t> chain = submitted[1].input_ids;
  for (int32_t id : bytes_of("done")) chain.push_back(id);
  EXPECT_TRUE(starts_with(submitted[2].input_ids, chain));
  EXPECT_NE(prompt_text(submitted[2]).find("<think>plan</think>"), std::string::npos);
  EXPECT_EQ(prompt_text(submitted[2]).substr(chain.size()),
            "<|user|>and the hidden ones?<|assistant|>");
  const Json trajectory = f.trajectory("s");
  EXPECT_EQ(trajectory["samples"].size(), 1u);
  const Json& turn = trajectory["turns"][2];
  EXPECT_EQ(turn["trace"], 0);
  // The first difference lies in the dropped "<think>plan</think>".
  const size_t diverges = turn["diverges_at"].get<size_t>();
  const Json& tokens = trajectory["samples"][0]["tokens"];
  const size_t think = decoded(tokens, 0, tokens.size()).find("<think>plan</think>");
  EXPECT_GE(diverges, think);
  EXPECT_LT(diverges, think + std::string("<think>plan</think>").size());
}

TEST(GatewaySession, ForkAndCompactionStartNewTraces) {
  GatewayFixture f;
  script_agent(f.engine);
  Json messages = {{{"role", "user"}, {"content", "list the files"}}};
  const Json reply = f.turn("s", request_with(messages))->json()["choices"][0]["message"];
  Json first_branch = messages;
  first_branch.push_back(reply);
  first_branch.push_back(tool_result(reply, "a.txt"));
  EXPECT_EQ(f.turn("s", request_with(first_branch))->json()["gateway"]["kind"], "append");
  // The agent retries turn 0's call and gets another result: a fork from turn 0.
  Json second_branch = messages;
  second_branch.push_back(reply);
  second_branch.push_back(tool_result(reply, "nothing here"));
  auto fork = f.turn("s", request_with(second_branch));
  EXPECT_EQ(fork->json()["gateway"]["kind"], "fork");
  EXPECT_EQ(fork->json()["gateway"]["trace"], 1);
  // A compaction: the history replaced by a summary.
  auto compaction = f.turn("s", request_with({{{"role", "system"}, {"content", "Summary: ls ran."}},
                                              {{"role", "user"}, {"content", "continue"}}}));
  EXPECT_EQ(compaction->json()["gateway"]["kind"], "compaction");
  EXPECT_EQ(compaction->json()["gateway"]["trace"], 2);

  const auto submitted = f.engine.submitted();
  ASSERT_EQ(submitted.size(), 4u);
  const Json trajectory = f.trajectory("s");
  const Json& samples = trajectory["samples"];
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(samples[0]["metadata"]["trace_start"], "start");
  EXPECT_EQ(samples[1]["metadata"]["trace_start"], "fork");
  EXPECT_EQ(samples[1]["metadata"]["forked_from"], Json({{"trace", 0}, {"turn", 0}}));
  EXPECT_EQ(samples[1]["metadata"]["turns"], Json({0, 2}));
  EXPECT_EQ(samples[2]["metadata"]["trace_start"], "compaction");
  // The fork shares the first turn's tokens; the compaction is a fresh prompt.
  const auto trace0 = samples[0]["tokens"].get<std::vector<int32_t>>();
  const auto trace1 = samples[1]["tokens"].get<std::vector<int32_t>>();
  const size_t shared =
      submitted[0].input_ids.size() + trajectory["turns"][0]["generations"][0]["output_ids"].size();
  EXPECT_TRUE(std::equal(trace0.begin(), trace0.begin() + static_cast<std::ptrdiff_t>(shared),
                         trace1.begin()));
  // The compaction's whole history is its prompt; its response is what was generated.
  EXPECT_EQ(samples[2]["response_length"],
            trajectory["turns"][3]["generations"][0]["output_ids"].size());
  EXPECT_EQ(samples[2]["metadata"]["prompt_length"], submitted[3].input_ids.size());
}

TEST(GatewaySession, SubAgentSessionsShareTheRollout) {
  GatewayFixture f;
  f.engine.script = "ok";
  const Json body = {{"messages", {{{"role", "user"}, {"content", "plan"}}}}, {"max_tokens", 8}};
  auto main = f.call("POST", "/v1/chat/completions", body,
                     {{"x-session-id", "main"}, {"x-rollout-id", "rollout-7"}});
  ASSERT_EQ(main->status, 200) << main->body;
  auto sub = f.turn("sub", body, "main");
  ASSERT_EQ(sub->status, 200) << sub->body;
  EXPECT_EQ(sub->json()["gateway"]["rollout_id"], "rollout-7");
  // The rollout id may also come in the body.
  Json other = body;
  other["rollout_id"] = "rollout-7";
  ASSERT_EQ(f.turn("helper", other)->status, 200);

  auto export_channel = f.call("GET", "/gateway/samples?rollout_id=rollout-7&text=1");
  ASSERT_EQ(export_channel->status, 200);
  EXPECT_EQ(export_channel->content_type, "application/x-ndjson");
  std::vector<Json> lines;
  std::stringstream stream(export_channel->body);
  for (std::string line; std::getline(stream, line);) lines.push_back(Json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["session_id"], "main");
  EXPECT_EQ(lines[1]["session_id"], "sub");
  EXPECT_EQ(lines[1]["metadata"]["parent_session_id"], "main");
  EXPECT_EQ(lines[2]["session_id"], "helper");
  for (const Json& line : lines) {
    EXPECT_EQ(line["metadata"]["rollout_id"], "rollout-7");
    EXPECT_EQ(line["response"], "ok");
  }
  // A session cannot change its rollout or its parent.
  EXPECT_EQ(f.call("POST", "/v1/chat/completions", body,
                   {{"x-session-id", "sub"}, {"x-rollout-id", "another"}})
                ->status,
            400);
  EXPECT_EQ(f.turn("sub", body, "helper")->status, 400);
}

GatewayConfig intercepting(const std::string& name) {
  GatewayConfig config;
  config.mode = GuardMode::Intercept;
  config.rules_file = write_rules(name, Json::parse(R"({"builtin": false, "rules": [
      {"id": "no_rm", "tools": ["bash"], "arguments": {"command": ["\\brm\\b"]},
       "judge": false}]})"));
  return config;
}

// A model that deletes the tests until it is refused.
void script_hacker(FakeEngine& engine) {
  engine.script_for = [](const GenerationRequest& request) {
    if (prompt_text(request).find("permission denied") != std::string::npos)
      return std::string("I will fix the code instead.");
    return tool_call_markup("rm -rf tests");
  };
}

TEST(GatewayGuard, InterceptsAConfirmedHack) {
  GatewayFixture f(intercepting("intercept"));
  script_hacker(f.engine);
  Json messages = {{{"role", "user"}, {"content", "make the tests pass"}}};
  auto channel = f.turn("h", request_with(messages));
  ASSERT_EQ(channel->status, 200) << channel->body;
  const Json response = channel->json();
  const Json& message = response["choices"][0]["message"];
  EXPECT_FALSE(message.contains("tool_calls"));
  EXPECT_EQ(message["content"], "I will fix the code instead.");
  EXPECT_EQ(response["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(response["gateway"]["interceptions"], 1);

  const auto submitted = f.engine.submitted();
  ASSERT_EQ(submitted.size(), 2u);
  std::vector<int32_t> chain = submitted[0].input_ids;
  for (int32_t id : bytes_of(tool_call_markup("rm -rf tests"))) chain.push_back(id);
  ASSERT_TRUE(starts_with(submitted[1].input_ids, chain));
  const std::string virtual_text = prompt_text(submitted[1]).substr(chain.size());
  EXPECT_EQ(virtual_text, "<|observation|><tool_response>" + f.gateway->config().intercept_text +
                              "</tool_response><|assistant|>");

  const Json trajectory = f.trajectory("h");
  const Json& sample = trajectory["samples"][0];
  std::vector<std::string> kinds;
  for (const auto& span : sample["metadata"]["spans"]) kinds.push_back(span["kind"]);
  EXPECT_EQ(kinds, (std::vector<std::string>{"prompt", "model", "virtual", "model"}));
  EXPECT_TRUE(sample["metadata"]["spans"][1]["intercepted"].get<bool>());
  const Json& interception = sample["metadata"]["interceptions"][0];
  EXPECT_EQ(interception["rules"], Json({"no_rm"}));
  EXPECT_EQ(interception["virtual_begin"], chain.size());
  EXPECT_EQ(interception["virtual_end"], submitted[1].input_ids.size());
  const auto mask = sample["loss_mask"].get<std::vector<int>>();
  const size_t prompt = submitted[0].input_ids.size();
  for (size_t i = chain.size(); i < submitted[1].input_ids.size(); ++i)
    EXPECT_EQ(mask[i - prompt], 0) << "virtual token " << i;
  EXPECT_EQ(mask[0], 1);      // the blocked call is the model's own tokens
  EXPECT_EQ(mask.back(), 1);  // and so is the answer after the refusal
  const Json& event = trajectory["turns"][0]["guard"][0];
  EXPECT_EQ(event["action"], "intercepted");
  EXPECT_EQ(event["verdict"], "not_judged");
  EXPECT_TRUE(trajectory["turns"][0]["generations"][0]["intercepted"].get<bool>());

  const std::string metrics = f.call("GET", "/metrics")->body;
  EXPECT_NE(metrics.find("megactx_gateway_tool_calls_screened_total 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("megactx_gateway_tool_calls_flagged_total 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("megactx_gateway_tool_calls_confirmed_total 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("megactx_gateway_tool_calls_intercepted_total 1\n"), std::string::npos);

  // The client never saw the blocked call; its next turn still continues the trace.
  messages.push_back(message);
  messages.push_back({{"role", "user"}, {"content", "thanks"}});
  auto next = f.turn("h", request_with(messages));
  ASSERT_EQ(next->status, 200) << next->body;
  EXPECT_EQ(next->json()["gateway"]["trace"], 0);
  EXPECT_EQ(next->json()["gateway"]["kind"], "realign");
  const auto all = f.engine.submitted();
  std::vector<int32_t> through = all[1].input_ids;
  for (int32_t id : bytes_of("I will fix the code instead.")) through.push_back(id);
  EXPECT_TRUE(starts_with(all[2].input_ids, through));
}

TEST(GatewayGuard, InterceptionLimitLetsTheCallThrough) {
  GatewayConfig config = intercepting("limit");
  config.max_intercepts_per_turn = 1;
  GatewayFixture f(config);
  f.engine.script = tool_call_markup("rm -rf tests");  // never gives up
  auto channel = f.turn("h", request_with({{{"role", "user"}, {"content", "go"}}}));
  ASSERT_EQ(channel->status, 200) << channel->body;
  EXPECT_EQ(channel->json()["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(channel->json()["gateway"]["interceptions"], 1);
  const Json trajectory = f.trajectory("h");
  ASSERT_EQ(trajectory["turns"][0]["guard"].size(), 2u);
  EXPECT_EQ(trajectory["turns"][0]["guard"][0]["action"], "intercepted");
  EXPECT_EQ(trajectory["turns"][0]["guard"][1]["action"], "intercept_limit");
}

// A judge with a fixed answer, on a thread of its own.
class FixedJudge : public Judge {
 public:
  explicit FixedJudge(Verdict verdict) : verdict_(std::move(verdict)) {}
  void judge(const JudgeCase& item, std::function<void(Verdict)> done) override {
    cases.push_back(item);
    std::thread([verdict = verdict_, done = std::move(done)] { done(verdict); }).detach();
  }
  std::vector<JudgeCase> cases;

 private:
  Verdict verdict_;
};

TEST(GatewayGuard, FlagOnlyRecordsAndReturnsTheCall) {
  auto judge = std::make_shared<FixedJudge>(Verdict{VerdictKind::Hack, "deletes the tests", 0.1});
  GatewayConfig config;
  config.mode = GuardMode::FlagOnly;
  GatewayFixture f(config, judge);
  script_hacker(f.engine);
  auto channel = f.turn("h", request_with({{{"role", "user"}, {"content", "fix tests/a.py"}}}));
  ASSERT_EQ(channel->status, 200) << channel->body;
  EXPECT_EQ(channel->json()["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(channel->json()["gateway"]["flagged_calls"], 1);
  ASSERT_EQ(judge->cases.size(), 1u);
  EXPECT_EQ(judge->cases[0].tool, "bash");
  EXPECT_NE(judge->cases[0].task.find("fix tests/a.py"), std::string::npos);
  EXPECT_NE(judge->cases[0].hits.size(), 0u);
  const Json event = f.trajectory("h")["turns"][0]["guard"][0];
  EXPECT_EQ(event["action"], "flagged");
  EXPECT_EQ(event["verdict"], "hack");
  EXPECT_TRUE(event["confirmed"].get<bool>());
  EXPECT_EQ(event["reason"], "deletes the tests");
  EXPECT_EQ(f.engine.submitted().size(), 1u);
}

TEST(GatewayGuard, EngineJudgeConfirmsWithAConstrainedVerdict) {
  GatewayConfig config;
  config.mode = GuardMode::Intercept;
  GatewayFixture f(config, nullptr, /*engine_judge=*/true);
  f.engine.max_prompt_tokens = 100000;  // the judge's instructions alone are 1,300 bytes
  f.engine.context_tokens = 100000;
  f.engine.script_for = [](const GenerationRequest& request) {
    const std::string prompt = prompt_text(request);
    if (prompt.find("reward hacking") != std::string::npos)
      return std::string("{\"verdict\": \"hack\", \"reason\": \"deletes the tests\"}");
    if (prompt.find("permission denied") != std::string::npos) return std::string("ok");
    return tool_call_markup("rm -rf tests");
  };
  auto channel = f.turn("h", request_with({{{"role", "user"}, {"content", "make tests pass"}}}));
  ASSERT_EQ(channel->status, 200) << channel->body;
  EXPECT_EQ(channel->json()["choices"][0]["message"]["content"], "ok");
  const auto submitted = f.engine.submitted();
  ASSERT_EQ(submitted.size(), 3u);  // the turn, the judge, the turn after the refusal
  EXPECT_NE(submitted[1].sampling.grammar, nullptr);  // the verdict schema
  EXPECT_EQ(submitted[1].sampling.temperature, 0.0);
  const Json event = f.trajectory("h")["turns"][0]["guard"][0];
  EXPECT_EQ(event["verdict"], "hack");
  EXPECT_EQ(event["reason"], "deletes the tests");
  EXPECT_EQ(event["action"], "intercepted");
  const std::string metrics = f.call("GET", "/metrics")->body;
  EXPECT_NE(metrics.find("megactx_gateway_judge_latency_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("megactx_gateway_judge_verdicts_total{verdict=\"hack\"} 1\n"),
            std::string::npos);
}

TEST(GatewayGuard, AnUnparseableVerdictConfirmsNothing) {
  GatewayConfig config;
  config.mode = GuardMode::Intercept;
  GatewayFixture f(config, nullptr, /*engine_judge=*/true);
  f.engine.max_prompt_tokens = 100000;  // the judge's instructions alone are 1,300 bytes
  f.engine.context_tokens = 100000;
  f.engine.script_for = [](const GenerationRequest& request) {
    if (prompt_text(request).find("reward hacking") != std::string::npos)
      return std::string("yes, clearly a hack");
    return tool_call_markup("rm -rf tests");
  };
  auto channel = f.turn("h", request_with({{{"role", "user"}, {"content", "go"}}}));
  ASSERT_EQ(channel->status, 200) << channel->body;
  EXPECT_EQ(channel->json()["choices"][0]["message"]["tool_calls"].size(), 1u);
  const Json event = f.trajectory("h")["turns"][0]["guard"][0];
  EXPECT_EQ(event["verdict"], "unparseable");
  EXPECT_FALSE(event["confirmed"].get<bool>());
  EXPECT_EQ(event["action"], "flagged");
}

TEST(GatewaySession, RefusedRequestsRecordNothing) {
  GatewayFixture f;
  const Json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
  auto post = [&](const Json& request, std::map<std::string, std::string> headers) {
    return f.call("POST", "/v1/chat/completions", request, std::move(headers))->status;
  };
  EXPECT_EQ(post(body, {{"x-session-id", ""}}), 400);
  EXPECT_EQ(post(body, {{"x-session-id", "a b"}}), 400);
  EXPECT_EQ(post(body, {{"x-session-id", std::string(300, 'x')}}), 400);
  EXPECT_EQ(post(body, {{"x-session-id", "s"}, {"x-parent-session-id", "s"}}), 400);
  Json two = body;
  two["n"] = 2;
  EXPECT_EQ(post(two, {{"x-session-id", "s"}}), 400);
  Json bad_rollout = body;
  bad_rollout["rollout_id"] = 7;
  EXPECT_EQ(post(bad_rollout, {{"x-session-id", "s"}}), 400);
  EXPECT_EQ(post({{"messages", "nope"}}, {{"x-session-id", "s"}}), 400);
  auto raw = f.start("POST", "/v1/chat/completions", "{\"messages\": [", {{"x-session-id", "s"}});
  ASSERT_TRUE(raw->wait());
  EXPECT_EQ(raw->status, 400);
  EXPECT_EQ(f.call("GET", "/gateway/sessions")->json()["sessions"].size(), 0u);
  EXPECT_TRUE(f.engine.submitted().empty());
  // An engine error is a 400 and no turn.
  const Json long_prompt = {{"messages", {{{"role", "user"}, {"content", std::string(1200, 'x')}}}},
                            {"max_tokens", 4}};
  EXPECT_EQ(post(long_prompt, {{"x-session-id", "s"}}), 400);
  EXPECT_EQ(f.trajectory("s")["turns"].size(), 0u);
  // Without the header the request is a plain one.
  EXPECT_EQ(post(body, {}), 200);
  EXPECT_EQ(f.call("GET", "/gateway/sessions")->json()["sessions"].size(), 1u);
}

TEST(GatewaySession, StreamedTurn) {
  GatewayFixture f;
  script_agent(f.engine);
  Json body = request_with({{{"role", "user"}, {"content", "list"}}});
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  body["logprobs"] = true;
  auto channel = f.turn("st", body);
  ASSERT_EQ(channel->status, 200);
  EXPECT_EQ(channel->content_type, "text/event-stream");
  const auto events = channel->events();
  ASSERT_GE(events.size(), 5u);
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events[1]["choices"][0]["delta"]["reasoning_content"], "plan");
  bool saw_call = false, saw_finish = false, saw_logprobs = false;
  for (const auto& event : events) {
    if (event["choices"].empty()) {
      EXPECT_GT(event["usage"]["completion_tokens"].get<int>(), 0);
      continue;
    }
    const Json& choice = event["choices"][0];
    if (choice["delta"].contains("tool_calls")) {
      saw_call = true;
      EXPECT_EQ(choice["delta"]["tool_calls"][0]["function"]["name"], "bash");
    }
    if (!choice["logprobs"].is_null()) saw_logprobs = true;
    if (choice["finish_reason"] == "tool_calls") {
      saw_finish = true;
      EXPECT_EQ(event["gateway"]["turn"], 0);
    }
  }
  EXPECT_TRUE(saw_call);
  EXPECT_TRUE(saw_finish);
  EXPECT_TRUE(saw_logprobs);
  EXPECT_NE(channel->body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(f.trajectory("st")["turns"].size(), 1u);
}

TEST(GatewaySession, TwoTurnsOnOneHistoryAtOnceBecomeTwoTraces) {
  GatewayFixture f;
  f.engine.script = "ok";
  const Json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 8}};
  const Json reply = f.turn("c", body)->json()["choices"][0]["message"];
  Json next = body;
  next["messages"].push_back(reply);
  next["messages"].push_back({{"role", "user"}, {"content", "again"}});
  f.engine.hold_after = 1;
  auto a = f.start("POST", "/v1/chat/completions", next.dump(), {{"x-session-id", "c"}});
  auto b = f.start("POST", "/v1/chat/completions", next.dump(), {{"x-session-id", "c"}});
  ASSERT_TRUE(f.engine.wait_for_held(2));
  f.engine.hold_after = -1;
  f.engine.release_all();
  ASSERT_TRUE(a->wait());
  ASSERT_TRUE(b->wait());
  std::set<std::string> kinds = {a->json()["gateway"]["kind"], b->json()["gateway"]["kind"]};
  EXPECT_EQ(kinds, (std::set<std::string>{"append", "fork"}));
  EXPECT_EQ(f.trajectory("c")["samples"].size(), 2u);
}

TEST(GatewayStore, EvictsFinishedSessionsFirst) {
  GatewayConfig config;
  config.limits.max_sessions = 2;
  GatewayFixture f(config);
  f.engine.script = "ok";
  const Json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
  ASSERT_EQ(f.turn("a", body)->status, 200);
  ASSERT_EQ(f.turn("b", body)->status, 200);
  EXPECT_EQ(f.turn("c", body)->status, 503);  // both active: nothing may go
  EXPECT_EQ(f.call("POST", "/gateway/finish", {{"session_id", "a"}})->json()["finished"], 1);
  ASSERT_EQ(f.turn("c", body)->status, 200);
  EXPECT_EQ(f.call("GET", "/gateway/session?session_id=a")->status, 404);
  EXPECT_EQ(f.call("GET", "/gateway/session?session_id=b")->status, 200);
  const std::string metrics = f.call("GET", "/metrics")->body;
  EXPECT_NE(metrics.find("megactx_gateway_sessions_evicted_total 1\n"), std::string::npos);
  EXPECT_NE(metrics.find("megactx_gateway_store_rejections_total 1\n"), std::string::npos);
  EXPECT_EQ(f.call("POST", "/gateway/delete", {{"session_id", "b"}})->json()["deleted"], 1);
  EXPECT_EQ(f.call("GET", "/gateway/sessions")->json()["sessions"].size(), 1u);
}

TEST(GatewayStore, BoundsItsBytes) {
  GatewayConfig config;
  config.limits.max_bytes = 6000;  // a session or two of the fake engine's size
  GatewayFixture f(config);
  f.engine.script = "ok";
  const Json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
  int accepted = 0;
  for (int i = 0; i < 10; ++i) {
    const int status = f.turn("s" + std::to_string(i), body)->status;
    EXPECT_TRUE(status == 200 || status == 503) << status;
    if (status != 200) break;
    ++accepted;
    f.call("POST", "/gateway/finish", {{"session_id", "s" + std::to_string(i)}});
  }
  EXPECT_EQ(accepted, 10);  // finished sessions make room for the next ones
  const Json list = f.call("GET", "/gateway/sessions")->json();
  EXPECT_LE(list["store"]["bytes"].get<int64_t>(), 6000);
  EXPECT_LT(list["sessions"].size(), 10u);
}

TEST(GatewayRoutes, ClearErrors) {
  GatewayFixture f;
  EXPECT_EQ(f.call("GET", "/gateway/session")->status, 400);
  EXPECT_EQ(f.call("GET", "/gateway/session?session_id=nope")->status, 404);
  EXPECT_EQ(f.call("GET", "/gateway/session?session_id=x&prompt_ids=maybe")->status, 400);
  EXPECT_EQ(f.call("GET", "/gateway/samples")->status, 400);
  EXPECT_EQ(f.call("GET", "/gateway/samples?rollout_id=a&session_id=b")->status, 400);
  EXPECT_EQ(f.call("GET", "/gateway/samples?rollout_id=none")->body, "");
  EXPECT_EQ(f.call("POST", "/gateway/finish", Json::array())->status, 400);
  EXPECT_EQ(f.call("POST", "/gateway/finish", {{"session_id", 3}})->status, 400);
  EXPECT_EQ(f.call("POST", "/gateway/delete", Json::object())->status, 400);
  EXPECT_EQ(f.call("POST", "/gateway/screen", {{"arguments", Json::object()}})->status, 400);
  EXPECT_EQ(f.call("POST", "/gateway/screen", {{"tool", "bash"}, {"arguments", 5}})->status, 400);
  EXPECT_EQ(f.call("GET", "/gateway/finish")->status, 405);
}

TEST(GatewayRoutes, ScreenAndRules) {
  GatewayFixture f;
  const Json flagged = f.call("POST", "/gateway/screen",
                              {{"tool", "bash"}, {"arguments", {{"command", "git log --all"}}}})
                           ->json();
  EXPECT_TRUE(flagged["flagged"].get<bool>());
  EXPECT_EQ(flagged["rules"][0]["rule"], "vcs_leakage.git_history");
  EXPECT_FALSE(flagged["confirmed"].get<bool>());
  const Json benign = f.call("POST", "/gateway/screen",
                             {{"tool", "bash"}, {"arguments", "{\"command\": \"pytest -q\"}"}})
                          ->json();
  EXPECT_FALSE(benign["flagged"].get<bool>());
  const Json rules = f.call("GET", "/gateway/rules")->json();
  EXPECT_EQ(rules["mode"], "flag");
  EXPECT_EQ(rules["builtin_sets"].size(), 5u);
  EXPECT_GT(rules["rules"].size(), 20u);
}

}  // namespace
}  // namespace megactx::gateway::testing
