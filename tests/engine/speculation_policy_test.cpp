// SpeculationPolicy on synthetic step timings: the fixed threshold, and the
// measured choice per batch-size bucket (measure both ways, pick the faster,
// run the slower now and then, follow a change).
#include <gtest/gtest.h>

#include "engine/speculation_policy.h"

namespace megactx {
namespace {

// Runs `steps` decisions at `batch`; each chosen way reports its step time and
// tokens. Returns how many steps drafted.
int64_t run(SpeculationPolicy& policy, int64_t batch, int64_t steps, double drafted_seconds,
            int64_t drafted_tokens, double plain_seconds, int64_t plain_tokens) {
  int64_t drafted = 0;
  for (int64_t i = 0; i < steps; ++i) {
    const bool drafts = policy.speculate(batch);
    drafted += drafts;
    policy.record(batch, drafts, drafts ? drafted_seconds : plain_seconds,
                  drafts ? drafted_tokens : plain_tokens);
  }
  return drafted;
}

TEST(SpeculationPolicy, FixedThresholdIsABatchSize) {
  SpeculationPolicy policy(16, false);
  EXPECT_TRUE(policy.speculate(1));
  EXPECT_TRUE(policy.speculate(15));
  EXPECT_FALSE(policy.speculate(16));
  EXPECT_FALSE(policy.speculate(200));
  EXPECT_EQ(policy.off_steps(), 2);
  SpeculationPolicy always(0, false);
  for (int64_t batch : {1, 64, 4096}) EXPECT_TRUE(always.speculate(batch));
}

TEST(SpeculationPolicy, MeasuredChoiceFollowsTheFasterWayPerBucket) {
  SpeculationPolicy policy(0, true);
  // Batch 1: a drafting step takes 1.5x a plain one and emits 3 tokens (2x).
  const int64_t steps = 200;
  const int64_t at_one = run(policy, 1, steps, 0.015, 3, 0.010, 1);
  // Warm-up: 1 + kWarmup of each way; then the faster way, the slower one
  // every kRefreshEvery decisions.
  const int64_t warmup = SpeculationPolicy::kWarmup + 1;
  EXPECT_GE(steps - at_one, warmup);
  EXPECT_LE(steps - at_one, warmup + steps / SpeculationPolicy::kRefreshEvery + 1);
  EXPECT_NEAR(policy.tokens_per_second(1, true), 200.0, 1e-6);
  EXPECT_NEAR(policy.tokens_per_second(1, false), 100.0, 1e-6);
  // Batch 16 (bucket 16-31): verification costs 2x for 1.6x the tokens: plain wins.
  const int64_t at_sixteen = run(policy, 16, steps, 0.020, 26, 0.010, 16);
  EXPECT_GE(at_sixteen, warmup);
  EXPECT_LE(at_sixteen, warmup + steps / SpeculationPolicy::kRefreshEvery + 1);
  // Batches of the same bucket share the choice; batch 1's is untouched.
  int64_t drafted_in_bucket = 0;
  for (int64_t batch : {20, 31, 24}) drafted_in_bucket += policy.speculate(batch);
  EXPECT_LE(drafted_in_bucket, 1);  // at most a refresh step
  EXPECT_GE(run(policy, 1, 10, 0.015, 3, 0.010, 1), 9);
  EXPECT_GT(policy.off_steps(), 0);
}

TEST(SpeculationPolicy, AChangeInAcceptanceTurnsTheChoiceAround) {
  SpeculationPolicy policy(0, true);
  // First drafts are accepted (3 tokens per drafting step), then never (1).
  EXPECT_GT(run(policy, 4, 100, 0.015, 12, 0.010, 4), 80);
  run(policy, 4, 300, 0.015, 4, 0.010, 4);
  // Once the averages have followed, drafting is only the refresh steps.
  EXPECT_LE(run(policy, 4, 100, 0.015, 4, 0.010, 4), 100 / SpeculationPolicy::kRefreshEvery + 1);
}

TEST(SpeculationPolicy, TheThresholdStillCapsTheMeasuredChoice) {
  SpeculationPolicy policy(8, true);
  EXPECT_EQ(run(policy, 8, 50, 0.001, 100, 1.0, 1), 0);  // drafting would win, but batch >= 8
  EXPECT_EQ(policy.off_steps(), 50);
  EXPECT_GT(run(policy, 2, 50, 0.001, 100, 1.0, 1), 40);
}

}  // namespace
}  // namespace megactx
