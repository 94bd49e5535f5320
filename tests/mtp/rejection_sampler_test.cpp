// Rejection sampling must leave the target distribution unchanged.
//
// Synthetic models over a 4- or 5-token vocabulary: a target Markov chain P
// and a different draft chain Q (first-order, so p and q depend on the
// previous token like a real model's on its prefix). One speculative round
// drafts d_1..d_k from Q, takes p_0..p_k from P at [last, d_1..d_k], and
// calls the verifier; rounds repeat until 3 tokens are emitted. The emitted
// 3-token strings are counted over N independent runs and compared with the
// exact P-chain probabilities by Pearson's chi-square test.
//
// Level: each test rejects when chi^2 exceeds its 1 - 1e-7 quantile (df = 63:
// 139.58; df = 26: 82.08, computed from the regularized incomplete gamma).
// Four such tests run (rejection with sampled q, with greedy one-hot q,
// target-only, and under a temperature/top-k transform), so a correct
// sampler fails this file with probability below 4e-7 (Bonferroni). Every
// expected cell count is >= 150 (N = 200,000; asserted in chi_square), so the
// chi-square approximation holds. A deliberately broken verifier (accept everything)
// and one that resamples from p instead of norm(max(0, p - q)) are rejected,
// so the test can fail.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"
#include "engine/cpu_sampler.h"
#include "engine/rejection_sampler.h"

