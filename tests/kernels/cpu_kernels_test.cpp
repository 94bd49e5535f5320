// The fast CPU kernels against the reference loops on random inputs, and the
// reference loops against small hand-worked cases (rotation angles, top-k
// tie-breaking, group-limited routing).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "kernels/cpu/batch_invariant_linear.h"
#include "kernels/cpu/dense_ops.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/reference/dense_ops.h"
#include "kernels/reference/sparse_attention.h"

namespace megactx {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

double max_relative(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// The deterministic mode's GEMM: close to a double-precision product, and each
// row bit-identical whatever rows share the call (1, a few, hundreds, at any
// offset and stride), which OpenBLAS's shape-dependent kernels are not.
TEST(CpuKernels, BatchInvariantLinearGivesEveryRowTheSameBitsInEveryBatch) {
  for (auto [in, out] : std::vector<std::pair<int, int>>{{7, 5}, {64, 96}, {257, 131}}) {
    const int rows = 150, stride = in + 5;
    const auto x = random_values(static_cast<size_t>(rows * stride), 11);
    const auto w = random_values(static_cast<size_t>(out * in), 12);
    std::vector<float> all(static_cast<size_t>(rows * out));
    cpu::linear_batch_invariant(x.data(), rows, in, stride, w.data(), out, all.data(), out);
    double worst = 0.0;
    for (int r = 0; r < rows; ++r) {
      for (int o = 0; o < out; ++o) {
        double exact = 0.0;
        for (int k = 0; k < in; ++k) exact += double{x[r * stride + k]} * w[o * in + k];
        worst = std::max(worst, std::fabs(exact - all[r * out + o]));
        EXPECT_EQ(all[r * out + o], cpu::batch_invariant_dot(&x[r * stride], &w[o * in], in));
      }
    }
    EXPECT_LT(worst, 1e-4 * std::sqrt(in));
    for (auto [first, count] :
         std::vector<std::pair<int, int>>{{0, 1}, {37, 1}, {5, 3}, {40, 110}}) {
      std::vector<float> part(static_cast<size_t>(count * (out + 2)), -1.0f);
      cpu::linear_batch_invariant(x.data() + first * stride, count, in, stride, w.data(), out,
                                  part.data(), out + 2);
      for (int r = 0; r < count; ++r) {
        for (int o = 0; o < out; ++o) {
          ASSERT_EQ(part[r * (out + 2) + o], all[(first + r) * out + o])
              << "row " << first + r << " of a call of " << count;
        }
      }
    }
  }
}

TEST(CpuKernels, LinearMatchesReferenceIncludingStrides) {
  for (auto [rows, in, out] :
       std::vector<std::tuple<int, int, int>>{{1, 7, 5}, {33, 64, 96}, {130, 48, 17}}) {
    const auto x = random_values(static_cast<size_t>(rows * (in + 3)), 1);
    const auto w = random_values(static_cast<size_t>(out * in), 2);
    std::vector<float> fast(static_cast<size_t>(rows * (out + 2)), 7.0f), slow(fast);
    cpu::linear_strided(x.data(), rows, in, in + 3, w.data(), out, fast.data(), out + 2);
    for (int r = 0; r < rows; ++r) {
      reference::linear(x.data() + r * (in + 3), 1, in, w.data(), out, slow.data() + r * (out + 2));
    }
    EXPECT_LE(max_relative(fast, slow), 1e-5) << rows << "x" << in << "x" << out;
    EXPECT_EQ(fast[out], 7.0f);  // the gap between strided rows is untouched
  }
}

TEST(CpuKernels, NormsAndActivationMatchReference) {
  const int rows = 37, n = 80;
  const auto x = random_values(rows * n, 3, 2.0f), w = random_values(n, 4), b = random_values(n, 5);
  std::vector<float> fast(rows * n), slow(rows * n);
  cpu::rmsnorm(x.data(), rows, n, n, w.data(), 1e-6f, fast.data(), n);
  reference::rmsnorm(x.data(), rows, n, n, w.data(), 1e-6f, slow.data(), n);
  EXPECT_LE(max_relative(fast, slow), 1e-6);
  // rmsnorm of a constant row c is weight * sign(c) (eps negligible).
  std::vector<float> ones(n, 3.0f), y(n);
  reference::rmsnorm(ones.data(), 1, n, n, w.data(), 0.0f, y.data(), n);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(y[i], w[i], 1e-6);
  cpu::layernorm(x.data(), rows, n, w.data(), b.data(), 1e-6f, fast.data());
  reference::layernorm(x.data(), rows, n, w.data(), b.data(), 1e-6f, slow.data());
  EXPECT_LE(max_relative(fast, slow), 1e-6);
  std::vector<float> act_fast(rows * n / 2), act_slow(rows * n / 2);
  cpu::silu_mul(x.data(), x.data() + n / 2, rows, n / 2, n, act_fast.data());
  reference::silu_mul(x.data(), x.data() + n / 2, rows, n / 2, n, act_slow.data());
  EXPECT_EQ(act_fast, act_slow);
  const float g = 1.5f, u = -2.0f;
  float out;
  reference::silu_mul(&g, &u, 1, 1, 1, &out);
  EXPECT_NEAR(out, 1.5f / (1.0f + std::exp(-1.5f)) * -2.0f, 1e-6);
}

TEST(ReferenceKernels, RopeRotatesPairsByTheirAngle) {
  // dim 4: pair 0 angle a, pair 1 angle b.
  const float a = 0.3f, b = 1.1f;
  const float cos[2] = {std::cos(a), std::cos(b)}, sin[2] = {std::sin(a), std::sin(b)};
  float interleaved[4] = {1, 0, 0, 2};  // pairs (x0, x1), (x2, x3)
  reference::rope(interleaved, 1, 1, 4, 4, 4, cos, sin, true);
  EXPECT_NEAR(interleaved[0], std::cos(a), 1e-6);
  EXPECT_NEAR(interleaved[1], std::sin(a), 1e-6);
  EXPECT_NEAR(interleaved[2], -2 * std::sin(b), 1e-6);
  EXPECT_NEAR(interleaved[3], 2 * std::cos(b), 1e-6);
  float half[4] = {1, 0, 0, 2};  // pairs (x0, x2), (x1, x3)
  reference::rope(half, 1, 1, 4, 4, 4, cos, sin, false);
  EXPECT_NEAR(half[0], std::cos(a), 1e-6);
  EXPECT_NEAR(half[2], std::sin(a), 1e-6);
  EXPECT_NEAR(half[1], -2 * std::sin(b), 1e-6);
  EXPECT_NEAR(half[3], 2 * std::cos(b), 1e-6);
}

TEST(ReferenceKernels, TopkPrefersHigherScoresThenLowerIndices) {
  const float scores[6] = {0.5f, 2.0f, 0.5f, -1.0f, 2.0f, 0.5f};
  int32_t out[4];
  ASSERT_EQ(reference::topk_indices(scores, 6, 4, out), 4);
  EXPECT_EQ(std::vector<int32_t>(out, out + 4), (std::vector<int32_t>{0, 1, 2, 4}));
  ASSERT_EQ(reference::topk_indices(scores, 2, 4, out), 2);  // fewer visible than k
  EXPECT_EQ(std::vector<int32_t>(out, out + 2), (std::vector<int32_t>{0, 1}));
}

// The selection the CPU indexer uses (nth_element and one ordered pass)
// against the reference's sort, on rows with many ties (values drawn from a
// few levels, signed zeros among them), infinities, fewer or as many
// positions as k, k = 0, and a NaN (the reference's own order then).
TEST(CpuKernels, TopkEqualsTheReferenceSelection) {
  std::mt19937 rng(7);
  const float levels[] = {-0.0f, 0.0f, 1.5f, -2.0f, 3.25f, INFINITY, -INFINITY, 1e-30f};
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = static_cast<int64_t>(rng() % 700);
    const int64_t k = static_cast<int64_t>(rng() % 260);
    std::vector<float> scores(static_cast<size_t>(n));
    std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
    for (float& v : scores) v = trial % 3 == 0 ? uniform(rng) : levels[rng() % 8];
    if (trial % 50 == 49 && n > 0) scores[rng() % n] = NAN;
    std::vector<int32_t> expected(static_cast<size_t>(k) + 1, -7), got(expected);
    const int64_t want = reference::topk_indices(scores.data(), n, k, expected.data());
    ASSERT_EQ(cpu::topk_indices(scores.data(), n, k, got.data()), want) << trial;
    EXPECT_EQ(got, expected) << "trial " << trial << ": n " << n << ", k " << k;
  }
  // Long rows (the sampled threshold): random, a few levels, rising and
  // falling (the sample's floor misses and the whole row decides), a NaN.
  for (int trial = 0; trial < 120; ++trial) {
    const int64_t n = 1024 + static_cast<int64_t>(rng() % 20000);
    const int64_t k = 1 + static_cast<int64_t>(rng() % 300);
    std::vector<float> scores(static_cast<size_t>(n));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      switch (trial % 5) {
        case 0:
          scores[i] = normal(rng);
          break;
        case 1:
          scores[i] = levels[rng() % 8];
          break;
        case 2:
          scores[i] = static_cast<float>(i);
          break;  // the top is off the sample
        case 3:
          scores[i] = static_cast<float>(n - i) * 1e-3f;
          break;
        default:
          scores[i] = (i % 97 == 5) ? 10.0f + static_cast<float>(i % 7) : normal(rng);
      }
    }
    if (trial % 40 == 39) scores[rng() % n] = NAN;
    std::vector<int32_t> expected(static_cast<size_t>(k), -7), got(expected);
    const int64_t want = reference::topk_indices(scores.data(), n, k, expected.data());
    ASSERT_EQ(cpu::topk_indices(scores.data(), n, k, got.data()), want) << trial;
    EXPECT_EQ(got, expected) << "long trial " << trial << ": n " << n << ", k " << k;
  }
}

