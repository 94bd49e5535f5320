// The engine over a deterministic fake model: greedy output equals a plain
// (unpaged) reference in every scheduling situation — batching, chunked
// prefill, prefix-cache hits, preemption under a tiny KV budget — with the
// cache/scheduler invariants checked after every step.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "engine_harness.h"

namespace megactx::testing {
namespace {

TEST(Engine, GreedyBatchMatchesReference) {
  FakeModel reference;
  Harness harness;
  const std::vector<int64_t> lengths = {1, 2, 63, 64, 65, 130, 200};
  for (size_t i = 0; i < lengths.size(); ++i) {
    harness.submit(greedy_request("r" + std::to_string(i), make_prompt(i, lengths[i]), 70));
  }
  harness.run();
  for (size_t i = 0; i < lengths.size(); ++i) {
    const Collected& c = harness.results["r" + std::to_string(i)];
    const auto expected = reference_greedy(reference, make_prompt(i, lengths[i]), 70);
    EXPECT_EQ(c.tokens, expected) << "prompt length " << lengths[i];
    const bool hit_eos = !expected.empty() && expected.back() == 31;
    EXPECT_EQ(c.finish, hit_eos ? FinishReason::Stop : FinishReason::Length);
    EXPECT_EQ(c.prompt_tokens, lengths[i]);
    EXPECT_EQ(c.completion_tokens, static_cast<int64_t>(expected.size()));
    EXPECT_FALSE(c.finished_twice);
  }
  EXPECT_EQ(harness.engine->stats().running_requests, 0);
}

TEST(Engine, ChunkedPrefillGivesTheSameOutput) {
  FakeModel reference;
  EngineConfig config = test_config();
  config.max_prefill_tokens = 16;  // a 300-token prompt takes 19 steps to prefill
  auto model = std::make_unique<FakeModel>();
  FakeModel* raw = model.get();
  Harness harness(config, std::move(model));
  harness.submit(greedy_request("long", make_prompt(7, 300), 20));
  harness.submit(greedy_request("short", make_prompt(8, 5), 20));
  harness.run();
  EXPECT_EQ(harness.results["long"].tokens, reference_greedy(reference, make_prompt(7, 300), 20));
  EXPECT_EQ(harness.results["short"].tokens, reference_greedy(reference, make_prompt(8, 5), 20));
  EXPECT_GE(raw->forward_calls(), 300 / 16);
  // /metrics' step counters: a step per forward, and the tokens the model saw.
  const EngineStats stats = harness.engine->stats();
  EXPECT_EQ(stats.steps, raw->forward_calls());
  EXPECT_EQ(stats.step_tokens, raw->tokens_processed());
  EXPECT_GE(stats.step_tokens, 300 + 5);
  EXPECT_GT(stats.step_microseconds, 0);
}

TEST(Engine, PrefixCacheHitGivesIdenticalOutput) {
  FakeModel reference;
  auto shared = make_prompt(3, 150);
  auto second = shared;
  second.resize(140);
  for (int i = 0; i < 30; ++i) second.push_back(static_cast<int32_t>(i % 7));
  Harness harness;
  harness.submit(greedy_request("first", shared, 40));
  harness.run();
  harness.submit(greedy_request("second", second, 40));
  harness.run();
  const Collected& hit = harness.results["second"];
  EXPECT_EQ(hit.cached_tokens, 128);  // two full pages of the shared 140 tokens
  EXPECT_EQ(hit.tokens, reference_greedy(reference, second, 40));
  EXPECT_EQ(harness.results["first"].cached_tokens, 0);
  EngineStats stats = harness.engine->stats();
  EXPECT_EQ(stats.prefix_cache_hits, 128);
  EXPECT_GT(stats.kv_pages_used, 0);  // cached pages stay
  // The same prompt again: everything but the last partial page is reused.
  harness.submit(greedy_request("again", shared, 40));
  harness.run();
  EXPECT_EQ(harness.results["again"].cached_tokens, 128);
  EXPECT_EQ(harness.results["again"].tokens, harness.results["first"].tokens);
  EXPECT_TRUE(harness.engine->flush_cache());
  EXPECT_EQ(harness.engine->stats().kv_pages_used, 0);
}

TEST(Engine, ConcurrentRequestsShareAPrefixWhileRunning) {
  FakeModel reference;
  auto prompt = make_prompt(11, 200);
  Harness harness;
  harness.submit(greedy_request("a", prompt, 100));
  harness.engine->step();  // a is prefilled; its 3 full pages are in the tree
  harness.submit(greedy_request("b", prompt, 100));
  harness.run();
  EXPECT_EQ(harness.results["b"].cached_tokens, 192);
  EXPECT_EQ(harness.results["a"].tokens, reference_greedy(reference, prompt, 100));
  EXPECT_EQ(harness.results["b"].tokens, harness.results["a"].tokens);
}

TEST(Engine, PreemptionUnderATinyKvBudgetKeepsGreedyOutput) {
  FakeModel reference;
  EngineConfig config = test_config(/*pages=*/6);  // 384 tokens for 8 x ~150
  config.max_prefill_tokens = 64;
  auto model = std::make_unique<FakeModel>(32, /*peak=*/4.0f);
  Harness harness(config, std::move(model));
  for (int i = 0; i < 8; ++i) {
    harness.submit(
        greedy_request("r" + std::to_string(i), make_prompt(100 + i, 40 + 3 * i), 110, true));
  }
  harness.run();
  EXPECT_GT(harness.engine->num_preemptions(), 0);
  for (int i = 0; i < 8; ++i) {
    const Collected& c = harness.results["r" + std::to_string(i)];
    EXPECT_EQ(c.tokens, reference_greedy(reference, make_prompt(100 + i, 40 + 3 * i), 110, true))
        << i;
    EXPECT_EQ(c.finish, FinishReason::Length);
    EXPECT_NE(c.finish, FinishReason::Error) << c.finish_detail;
  }
}

TEST(Engine, PreemptionWithoutPrefixCache) {
  FakeModel reference;
  EngineConfig config = test_config(/*pages=*/5);
  config.enable_prefix_cache = false;
  Harness harness(config);
  for (int i = 0; i < 6; ++i) {
    harness.submit(greedy_request("r" + std::to_string(i), make_prompt(200 + i, 70), 90, true));
  }
  harness.run();
  EXPECT_GT(harness.engine->num_preemptions(), 0);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(harness.results["r" + std::to_string(i)].tokens,
              reference_greedy(reference, make_prompt(200 + i, 70), 90, true));
  }
  EXPECT_EQ(harness.engine->stats().kv_pages_used, 0);
}

TEST(Engine, AbortFreesPagesAtOnce) {
  EngineConfig config = test_config();
  config.enable_prefix_cache = false;
  Harness harness(config);
  harness.submit(greedy_request("victim", make_prompt(5, 100), 1000));
  GenerationRequest keep = greedy_request("keep", make_prompt(6, 10), 1000);
  keep.sampling.ignore_eos = true;
  harness.submit(keep);
  for (int i = 0; i < 5; ++i) harness.engine->step();
  const int64_t before = harness.engine->stats().kv_pages_used;
  EXPECT_FALSE(harness.engine->abort("nobody"));
  EXPECT_TRUE(harness.engine->abort("victim"));
  harness.engine->step();
  harness.engine->check_integrity();
  const Collected& victim = harness.results["victim"];
  EXPECT_EQ(victim.finish, FinishReason::Abort);
  EXPECT_EQ(victim.completion_tokens, static_cast<int64_t>(victim.tokens.size()));
  EXPECT_GE(victim.tokens.size(), 4u);
  EXPECT_EQ(harness.engine->stats().kv_pages_used, before - 2);  // 100 + 5 tokens = 2 pages
  EXPECT_FALSE(harness.engine->abort("victim"));                 // already finished
  EXPECT_FALSE(harness.engine->flush_cache());                   // "keep" still runs
  harness.engine->abort_all();
  harness.run();
  EXPECT_EQ(harness.results["keep"].finish, FinishReason::Abort);
  EXPECT_EQ(harness.engine->stats().kv_pages_used, 0);
  EXPECT_TRUE(harness.engine->flush_cache());
}

TEST(Engine, AbortOfAWaitingRequest) {
  EngineConfig config = test_config();
  config.max_running_requests = 1;
  Harness harness(config);
  harness.submit(greedy_request("running", make_prompt(1, 10), 5));
  harness.submit(greedy_request("queued", make_prompt(2, 10), 5));
  harness.engine->step();
  EXPECT_EQ(harness.engine->stats().waiting_requests, 1);
  EXPECT_TRUE(harness.engine->abort("queued"));
  harness.run();
  EXPECT_EQ(harness.results["queued"].finish, FinishReason::Abort);
  EXPECT_TRUE(harness.results["queued"].tokens.empty());
  EXPECT_NE(harness.results["running"].finish, FinishReason::Abort);
}

TEST(Engine, InvalidRequestsFailBeforeAnyWork) {
  EngineConfig config = test_config(/*pages=*/4);  // 256 tokens of KV
  config.context_length = 200;
  auto model = std::make_unique<FakeModel>();
  FakeModel* raw = model.get();
  Harness harness(config, std::move(model));
  auto expect_error = [&](GenerationRequest request, const std::string& words) {
    const std::string rid = request.rid;
    harness.submit(std::move(request));
    const Collected& c = harness.results[rid];
    EXPECT_EQ(c.finish, FinishReason::Error) << rid;
    EXPECT_FALSE(c.server_error) << rid << ": the request's error, not the server's";
    EXPECT_NE(c.finish_detail.find(words), std::string::npos) << c.finish_detail;
  };
  expect_error(greedy_request("empty", {}, 5), "empty");
  expect_error(greedy_request("long", make_prompt(1, 201), 5), "context length");
  expect_error(greedy_request("full", make_prompt(1, 200), 5), "context length");
  expect_error(greedy_request("vocab", {1, 2, 32}, 5), "vocabulary");
  expect_error(greedy_request("negative", {1, -1}, 5), "vocabulary");
  GenerationRequest bad = greedy_request("temperature", {1}, 5);
  bad.sampling.temperature = -1;
  expect_error(bad, "temperature");
  bad = greedy_request("top_p", {1}, 5);
  bad.sampling.top_p = 0;
  expect_error(bad, "top_p");
  bad = greedy_request("top_k", {1}, 5);
  bad.sampling.top_k = -2;
  expect_error(bad, "top_k");
  bad = greedy_request("min_new", {1}, 5);
  bad.sampling.min_new_tokens = 6;
  expect_error(bad, "min_new_tokens");
  bad = greedy_request("start", {1, 2}, 5);
  bad.logprob_start_len = 2;
  expect_error(bad, "logprob_start_len");
  harness.submit(greedy_request("dup", {1}, 50, /*ignore_eos=*/true));
  expect_error(greedy_request("dup", {1}, 5), "already in use");
  harness.run();
  EXPECT_EQ(harness.results["dup"].finish, FinishReason::Length);
  EXPECT_EQ(raw->tokens_processed(), 50);  // only "dup" ran

  // Over the KV capacity but within the context.
  EngineConfig small = test_config(/*pages=*/2);
  Harness tiny(small);
  tiny.submit(greedy_request("kv", make_prompt(1, 129), 5));
  EXPECT_EQ(tiny.results["kv"].finish, FinishReason::Error);
  EXPECT_NE(tiny.results["kv"].finish_detail.find("KV cache capacity"), std::string::npos);
}

TEST(Engine, AFailedStepIsTheServersErrorAndTheEngineGoesOn) {
  auto model = std::make_unique<FakeModel>();
  FakeModel* raw = model.get();
  Harness harness(test_config(/*pages=*/8), std::move(model));
  raw->fail_next_forwards(1);
  harness.submit(greedy_request("failed", make_prompt(1, 10), 5));
  harness.run();
  EXPECT_EQ(harness.results["failed"].finish, FinishReason::Error);
  EXPECT_TRUE(harness.results["failed"].server_error);
  EXPECT_NE(harness.results["failed"].finish_detail.find("injected"), std::string::npos);
  harness.submit(greedy_request("after", make_prompt(2, 10), 5, /*ignore_eos=*/true));
  harness.run();
  EXPECT_EQ(harness.results["after"].finish, FinishReason::Length);
  EXPECT_FALSE(harness.results["after"].server_error);
}

TEST(Engine, GenerationStopsAtTheContextLength) {
  EngineConfig config = test_config();
  config.context_length = 100;
  Harness harness(config);
  GenerationRequest request = greedy_request("r", make_prompt(4, 90), 50);
  request.sampling.ignore_eos = true;
  harness.submit(request);
  harness.run();
  EXPECT_EQ(harness.results["r"].finish, FinishReason::Length);
  EXPECT_EQ(harness.results["r"].tokens.size(), 10u);
  EXPECT_EQ(harness.engine->max_context_tokens(), 100);
}

TEST(Engine, EngineThreadServesConcurrentSubmitters) {
  FakeModel reference;
  EngineConfig config = test_config();
  config.run_thread = true;
  GenerationDefaults defaults;
  defaults.eos_token_ids = {31};
  auto engine = Engine::create(config, std::make_unique<FakeModel>(),
                               std::make_shared<FakeTokenizer>(), defaults);
  std::mutex mutex;
  std::condition_variable done;
  std::map<std::string, std::vector<int32_t>> outputs;
  int finished = 0;
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        const std::string rid = "t" + std::to_string(t) + "-" + std::to_string(i);
        engine->submit(greedy_request(rid, make_prompt(t * 10 + i, 20 + i * 30), 30),
                       [&, rid](const RequestUpdate& update) {
                         std::lock_guard lock(mutex);
                         auto& out = outputs[rid];
                         out.insert(out.end(), update.new_token_ids.begin(),
                                    update.new_token_ids.end());
                         if (update.finish != FinishReason::None) {
                           ++finished;
                           done.notify_all();
                         }
                       });
      }
    });
  }
  for (auto& client : clients) client.join();
  std::unique_lock lock(mutex);
  done.wait(lock, [&] { return finished == 20; });
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(outputs["t" + std::to_string(t) + "-" + std::to_string(i)],
                reference_greedy(reference, make_prompt(t * 10 + i, 20 + i * 30), 30));
    }
  }
  lock.unlock();
  engine->check_integrity();
}

}  // namespace
}  // namespace megactx::testing
