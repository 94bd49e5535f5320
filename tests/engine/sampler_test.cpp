// The CPU sampler's transforms against hand-computed values (vLLM/SGLang
// semantics as documented in engine/sampler.h) and its randomness.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "engine/cpu_sampler.h"

namespace megactx {
namespace {

std::vector<float> log_of(std::vector<double> probs) {
  std::vector<float> logits;
  for (const double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

void expect_probs(const std::vector<float>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(actual[i], 0.0f) << "token " << i << " must be masked exactly";
    } else {
      EXPECT_NEAR(actual[i], expected[i], 1e-6) << "token " << i;
    }
  }
}

SamplingParams params(double temperature = 1.0) {
  SamplingParams p;
  p.temperature = temperature;
  return p;
}

TEST(Sampler, TemperatureScalesTheSoftmax) {
  SamplingParams p = params(2.0);
  const std::vector<float> logits = {0.0f, 2.0f, 4.0f};
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  expect_probs(sampling_distribution(p, logits), {1 / z, std::exp(1.0) / z, std::exp(2.0) / z});
}

TEST(Sampler, TopKKeepsExactlyKTokensAndRenormalizes) {
  SamplingParams p = params();
  p.top_k = 2;
  const std::vector<float> logits = {1, 2, 3, 4, 5};
  const double z = std::exp(4.0) + std::exp(5.0);
  expect_probs(sampling_distribution(p, logits), {0, 0, 0, std::exp(4.0) / z, std::exp(5.0) / z});
  // Ties: the lower id wins the last place.
  p.top_k = 1 + 1;
  expect_probs(sampling_distribution(p, std::vector<float>{3, 3, 3}), {0.5, 0.5, 0});
}

TEST(Sampler, TopPKeepsTokensWhileTheMassBeforeThemIsWithinP) {
  SamplingParams p = params();
  p.top_p = 0.7;  // 0.5 (mass before 0), 0.3 (before 0.5); 0.15 has 0.8 before it
  expect_probs(sampling_distribution(p, log_of({0.15, 0.5, 0.05, 0.3})),
               {0, 0.5 / 0.8, 0, 0.3 / 0.8});
  p.top_p = 0.4;  // only the best token
  expect_probs(sampling_distribution(p, log_of({0.15, 0.5, 0.05, 0.3})), {0, 1, 0, 0});
}

// top-p over a whole vocabulary, as the sampler defines it: every token in
// (probability desc, id asc) order, kept while the mass before it is at most
// top_p, from one full sort (what sampling_distribution computes from a
// partial one).
std::vector<float> top_p_by_full_sort(std::vector<float> probs, double top_p) {
  std::vector<int32_t> order(probs.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
  });
  double before = 0.0;
  for (const int32_t id : order) {
    if (before > top_p) {
      probs[id] = 0.0f;
    } else {
      before += probs[id];
    }
  }
  const auto scale = static_cast<float>(1.0 / before);
  for (float& p : probs) p *= scale;
  return probs;
}

TEST(Sampler, TopPOverALargeVocabularyEqualsAFullSortBitForBit) {
  // Peaked, flat and tied rows of 8K and 150K tokens: the kept prefix ends
  // inside the first 256 candidates, after several rounds of widening, or
  // at the very end (top-p 0.9999 of a flat row).
  std::mt19937 rng(7);
  for (const size_t vocab : {size_t{8192}, size_t{151552}}) {
    for (const double spread : {8.0, 1.0, 0.05}) {
      std::normal_distribution<float> normal(0.0f, static_cast<float>(spread));
      std::vector<float> logits(vocab);
      for (float& x : logits) x = normal(rng);
      for (size_t i = 0; i < vocab; i += 7) logits[i] = logits[0];  // ties across the cut
      for (const double top_p : {0.1, 0.5, 0.95, 0.9999}) {
        SamplingParams p = params();
        p.top_p = top_p;
        SamplingParams plain = params();
        const std::vector<float> expected =
            top_p_by_full_sort(sampling_distribution(plain, logits), top_p);
        const std::vector<float> actual = sampling_distribution(p, logits);
        ASSERT_EQ(actual.size(), expected.size());
        for (size_t i = 0; i < vocab; ++i)
          ASSERT_EQ(actual[i], expected[i])
              << "vocab " << vocab << " spread " << spread << " top_p " << top_p << " token " << i;
      }
    }
  }
}

TEST(Sampler, MinPIsRelativeToTheBestToken) {
  SamplingParams p = params();
  p.min_p = 0.2;  // threshold 0.1
  expect_probs(sampling_distribution(p, log_of({0.5, 0.3, 0.15, 0.05})),
               {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
}

TEST(Sampler, TopKThenTopPThenMinP) {
  SamplingParams p = params();
  p.top_k = 3;    // [0.4 0.3 0.2] -> [4/9 3/9 2/9]
  p.top_p = 0.6;  // keeps 4/9 and 3/9 (4/9 before it)
  expect_probs(sampling_distribution(p, log_of({0.1, 0.2, 0.3, 0.4})), {0, 0, 3 / 7.0, 4 / 7.0});
  p.min_p = 0.8;  // 3/7 < 0.8 * 4/7
  expect_probs(sampling_distribution(p, log_of({0.1, 0.2, 0.3, 0.4})), {0, 0, 0, 1});
}

TEST(Sampler, PenaltiesMatchHandComputedValues) {
  SamplingParams p = params();
  p.repetition_penalty = 2.0;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  std::unordered_map<int32_t, int32_t> counts = {{1, 2}, {3, 1}};
  std::vector<int32_t> prompt = {0, 3};
  SamplingRow row;
  row.params = &p;
  row.output_counts = &counts;
  row.prompt_tokens = prompt;
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  apply_penalties(row, logits);
  // 0: prompt, positive -> 2/2. 1: output x2, negative -> -1*2 - (0.5*2 + 0.25).
  // 2: untouched. 3: prompt and output once -> 3/2 - (0.5 + 0.25). 4: untouched.
  EXPECT_FLOAT_EQ(logits[0], 1.0f);
  EXPECT_FLOAT_EQ(logits[1], -3.25f);
  EXPECT_FLOAT_EQ(logits[2], 0.5f);
  EXPECT_FLOAT_EQ(logits[3], 0.75f);
  EXPECT_FLOAT_EQ(logits[4], 1.0f);
}

TEST(Sampler, LogitBiasIsAddedBeforeThePenalties) {
  SamplingParams p = params();
  p.logit_bias = {{1, 4.0f}, {2, -100.0f}};
  p.repetition_penalty = 2.0;
  std::unordered_map<int32_t, int32_t> counts = {{1, 1}};
  SamplingRow row;
  row.params = &p;
  row.output_counts = &counts;
  std::vector<float> logits = {0.5f, -1.0f, 3.0f};
  apply_penalties(row, logits);
  EXPECT_FLOAT_EQ(logits[0], 0.5f);
  EXPECT_FLOAT_EQ(logits[1], 1.5f);  // (-1 + 4) / 2: biased first, then penalized
  EXPECT_FLOAT_EQ(logits[2], -97.0f);
}

TEST(Sampler, LogitBiasSteersGreedyAndSampledDrawsButNotLogprobs) {
  Tensor logits = Tensor::zeros({1, 3});
  logits.data<float>()[0] = 2.0f;  // the unbiased argmax
  CpuSampler sampler;
  SamplingParams greedy = params(0.0);
  greedy.logit_bias = {{2, 5.0f}};
  SamplingRow row;
  row.params = &greedy;
  row.want_logprob = true;
  std::vector<SampleResult> results(1);
  sampler.sample(logits, {&row, 1}, results);
  EXPECT_EQ(results[0].token, 2);
  const double z = std::exp(2.0) + 2.0;
  EXPECT_NEAR(results[0].logprob, -std::log(z), 1e-5);  // of the model's own logits
  // -100 on every token but one: every seeded draw takes that one.
  SamplingParams sampled = params(1.0);
  sampled.logit_bias = {{0, -100.0f}, {2, -100.0f}};
  row.params = &sampled;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    row.seed = seed;
    sampler.sample(logits, {&row, 1}, results);
    EXPECT_EQ(results[0].token, 1) << "seed " << seed;
  }
}

TEST(Sampler, TokenIdsAndTemperatureScaledLogprobs) {
  const std::vector<float> raw = {1.0f, 2.0f, 0.5f, -1.0f};
  Tensor logits = Tensor::zeros({1, 4});
  std::copy(raw.begin(), raw.end(), logits.data<float>());
  const std::vector<int32_t> asked = {3, 0};
  auto log_softmax_at = [&](double temperature, int32_t id) {
    double z = 0;
    for (const float x : raw) z += std::exp(x / temperature);
    return raw[static_cast<size_t>(id)] / temperature - std::log(z);
  };
  CpuSampler sampler;
  for (const double t : {1.0, 0.5, 2.0}) {
    SamplingParams p = params(0.0);
    SamplingRow row;
    row.params = &p;
    row.want_logprob = true;
    row.logprob_token_ids = asked;
    row.logprob_temperature = t;
    std::vector<SampleResult> results(1);
    sampler.sample(logits, {&row, 1}, results);
    EXPECT_EQ(results[0].token, 1);
    EXPECT_NEAR(results[0].logprob, log_softmax_at(t, 1), 1e-5) << t;
    ASSERT_EQ(results[0].token_ids.size(), 2u);
    EXPECT_EQ(results[0].token_ids[0].first, 3);
    EXPECT_NEAR(results[0].token_ids[0].second, log_softmax_at(t, 3), 1e-5) << t;
    EXPECT_NEAR(results[0].token_ids[1].second, log_softmax_at(t, 0), 1e-5) << t;
    // Scoring gives the same numbers.
    LogprobQuery query{0, 2, 0, asked, t};
    std::vector<TokenLogprob> scored(1);
    sampler.score(logits, {&query, 1}, scored);
    EXPECT_NEAR(scored[0].logprob, log_softmax_at(t, 2), 1e-5);
    EXPECT_EQ(scored[0].token_ids, results[0].token_ids);
  }
}

TEST(Sampler, MaskedTokensCannotBeSampled) {
  SamplingParams p = params(0.0);
  std::vector<int32_t> masked = {2};
  SamplingRow row;
  row.params = &p;
  row.masked_tokens = masked;
  Tensor logits = Tensor::zeros({1, 3});
  logits.data<float>()[2] = 10.0f;
  logits.data<float>()[1] = 1.0f;
  CpuSampler sampler;
  std::vector<SampleResult> results(1);
  sampler.sample(logits, {&row, 1}, results);
  EXPECT_EQ(results[0].token, 1);
}

TEST(Sampler, AGrammarMaskLeavesOnlyItsTokensAndRenormalizesOverThem) {
  // 40 logits (two mask words); the mask allows ids 1, 3 and 33.
  const int64_t vocab = 40;
  std::vector<uint32_t> allowed = {(1u << 1) | (1u << 3), 1u << 1};
  Tensor logits = Tensor::zeros({1, vocab});
  float* x = logits.data<float>();
  x[0] = 9.0f;  // the unmasked argmax, left out
  x[1] = std::log(0.2f);
  x[3] = std::log(0.5f);
  x[33] = std::log(0.3f);
  SamplingParams greedy = params(0.0);
  SamplingRow row;
  row.params = &greedy;
  row.allowed = allowed;
  row.want_logprob = true;
  CpuSampler sampler;
  std::vector<SampleResult> results(1);
  sampler.sample(logits, {&row, 1}, results);
  EXPECT_EQ(results[0].token, 3);
  double z = 0;
  for (int64_t i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(x[i]));
  EXPECT_NEAR(results[0].logprob, std::log(0.5) - std::log(z), 1e-5);  // unmodified logits
  // The masked distribution: the allowed tokens' probabilities renormalised.
  std::vector<float> masked(x, x + vocab);
  apply_token_mask(allowed, masked);
  std::vector<double> expected(static_cast<size_t>(vocab), 0.0);
  expected[1] = 0.2;
  expected[3] = 0.5;
  expected[33] = 0.3;
  expect_probs(sampling_distribution(params(1.0), masked), expected);
  // Draws follow it (seeded, so the test is deterministic).
  SamplingParams sampled = params(1.0);
  row.params = &sampled;
  std::map<int32_t, int> counts;
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    row.seed = seed;
    sampler.sample(logits, {&row, 1}, results);
    ++counts[results[0].token];
  }
  EXPECT_EQ(counts.size(), 3u);
  EXPECT_NEAR(counts[3] / 3000.0, 0.5, 0.05);
  EXPECT_NEAR(counts[33] / 3000.0, 0.3, 0.05);
}

TEST(Sampler, GreedyTakesTheLowestIdOnTies) {
  SamplingParams p = params(0.0);
  SamplingRow row;
  row.params = &p;
  Tensor logits = Tensor::zeros({1, 4});
  logits.data<float>()[1] = 5.0f;
  logits.data<float>()[3] = 5.0f;
  CpuSampler sampler;
  std::vector<SampleResult> results(1);
  sampler.sample(logits, {&row, 1}, results);
  EXPECT_EQ(results[0].token, 1);
}

TEST(Sampler, LogprobsComeFromTheUnmodifiedDistribution) {
  SamplingParams p = params(0.5);
  p.top_k = 2;
  p.repetition_penalty = 1.5;
  std::unordered_map<int32_t, int32_t> counts = {{0, 1}};
  SamplingRow row;
  row.params = &p;
  row.output_counts = &counts;
  row.want_logprob = true;
  row.top_logprobs = 3;
  row.seed = 5;
  const std::vector<float> raw = {1.0f, 2.0f, 0.5f, -1.0f};
  Tensor logits = Tensor::zeros({1, 4});
  std::copy(raw.begin(), raw.end(), logits.data<float>());
  CpuSampler sampler;
  std::vector<SampleResult> results(1);
  sampler.sample(logits, {&row, 1}, results);
  double z = 0;
  for (const float x : raw) z += std::exp(x);
  const auto expected = [&](int32_t id) { return raw[static_cast<size_t>(id)] - std::log(z); };
  EXPECT_NEAR(results[0].logprob, expected(results[0].token), 1e-5);
  ASSERT_EQ(results[0].top.size(), 3u);
  EXPECT_EQ(results[0].top[0].first, 1);
  EXPECT_EQ(results[0].top[1].first, 0);
  EXPECT_EQ(results[0].top[2].first, 2);
  EXPECT_NEAR(results[0].top[0].second, expected(1), 1e-5);
}

TEST(Sampler, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  SamplingParams p = params();
  const std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  const std::vector<float> raw = log_of(probs);
  Tensor logits = Tensor::zeros({2, 4});
  std::copy(raw.begin(), raw.end(), logits.data<float>());
  std::copy(raw.begin(), raw.end(), logits.data<float>() + 4);
  CpuSampler sampler;
  std::map<int32_t, int> counts;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) {
    SamplingRow rows[2];
    rows[0].params = rows[1].params = &p;
    rows[0].seed = 42;
    rows[0].draw_index = static_cast<uint64_t>(i);
    rows[0].logits_row = 0;
    rows[1] = rows[0];  // same seed and index in another row of the batch
    rows[1].logits_row = 1;
    std::vector<SampleResult> results(2);
    sampler.sample(logits, rows, results);
    EXPECT_EQ(results[0].token, results[1].token);
    ++counts[results[0].token];
  }
  // Chi-square with 3 degrees of freedom; fixed seeds make the outcome
  // deterministic, 16.27 is the 0.999 quantile for a fair sampler.
  double chi2 = 0;
  for (int id = 0; id < 4; ++id) {
    const double expected = draws * probs[static_cast<size_t>(id)];
    chi2 += (counts[id] - expected) * (counts[id] - expected) / expected;
  }
  EXPECT_LT(chi2, 16.27);
  EXPECT_NE(sampling_uniform(1, 0), sampling_uniform(2, 0));
  EXPECT_EQ(sampling_uniform(7, 3), sampling_uniform(7, 3));
}