TEST(ReferenceKernels, GroupLimitedRoutingKeepsOnlyTheBestGroups) {
  // 8 experts in 4 groups of 2; choice scores below (bias zero).
  // Group sums: {0,1} 0.997, {2,3} 1.455, {4,5} 1.257, {6,7} 0.978 -> groups 1 and 2.
  // Best experts there: 2 (0.807) and 5 (0.771); expert 0 (0.808) is excluded.
  const float choice[8] = {0.808f, 0.189f, 0.807f, 0.648f, 0.486f, 0.771f, 0.623f, 0.355f};
  float logits[8];
  for (int i = 0; i < 8; ++i) logits[i] = std::log(choice[i] / (1.0f - choice[i]));
  int32_t ids[2];
  float weights[2];
  reference::moe_route(logits, nullptr, {8, 4, 2, 2, true, 2.5f}, ids, weights);
  EXPECT_EQ(std::set<int32_t>(ids, ids + 2), (std::set<int32_t>{2, 5}));
  const float total = 0.807f + 0.771f;
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(weights[i], 2.5f * choice[ids[i]] / total, 1e-5);
  }
  // Without groups the two best overall win; a bias moves the choice but not the weights.
  reference::moe_route(logits, nullptr, {8, 1, 1, 2, false, 1.0f}, ids, weights);
  EXPECT_EQ(std::set<int32_t>(ids, ids + 2), (std::set<int32_t>{0, 2}));
  const float bias[8] = {0, 0, 0, 0, 0, 0, 0, 0.5f};
  reference::moe_route(logits, bias, {8, 1, 1, 2, false, 1.0f}, ids, weights);
  EXPECT_EQ(std::set<int32_t>(ids, ids + 2), (std::set<int32_t>{0, 7}));
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(weights[i], choice[ids[i]], 1e-5);
}

