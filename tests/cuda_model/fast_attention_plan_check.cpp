// The host side of the CUDA model's fast DSA attention path
// (model/cuda_fast_attention_plan.h), on any machine: which models and caches
// take it, and the scratch bound's growth per token, per context and past
// the top-k's one-CTA limit, re-derived here from the buffers the path keeps
// (cuda_fast_attention_test checks the bound against the real allocation).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "io/model_config.h"
#include "model/cuda_fast_attention_plan.h"

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
  // [heads, 512], its bf16 + e4m3 indexer queries [index heads, 128], its
  // slot list min(top_k, context) and page list.
  auto per_token = [](const ModelConfig& c, int64_t context) {
    const int64_t columns = std::min<int64_t>(2048, context);
    return c.num_attention_heads * (2 * 576 + 2 * 512) + c.index_n_heads * 128 * 3 + 4 * columns +
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
  // The split-K partial states depend on the SM count only.
  EXPECT_EQ(cuda_fast_attention_scratch_bytes(glm, 8, 4096, 2048, 264) -
                cuda_fast_attention_scratch_bytes(glm, 8, 4096, 2048, 132),
            132 * 64 * 4 * 513);
}

}  // namespace
}  // namespace megactx
