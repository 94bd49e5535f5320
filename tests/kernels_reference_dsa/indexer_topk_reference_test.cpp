// The fp32 indexer and top-k references against hand-computed values: keys
// built from e4m3-exact numbers so the fp8 cache stores them exactly.
#include "kernels/reference/indexer_topk_reference.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "core/dtype.h"

namespace megactx::reference {
namespace {

// A value e4m3 holds exactly: +-(0..15) / 2 and +-448 (the amax that makes the scale 1).
float exact_value(std::mt19937& rng) {
  return static_cast<float>(static_cast<int>(rng() % 31) - 15) / 2.f;
}

TEST(IndexerReference, KeyRoundTripWithinE4m3Precision) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::vector<float> key(kIndexerDim), decoded(kIndexerDim);
  std::vector<uint8_t> entry(kIndexerEntryBytes);
  for (float& v : key) v = normal(rng);
  encode_indexer_key_fp8(key.data(), entry.data());
  decode_indexer_key_fp8(entry.data(), decoded.data());
  float amax = 0.f;
  for (float v : key) amax = std::max(amax, std::fabs(v));
  for (int i = 0; i < kIndexerDim; ++i)
    EXPECT_LE(std::fabs(decoded[i] - key[i]),
              std::max(std::fabs(key[i]) / 16.f, amax / 448.f / 256.f))
        << i;
  // The largest magnitude maps to +-448 exactly.
  const int top = static_cast<int>(
      std::max_element(key.begin(), key.end(),
                       [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
      key.begin());
  EXPECT_FLOAT_EQ(decoded[top], key[top]);
}

TEST(IndexerReference, ZeroKeyHasUnitScale) {
  std::vector<float> key(kIndexerDim, 0.f), decoded(kIndexerDim, 1.f);
  std::vector<uint8_t> entry(kIndexerEntryBytes);
  encode_indexer_key_fp8(key.data(), entry.data());
  float scale;
  std::memcpy(&scale, entry.data() + kIndexerDim, 4);
  EXPECT_EQ(scale, 1.f);
  decode_indexer_key_fp8(entry.data(), decoded.data());
  for (float v : decoded) EXPECT_EQ(v, 0.f);
}

TEST(IndexerReference, ScoresFollowTheBlockTableAndTheFormula) {
  std::mt19937 rng(2);
  const int heads = 4, pages = 3;
  const int64_t visible = 150;                   // not a multiple of 64
  const std::vector<int32_t> table = {2, 0, 4};  // logical page -> physical page
  std::vector<uint8_t> pool(5 * kCachePageTokens * kIndexerEntryBytes, 0xee);
  std::vector<std::vector<float>> keys(visible, std::vector<float>(kIndexerDim));
  for (int64_t p = 0; p < visible; ++p) {
    for (float& v : keys[p]) v = exact_value(rng);
    keys[p][p % kIndexerDim] = 448.f;  // amax 448: scale exactly 1
    const int64_t slot = table[p / 64] * 64 + p % 64;
    encode_indexer_key_fp8(keys[p].data(), pool.data() + slot * kIndexerEntryBytes);
  }
  (void)pages;
  std::vector<float> queries(heads * kIndexerDim), weights = {0.5f, -1.f, 2.f, 0.25f};
  for (float& v : queries) v = exact_value(rng) / 64.f;
  std::vector<float> scores(visible);
  indexer_scores_reference(queries.data(), weights.data(), heads, pool.data(), table.data(),
                           visible, scores.data());
  for (int64_t p = 0; p < visible; ++p) {
    double expected = 0;
    for (int h = 0; h < heads; ++h) {
      double dot = 0;
      for (int i = 0; i < kIndexerDim; ++i)
        dot += double(queries[h * kIndexerDim + i]) * keys[p][i];
      expected += weights[h] * std::max(dot, 0.0);
    }
    EXPECT_NEAR(scores[p], expected, 1e-4 * (1 + std::fabs(expected))) << p;
  }
}

TEST(IndexerReference, QueryQuantisationFoldsTheScale) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> query(kIndexerDim);
  for (float& v : query) v = normal(rng);
  std::vector<uint8_t> q8(kIndexerDim);
  float folded = 0.f;
  quantize_indexer_query(query.data(), 0.75f, 0.125f, q8.data(), &folded);
  float amax = 0.f;
  for (float v : query) amax = std::max(amax, std::fabs(v));
  const float scale = amax / 448.f;
  EXPECT_FLOAT_EQ(folded, 0.75f * scale * 0.125f);
  for (int i = 0; i < kIndexerDim; ++i)
    EXPECT_LE(std::fabs(fp8_e4m3_to_float(q8[i]) * scale - query[i]),
              std::fabs(query[i]) / 16.f + scale / 256.f);
}

TEST(TopkReference, SelectsTheLargestWithTiesByPosition) {
  const std::vector<int32_t> table = {7, 3};
  const std::vector<float> scores = {1.f, 5.f, 3.f, 5.f, -2.f, 4.f, 3.f};
  const auto slots = topk_slots_reference(scores.data(), 7, 4, table.data());
  // Descending: 5 (p1), 5 (p3), 4 (p5), then 3 at p2 (lower position wins the tie with p6).
  EXPECT_EQ(slots, (std::vector<int32_t>{7 * 64 + 1, 7 * 64 + 3, 7 * 64 + 5, 7 * 64 + 2}));
}

TEST(TopkReference, PadsShortRowsAndMapsSecondPage) {
  const std::vector<int32_t> table = {1, 9};
  std::vector<float> scores(70);
  for (int i = 0; i < 70; ++i) scores[i] = static_cast<float>(i);
  const auto slots = topk_slots_reference(scores.data(), 70, 80, table.data());
  ASSERT_EQ(slots.size(), 80u);
  EXPECT_EQ(slots[0], 9 * 64 + 5);  // position 69 is on logical page 1
  std::set<int32_t> distinct(slots.begin(), slots.begin() + 70);
  EXPECT_EQ(distinct.size(), 70u);
  for (int i = 70; i < 80; ++i) EXPECT_EQ(slots[i], -1);
  const auto empty = topk_slots_reference(scores.data(), 0, 3, table.data());
  EXPECT_EQ(empty, (std::vector<int32_t>{-1, -1, -1}));
}

}  // namespace
}  // namespace megactx::reference
