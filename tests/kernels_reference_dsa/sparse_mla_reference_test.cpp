// The fp32 sparse MLA reference against an independent double-precision
// softmax attention over e4m3-exact latents.
#include "kernels/reference/sparse_mla_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace megactx::reference {
namespace {

constexpr int kQueryDim = kLatentRankDim + kLatentRopeDim;

struct Latents {
  std::vector<std::vector<float>> c_kv, k_rope;  // per token, exactly representable
  std::vector<uint8_t> pool;
};

Latents make_latents(int tokens, std::mt19937& rng) {
  Latents latents;
  latents.pool.assign(static_cast<size_t>(tokens) * kLatentEntryBytes, 0);
  for (int t = 0; t < tokens; ++t) {
    std::vector<float> c(kLatentRankDim), r(kLatentRopeDim);
    for (int i = 0; i < kLatentRankDim; ++i)
      c[i] = (i % 128 == t % 128) ? 448.f
                                  : static_cast<float>(static_cast<int>(rng() % 31) - 15) / 2.f;
    for (float& v : r)
      v = static_cast<float>(static_cast<int>(rng() % 255) - 127) / 64.f;  // bf16-exact
    encode_latent_fp8(c.data(), r.data(),
                      latents.pool.data() + static_cast<size_t>(t) * kLatentEntryBytes);
    latents.c_kv.push_back(c);
    latents.k_rope.push_back(r);
  }
  return latents;
}

TEST(SparseMlaReference, LatentRoundTripIsExactForRepresentableValues) {
  std::mt19937 rng(4);
  Latents latents = make_latents(3, rng);
  std::vector<float> c(kLatentRankDim), r(kLatentRopeDim);
  for (int t = 0; t < 3; ++t) {
    decode_latent_fp8(latents.pool.data() + t * kLatentEntryBytes, c.data(), r.data());
    EXPECT_EQ(c, latents.c_kv[t]);
    EXPECT_EQ(r, latents.k_rope[t]);
  }
}

TEST(SparseMlaReference, MatchesDoublePrecisionAttentionAndIgnoresPadding) {
  std::mt19937 rng(5);
  const int tokens = 40, heads = 3;
  Latents latents = make_latents(tokens, rng);
  std::normal_distribution<float> normal(0.f, 0.002f);
  std::vector<float> q(heads * kQueryDim);
  for (float& v : q) v = normal(rng);
  // Slots: 25 distinct tokens in a shuffled order with -1 holes.
  std::vector<int32_t> slots;
  for (int t = 0; t < 25; ++t) slots.push_back((t * 7) % tokens);
  slots.insert(slots.begin() + 3, -1);
  slots.push_back(-1);
  const float scale = 1.f / std::sqrt(256.f);
  std::vector<float> out(heads * kLatentRankDim), lse(heads);
  sparse_mla_reference(q.data(), heads, slots.data(), static_cast<int>(slots.size()),
                       latents.pool.data(), scale, out.data(), lse.data());
  for (int h = 0; h < heads; ++h) {
    std::vector<double> logits;
    std::vector<int> chosen;
    for (int32_t s : slots) {
      if (s < 0) continue;
      double dot = 0;
      for (int i = 0; i < kLatentRankDim; ++i)
        dot += double(q[h * kQueryDim + i]) * latents.c_kv[s][i];
      for (int i = 0; i < kLatentRopeDim; ++i)
        dot += double(q[h * kQueryDim + kLatentRankDim + i]) * latents.k_rope[s][i];
      logits.push_back(dot * scale);
      chosen.push_back(s);
    }
    const double top = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double l : logits) sum += std::exp(l - top);
    EXPECT_NEAR(lse[h], top + std::log(sum), 1e-4);
    for (int i = 0; i < kLatentRankDim; ++i) {
      double expected = 0;
      for (size_t j = 0; j < chosen.size(); ++j)
        expected += std::exp(logits[j] - top) / sum * latents.c_kv[chosen[j]][i];
      EXPECT_NEAR(out[h * kLatentRankDim + i], expected, 1e-3 * (1 + std::fabs(expected)))
          << h << " " << i;
    }
  }
}

TEST(SparseMlaReference, EmptyRowGivesZeroAndMinusInfinity) {
  std::mt19937 rng(6);
  Latents latents = make_latents(2, rng);
  std::vector<float> q(kQueryDim, 1.f), out(kLatentRankDim, 7.f), lse(1, 0.f);
  const std::vector<int32_t> slots = {-1, -1, -1};
  sparse_mla_reference(q.data(), 1, slots.data(), 3, latents.pool.data(), 0.1f, out.data(),
                       lse.data());
  EXPECT_TRUE(std::isinf(lse[0]) && lse[0] < 0);
  for (float v : out) EXPECT_EQ(v, 0.f);
}

}  // namespace
}  // namespace megactx::reference