namespace megactx {
namespace {

constexpr int kLength = 3;
constexpr int64_t kRuns = 200000;

using Chain = std::vector<std::vector<float>>;  // [V][V]: row prev -> distribution

Chain normalize_rows(std::vector<std::vector<double>> w) {
  Chain c;
  for (auto& row : w) {
    double total = 0;
    for (double v : row) total += v;
    std::vector<float> r;
    for (double v : row) r.push_back(static_cast<float>(v / total));
    c.push_back(r);
  }
  return c;
}

// Target: every transition >= 0.1. Draft: different, with a zero (residual
// mass matters) and a token the target rarely picks favoured.
Chain target_chain() {
  return normalize_rows({{4, 2, 1, 3}, {1, 1, 5, 3}, {2, 4, 2, 2}, {3, 1, 1, 5}});
}
Chain draft_chain() {
  return normalize_rows({{1, 5, 0, 4}, {6, 1, 2, 1}, {0, 2, 7, 1}, {2, 2, 5, 1}});
}

enum class Verifier { Rejection, RejectionOneHot, TargetOnly, AcceptAll, ResampleFromP };

// One emitted 3-token string (starting after token 0) under speculation.
std::array<int, kLength> speculate(const Chain& P, const Chain& Q, int k, Verifier verifier,
                                   std::mt19937_64& rng) {
  auto uniform = [&rng] { return std::generate_canonical<double, 53>(rng); };
  std::vector<int32_t> out;
  int32_t last = 0;
  while (static_cast<int>(out.size()) < kLength) {
    std::vector<int32_t> drafts;
    std::vector<std::vector<float>> q, p;
    int32_t prev = last;
    p.push_back(P[prev]);
    for (int i = 0; i < k; ++i) {
      int32_t d;
      if (verifier == Verifier::RejectionOneHot) {
        d = argmax(Q[prev]);
        q.emplace_back();  // one-hot
      } else {
        d = draw_from(Q[prev], uniform());
        q.push_back(Q[prev]);
      }
      drafts.push_back(d);
      p.push_back(P[d]);
      prev = d;
    }
    VerifyResult r;
    switch (verifier) {
      case Verifier::Rejection:
      case Verifier::RejectionOneHot:
        r = verify_rejection(p, q, drafts, uniform);
        break;
      case Verifier::TargetOnly:
        r = verify_target_only(p, drafts, uniform);
        break;
      case Verifier::AcceptAll:
        r.tokens = drafts;
        r.tokens.push_back(draw_from(p.back(), uniform()));
        break;
      case Verifier::ResampleFromP: {
        // Wrong: on rejection draws from p instead of the residual.
        for (int i = 0; i < k; ++i) {
          if (uniform() * q[i][drafts[i]] < p[i][drafts[i]]) {
            r.tokens.push_back(drafts[i]);
            continue;
          }
          r.tokens.push_back(draw_from(p[i], uniform()));
          break;
        }
        if (static_cast<int>(r.tokens.size()) == k)
          r.tokens.push_back(draw_from(p.back(), uniform()));
        break;
      }
    }
    EXPECT_GE(r.tokens.size(), 1u);
    for (int32_t t : r.tokens) out.push_back(t);
    last = out.back();
  }
  return {out[0], out[1], out[2]};
}

// Pearson chi-square of the emitted strings against the exact P-chain
// probabilities; cells with probability 0 must never occur.
double chi_square(const Chain& P, const Chain& Q, int k, Verifier verifier, uint64_t seed,
                  int* nonzero_cells) {
  const int V = static_cast<int>(P.size());
  std::vector<int64_t> counts(static_cast<size_t>(V * V * V), 0);
  std::mt19937_64 rng(seed);
  for (int64_t n = 0; n < kRuns; ++n) {
    const auto s = speculate(P, Q, k, verifier, rng);
    ++counts[static_cast<size_t>((s[0] * V + s[1]) * V + s[2])];
  }
  double chi2 = 0;
  *nonzero_cells = 0;
  for (int a = 0; a < V; ++a) {
    for (int b = 0; b < V; ++b) {
      for (int c = 0; c < V; ++c) {
        const double prob = double(P[0][a]) * P[a][b] * P[b][c];
        const int64_t observed = counts[static_cast<size_t>((a * V + b) * V + c)];
        if (prob == 0.0) {
          if (observed > 0) return INFINITY;
          continue;
        }
        const double expected = prob * kRuns;
        EXPECT_GE(expected, 150.0);
        chi2 += (observed - expected) * (observed - expected) / expected;
        ++*nonzero_cells;
      }
    }
  }
  return chi2;
}

constexpr double kChi2Df63 = 139.58;  // 1 - 1e-7 quantile, 63 degrees of freedom
constexpr double kChi2Df26 = 82.08;   // 1 - 1e-7 quantile, 26 degrees of freedom

TEST(RejectionSampling, PreservesTargetDistribution) {
  int cells = 0;
  const double chi2 = chi_square(target_chain(), draft_chain(), 3, Verifier::Rejection, 1, &cells);
  EXPECT_EQ(cells, 64);
  EXPECT_LT(chi2, kChi2Df63);
}

TEST(RejectionSampling, GreedyOneHotDraftsPreserveTargetDistribution) {
  int cells = 0;
  const double chi2 =
      chi_square(target_chain(), draft_chain(), 2, Verifier::RejectionOneHot, 2, &cells);
  EXPECT_LT(chi2, kChi2Df63);
}

TEST(RejectionSampling, TargetOnlyPreservesTargetDistribution) {
  int cells = 0;
  const double chi2 = chi_square(target_chain(), draft_chain(), 3, Verifier::TargetOnly, 3, &cells);
  EXPECT_LT(chi2, kChi2Df63);
}

// Both distributions through the same temperature 0.7 / top-k 3 transform
// (cpu_sampler's sampling_distribution) over 5 tokens: the output follows the
// transformed target exactly; the dropped token never appears.
TEST(RejectionSampling, SameTransformOfBothPreservesTransformedTarget) {
  SamplingParams params;
  params.temperature = 0.7;
  params.top_k = 3;
  const std::vector<std::vector<float>> target_logits = {{1.0f, 0.2f, 0.6f, -2.0f, 0.4f},
                                                         {0.1f, 0.9f, 0.5f, 0.3f, -3.0f},
                                                         {-1.0f, 0.5f, 0.8f, 0.6f, 0.1f},
                                                         {0.7f, -2.5f, 0.2f, 0.9f, 0.4f},
                                                         {0.3f, 0.6f, -1.0f, 0.2f, 0.8f}};
  const std::vector<std::vector<float>> draft_logits = {{0.2f, 1.5f, 0.1f, 0.0f, 0.9f},
                                                        {1.2f, 0.1f, 0.4f, 0.9f, 0.0f},
                                                        {0.3f, 0.1f, 1.4f, -0.5f, 0.6f},
                                                        {0.1f, 0.8f, 1.1f, 0.2f, 0.0f},
                                                        {1.0f, 0.0f, 0.5f, 0.6f, 0.2f}};
  Chain P, Q;
  for (const auto& l : target_logits) P.push_back(sampling_distribution(params, l));
  for (const auto& l : draft_logits) Q.push_back(sampling_distribution(params, l));
  int cells = 0;
  const double chi2 = chi_square(P, Q, 3, Verifier::Rejection, 4, &cells);
  EXPECT_EQ(cells, 27);
  EXPECT_LT(chi2, kChi2Df26);
}

TEST(RejectionSampling, BrokenVerifiersAreDetected) {
  int cells = 0;
  EXPECT_GT(chi_square(target_chain(), draft_chain(), 3, Verifier::AcceptAll, 5, &cells),
            kChi2Df63);
  EXPECT_GT(chi_square(target_chain(), draft_chain(), 3, Verifier::ResampleFromP, 6, &cells),
            kChi2Df63);
}

TEST(RejectionSampling, GreedyVerification) {
  const std::vector<float> a{0.1f, 0.9f, 0.0f}, b{0.5f, 0.2f, 0.3f}, c{0.0f, 0.0f, 1.0f};
  const std::vector<std::span<const float>> rows{a, b, c};
  const std::vector<int32_t> all{1, 0};
  VerifyResult r = verify_greedy(rows, all);
  EXPECT_EQ(r.accepted, 2);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 0, 2}));  // bonus from the last row
  const std::vector<int32_t> second_wrong{1, 2};
  r = verify_greedy(rows, second_wrong);
  EXPECT_EQ(r.accepted, 1);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1, 0}));  // correction
  const std::vector<int32_t> first_wrong{2, 0};
  r = verify_greedy(rows, first_wrong);
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{1}));
}