TEST(Sampler, ABigBatchOnThreadsGivesTheSameTokensAsRowByRow) {
  const int64_t rows = 64, vocab = 8192;  // over the threshold for threads
  Tensor logits = Tensor::empty({rows, vocab});
  uint64_t state = 1;
  for (int64_t i = 0; i < rows * vocab; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    logits.data<float>()[i] = static_cast<float>(state >> 40) * 1e-6f;
  }
  std::vector<SamplingParams> params(static_cast<size_t>(rows));
  std::vector<SamplingRow> batch(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    SamplingParams& p = params[static_cast<size_t>(r)];
    p.temperature = r % 3 == 0 ? 0.0 : 0.7;
    p.top_p = r % 2 == 0 ? 0.9 : 1.0;
    p.top_k = r % 5 == 0 ? 50 : -1;
    SamplingRow& row = batch[static_cast<size_t>(r)];
    row.params = &p;
    row.logits_row = rows - 1 - r;  // rows in any order
    row.seed = static_cast<uint64_t>(r) * 7;
    row.want_logprob = true;
  }
  CpuSampler sampler;
  std::vector<SampleResult> together(static_cast<size_t>(rows));
  sampler.sample(logits, batch, together);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<SampleResult> alone(1);
    sampler.sample(logits, {&batch[static_cast<size_t>(r)], 1}, alone);
    EXPECT_EQ(alone[0].token, together[static_cast<size_t>(r)].token) << r;
    EXPECT_EQ(alone[0].logprob, together[static_cast<size_t>(r)].logprob) << r;
  }
}

}  // namespace
}  // namespace megactx
