// The SGLang-compatible native API over a fake engine: /generate (single,
// batch, ids, stream, logprobs, scoring), /abort_request, /flush_cache,
// /health*, /get_model_info, /metrics, and the error statuses.
#include <gtest/gtest.h>

#include <thread>

#include "server_fixture.h"

namespace megactx::server::testing {
namespace {

using nlohmann::json;

TEST(NativeGenerate, TextGivesTextIdsAndMetaInfo) {
  ServerFixture f;
  auto r =
      f.call("POST", "/generate",
             {{"text", "ab"}, {"sampling_params", {{"max_new_tokens", 5}, {"temperature", 0}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = r->json();
  EXPECT_EQ(body["text"], "Hello");
  EXPECT_EQ(body["output_ids"], json({'H', 'e', 'l', 'l', 'o'}));
  const json& meta = body["meta_info"];
  EXPECT_EQ(meta["finish_reason"], json({{"type", "length"}, {"length", 5}}));
  EXPECT_EQ(meta["prompt_tokens"], 3);  // <bos> a b: text is tokenized with special tokens
  EXPECT_EQ(meta["completion_tokens"], 5);
  EXPECT_EQ(meta["cached_tokens"], 0);
  EXPECT_TRUE(meta.contains("spec_verify_ct"));
  EXPECT_TRUE(meta.contains("spec_accept_token_num"));
  EXPECT_TRUE(meta.contains("spec_draft_token_num"));
  EXPECT_TRUE(meta["e2e_latency"].is_number());
  auto submitted = f.engine.submitted();
  ASSERT_EQ(submitted.size(), 1u);
  EXPECT_EQ(submitted[0].input_ids, (std::vector<int32_t>{257, 'a', 'b'}));
  EXPECT_EQ(submitted[0].sampling.temperature, 0.0);
  EXPECT_EQ(meta["id"], submitted[0].rid);
}

TEST(NativeGenerate, StopsOnEosWithMatchedToken) {
  ServerFixture f;
  auto r = f.call("POST", "/generate",
                  {{"input_ids", {1, 2, 3}}, {"sampling_params", {{"max_new_tokens", 100}}}});
  json body = r->json();
  EXPECT_EQ(body["text"], "Hello, world!");
  EXPECT_EQ(body["meta_info"]["finish_reason"], json({{"type", "stop"}, {"matched", 256}}));
}

TEST(NativeGenerate, MapsEverySamplingParam) {
  ServerFixture f;
  json params = {{"max_new_tokens", 3},
                 {"min_new_tokens", 1},
                 {"temperature", 0.7},
                 {"top_p", 0.9},
                 {"top_k", 20},
                 {"min_p", 0.05},
                 {"frequency_penalty", 0.1},
                 {"presence_penalty", 0.2},
                 {"repetition_penalty", 1.1},
                 {"stop", {"x", "yz"}},
                 {"stop_token_ids", {7, 8}},
                 {"ignore_eos", true},
                 {"skip_special_tokens", false},
                 {"no_stop_trim", true},
                 {"sampling_seed", 42}};
  auto r = f.call("POST", "/generate",
                  {{"input_ids", {5, 6}}, {"sampling_params", params}, {"rid", "my-rid"}});
  ASSERT_EQ(r->status, 200) << r->body;
  GenerationRequest request = f.engine.submitted().at(0);
  const SamplingParams& s = request.sampling;
  EXPECT_EQ(request.rid, "my-rid");
  EXPECT_EQ(s.max_new_tokens, 3);
  EXPECT_EQ(s.min_new_tokens, 1);
  EXPECT_DOUBLE_EQ(s.temperature, 0.7);
  EXPECT_DOUBLE_EQ(s.top_p, 0.9);
  EXPECT_EQ(s.top_k, 20);
  EXPECT_DOUBLE_EQ(s.min_p, 0.05);
  EXPECT_DOUBLE_EQ(s.frequency_penalty, 0.1);
  EXPECT_DOUBLE_EQ(s.presence_penalty, 0.2);
  EXPECT_DOUBLE_EQ(s.repetition_penalty, 1.1);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_EQ(s.stop_token_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_FALSE(s.skip_special_tokens);
  EXPECT_TRUE(s.include_stop_str_in_output);
  ASSERT_TRUE(s.seed.has_value());
  EXPECT_EQ(*s.seed, 42u);
  EXPECT_EQ(r->json()["meta_info"]["id"], "my-rid");
}

TEST(NativeGenerate, DefaultMaxNewTokensIs128AndClampedToContext) {
  ServerFixture f;
  f.engine.context_tokens = 50;
  f.call("POST", "/generate", {{"input_ids", {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}});
  EXPECT_EQ(f.engine.submitted().at(0).sampling.max_new_tokens, 40);
  f.engine.context_tokens = 4096;
  f.call("POST", "/generate", {{"input_ids", {1}}});
  EXPECT_EQ(f.engine.submitted().at(1).sampling.max_new_tokens, 128);
}

TEST(NativeGenerate, BatchOfIdsWithPerItemParams) {
  ServerFixture f;
  auto r = f.call("POST", "/generate",
                  {{"input_ids", {{1, 2}, {3, 4, 5}}},
                   {"sampling_params", {{{"max_new_tokens", 2}}, {{"max_new_tokens", 4}}}},
                   {"rid", {"a", "b"}}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = r->json();
  ASSERT_TRUE(body.is_array());
  ASSERT_EQ(body.size(), 2u);
  EXPECT_EQ(body[0]["text"], "He");
  EXPECT_EQ(body[1]["text"], "Hell");
  EXPECT_EQ(body[0]["meta_info"]["id"], "a");
  EXPECT_EQ(body[1]["meta_info"]["prompt_tokens"], 3);
}

TEST(NativeGenerate, LogprobsAsSglangTriples) {
  ServerFixture f;
  auto r = f.call("POST", "/generate",
                  {{"input_ids", {10, 11, 12}},
                   {"return_logprob", true},
                   {"top_logprobs_num", 2},
                   {"logprob_start_len", 0},
                   {"sampling_params", {{"max_new_tokens", 2}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  const json meta = r->json()["meta_info"];
  // Output: [logprob, token_id, null] per generated token.
  EXPECT_EQ(meta["output_token_logprobs"], json::parse("[[-0.5, 72, null], [-0.5, 101, null]]"));
  // Input from position 0: the first prompt token has no logprob.
  EXPECT_EQ(meta["input_token_logprobs"],
            json::parse("[[null, 10, null], [-1.0, 11, null], [-1.0, 12, null]]"));
  ASSERT_EQ(meta["output_top_logprobs"].size(), 2u);
  EXPECT_EQ(meta["output_top_logprobs"][0], json::parse("[[-0.5, 72, null], [-1.5, 73, null]]"));
  EXPECT_TRUE(meta["input_top_logprobs"][0].is_null());
  GenerationRequest request = f.engine.submitted().at(0);
  EXPECT_TRUE(request.return_logprob);
  EXPECT_EQ(request.top_logprobs_num, 2);
  EXPECT_EQ(request.logprob_start_len, 0);
}

TEST(NativeGenerate, ReturnTextInLogprobs) {
  ServerFixture f;
  auto r = f.call("POST", "/generate",
                  {{"input_ids", {1}},
                   {"return_logprob", true},
                   {"return_text_in_logprobs", true},
                   {"sampling_params", {{"max_new_tokens", 1}}}});
  EXPECT_EQ(r->json()["meta_info"]["output_token_logprobs"], json::parse("[[-0.5, 72, \"H\"]]"));
}

TEST(NativeGenerate, ScoringWithZeroNewTokens) {
  ServerFixture f;
  auto r = f.call("POST", "/generate",
                  {{"input_ids", {1, 2, 3, 4}},
                   {"return_logprob", true},
                   {"logprob_start_len", 2},
                   {"sampling_params", {{"max_new_tokens", 0}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  json body = r->json();
  EXPECT_EQ(body["text"], "");
  EXPECT_EQ(body["meta_info"]["completion_tokens"], 0);
  EXPECT_EQ(body["meta_info"]["finish_reason"]["type"], "length");
  EXPECT_EQ(body["meta_info"]["input_token_logprobs"],
            json::parse("[[-1.0, 3, null], [-1.0, 4, null]]"));
}

TEST(NativeGenerate, StreamSendsCumulativeChunksThenDone) {
  ServerFixture f;
  auto r = f.call("POST", "/generate",
                  {{"text", "x"}, {"stream", true}, {"sampling_params", {{"max_new_tokens", 3}}}});
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->content_type, "text/event-stream");
  EXPECT_TRUE(r->ends_with_done());
  auto events = r->events();
  ASSERT_EQ(events.size(), 4u);  // H, He, Hel, then the finish with no new token
  EXPECT_EQ(events[0]["text"], "H");
  EXPECT_EQ(events[1]["text"], "He");
  EXPECT_EQ(events[2]["text"], "Hel");
  EXPECT_EQ(events[2]["output_ids"], json({'H', 'e', 'l'}));
  EXPECT_TRUE(events[0]["meta_info"]["finish_reason"].is_null());
  EXPECT_EQ(events[3]["meta_info"]["finish_reason"]["type"], "length");
}

TEST(NativeGenerate, AbortRequestReturnsWhatWasGenerated) {
  ServerFixture f;
  f.engine.hold_after = 4;
  auto pending = f.start("POST", "/generate", json({{"input_ids", {1}}, {"rid", "r1"}}).dump());
  ASSERT_TRUE(f.engine.wait_for_held(1));
  auto abort = f.call("POST", "/abort_request", {{"rid", "r1"}});
  EXPECT_EQ(abort->status, 200);
  EXPECT_EQ(abort->json()["found"], true);
  ASSERT_TRUE(pending->wait());
  json body = pending->json();
  EXPECT_EQ(pending->status, 200);
  EXPECT_EQ(body["text"], "Hell");
  EXPECT_EQ(body["meta_info"]["finish_reason"]["type"], "abort");
  EXPECT_EQ(body["meta_info"]["completion_tokens"], 4);
}

TEST(NativeGenerate, AbortAll) {
  ServerFixture f;
  f.engine.hold_after = 1;
  auto a = f.start("POST", "/generate", json({{"input_ids", {1}}}).dump());
  auto b = f.start("POST", "/generate", json({{"input_ids", {2}}, {"stream", true}}).dump());
  ASSERT_TRUE(f.engine.wait_for_held(2));
  EXPECT_EQ(f.call("POST", "/abort_request", {{"abort_all", true}})->status, 200);
  ASSERT_TRUE(a->wait());
  ASSERT_TRUE(b->wait());
  EXPECT_EQ(a->json()["meta_info"]["finish_reason"]["type"], "abort");
  EXPECT_TRUE(b->ends_with_done());
  EXPECT_EQ(b->events().back()["meta_info"]["finish_reason"]["type"], "abort");
  EXPECT_EQ(f.call("POST", "/abort_request", {{"rid", "unknown"}})->json()["found"], false);
}

TEST(NativeGenerate, DisconnectAbortsTheEngineRequest) {
  ServerFixture f;
  f.engine.hold_after = 2;
  auto pending = f.start("POST", "/generate",
                         json({{"input_ids", {1}}, {"rid", "gone"}, {"stream", true}}).dump());
  ASSERT_TRUE(f.engine.wait_for_held(1));
  pending->disconnect();
  ASSERT_TRUE(pending->wait());
  EXPECT_EQ(f.engine.aborted(), std::vector<std::string>{"gone"});
}

TEST(NativeGenerate, EngineErrorIs400) {
  ServerFixture f;
  auto r = f.call("POST", "/generate", {{"input_ids", std::vector<int>(1001, 1)}});
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(r->json()["error"]["message"], "prompt too long for the fake engine");
}

TEST(NativeGenerate, InvalidRequestsAre400WithParam) {
  ServerFixture f;
  struct Case {
    json body;
    std::string param;
  } cases[] = {
      {json::object(), "text"},
      {{{"text", "a"}, {"input_ids", {1}}}, "text"},
      {{{"text", 5}}, "text"},
      {{{"input_ids", {1, -2}}}, "input_ids"},
      {{{"input_ids", {1, 999999}}}, "input_ids"},
      {{{"input_ids", json::array()}}, "input_ids"},
      {{{"input_ids", {1}}, {"sampling_params", {{"temperature", "hot"}}}}, "temperature"},
      {{{"input_ids", {1}}, {"sampling_params", {{"top_p", 0}}}}, "top_p"},
      {{{"input_ids", {1}}, {"sampling_params", {{"max_new_tokens", -1}}}}, "max_new_tokens"},
      {{{"input_ids", {1}}, {"sampling_params", {{"regex", "a("}}}}, "regex"},
      {{{"input_ids", {1}}, {"sampling_params", {{"stop", {1}}}}}, "stop"},
      {{{"input_ids", {1}}, {"return_logprob", "yes"}}, "return_logprob"},
      {{{"input_ids", {1}}, {"logprob_start_len", 5}}, "logprob_start_len"},
      {{{"input_ids", {{1}, {2}}}, {"rid", {"same", "same"}}}, "rid"},
      {{{"input_ids", {{1}, {2}}}, {"rid", {"one"}}}, "rid"},
  };
  for (const auto& c : cases) {
    auto r = f.call("POST", "/generate", c.body);
    EXPECT_EQ(r->status, 400) << c.body.dump();
    json error = r->json()["error"];
    EXPECT_EQ(error["type"], "invalid_request_error") << c.body.dump();
    EXPECT_EQ(error["param"], c.param) << c.body.dump() << " -> " << r->body;
    EXPECT_EQ(error["code"], 400);
    EXPECT_FALSE(error["message"].get<std::string>().empty());
  }
  EXPECT_TRUE(f.engine.submitted().empty());
}

TEST(NativeGenerate, ParallelSamplesShareTheirPrompt) {
  ServerFixture f;
  auto r = f.call("POST", "/generate",
                  {{"input_ids", {1, 2, 3}},
                   {"rid", "g"},
                   {"sampling_params", {{"n", 3}, {"max_new_tokens", 2}, {"sampling_seed", 7}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  json results = r->json();
  ASSERT_TRUE(results.is_array());
  ASSERT_EQ(results.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(results[k]["meta_info"]["id"], "g-" + std::to_string(k));
    EXPECT_EQ(results[k]["text"], "He");
  }
  auto submitted = f.engine.submitted();
  ASSERT_EQ(submitted.size(), 3u);
  // The leader goes first; its samples follow its first update, seeds + k.
  EXPECT_EQ(submitted[0].rid, "g-0");
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(submitted[k].input_ids, (std::vector<int32_t>{1, 2, 3}));
    const size_t index = submitted[k].rid.back() - '0';
    EXPECT_EQ(*submitted[k].sampling.seed, 7u + index);
  }
  // A batch of two prompts with n = 2: four results, prompt by prompt.
  auto batch =
      f.call("POST", "/generate", {{"input_ids", {{1}, {2}}}, {"sampling_params", {{"n", 2}}}});
  ASSERT_EQ(batch->status, 200) << batch->body;
  EXPECT_EQ(batch->json().size(), 4u);
  EXPECT_EQ(f.call("POST", "/generate", {{"text", "a"}, {"sampling_params", {{"n", 0}}}})->status,
            400);
}

TEST(NativeGenerate, TeacherScoringFields) {
  ServerFixture f;
  auto r = f.call("POST", "/generate",
                  {{"input_ids", {1, 2, 3}},
                   {"return_logprob", true},
                   {"logprob_start_len", 0},
                   {"token_ids_logprob", {5, 9}},
                   {"temp_scaled_logprobs", true},
                   {"sampling_params", {{"max_new_tokens", 1}, {"temperature", 0.7}}}});
  ASSERT_EQ(r->status, 200) << r->body;
  const GenerationRequest sent = f.engine.submitted().back();
  EXPECT_EQ(sent.token_ids_logprob, (std::vector<int32_t>{5, 9}));
  EXPECT_TRUE(sent.temp_scaled_logprobs);
  json meta = r->json()["meta_info"];
  EXPECT_TRUE(meta.contains("input_token_ids_logprobs"));
  EXPECT_TRUE(meta.contains("output_token_ids_logprobs"));
  // A batch: one list for all prompts, or a list per prompt.
  auto shared =
      f.call("POST", "/generate",
             {{"input_ids", {{1}, {2}}}, {"return_logprob", true}, {"token_ids_logprob", {4}}});
  ASSERT_EQ(shared->status, 200) << shared->body;
  auto submitted = f.engine.submitted();
  EXPECT_EQ(submitted[submitted.size() - 1].token_ids_logprob, (std::vector<int32_t>{4}));
  EXPECT_EQ(submitted[submitted.size() - 2].token_ids_logprob, (std::vector<int32_t>{4}));
  auto each = f.call("POST", "/generate",
                     {{"input_ids", {{1}, {2}}}, {"token_ids_logprob", {{4}, {6, 7}}}});
  ASSERT_EQ(each->status, 200) << each->body;
  submitted = f.engine.submitted();
  EXPECT_EQ(submitted[submitted.size() - 1].token_ids_logprob, (std::vector<int32_t>{6, 7}));
  for (json bad : {json{{"token_ids_logprob", {999999}}}, json{{"token_ids_logprob", "x"}},
                   json{{"temp_scaled_logprobs", 1}}, json{{"return_routed_experts", true}},
                   json{{"return_hidden_states", true}}}) {
    json body = {{"input_ids", {1}}};
    body.update(bad);
    EXPECT_EQ(f.call("POST", "/generate", body)->status, 400) << bad.dump();
  }
}

TEST(NativeGenerate, MalformedJsonIs400) {
  ServerFixture f;
  for (std::string body : {"", "{", "[1,2]", "null", "{\"text\": \"a\",}", "\xff\xfe"}) {
    auto r = f.start("POST", "/generate", body);
    ASSERT_TRUE(r->wait());
    EXPECT_EQ(r->status, 400) << body;
    EXPECT_TRUE(r->json().contains("error"));
  }
}

TEST(NativeGenerate, OverloadedIs503) {
  ServerFixture f;
  f.engine.waiting_requests = 8;
  auto r = f.call("POST", "/generate", {{"input_ids", {1}}});
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->json()["error"]["type"], "server_overloaded");
  EXPECT_TRUE(f.engine.submitted().empty());
}

TEST(NativeAdmin, FlushCache) {
  ServerFixture f;
  EXPECT_EQ(f.call("POST", "/flush_cache")->status, 200);
  f.engine.flush_ok = false;
  EXPECT_EQ(f.call("POST", "/flush_cache")->status, 400);
  EXPECT_EQ(f.engine.flushes.load(), 2);
}

TEST(NativeAdmin, HealthModelInfoServerInfo) {
  ServerFixture f;
  EXPECT_EQ(f.call("GET", "/health")->status, 200);
  EXPECT_EQ(f.call("GET", "/health_generate")->status, 200);
  json info = f.call("GET", "/get_model_info")->json();
  EXPECT_EQ(info["model_path"], "/models/test");
  EXPECT_EQ(info["is_generation"], true);
  EXPECT_EQ(info["model_type"], "glm_moe_dsa");
  json server = f.call("GET", "/get_server_info")->json();
  EXPECT_EQ(server["context_length"], 4096);
  EXPECT_EQ(server["served_model_name"], "test-model");
}

TEST(NativeAdmin, MetricsInPrometheusFormat) {
  ServerFixture f;
  f.call("POST", "/generate", {{"input_ids", {1}}, {"sampling_params", {{"max_new_tokens", 4}}}});
  auto r = f.call("GET", "/metrics");
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->content_type.rfind("text/plain", 0), 0u);
  const std::string& text = r->body;
  for (const char* line : {"# TYPE megactx_time_to_first_token_seconds histogram",
                           "megactx_time_to_first_token_seconds_count 1",
                           "megactx_time_per_output_token_seconds_count 1",
                           "megactx_e2e_request_latency_seconds_count 1",
                           "megactx_e2e_request_latency_seconds_bucket{le=\"+Inf\"} 1",
                           "megactx_generation_tokens_total 4",
                           "megactx_num_running_reqs 1",
                           "megactx_num_waiting_reqs 0",
                           "megactx_kv_pages_used 7",
                           "megactx_kv_pages_total 100",
                           "megactx_prefix_cache_hit_rate 0.4",
                           "megactx_spec_accept_length 4",
                           "megactx_requests_finished_total 1",
                           "megactx_engine_steps_total 12",
                           "megactx_engine_step_tokens_total 300",
                           "megactx_engine_step_seconds_total 1.5",
                           "# TYPE megactx_cuda_graph_replays_total counter",
                           "megactx_cuda_graph_replays_total{graphs=\"target\"} 9",
                           "megactx_cuda_graph_replays_total{graphs=\"mtp\"} 5",
                           "megactx_cuda_graph_eager_steps_total{graphs=\"target\"} 3",
                           "megactx_cuda_graph_failed_captures_total{graphs=\"mtp\"} 0"})
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << line << "\n" << text;
}

TEST(Routing, UnknownPathIs404AndWrongMethodIs405) {
  ServerFixture f;
  auto missing = f.call("GET", "/v2/nothing");
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->json()["error"]["code"], 404);
  auto wrong = f.call("GET", "/generate");
  EXPECT_EQ(wrong->status, 405);
  EXPECT_EQ(wrong->headers["Allow"], "POST");
  EXPECT_EQ(f.call("DELETE", "/v1/models")->status, 405);
}

TEST(Routing, ApiKeyRequiredExceptHealthAndMetrics) {
  ServerFixture f("sekrit");
  auto no_key = f.call("GET", "/v1/models");
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(no_key->json()["error"]["type"], "authentication_error");
  EXPECT_EQ(no_key->headers["WWW-Authenticate"], "Bearer");
  EXPECT_EQ(f.call("GET", "/v1/models", nullptr, {{"authorization", "Bearer wrong!"}})->status,
            401);
  EXPECT_EQ(f.call("GET", "/v1/models", nullptr, {{"authorization", "Bearer sekri"}})->status, 401);
  EXPECT_EQ(f.call("GET", "/v1/models", nullptr, {{"authorization", "sekrit"}})->status, 401);
  EXPECT_EQ(f.call("GET", "/v1/models", nullptr, {{"authorization", "Bearer sekrit"}})->status,
            200);
  EXPECT_EQ(f.call("GET", "/v1/models", nullptr, {{"authorization", "bearer sekrit"}})->status,
            200);
  EXPECT_EQ(f.call("POST", "/generate", {{"input_ids", {1}}})->status, 401);
  EXPECT_EQ(f.call("GET", "/health")->status, 200);
  EXPECT_EQ(f.call("GET", "/metrics")->status, 200);
  EXPECT_TRUE(f.engine.submitted().empty());
}

}  // namespace
}  // namespace megactx::server::testing
