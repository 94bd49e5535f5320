// Host side of the grouped device MoE (kernels/cuda/moe/grouped_moe.h), no
// GPU needed: which shapes the path serves, the errors for the others, the
// plan buffer's layout, and the tile bound that fixes the expert kernels'
// grid (checked against brute-force tile counts of many routings).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/moe/grouped_moe.h"

namespace megactx::cuda {
namespace {

std::string error_of(const GroupedMoeShape& shape) {
  try {
    check_grouped_moe(shape);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST(GroupedMoePlan, ServesDecodeAndVerificationShapesOfTheRealModels) {
  // GLM-5.2 (H 6144, I 2048) and DeepSeek-V3.2 (H 7168, I 2048): 256
  // experts, top-8, up to 256 rows (the largest decode-graph bucket).
  for (int64_t hidden : {6144, 7168}) {
    for (int64_t rows : {1, 2, 8, 16, 64, 128, 256}) {
      EXPECT_TRUE(grouped_moe_supported({rows, hidden, 2048, 256, 8})) << hidden << " " << rows;
    }
    EXPECT_FALSE(grouped_moe_supported({257, hidden, 2048, 256, 8}));
  }
  // The HF fixtures (H 32 / 160, I 16 / 80, 8 / 4 experts, top-2), prefill included.
  EXPECT_TRUE(grouped_moe_supported({64, 32, 16, 8, 2}));
  EXPECT_TRUE(grouped_moe_supported({80, 160, 80, 4, 2}));
}

TEST(GroupedMoePlan, UnsupportedShapesNameTheReason) {
  EXPECT_NE(error_of({kGroupedMoeMaxRows + 1, 64, 64, 256, 1}).find("exceed the bounds"),
            std::string::npos);
  // 256 rows x top-32 = 8192 pairs > 4096.
  EXPECT_NE(error_of({256, 64, 64, 256, 32}).find("exceed the bounds"), std::string::npos);
  EXPECT_NE(error_of({4, 60, 64, 8, 2}).find("multiples of 8"), std::string::npos);
  EXPECT_NE(error_of({4, 64, 20, 8, 2}).find("multiples of 8"), std::string::npos);
  EXPECT_NE(error_of({4, 64, 64, 2, 3}).find("top_k 3 exceeds"), std::string::npos);
  EXPECT_NE(error_of({0, 64, 64, 8, 2}).find("must all be positive"), std::string::npos);
  // 512 pairs (16 warps) x 600 experts: (5 + 16) * 600 * 4 B > 48 KiB;
  // 8 pairs (1 warp): (5 + 1) * 600 * 4 B fits.
  EXPECT_NE(error_of({64, 64, 64, 600, 8}).find("shared memory"), std::string::npos);
  EXPECT_TRUE(grouped_moe_supported({1, 64, 64, 600, 8}));
  EXPECT_THROW(grouped_moe_layout({4, 60, 64, 8, 2}), Error);
  EXPECT_EQ(error_of({4, 64, 64, 8, 2}), "");
}

TEST(GroupedMoePlan, LayoutRegionsAreDisjointAndSized) {
  const GroupedMoeShape shape{37, 256, 128, 256, 8};
  const GroupedMoeLayout l = grouped_moe_layout(shape);
  const int64_t pairs = 37 * 8;
  EXPECT_EQ(l.max_tiles, std::min<int64_t>(256, pairs) + pairs / kGroupedMoeTileRowsF32);
  EXPECT_EQ(l.tile_count, 0);
  EXPECT_EQ(l.tiles, 1);
  EXPECT_EQ(l.pair_of, l.tiles + 3 * l.max_tiles);
  EXPECT_EQ(l.counts, l.pair_of + pairs);
  EXPECT_EQ(l.offsets, l.counts + 256);
  EXPECT_EQ(l.plan_ints, l.offsets + 257);
  EXPECT_EQ(l.act_floats, pairs * 128);
  EXPECT_EQ(l.pair_out_floats, pairs * 256);
  EXPECT_EQ(l.plan_threads, 320);  // 296 pairs rounded up to whole warps
  EXPECT_EQ(l.plan_shared_bytes, static_cast<size_t>((5 + 10) * 256 * 4));
  // More pairs than one pass of 512 threads.
  const GroupedMoeLayout big = grouped_moe_layout({256, 256, 128, 256, 8});
  EXPECT_EQ(big.plan_threads, 512);
  EXPECT_EQ(big.plan_shared_bytes, static_cast<size_t>((5 + 16) * 256 * 4));
  EXPECT_EQ(big.max_tiles, 256 + 2048 / kGroupedMoeTileRowsF32);
  // bf16 weights: tiles of 32 rows (tensor-core column groups).
  GroupedMoeShape bf16_shape{256, 256, 128, 256, 8};
  bf16_shape.bf16 = true;
  EXPECT_EQ(bf16_shape.tile_rows(), 32);
  EXPECT_EQ(grouped_moe_layout(bf16_shape).max_tiles, 256 + 2048 / 32);
}

// Tiles a routing needs: sum over experts of ceil(pairs of e / tile rows).
int64_t tiles_needed(const std::vector<int64_t>& per_expert, int64_t tile_rows) {
  int64_t tiles = 0;
  for (int64_t m : per_expert) tiles += (m + tile_rows - 1) / tile_rows;
  return tiles;
}

TEST(GroupedMoePlan, TileBoundCoversEveryRouting) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t experts = 1 + rng() % 300;
    const int64_t top_k = 1 + rng() % std::min<int64_t>(experts, 16);
    const int64_t max_rows = std::min<int64_t>(kGroupedMoeMaxRows, kGroupedMoeMaxPairs / top_k);
    const int64_t rows = 1 + rng() % max_rows;
    GroupedMoeShape shape{rows, 64, 64, experts, top_k};
    shape.bf16 = trial % 3 == 0;
    if (!grouped_moe_supported(shape)) continue;
    // Each row picks top_k distinct experts, from a small or the full range
    // (few busy experts, many idle ones, or spread out).
    const int64_t range = std::max(top_k, trial % 2 == 0 ? experts : top_k + trial % 5);
    std::vector<int64_t> per_expert(static_cast<size_t>(experts), 0);
    std::vector<int64_t> choice(static_cast<size_t>(std::min(range, experts)));
    for (int64_t r = 0; r < rows; ++r) {
      for (size_t i = 0; i < choice.size(); ++i) choice[i] = static_cast<int64_t>(i);
      std::shuffle(choice.begin(), choice.end(), rng);
      for (int64_t s = 0; s < top_k; ++s) ++per_expert[choice[s]];
    }
    ASSERT_LE(tiles_needed(per_expert, shape.tile_rows()), grouped_moe_layout(shape).max_tiles)
        << "experts " << experts << " top_k " << top_k << " rows " << rows;
  }
  // The worst cases: every expert with pairs just above a tile multiple.
  const GroupedMoeShape spread{128, 64, 64, 113, 8};  // 1024 pairs: 9 or 10 per expert
  std::vector<int64_t> per_expert(113, 1024 / 113);
  for (int64_t e = 0; e < 1024 % 113; ++e) ++per_expert[e];
  EXPECT_LE(tiles_needed(per_expert, spread.tile_rows()), grouped_moe_layout(spread).max_tiles);
  // bf16 tiles of 32: 1024 pairs as 33 per expert on 31 experts (+1 on one).
  GroupedMoeShape spread_bf16{128, 64, 64, 31, 8};
  spread_bf16.bf16 = true;
  std::vector<int64_t> per_expert_bf16(31, 1024 / 31);
  for (int64_t e = 0; e < 1024 % 31; ++e) ++per_expert_bf16[e];
  EXPECT_LE(tiles_needed(per_expert_bf16, 32), grouped_moe_layout(spread_bf16).max_tiles);
}

TEST(GroupedMoePlan, Fp8ShapesTilesAndWorkspace) {
  // GLM-5.2 / DeepSeek-V3.2 fp8 checkpoints on the grouped path up to the
  // largest decode-graph bucket; tiles of 32 rows.
  for (int64_t hidden : {6144, 7168}) {
    GroupedMoeShape shape{256, hidden, 2048, 256, 8};
    shape.fp8 = true;
    EXPECT_TRUE(grouped_moe_supported(shape)) << hidden;
    EXPECT_EQ(shape.tile_rows(), kGroupedMoeTileRowsFp8);
  }
  GroupedMoeShape both{1, 64, 64, 8, 2};
  both.fp8 = both.bf16 = true;
  EXPECT_NE(error_of(both).find("both fp8 and bf16"), std::string::npos) << error_of(both);

  // The quantised inputs: x_q [rows, H] bytes, x_scale [rows, ceil(H / 128)]
  // floats, act_q [pairs, I] bytes, act_scale [pairs, ceil(I / 128)] floats,
  // each region 16-byte aligned and disjoint (ragged H and I).
  GroupedMoeShape ragged{13, 200, 80, 16, 4};
  ragged.fp8 = true;
  const GroupedMoeLayout l = grouped_moe_layout(ragged);
  const size_t x_q = 13 * 200, x_scale = 4 * 13 * 2, act_q = 52 * 80, act_scale = 4 * 52 * 1;
  EXPECT_EQ(l.fp8_x_q, 0u);
  EXPECT_GE(l.fp8_x_scale, l.fp8_x_q + x_q);
  EXPECT_GE(l.fp8_act_q, l.fp8_x_scale + x_scale);
  EXPECT_GE(l.fp8_act_scale, l.fp8_act_q + act_q);
  EXPECT_GE(l.fp8_bytes, l.fp8_act_scale + act_scale);
  EXPECT_LT(l.fp8_bytes, x_q + x_scale + act_q + act_scale + 4 * 16);  // padding only
  for (size_t offset : {l.fp8_x_scale, l.fp8_act_q, l.fp8_act_scale, l.fp8_bytes})
    EXPECT_EQ(offset % 16, 0u) << offset;
  // float32 and bf16 shapes need no fp8 workspace.
  GroupedMoeShape plain = ragged;
  plain.fp8 = false;
  EXPECT_EQ(grouped_moe_layout(plain).fp8_bytes, 0u);
}

TEST(GroupedMoePlan, Fp8GateUpScaleRowsFollowTheStackingRule) {
  // Gate and up quantised apart, then stacked (scale_split = I): each keeps
  // ceil(I / 128) scale rows. One grid over 2I rows (scale_split 0):
  // ceil(2I / 128).
  EXPECT_EQ(grouped_moe_gate_up_scale_rows(80, 80), 2);
  EXPECT_EQ(grouped_moe_gate_up_scale_rows(80, 0), 2);
  EXPECT_EQ(grouped_moe_gate_up_scale_rows(200, 200), 4);
  EXPECT_EQ(grouped_moe_gate_up_scale_rows(200, 0), 4);
  EXPECT_EQ(grouped_moe_gate_up_scale_rows(1088, 1088), 18);
  EXPECT_EQ(grouped_moe_gate_up_scale_rows(1088, 0), 17);
  EXPECT_EQ(grouped_moe_gate_up_scale_rows(2048, 2048), 32);
  EXPECT_EQ(grouped_moe_gate_up_scale_rows(64, 0), 1);
  EXPECT_EQ(grouped_moe_gate_up_scale_rows(64, 64), 2);
}

}  // namespace
}  // namespace megactx::cuda