// The two parts a verification split over ranks would call: the accept
// tests from each draft's probabilities alone (one uniform each), then one
// row's draw. A draft with p >= q always passes, one with p = 0 never; the
// residual of a greedy (one-hot) draft never gives the draft back; all
// accepted draws the bonus from the row given.
TEST(RejectionSampling, TheTwoPartsFromScalarsAndOneRow) {
  int draws = 0;
  auto u = [&draws] {
    ++draws;
    return 0.999;
  };
  const std::vector<float> p_at{0.5f, 0.2f, 0.0f}, q_at{0.5f, 0.1f, 0.3f};
  EXPECT_EQ(rejection_accepted(p_at, q_at, u), 2);  // the third has p = 0
  EXPECT_EQ(draws, 3);
  const std::vector<float> all_pass{0.4f, 1.0f}, greedy{1.0f, 1.0f};
  EXPECT_EQ(rejection_accepted(all_pass, all_pass, u), 2);
  const std::vector<float> row{0.25f, 0.5f, 0.25f};
  for (const double v : {0.0, 0.3, 0.6, 0.999}) {
    auto fixed = [v] { return v; };
    EXPECT_NE(rejection_final_token(row, {}, 1, true, fixed), 1) << v;  // one-hot q at 1
  }
  auto last = [] { return 0.999; };
  EXPECT_EQ(rejection_final_token(row, {}, -1, false, last), 2);  // bonus: inverse CDF of p
  const std::vector<float> zero_q{1.0f, 0.0f};
  EXPECT_THROW(rejection_accepted(greedy, zero_q, u), Error);
}

