// Capacity planning with the per-token layouts of cache/kv_cache.h worked out
// by hand: GLM-5-like schedule (78 layers, 21 with an indexer).
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/kv_capacity.h"

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

TEST(KvCapacity, MtpLayerAddsALatentAndAnIndexerPool) {
  KvCapacityPlan plan = plan_kv_capacity(glm_like(), KvDType::BF16, int64_t{1} << 30, 64, true);
  EXPECT_EQ(plan.spec.latent_layers.back(), 78);
  EXPECT_EQ(plan.spec.indexer_layers.back(), 78);
  EXPECT_EQ(plan.bytes_per_token, 79 * 1152 + 22 * 256);
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
