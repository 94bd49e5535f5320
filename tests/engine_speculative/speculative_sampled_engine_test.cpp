// Sampled requests under MTP speculation through the serving Engine.
//
//  * Distribution: on the glm_schedule fixture (vocabulary 256, random MTP
//    weights, so drafts and target disagree often and rejections with
//    residual resampling are frequent), N seeded requests with temperature 1
//    and top_k 2 generate 5 tokens each (the first from the prefill, the rest
//    from verifications of up to 3 drafts); the empirical distribution of
//    the 2^5 = 32 possible continuations is compared with the exact target
//    distribution (a product of sampling_distribution over the target's
//    logits, computed with SequenceRunner, without the engine or any MTP
//    code) by Pearson's chi-square test. Cells with expected count < 5 are
//    pooled. The test fails when the p-value is below 1e-6: a correct
//    implementation fails with probability 1e-6 (up to the chi-square
//    approximation, with every cell's expectation >= 5). Both lossless modes
//    (rejection sampling, target-only) are checked.
//  * Seeded requests are reproducible: the same batch twice gives the same
//    tokens, and each request alone gives the tokens it got inside a batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "chi_square_check.h"

namespace megactx::testing {
namespace {

TEST(ChiSquare, PValuesOfKnownQuantiles) {
  // chi2(1) 0.95 quantile 3.841459, chi2(10) 0.99 quantile 23.20925 (tables).
  EXPECT_NEAR(upper_gamma_q(0.5, 3.841459 / 2), 0.05, 1e-6);
  EXPECT_NEAR(upper_gamma_q(5.0, 23.20925 / 2), 0.01, 1e-6);
  // Integer a: Q(n, x) = exp(-x) sum_{i < n} x^i / i! (series and fraction branches).
  auto poisson_tail = [](int n, double x) {
    double term = 1.0, sum = 0.0;
    for (int i = 0; i < n; ++i) {
      sum += term;
      term *= x / (i + 1);
    }
    return std::exp(-x) * sum;
  };
  EXPECT_NEAR(upper_gamma_q(15.0, 5.0), poisson_tail(15, 5.0), 1e-12);
  EXPECT_NEAR(upper_gamma_q(3.0, 20.0) / poisson_tail(3, 20.0), 1.0, 1e-9);
  EXPECT_NEAR(upper_gamma_q(13.0, 40.0) / poisson_tail(13, 40.0), 1.0, 1e-9);
}

TEST(SpeculativeSampledEngine, RejectionSamplingKeepsTheTargetDistribution) {
  EXPECT_GT(p_value_of_engine_samples(VerifyMode::RejectionSampling, 3000), 1e-6);
}

TEST(SpeculativeSampledEngine, TargetOnlyVerificationKeepsTheTargetDistribution) {
  EXPECT_GT(p_value_of_engine_samples(VerifyMode::TargetOnly, 3000), 1e-6);
}

GenerationRequest sampled_request(const std::string& rid, std::vector<int32_t> prompt,
                                  uint64_t seed) {
  GenerationRequest request = make_request(rid, std::move(prompt), 20, 1.0);
  request.sampling.top_p = 0.9;
  request.sampling.top_k = 50;
  request.sampling.seed = seed;
  request.return_logprob = true;
  return request;
}

TEST(SpeculativeSampledEngine, SeededRequestsAreReproducibleAloneAndBatched) {
  const std::string dir = source_path("models/default");
  const std::vector<int32_t> text = default_text_tokens();
  const size_t lengths[] = {7, 70, 140, 33, 1};
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < std::size(lengths); ++i) {
    prompts.emplace_back(text.begin() + 500 * i, text.begin() + 500 * i + lengths[i]);
  }
  SpecEngineOptions options;
  options.steps = 3;
  auto run = [&](const std::vector<size_t>& which) {
    SpecEngine spec(dir, options);
    for (const size_t i : which) spec.submit(sampled_request(std::to_string(i), prompts[i], i));
    spec.run();
    return spec.results;
  };
  const std::vector<size_t> all = {0, 1, 2, 3, 4};
  const auto first = run(all);
  const auto second = run(all);
  int64_t accepted = 0;
  for (const size_t i : all) {
    const std::string rid = std::to_string(i);
    const SpecResult& r = first.at(rid);
    EXPECT_EQ(r.tokens.size(), 20u) << rid;
    EXPECT_EQ(r.tokens, second.at(rid).tokens) << rid;
    EXPECT_EQ(r.logprobs.size(), r.tokens.size()) << rid;
    EXPECT_GT(r.verify_ct, 0) << rid;
    EXPECT_LE(r.accepted_tokens, r.draft_tokens) << rid;
    accepted += r.accepted_tokens;
    EXPECT_EQ(run({i}).at(rid).tokens, r.tokens) << "alone vs batched " << rid;
  }
  EXPECT_GT(accepted, 0);  // the trained MTP layer's drafts pass sometimes
}

// Expected acceptance per draft: sum min(p, q) under rejection sampling,
// sum p q under target-only verification; with the trained MTP layer the gap
// (1.80 vs 1.37 tokens per verification at k = 1 in docs/default-model.md) is
// far beyond the noise of 8 requests x ~16 verifications.
TEST(SpeculativeSampledEngine, RejectionSamplingAcceptsMoreThanTargetOnly) {
  const std::string dir = source_path("models/default");
  const std::vector<int32_t> text = default_text_tokens();
  double per_verification[2] = {0, 0};
  for (const VerifyMode mode : {VerifyMode::RejectionSampling, VerifyMode::TargetOnly}) {
    SpecEngineOptions options;
    options.steps = 3;
    options.sampled_mode = mode;
    SpecEngine spec(dir, options);
    for (int i = 0; i < 8; ++i) {
      GenerationRequest request = make_request(
          std::to_string(i),
          std::vector<int32_t>(text.begin() + 400 * i, text.begin() + 400 * i + 96), 48, 1.0);
      request.sampling.seed = 100 + static_cast<uint64_t>(i);
      spec.submit(std::move(request));
    }
    spec.run();
    int64_t accepted = 0, verifies = 0;
    for (const auto& [rid, r] : spec.results) {
      accepted += r.accepted_tokens;
      verifies += r.verify_ct;
    }
    ASSERT_GT(verifies, 0);
    per_verification[mode == VerifyMode::TargetOnly] = double(accepted) / double(verifies);
  }
  EXPECT_GT(per_verification[0], per_verification[1]);
}

}  // namespace
}  // namespace megactx::testing
