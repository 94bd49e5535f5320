// parse_model_config against the public model cards' numbers and HF's
// defaulting rules (configuration_glm_moe_dsa.py / configuration_deepseek_v32.py).
#include "io/model_config.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace megactx {
namespace {

std::string fixture(const std::string& name) {
  std::ifstream file(std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/configs/" + name);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

nlohmann::json fixture_json(const std::string& name) {
  return nlohmann::json::parse(fixture(name));
}

ModelConfig parse(const nlohmann::json& json) {
  return parse_model_config(json.dump());
}

// Expects an Error whose message contains `needle`.
void expect_error(const nlohmann::json& json, const std::string& needle) {
  try {
    parse(json);
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
        << "message: " << error.what();
  }
}

TEST(ModelConfig, Glm52Shape) {
  const ModelConfig config = parse_model_config(fixture("glm5_2.json"));
  EXPECT_EQ(config.model_type, ModelType::GlmMoeDsa);
  EXPECT_EQ(config.model_type_name, "glm_moe_dsa");
  EXPECT_EQ(config.num_hidden_layers, 78);
  EXPECT_EQ(config.hidden_size, 6144);
  EXPECT_EQ(config.vocab_size, 154880);
  EXPECT_EQ(config.q_lora_rank, 2048);
  EXPECT_EQ(config.kv_lora_rank, 512);
  EXPECT_EQ(config.qk_head_dim(), 256);
  EXPECT_EQ(config.v_head_dim, 256);
  EXPECT_EQ(config.index_n_heads, 32);
  EXPECT_EQ(config.index_topk_freq, 4);
  EXPECT_EQ(config.index_skip_topk_offset, 3);
  EXPECT_DOUBLE_EQ(config.rope.rope_theta, 8e6);
  EXPECT_EQ(config.rope.rope_type, "default");
  EXPECT_TRUE(config.indexer_rope_interleave);
  EXPECT_DOUBLE_EQ(config.rms_norm_eps, 1e-5);
  EXPECT_EQ(config.num_nextn_predict_layers, 1);
  EXPECT_TRUE(config.index_share_for_mtp_iteration);
  EXPECT_EQ(config.eos_token_ids, (std::vector<int64_t>{154820, 154827, 154829}));
  EXPECT_EQ(config.pad_token_id, 154820);
  EXPECT_FALSE(config.is_fp8_checkpoint());

  // Full layers {0, 1, 2, 6, 10, ..., 74} (model card): 21 of them.
  std::vector<int64_t> expected = {0, 1, 2};
  for (int64_t layer = 6; layer <= 74; layer += 4) expected.push_back(layer);
  EXPECT_EQ(config.full_indexer_layers(), expected);
  EXPECT_EQ(config.full_indexer_layers().size(), 21u);
  EXPECT_EQ(config.indexer_source_layer(5), 2);
  EXPECT_EQ(config.indexer_source_layer(6), 6);
  EXPECT_EQ(config.indexer_source_layer(77), 74);
  for (int64_t layer = 0; layer < 78; ++layer) EXPECT_EQ(config.layer_is_moe(layer), layer >= 3);
  EXPECT_TRUE(config.mtp_layer_is_moe());
}

TEST(ModelConfig, DeepseekV32Shape) {
  const ModelConfig config = parse_model_config(fixture("deepseek_v32.json"));
  EXPECT_EQ(config.model_type, ModelType::DeepseekV32);
  EXPECT_EQ(config.num_hidden_layers, 61);
  EXPECT_EQ(config.num_attention_heads, 128);
  EXPECT_EQ(config.q_lora_rank, 1536);
  EXPECT_EQ(config.qk_head_dim(), 192);
  EXPECT_EQ(config.n_group, 8);
  EXPECT_EQ(config.topk_group, 4);
  EXPECT_FALSE(config.indexer_rope_interleave);  // V3.2's indexer rotates half-split
  EXPECT_TRUE(config.rope_interleave);
  // Legacy rope_scaling with "type" + top-level rope_theta.
  EXPECT_EQ(config.rope.rope_type, "yarn");
  EXPECT_DOUBLE_EQ(config.rope.factor, 40.0);
  EXPECT_DOUBLE_EQ(config.rope.rope_theta, 10000.0);
  EXPECT_EQ(config.rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(config.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(config.rope.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(config.rope.mscale, 1.0);
  EXPECT_DOUBLE_EQ(config.rope.mscale_all_dim, 1.0);
  EXPECT_TRUE(config.is_fp8_checkpoint());
  EXPECT_EQ(config.quantization.weight_block_size, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(config.quantization.scale_fmt, "ue8m0");
  EXPECT_EQ(config.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_EQ(config.full_indexer_layers().size(), 61u);  // every layer runs its indexer
  EXPECT_EQ(config.torch_dtype, "bfloat16");

  // DeepseekV32Config ignores the GLM schedule knobs: still every layer full.
  auto json = fixture_json("deepseek_v32.json");
  json["index_topk_freq"] = 4;
  json["index_skip_topk_offset"] = 3;
  json["index_topk_pattern"] = std::string(61, 'S').replace(0, 1, "F");
  EXPECT_EQ(parse(json).full_indexer_layers().size(), 61u);
}

TEST(ModelConfig, HfDefaultsWhenFieldsAreAbsent) {
  // Only model_type: every other field takes the HF class default.
  const ModelConfig glm = parse(nlohmann::json{{"model_type", "glm_moe_dsa"}});
  EXPECT_EQ(glm.num_hidden_layers, 78);
  EXPECT_EQ(glm.hidden_size, 6144);
  EXPECT_DOUBLE_EQ(glm.rms_norm_eps, 1e-5);
  EXPECT_EQ(glm.index_n_heads, 32);
  EXPECT_EQ(glm.max_position_embeddings, 202752);
  EXPECT_DOUBLE_EQ(glm.rope.rope_theta, 10000.0);
  EXPECT_EQ(glm.bos_token_id, 0);
  EXPECT_EQ(glm.eos_token_ids, (std::vector<int64_t>{1}));
  EXPECT_FALSE(glm.pad_token_id.has_value());
  // index_topk_freq defaults to 1 (offset 2): every layer full.
  EXPECT_EQ(glm.full_indexer_layers().size(), 78u);
  EXPECT_EQ(glm.first_k_dense_replace, 3);

  const ModelConfig deepseek = parse(nlohmann::json{{"model_type", "deepseek_v32"}});
  EXPECT_EQ(deepseek.num_hidden_layers, 61);
  EXPECT_DOUBLE_EQ(deepseek.rms_norm_eps, 1e-6);
  EXPECT_EQ(deepseek.index_n_heads, 64);
  EXPECT_EQ(deepseek.n_group, 8);
  EXPECT_EQ(deepseek.topk_group, 4);
  EXPECT_EQ(deepseek.qk_nope_head_dim, 128);
}

TEST(ModelConfig, GlmDefaultOffsetIsTwo) {
  // HF: offset defaults to 2 for glm_moe_dsa, so with freq 4 the full layers are
  // those where max(i - 1, 0) % 4 == 0: 0, 1, 5, 9.
  auto json = fixture_json("tiny_glm.json");
  json.erase("index_skip_topk_offset");
  json["num_hidden_layers"] = 10;
  json["index_topk_freq"] = 4;
  EXPECT_EQ(parse(json).full_indexer_layers(), (std::vector<int64_t>{0, 1, 5, 9}));
  json["index_topk_freq"] = 0;  // clamped to 1 like HF
  EXPECT_EQ(parse(json).full_indexer_layers().size(), 10u);
}

TEST(ModelConfig, ExplicitIndexerSchedules) {
  auto json = fixture_json("tiny_glm.json");
  json["index_topk_pattern"] = "FSFF";
  EXPECT_EQ(parse(json).full_indexer_layers(), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(parse(json).index_topk_pattern, "FSFF");
  // indexer_types wins over the pattern.
  json["indexer_types"] = {"full", "full", "shared", "shared"};
  EXPECT_EQ(parse(json).full_indexer_layers(), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(parse(json).indexer_source_layer(3), 1);
  // A pattern given as a list, like HF accepts.
  json.erase("indexer_types");
  json["index_topk_pattern"] = {"full", "shared", "shared", "full"};
  EXPECT_EQ(parse(json).full_indexer_layers(), (std::vector<int64_t>{0, 3}));
  // Derived (tiny: freq 2, offset 1 -> even layers).
  EXPECT_EQ(parse(fixture_json("tiny_glm.json")).full_indexer_layers(),
            (std::vector<int64_t>{0, 2}));
}

TEST(ModelConfig, MlpLayerTypes) {
  auto json = fixture_json("tiny_glm.json");
  EXPECT_FALSE(parse(json).layer_is_moe(0));
  EXPECT_TRUE(parse(json).layer_is_moe(1));
  json["mlp_layer_types"] = {"dense", "sparse", "dense", "sparse"};
  const ModelConfig config = parse(json);
  EXPECT_FALSE(config.layer_is_moe(2));
  EXPECT_TRUE(config.layer_is_moe(3));
  json["first_k_dense_replace"] = 99;  // clamped to the layer count like HF
  json.erase("mlp_layer_types");
  json["num_nextn_predict_layers"] = 0;
  EXPECT_FALSE(parse(json).layer_is_moe(3));
}

TEST(ModelConfig, RopeParametersAndYarn) {
  auto json = fixture_json("tiny_glm.json");
  json["rope_parameters"] = {{"rope_type", "yarn"},
                             {"rope_theta", 50000},
                             {"factor", 4},
                             {"original_max_position_embeddings", 64},
                             {"mscale_all_dim", 0.707}};
  ModelConfig config = parse(json);
  EXPECT_EQ(config.rope.rope_type, "yarn");
  EXPECT_DOUBLE_EQ(config.rope.rope_theta, 50000.0);
  EXPECT_DOUBLE_EQ(config.rope.factor, 4.0);
  EXPECT_EQ(config.rope.original_max_position_embeddings, 64);
  EXPECT_DOUBLE_EQ(config.rope.mscale_all_dim, 0.707);
  EXPECT_DOUBLE_EQ(config.rope.beta_fast, 32.0);
  // The legacy rope_scaling wins over rope_parameters (HF BC rule).
  json["rope_scaling"] = {{"type", "default"}};
  json["rope_theta"] = 1234;
  config = parse(json);
  EXPECT_EQ(config.rope.rope_type, "default");
  EXPECT_DOUBLE_EQ(config.rope.rope_theta, 1234.0);
  // YaRN without original_max_position_embeddings falls back to max_position_embeddings.
  json.erase("rope_scaling");
  json["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 2}};
  EXPECT_EQ(parse(json).rope.original_max_position_embeddings, 256);
}

TEST(ModelConfig, EosAndQLora) {
  auto json = fixture_json("tiny_glm.json");
  json["eos_token_id"] = {1, 2};
  EXPECT_EQ(parse(json).eos_token_ids, (std::vector<int64_t>{1, 2}));
  json["eos_token_id"] = nullptr;
  EXPECT_TRUE(parse(json).eos_token_ids.empty());
  json["q_lora_rank"] = nullptr;
  EXPECT_FALSE(parse(json).q_lora_rank.has_value());
  json["max_position_embeddings"] = 4096.0;  // integral float accepted
  EXPECT_EQ(parse(json).max_position_embeddings, 4096);
}

TEST(ModelConfig, ErrorsNameTheField) {
  const auto base = fixture_json("tiny_glm.json");
  auto json = base;
  json["model_type"] = "llama";
  expect_error(json, "model_type");
  json = base;
  json.erase("model_type");
  expect_error(json, "model_type");
  json = base;
  json["hidden_size"] = "big";
  expect_error(json, "'hidden_size' must be an integer");
  json = base;
  json["hidden_size"] = 12.5;
  expect_error(json, "hidden_size");
  json = base;
  json["num_hidden_layers"] = 0;
  expect_error(json, "num_hidden_layers");
  json = base;
  json["indexer_types"] = {"full", "shared"};
  expect_error(json, "indexer_types");
  json = base;
  json["indexer_types"] = {"full", "shared", "sometimes", "full"};
  expect_error(json, "indexer_types");
  json = base;
  json["indexer_types"] = {"shared", "full", "full", "full"};
  expect_error(json, "layer 0");
  json = base;
  json["index_topk_pattern"] = "FSXF";
  expect_error(json, "index_topk_pattern");
  json = base;
  json["index_topk_pattern"] = "FSF";
  expect_error(json, "index_topk_pattern");
  json = base;
  json["mlp_layer_types"] = {"dense"};
  expect_error(json, "mlp_layer_types");
  json = base;
  json["num_experts_per_tok"] = 5;
  expect_error(json, "num_experts_per_tok");
  json = base;
  json["n_group"] = 3;
  expect_error(json, "n_group");
  json = base;
  json["qk_rope_head_dim"] = 5;
  expect_error(json, "qk_rope_head_dim");
  json = base;
  json["eos_token_id"] = 1000;
  expect_error(json, "eos_token_id");
  json = base;
  json["eos_token_id"] = {1, "x"};
  expect_error(json, "eos_token_id");
  json = base;
  json["rope_parameters"] = {{"rope_type", "longrope"}};
  expect_error(json, "rope_type");
  json = base;
  json["rope_parameters"] = {{"rope_type", "yarn"}};
  expect_error(json, "factor");
  json = base;
  json["quantization_config"] = {{"quant_method", "awq"}};
  expect_error(json, "quant_method");
  json = base;
  json["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128}}};
  expect_error(json, "weight_block_size");
  json = base;
  json["tie_word_embeddings"] = "no";
  expect_error(json, "tie_word_embeddings");

  EXPECT_THROW(parse_model_config("{\"model_type\": "), Error);
  EXPECT_THROW(parse_model_config("[1, 2]"), Error);
  EXPECT_THROW(parse_model_config(""), Error);
}

TEST(ModelConfig, LoadFromDirectory) {
  EXPECT_THROW(load_model_config("/nonexistent/megactx"), Error);
  try {
    load_model_config("/nonexistent/megactx");
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent/megactx/config.json"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace megactx
