// Randomized schedules: many requests with shared prefixes, random lengths,
// chunk sizes, KV budgets, arrivals and aborts. After every step the cache,
// tree and scheduler invariants hold; every request that was not aborted
// returns exactly the reference greedy output; every request gets exactly one
// final update; at the end no page is held by anyone but the prefix cache.
#include <gtest/gtest.h>

#include <random>

#include "engine_harness.h"

namespace megactx::testing {
namespace {

class EngineStress : public ::testing::TestWithParam<int> {};

TEST_P(EngineStress, RandomTrafficKeepsInvariantsAndOutputs) {
  std::mt19937_64 random(static_cast<uint64_t>(GetParam()));
  auto uniform = [&](int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(random);
  };
  FakeModel reference;
  const int64_t pages = uniform(6, 24);
  EngineConfig config = test_config(pages);
  config.max_prefill_tokens = uniform(8, 200);
  config.max_running_requests = uniform(1, 12);
  config.enable_prefix_cache = uniform(0, 4) != 0;
  Harness harness(config);
  // A few shared stems so prefixes collide on whole pages.
  std::vector<std::vector<int32_t>> stems;
  for (int i = 0; i < 3; ++i) stems.push_back(make_prompt(1000 + i + GetParam() * 10, 150));

  struct Expectation {
    std::vector<int32_t> prompt;
    int64_t max_new = 0;
    bool ignore_eos = false;
    bool aborted = false;
  };
  std::map<std::string, Expectation> expected;
  int next = 0;
  const int64_t capacity = pages * 64;
  for (int step = 0; step < 400; ++step) {
    if (next < 40 && uniform(0, 2) == 0) {
      Expectation e;
      const auto& stem = stems[static_cast<size_t>(uniform(0, 2))];
      e.prompt.assign(stem.begin(), stem.begin() + uniform(1, 150));
      const auto tail = make_prompt(static_cast<uint64_t>(5000 + next), uniform(0, 40));
      e.prompt.insert(e.prompt.end(), tail.begin(), tail.end());
      if (static_cast<int64_t>(e.prompt.size()) + 1 > capacity) e.prompt.resize(capacity / 2);
      e.max_new = uniform(0, 3) == 0 ? 0 : uniform(1, 120);
      e.ignore_eos = uniform(0, 1) == 1;
      const std::string rid = "q" + std::to_string(next++);
      GenerationRequest request = greedy_request(rid, e.prompt, e.max_new, e.ignore_eos);
      expected[rid] = e;
      harness.submit(request);
    }
    if (uniform(0, 15) == 0 && next > 0) {
      const std::string rid = "q" + std::to_string(uniform(0, next - 1));
      if (harness.engine->abort(rid)) expected[rid].aborted = true;
    }
    harness.engine->step();
    harness.engine->check_integrity();
  }
  harness.run();
  ASSERT_EQ(harness.results.size(), expected.size());
  for (const auto& [rid, e] : expected) {
    const Collected& c = harness.results[rid];
    EXPECT_FALSE(c.finished_twice) << rid;
    ASSERT_NE(c.finish, FinishReason::None) << rid;
    ASSERT_NE(c.finish, FinishReason::Error) << rid << ": " << c.finish_detail;
    const auto full = reference_greedy(reference, e.prompt, e.max_new, e.ignore_eos);
    if (e.aborted && c.finish == FinishReason::Abort) {
      // What it produced before the abort is a prefix of the full output.
      ASSERT_LE(c.tokens.size(), full.size()) << rid;
      EXPECT_TRUE(std::equal(c.tokens.begin(), c.tokens.end(), full.begin())) << rid;
    } else {
      EXPECT_EQ(c.tokens, full) << rid;
    }
  }
  const EngineStats stats = harness.engine->stats();
  EXPECT_EQ(stats.running_requests + stats.waiting_requests, 0);
  EXPECT_EQ(stats.kv_pages_used, stats.prefix_cache_pages);
  EXPECT_TRUE(harness.engine->flush_cache());
  EXPECT_EQ(harness.engine->stats().kv_pages_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, EngineStress, ::testing::Range(1, 21));

}  // namespace
}  // namespace megactx::testing
