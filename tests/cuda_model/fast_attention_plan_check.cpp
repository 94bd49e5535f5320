// The host side of the CUDA model's fast DSA attention path
// (model/cuda/fast_attention_plan.h), on any machine: which models and caches
// take it, and the scratch bound's growth per token, per context and past
// the top-k's one-CTA limit, re-derived here from the buffers the path keeps
// (cuda_fast_attention_test checks the bound against the real allocation).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "io/model_config.h"
#include "model/cuda/fast_attention_plan.h"

namespace megactx {
namespace {

ModelConfig config_named(const std::string& name) {
  std::ifstream file(std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/configs/" + name + ".json");
  std::stringstream text;
  text << file.rdbuf();
  return parse_model_config(text.str());
}

TEST(FastAttentionPlan, WhichModelsAndCachesTakeTheFastPath) {
  for (const char* name : {"glm5_2", "deepseek_v32"}) {
    const ModelConfig config = config_named(name);
    EXPECT_TRUE(cuda_fast_attention_shapes(config)) << name;
    EXPECT_TRUE(cuda_fast_attention_used(config, KvDType::FP8, 64, true)) << name;
    EXPECT_FALSE(cuda_fast_attention_used(config, KvDType::FP8, 64, false)) << name;
    EXPECT_FALSE(cuda_fast_attention_used(config, KvDType::BF16, 64, true)) << name;
    EXPECT_FALSE(cuda_fast_attention_used(config, KvDType::F32, 64, true)) << name;
    EXPECT_FALSE(cuda_fast_attention_used(config, KvDType::FP8, 32, true)) << name;
  }
  ModelConfig config = config_named("tiny_glm");
  EXPECT_FALSE(cuda_fast_attention_shapes(config));
  EXPECT_EQ(cuda_fast_attention_scratch_bytes(config, 64, 4096, 2048), 0);
  config = config_named("glm5_2");
  config.index_n_heads = 65;  // more indexer heads than the kernels have
  EXPECT_FALSE(cuda_fast_attention_shapes(config));
  config = config_named("glm5_2");
  config.index_head_dim = 64;
  EXPECT_FALSE(cuda_fast_attention_shapes(config));
}

TEST(FastAttentionPlan, ScratchBoundGrowsAsTheBuffers) {
  const ModelConfig glm = config_named("glm5_2");             // 64 heads, 32 indexer heads
  const ModelConfig deepseek = config_named("deepseek_v32");  // 128 heads, 64 indexer heads
  // One more token adds at least its bf16 MLA query [heads, 576] and output
  // [heads, 512], its e4m3 indexer queries [index heads, 128], its slot
  // list min(top_k, context) and page list.
  auto per_token = [](const ModelConfig& c, int64_t context) {
    const int64_t columns = std::min<int64_t>(2048, context);
    return c.num_attention_heads * (2 * 576 + 2 * 512) + c.index_n_heads * 128 + 4 * columns +
           4 * ((context + 63) / 64);
  };
  for (const ModelConfig* c : {&glm, &deepseek})
    for (int64_t context : {100, 4096, 32768}) {
      const int64_t one = cuda_fast_attention_scratch_bytes(*c, 1, context, 2048);
      const int64_t two = cuda_fast_attention_scratch_bytes(*c, 2, context, 2048);
      const int64_t many = cuda_fast_attention_scratch_bytes(*c, 1000, context, 2048);
      EXPECT_GE(two - one, per_token(*c, context)) << context;
      EXPECT_EQ(many - one, 999 * (two - one)) << "linear in tokens, context " << context;
      // Longer contexts never need less.
      EXPECT_GE(cuda_fast_attention_scratch_bytes(*c, 1000, context + 1, 2048), many);
    }
  // Past 32K keys the radix top-k keeps a 16 KiB histogram per row.
  EXPECT_GE(cuda_fast_attention_scratch_bytes(glm, 100, 32769, 2048) -
                cuda_fast_attention_scratch_bytes(glm, 100, 32768, 2048),
            99 * 16384);
  // The split-K partial states and the fused indexer's candidate buffers
  // (two arrays of [CTAs, 16 rows, 8192] x 4 B) depend on the SM count only.
  EXPECT_EQ(cuda_fast_attention_scratch_bytes(glm, 8, 4096, 2048, 264) -
                cuda_fast_attention_scratch_bytes(glm, 8, 4096, 2048, 132),
            132 * 64 * 4 * 513 + 132 * 2 * 16 * 8192 * 4);
  EXPECT_EQ(cuda_fused_indexer_workspace_bytes(8, 264) - cuda_fused_indexer_workspace_bytes(8, 132),
            132 * 2 * 16 * 8192 * 4);
}

TEST(FastAttentionPlan, FusedIndexerTakesTheStepsPastTheScoresCap) {
  const ModelConfig glm = config_named("glm5_2");
  EXPECT_TRUE(cuda_fused_indexer_serves(glm, 2048));
  EXPECT_TRUE(cuda_fused_indexer_serves(glm, 1));
  EXPECT_FALSE(cuda_fused_indexer_serves(glm, 4096));  // wider than its candidate buffers
  EXPECT_FALSE(cuda_fused_indexer_serves(config_named("tiny_glm"), 2048));
  // Decode steps keep the two-kernel path; prefill chunks over long contexts do not.
  EXPECT_FALSE(cuda_fused_indexer_chosen(glm, 2048, 64, 1048576));
  EXPECT_TRUE(cuda_fused_indexer_chosen(glm, 2048, 65, 1048576));
  EXPECT_FALSE(cuda_fused_indexer_chosen(glm, 2048, 2048, 32768));
  EXPECT_TRUE(cuda_fused_indexer_chosen(glm, 2048, 16384, 131072));
  EXPECT_FALSE(cuda_fused_indexer_chosen(glm, 4096, 16384, 131072));
  // The scores the fast path keeps: capped where the fused path serves.
  EXPECT_EQ(cuda_fast_attention_score_floats(glm, 2048, 16384, 1052672), kCudaIndexerScoresCap);
  EXPECT_EQ(cuda_fast_attention_score_floats(glm, 2048, 16, 1024), 16 * 1024);
  EXPECT_EQ(cuda_fast_attention_score_floats(glm, 4096, 16384, 1052672), 16384LL * 1052672);
}

TEST(FastAttentionPlan, PastTheCapNothingGrowsWithTheContext) {
  // 16K-token prefill chunks: from 128K to 1M context the fast path's own
  // scratch does not grow (the two-kernel path's histograms only shrink: fewer
  // of its rows fit under the cap at longer contexts).
  for (const char* name : {"glm5_2", "deepseek_v32"}) {
    const ModelConfig config = config_named(name);
    const int64_t at_128k = cuda_fast_attention_scratch_bytes(config, 16640, 131072, 2048);
    const int64_t at_1m = cuda_fast_attention_scratch_bytes(config, 16640, 1052672, 2048);
    EXPECT_LE(at_1m, at_128k) << name;
    EXPECT_EQ(at_128k - at_1m, 16384 * (512 - 63)) << name;  // histograms: 512 rows vs 63
    std::printf("%s fast attention scratch, 16640-token steps: %.1f MiB at 128K, %.1f MiB at 1M\n",
                name, at_128k / 1048576.0, at_1m / 1048576.0);
  }
}

}  // namespace
}  // namespace megactx