// Target rows made on demand (what the engine's verification passes): the
// same tokens as the two parts above from the same uniforms, and only the
// rows up to the first rejection (or the bonus row) are asked for, in order.
TEST(RejectionSampling, RowsOnDemandGiveTheSameResultAndReadOnlyTheRowsNeeded) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> weight(0.0f, 1.0f);
  constexpr int kVocab = 6;
  for (int trial = 0; trial < 400; ++trial) {
    const int k = 1 + trial % 7;
    auto row = [&] {
      std::vector<float> r(kVocab);
      double total = 0.0;
      for (float& w : r) total += (w = weight(rng) * weight(rng));
      for (float& w : r) w = static_cast<float>(w / total);
      return r;
    };
    std::vector<std::vector<float>> p, q;
    std::vector<int32_t> drafts;
    for (int i = 0; i <= k; ++i) p.push_back(row());
    for (int i = 0; i < k; ++i) {
      q.push_back(trial % 5 == 0 ? std::vector<float>() : row());  // some greedy (one-hot) drafts
      drafts.push_back(q.back().empty() ? static_cast<int32_t>(rng() % kVocab)
                                        : draw_from(q.back(), weight(rng)));
    }
    const uint32_t seed = rng();
    std::mt19937 stream_a(seed), stream_b(seed);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    auto u_a = [&] { return unit(stream_a); };
    auto u_b = [&] { return unit(stream_b); };
    // Reference: the split parts over every row.
    std::vector<float> p_at, q_at;
    for (int i = 0; i < k; ++i) {
      p_at.push_back(p[i][drafts[i]]);
      q_at.push_back(q[i].empty() ? 1.0f : q[i][drafts[i]]);
    }
    const int64_t accepted = rejection_accepted(p_at, q_at, u_a);
    const bool rejected = accepted < k;
    const int32_t last =
        rejection_final_token(p[accepted], rejected ? q[accepted] : std::vector<float>(),
                              rejected ? drafts[accepted] : -1, rejected, u_a);
    std::vector<size_t> asked;
    const TargetRow p_row = [&](size_t i) -> const std::vector<float>& {
      asked.push_back(i);
      return p[i];
    };
    const VerifyResult result = verify_rejection_rows(kVocab, p_row, q, drafts, u_b);
    ASSERT_EQ(result.accepted, accepted) << "trial " << trial;
    ASSERT_EQ(result.tokens.size(), static_cast<size_t>(accepted) + 1);
    EXPECT_EQ(result.tokens.back(), last) << "trial " << trial;
    std::vector<size_t> expected(static_cast<size_t>(accepted) + 1);
    std::iota(expected.begin(), expected.end(), size_t{0});
    EXPECT_EQ(asked, expected) << "trial " << trial;
    // Target-only from rows on demand against the same rows given whole.
    std::mt19937 stream_c(seed), stream_d(seed);
    auto u_c = [&] { return unit(stream_c); };
    auto u_d = [&] { return unit(stream_d); };
    asked.clear();
    const VerifyResult own = verify_target_only_rows(p_row, drafts, u_c);
    const VerifyResult whole = verify_target_only(p, drafts, u_d);
    EXPECT_EQ(own.accepted, whole.accepted);
    EXPECT_EQ(own.tokens, whole.tokens);
    EXPECT_EQ(asked.size(), static_cast<size_t>(own.accepted) + 1);
  }
}

TEST(RejectionSampling, BadInputIsAnError) {
  const std::vector<std::vector<float>> p{{0.5f, 0.5f}, {1.0f, 0.0f}};
  const std::vector<std::vector<float>> q{{1.0f, 0.0f}};
  auto u = [] { return 0.5; };
  const std::vector<int32_t> out_of_range{7};
  EXPECT_THROW(verify_rejection(p, q, out_of_range, u), Error);
  const std::vector<int32_t> zero_q{1};  // q(1) = 0: not drawn from q
  EXPECT_THROW(verify_rejection(p, q, zero_q, u), Error);
  const std::vector<int32_t> two{0, 1};
  EXPECT_THROW(verify_rejection(p, q, two, u), Error);
  const std::vector<float> zeros{0.0f, 0.0f};
  EXPECT_THROW(draw_from(zeros, 0.5), Error);
}

}  // namespace
}  // namespace megactx
