// inspect's numbers: the GLM-5.2 figures from the issue (21 full indexer
// layers, 53,940 B/token fp8), hand-counted parameters of a tiny config, the
// tensor layout and memory-size parsing.
#include "io/model_summary.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/tensor_layout.h"

namespace megactx {
namespace {

ModelConfig fixture(const std::string& name) {
  std::ifstream file(std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/configs/" + name);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return parse_model_config(buffer.str());
}

TEST(ModelSummary, Glm52IssueNumbers) {
  const ModelSummary s = summarize_model(fixture("glm5_2.json"), 80ull << 30);
  EXPECT_EQ(s.full_indexer_layer_ids.size(), 21u);
  EXPECT_EQ(s.kv_bytes_per_token_fp8, 656 * 78 + 132 * 21);
  EXPECT_EQ(s.kv_bytes_per_token_fp8, 53940);
  EXPECT_EQ(s.kv_bytes_per_token_bf16, (512 + 64) * 2 * 78 + 128 * 2 * 21);
  EXPECT_EQ(s.kv_bytes_per_token_fp8_mtp, 656 + 132);
  EXPECT_EQ(s.dense_layers, 3);
  EXPECT_EQ(s.moe_layers, 75);

  const nlohmann::json j = summary_to_json(s);
  EXPECT_EQ(j["full_indexer_layers"], 21);
  EXPECT_EQ(j["kv_bytes_per_token_fp8"], 53940);
  EXPECT_EQ(j["kv_bytes_per_token_bf16"], 95232);
  EXPECT_EQ(j["tokens_fit_fp8"], (80ull << 30) / 53940);
  EXPECT_EQ(j["params_total"], s.params_total);
  EXPECT_EQ(j["params_active"], s.params_active);
  // The model card: about 744B parameters, about 40B active.
  EXPECT_NEAR(s.params_total / 1e9, 744, 2);
  EXPECT_NEAR(s.params_active / 1e9, 40, 1);
}

TEST(ModelSummary, DeepseekV32Numbers) {
  const ModelSummary s = summarize_model(fixture("deepseek_v32.json"));
  EXPECT_EQ(s.kv_bytes_per_token_fp8, (656 + 132) * 61);
  // DeepSeek-V3: 671B main model + 14B MTP module, 37B activated.
  EXPECT_NEAR(s.params_total / 1e9, 671, 2);
  EXPECT_NEAR(s.params_mtp / 1e9, 14, 1);
  EXPECT_NEAR(s.params_active / 1e9, 37, 1);
}

TEST(ModelSummary, TinyHandCounted) {
  // tiny_glm.json counted by hand (see the comments for each term).
  const ModelSummary s = summarize_model(fixture("tiny_glm.json"));
  const int64_t attention = 2 * 32         // input/post norms
                            + 24 * 32      // q_a_proj
                            + 24           // q_a_layernorm
                            + 2 * 12 * 24  // q_b_proj: heads * (nope 8 + rope 4) x q_lora
                            + 20 * 32      // kv_a_proj_with_mqa: (kv_lora 16 + rope 4) x hidden
                            + 16           // kv_a_layernorm
                            + 2 * 16 * 16  // kv_b_proj: heads * (nope 8 + v 8) x kv_lora
                            + 32 * 16;     // o_proj: hidden x heads * v
  const int64_t indexer = 16 * 24 + 8 * 32 + 8 + 8 + 2 * 32;
  const int64_t dense = 3 * 48 * 32;
  // The router's e_score_correction_bias is a buffer, not a parameter (as in HF).
  const int64_t experts = 4 * 3 * 16 * 32, shared = 3 * 16 * 32, router = 4 * 32;
  const int64_t moe = experts + shared + router;
  const int64_t layers = (attention + indexer + dense)  // layer 0: full, dense
                         + (attention + moe)            // 1: shared, MoE
                         + (attention + indexer + moe)  // 2: full, MoE
                         + (attention + moe);           // 3: shared, MoE
  EXPECT_EQ(s.params_total, 64 * 32 * 2 + 32 + layers);
  EXPECT_EQ(s.params_active, s.params_total - 3 * experts / 2 - (64 * 32 - 32));
  EXPECT_EQ(s.params_embedding, 64 * 32 * 2);
  const int64_t mtp = attention + indexer + moe + 32 + 32 + 32 * 64 + 32;
  EXPECT_EQ(s.params_mtp, mtp);
  EXPECT_EQ(s.params_mtp_active, mtp - experts / 2);
  // fp8: latent 16 + one scale (4) + rope 4 * 2; indexer 8 + one scale.
  EXPECT_EQ(s.kv_bytes_per_token_fp8, 28 * 4 + 12 * 2);
  EXPECT_EQ(s.kv_bytes_per_token_bf16, 40 * 4 + 16 * 2);
  EXPECT_EQ(s.weight_bytes,
            (s.params_total + s.params_mtp) * 2 + 4 * 4 * 4 /* 4 f32 router biases of 4 */);
}

TEST(TensorLayout, SharedLayersHaveNoIndexerAndMtpIsRecognized) {
  const ModelConfig config = fixture("tiny_glm.json");
  std::vector<std::string> names;
  for (bool mtp : {false, true})
    for (const auto& spec : expected_tensors(config, mtp)) names.push_back(spec.name);
  auto has = [&](const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  EXPECT_TRUE(has("model.layers.0.self_attn.indexer.wq_b.weight"));
  EXPECT_FALSE(has("model.layers.1.self_attn.indexer.wq_b.weight"));
  EXPECT_TRUE(has("model.layers.2.self_attn.indexer.weights_proj.weight"));
  EXPECT_TRUE(has("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_TRUE(has("model.layers.1.mlp.experts.3.down_proj.weight"));
  EXPECT_TRUE(has("model.layers.1.mlp.shared_experts.up_proj.weight"));
  EXPECT_TRUE(has("model.layers.4.eh_proj.weight"));
  EXPECT_TRUE(has("model.layers.4.self_attn.indexer.wk.weight"));
  EXPECT_FALSE(has("model.layers.4.embed_tokens.weight"));  // GLM reuses the target's

  LayoutCheck check = check_layout(config, {"model.embed_tokens.weight", "bogus"});
  EXPECT_EQ(check.unexpected, (std::vector<std::string>{"bogus"}));
  EXPECT_EQ(check.missing.size(), names.size() - 1);

  const ModelConfig deepseek = fixture("deepseek_v32.json");
  bool scale_expected = false;
  for (const auto& spec : expected_tensors(deepseek, false))
    if (spec.name == "model.layers.3.mlp.experts.0.gate_proj.weight") {
      scale_expected = spec.quantized;
      EXPECT_EQ(scale_shape(deepseek, spec.shape), (Shape{16, 56}));  // 2048/128, 7168/128
    }
  EXPECT_TRUE(scale_expected);
  const auto mtp = expected_tensors(deepseek, true);
  EXPECT_TRUE(std::any_of(mtp.begin(), mtp.end(), [](const TensorSpec& spec) {
    return spec.name == "model.layers.61.shared_head.head.weight";
  }));
}

TEST(ModelSummary, MemorySizes) {
  EXPECT_EQ(parse_memory_size("80GiB"), 80ull << 30);
  EXPECT_EQ(parse_memory_size("80 GB"), 80'000'000'000ull);
  EXPECT_EQ(parse_memory_size("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_memory_size("1.5TiB"), 3ull << 39);
  EXPECT_EQ(parse_memory_size("80g"), 80ull << 30);
  EXPECT_EQ(parse_memory_size("1234"), 1234u);
  EXPECT_THROW(parse_memory_size("GiB"), Error);
  EXPECT_THROW(parse_memory_size("80 parsecs"), Error);
  EXPECT_THROW(parse_memory_size(""), Error);
  EXPECT_THROW(parse_memory_size("1e30"), Error);
}

}  // namespace
}  // namespace megactx