TEST(CpuKernels, IndexerTopkMatchesReference) {
  const int queries = 9, heads = 6, dim = 16, keys = 150, topk = 32;
  const auto q = random_values(queries * heads * dim, 10);
  const auto w = random_values(queries * heads, 11);
  const auto k = random_values(keys * dim, 12);
  std::vector<int64_t> visible(queries);
  for (int i = 0; i < queries; ++i) visible[i] = 10 + 17 * i;  // some below topk
  std::vector<int32_t> indices(queries * topk);
  std::vector<int64_t> counts(queries);
  cpu::indexer_topk({q.data(), w.data(), k.data(), visible.data(), queries, heads, dim, keys, topk,
                     0.25f, indices.data(), counts.data()});
  for (int i = 0; i < queries; ++i) {
    std::vector<float> scores(visible[i]);
    reference::indexer_scores(q.data() + i * heads * dim, w.data() + i * heads, heads, dim,
                              k.data(), visible[i], 0.25f, scores.data());
    std::vector<int32_t> expected(topk);
    const int64_t count = reference::topk_indices(scores.data(), visible[i], topk, expected.data());
    ASSERT_EQ(counts[i], count);
    // Compare selected sets by their scores (robust to ties).
    std::vector<float> got_scores, want_scores;
    for (int j = 0; j < count; ++j) {
      got_scores.push_back(scores[indices[i * topk + j]]);
      want_scores.push_back(scores[expected[j]]);
    }
    std::sort(got_scores.begin(), got_scores.end());
    std::sort(want_scores.begin(), want_scores.end());
    EXPECT_EQ(got_scores, want_scores) << "query " << i;
    for (int j = count; j < topk; ++j) EXPECT_EQ(indices[i * topk + j], -1);
  }
}

TEST(CpuKernels, MlaAttentionMatchesReferenceAndSoftmaxOfOneIsTheEntry) {
  const int queries = 5, heads = 3, lora = 24, rope = 8, rows = 40, stride = 12;
  const auto ql = random_values(queries * heads * lora, 13);
  const auto qr = random_values(queries * heads * rope, 14);
  const auto latents = random_values(rows * (lora + rope), 15);
  std::vector<int32_t> indices(queries * stride);
  std::vector<int64_t> counts = {0, 1, 5, 12, 12};
  std::mt19937 rng(16);
  for (auto& i : indices) i = static_cast<int32_t>(rng() % rows);
  std::vector<float> fast(queries * heads * lora), slow(fast.size());
  cpu::mla_attention({ql.data(), qr.data(), latents.data(), indices.data(), counts.data(), stride,
                      queries, heads, lora, rope, 0.2f, fast.data()});
  for (int i = 0; i < queries; ++i) {
    reference::mla_attention(ql.data() + i * heads * lora, qr.data() + i * heads * rope, heads,
                             lora, rope, latents.data(), indices.data() + i * stride, counts[i],
                             0.2f, slow.data() + i * heads * lora);
  }
  EXPECT_LE(max_relative(fast, slow), 1e-5);
  for (int d = 0; d < lora; ++d) {
    EXPECT_EQ(slow[d], 0.0f);  // no selected token: zeros
    EXPECT_NEAR(slow[heads * lora + d], latents[indices[stride] * (lora + rope) + d], 1e-6);
  }
}

}  // namespace
}  // namespace megactx
