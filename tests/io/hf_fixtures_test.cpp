// Against checkpoints written by Hugging Face transformers 5.17
// (tests/fixtures/hf, made by tools/fixtures/make_hf_fixtures.py): our config
// parser resolves the same indexer schedule HF did (reference.json), our
// expected tensor layout matches save_pretrained's names, shapes and dtypes
// exactly, and our parameter count equals HF's index metadata.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "io/checkpoint.h"
#include "io/model_summary.h"
#include "io/tensor_layout.h"

namespace megactx {
namespace {

std::string fixture_dir(const std::string& name) {
  return std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/hf/" + name;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream file(path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, ScheduleLayoutAndDtypes) {
  const std::string dir = fixture_dir(GetParam());
  const nlohmann::json reference = read_json(dir + "/reference.json");
  auto checkpoint = Checkpoint::open(dir);
  const ModelConfig& config = checkpoint->config();

  // HF's resolved indexer_types.
  std::vector<std::string> ours;
  for (auto type : config.indexer_types)
    ours.push_back(type == IndexerType::Full ? "full" : "shared");
  EXPECT_EQ(ours, reference["indexer_types"].get<std::vector<std::string>>());

  const LayoutCheck check = check_layout(config, checkpoint->names());
  EXPECT_TRUE(check.missing.empty()) << "first missing: " << check.missing.front();
  EXPECT_TRUE(check.unexpected.empty()) << "first unexpected: " << check.unexpected.front();

  const std::string stored = reference["stored_dtype"].get<std::string>();
  const DType plain = stored == "float32" ? DType::F32 : DType::BF16;
  for (const auto& spec : expected_tensors(config, false)) {
    if (!checkpoint->has(spec.name)) continue;  // reported above
    EXPECT_EQ(checkpoint->shape_of(spec.name), spec.shape) << spec.name;
    DType want = plain;
    if (stored == "fp8" && spec.quantized) {
      want = DType::F8_E4M3;
      const std::string scale = spec.name + "_scale_inv";
      EXPECT_EQ(checkpoint->shape_of(scale), scale_shape(config, spec.shape)) << scale;
      checkpoint->get(scale, scale_shape(config, spec.shape), DType::F32);
    } else if (stored == "fp8" && spec.name.ends_with("e_score_correction_bias")) {
      want = DType::F32;
    }
    EXPECT_EQ(checkpoint->dtype_of(spec.name), want) << spec.name;
    checkpoint->get_float(spec.name, spec.shape);
  }
  EXPECT_TRUE(checkpoint->unrequested().empty());
}

INSTANTIATE_TEST_SUITE_P(All, HfFixture,
                         ::testing::Values("glm_bf16", "glm_fp8", "glm_pattern", "glm_schedule",
                                           "dsv32_yarn"));

TEST(HfFixture, ParameterCountMatchesHfIndex) {
  const std::string dir = fixture_dir("glm_schedule");
  const nlohmann::json index = read_json(dir + "/model.safetensors.index.json");
  const ModelSummary summary = summarize_model(load_model_config(dir));
  EXPECT_EQ(summary.params_total, index["metadata"]["total_parameters"].get<int64_t>());
  // fp32 weights: 4 bytes each, like HF's total_size.
  EXPECT_EQ(summary.weight_bytes, index["metadata"]["total_size"].get<int64_t>());
}

TEST(HfFixture, YarnFromLegacyRopeScaling) {
  const ModelConfig config = load_model_config(fixture_dir("dsv32_yarn"));
  EXPECT_EQ(config.rope.rope_type, "yarn");
  EXPECT_DOUBLE_EQ(config.rope.factor, 4.0);
  EXPECT_EQ(config.rope.original_max_position_embeddings, 32);
  EXPECT_DOUBLE_EQ(config.rope.mscale_all_dim, 0.8);
  EXPECT_EQ(config.n_group, 4);
  EXPECT_EQ(config.topk_group, 2);
  EXPECT_FALSE(config.indexer_rope_interleave);
}

}  // namespace
}  // namespace megactx
