// Capacity planning with the per-token layouts of cache/kv_cache.h worked out
// by hand: GLM-5-like schedule (78 layers, 21 with an indexer), replicated and
// split over 8 ranks (LayerSplit).
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/kv_capacity.h"
#include "model/model_plan.h"

namespace megactx {
namespace {

ModelConfig glm_like() {
  ModelConfig config;
  config.num_hidden_layers = 78;
  config.kv_lora_rank = 512;
  config.qk_rope_head_dim = 64;
  config.index_head_dim = 128;
  config.num_nextn_predict_layers = 1;
  // Full iff max(i - 3 + 1, 0) % 4 == 0: 0, 1, 2, 6, 10, ..., 74.
  for (int64_t i = 0; i < 78; ++i) {
    config.indexer_types.push_back(std::max<int64_t>(i - 2, 0) % 4 == 0 ? IndexerType::Full
                                                                        : IndexerType::Shared);
  }
  return config;
}

TEST(KvCapacity, Fp8PoolsOnlyWhereUsed) {
  const int64_t gib = int64_t{1} << 30;
  KvCapacityPlan plan = plan_kv_capacity(glm_like(), KvDType::FP8, 10 * gib, 64, false);
  EXPECT_EQ(plan.spec.latent_layers.size(), 78u);
  EXPECT_EQ(plan.spec.indexer_layers.size(), 21u);
  EXPECT_EQ(plan.spec.indexer_layers[3], 6);
  const int64_t per_token = 78 * 656 + 21 * 132;  // 53,940 B
  EXPECT_EQ(plan.bytes_per_token, per_token);
  EXPECT_EQ(plan.spec.num_pages, 10 * gib / (64 * per_token));
  EXPECT_EQ(plan.max_tokens, plan.spec.num_pages * 64);
  EXPECT_LE(plan.total_bytes, 10 * gib);
}

// Data-parallel attention over 8 ranks: every rank gets the pages of its
// budget for its own requests; the spec numbers all of them, a sequence still
// fits in one rank's.
TEST(KvCapacity, DataParallelRanksEachGetTheirBudgetsPages) {
  const int64_t gib = int64_t{1} << 30;
  const KvCapacityPlan one = plan_kv_capacity(glm_like(), KvDType::FP8, 10 * gib, 64, false);
  const KvCapacityPlan dp = plan_kv_capacity(glm_like(), KvDType::FP8, 10 * gib, 64, false, {}, 8);
  EXPECT_EQ(dp.data_parallel_ranks, 8);
  EXPECT_EQ(dp.pages_per_rank, one.spec.num_pages);
  EXPECT_EQ(dp.spec.num_pages, 8 * one.spec.num_pages);
  EXPECT_EQ(dp.max_tokens, one.max_tokens);
  EXPECT_EQ(dp.total_bytes, one.total_bytes);  // per rank
  EXPECT_NE(dp.summary().find("over 8 data-parallel ranks"), std::string::npos);
}

TEST(KvCapacity, MtpLayerAddsALatentAndAnIndexerPool) {
  KvCapacityPlan plan = plan_kv_capacity(glm_like(), KvDType::BF16, int64_t{1} << 30, 64, true);
  EXPECT_EQ(plan.spec.latent_layers.back(), 78);
  EXPECT_EQ(plan.spec.indexer_layers.back(), 78);
  EXPECT_EQ(plan.bytes_per_token, 79 * 1152 + 22 * 256);
}

// GLM-5.2's layer schedule with LayerSplit over 8 tensor-parallel ranks.
ModelPlan glm_layer_split_plan(const ModelConfig& config) {
  ModelPlan plan;
  plan.attention.entry = 512 + 64;
  plan.attention.index_dim = 128;
  for (int64_t layer = 0; layer < 78; ++layer)
    plan.layers.push_back({layer, config.layer_runs_indexer(layer), layer, false});
  plan.layer_split = true;
  plan.tensor_parallel_size = 8;
  plan.kv_owner = layer_split_owners(plan.layers, plan.attention, 8);
  return plan;
}

// LayerSplit over 8 ranks (GLM-5.2 on 8 GPUs): each rank its layers' pools
// and the MTP layer's; the budget is each rank's, so the largest share bounds
// the pages, 7.07 x what the replicated pools get.
TEST(KvCapacity, LayerSplitPagesFollowTheLargestRank) {
  const ModelConfig config = glm_like();
  const ModelPlan plan = glm_layer_split_plan(config);
  const KvCacheShares shares = [&](const KvCacheSpec& whole) {
    return layer_split_shares(plan, whole);
  };
  const int64_t gib = int64_t{1} << 30;
  const KvCapacityPlan split = plan_kv_capacity(config, KvDType::FP8, 10 * gib, 64, true, shares);
  ASSERT_EQ(split.shares.size(), 8u);
  // Ranks 0-2: 10 layers (3 with an indexer); 3-4: 9 (3); 5-7: 10 (2); and the MTP layer.
  EXPECT_EQ(split.shares[0].latent_layers.size(), 11u);
  EXPECT_EQ(split.shares[0].indexer_layers.size(), 4u);
  EXPECT_EQ(split.shares[3].latent_layers.size(), 10u);
  EXPECT_EQ(split.shares[7].indexer_layers.size(), 3u);
  EXPECT_EQ(split.shares[7].latent_layers.back(), 78);
  const int64_t largest = 11 * 656 + 4 * 132;  // 7,744 B/token
  EXPECT_EQ(split.bytes_per_token, largest);
  EXPECT_EQ(split.spec.num_pages, 10 * gib / (64 * largest));
  EXPECT_EQ(split.spec.latent_layers.size(), 79u);  // the engine numbers pages for all of them
  const KvCapacityPlan whole = plan_kv_capacity(config, KvDType::FP8, 10 * gib, 64, true);
  EXPECT_EQ(whole.bytes_per_token, 79 * 656 + 22 * 132);  // 54,728 B/token
  EXPECT_NEAR(static_cast<double>(split.spec.num_pages) / whole.spec.num_pages, 7.07, 0.01);
  EXPECT_NE(split.summary().find("split over 8 ranks (LayerSplit)"), std::string::npos);
  // One share (no LayerSplit) plans as before.
  const KvCapacityPlan one = plan_kv_capacity(config, KvDType::FP8, 10 * gib, 64, true,
                                              [](const KvCacheSpec& s) { return std::vector{s}; });
  EXPECT_TRUE(one.shares.empty());
  EXPECT_EQ(one.spec.num_pages, whole.spec.num_pages);
}

// On GPUs a rank that lacks a layer's pool keeps two more, the owners' pools
// of the layer being computed and of the next (the form that sends pools,
// ahead of use): the plan counts them, so the largest rank's 11 + 2 latent
// pools bound the pages.
TEST(KvCapacity, LayerSplitCountsTheBorrowedPool) {
  const ModelConfig config = glm_like();
  const ModelPlan plan = glm_layer_split_plan(config);
  const int64_t gib = int64_t{1} << 30;
  const KvCapacityPlan split =
      plan_kv_capacity(config, KvDType::FP8, 10 * gib, 64, true, [&](const KvCacheSpec& whole) {
        return layer_split_shares(plan, whole, /*borrowed_pools=*/2);
      });
  ASSERT_EQ(split.shares.size(), 8u);
  for (const KvCacheSpec& share : split.shares) EXPECT_EQ(share.borrowed_latent_pools, 2);
  const int64_t largest = (11 + 2) * 656 + 4 * 132;
  EXPECT_EQ(split.bytes_per_token, largest);
  EXPECT_EQ(split.spec.num_pages, 10 * gib / (64 * largest));
  EXPECT_EQ(split.spec.borrowed_latent_pools, 0);  // the engine's numbering of every pool
  EXPECT_NE(split.summary().find("11 latent + 4 indexer pools + 2 borrowed"), std::string::npos)
      << split.summary();
  // The host model's shares borrow none.
  const std::vector<KvCacheSpec> host = layer_split_shares(plan, split.spec);
  for (const KvCacheSpec& share : host) EXPECT_EQ(share.borrowed_latent_pools, 0);
}

TEST(KvCapacity, RejectsABudgetBelowOnePage) {
  EXPECT_THROW(plan_kv_capacity(glm_like(), KvDType::F32, 1000, 64, false), Error);
  ModelConfig no_mtp = glm_like();
  no_mtp.num_nextn_predict_layers = 0;
  EXPECT_THROW(plan_kv_capacity(no_mtp, KvDType::BF16, int64_t{1} << 30, 64, true), Error);
  EXPECT_STREQ(kv_dtype_name(KvDType::FP8), "fp8");
}

}  // namespace
}  // namespace megactx
