// ModelMetadata against what transformers 5.17 reads from the same files
// (metadata_golden.json, made by tools/fixtures/make_tokenizer_fixtures.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "fixture_util.h"
#include "tokenizer/model_metadata.h"

namespace megactx {
namespace {

using testing::fixture_dir;
using testing::read_json;

std::optional<std::string> optional_string(const nlohmann::json& value) {
  if (value.is_null()) return std::nullopt;
  return value.get<std::string>();
}

void expect_matches_transformers(const std::string& variant) {
  const ModelMetadata metadata = load_model_metadata(fixture_dir(variant));
  const auto golden = read_json(fixture_dir(variant) + "/metadata_golden.json");
  ASSERT_FALSE(golden.contains("error")) << golden["error"];
  EXPECT_EQ(metadata.bos_token, optional_string(golden["bos_token"]));
  EXPECT_EQ(metadata.eos_token, optional_string(golden["eos_token"]));
  EXPECT_EQ(metadata.pad_token, optional_string(golden["pad_token"]));
  EXPECT_EQ(metadata.unk_token, optional_string(golden["unk_token"]));

  const auto& chat_template = golden["chat_template"];
  if (chat_template.is_string()) {
    EXPECT_EQ(metadata.chat_template, chat_template.get<std::string>());
  } else {
    for (const auto& [name, text] : chat_template.items())
      EXPECT_EQ(metadata.template_named(name), text.get<std::string>()) << name;
    EXPECT_EQ(metadata.chat_template, chat_template["default"].get<std::string>());
  }

  const auto& generation = golden["generation"];
  std::vector<TokenId> eos;
  if (generation["eos_token_id"].is_array()) {
    eos = generation["eos_token_id"].get<std::vector<TokenId>>();
  } else if (!generation["eos_token_id"].is_null()) {
    eos = {generation["eos_token_id"].get<TokenId>()};
  }
  EXPECT_EQ(metadata.eos_token_ids, eos);
  auto optional_id = [](const nlohmann::json& v) {
    return v.is_null() ? std::nullopt : std::optional<TokenId>(v.get<TokenId>());
  };
  EXPECT_EQ(metadata.bos_token_id, optional_id(generation["bos_token_id"]));
  EXPECT_EQ(metadata.pad_token_id, optional_id(generation["pad_token_id"]));
  auto optional_double = [](const nlohmann::json& v) {
    return v.is_null() ? std::nullopt : std::optional<double>(v.get<double>());
  };
  EXPECT_EQ(metadata.temperature, optional_double(generation["temperature"]));
  EXPECT_EQ(metadata.top_p, optional_double(generation["top_p"]));
  EXPECT_EQ(metadata.top_k, generation["top_k"].is_null()
                                ? std::nullopt
                                : std::optional<int64_t>(generation["top_k"].get<int64_t>()));
  EXPECT_EQ(metadata.do_sample, std::optional<bool>(generation["do_sample"].get<bool>()));

  // transformers' eos_token_id is the tokenizer_config eos token's id.
  const auto tokenizer = Tokenizer::load(fixture_dir(variant));
  const auto stops = stop_token_ids(metadata, *tokenizer);
  EXPECT_NE(std::find(stops.begin(), stops.end(), golden["eos_token_id"].get<TokenId>()),
            stops.end());
}

TEST(ModelMetadata, GlmMatchesTransformers) {
  expect_matches_transformers("glm");
  // chat_template.jinja took precedence over tokenizer_config.json's string.
  const ModelMetadata metadata = load_model_metadata(fixture_dir("glm"));
  EXPECT_EQ(metadata.chat_template,
            testing::read_file(fixture_dir("glm") + "/chat_template.jinja"));
}

TEST(ModelMetadata, DeepSeekMatchesTransformers) {
  expect_matches_transformers("deepseek");
  const ModelMetadata metadata = load_model_metadata(fixture_dir("deepseek"));
  EXPECT_EQ(metadata.add_bos_token, std::optional<bool>(true));
  EXPECT_EQ(metadata.model_max_length, std::optional<int64_t>(131072));
}

TEST(ModelMetadata, MissingFilesAreEmpty) {
  const ModelMetadata metadata = load_model_metadata(fixture_dir("gpt2_nfc"));
  EXPECT_TRUE(metadata.chat_template.empty());
  EXPECT_TRUE(metadata.eos_token_ids.empty());
  EXPECT_FALSE(metadata.temperature.has_value());
  EXPECT_THROW(metadata.template_named(""), Error);
  EXPECT_THROW(load_model_metadata(fixture_dir("no_such_model")), Error);
}

TEST(ModelMetadata, UnknownTemplateNameIsAnError) {
  const ModelMetadata metadata = load_model_metadata(fixture_dir("deepseek"));
  try {
    metadata.template_named("rag");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("tool_use"), std::string::npos) << error.what();
  }
}

TEST(ModelMetadata, MalformedFilesNameTheFile) {
  const auto dir = std::filesystem::temp_directory_path() / "megactx_metadata_test";
  std::filesystem::create_directories(dir);
  auto write = [&](const char* name, const char* text) { std::ofstream(dir / name) << text; };
  write("tokenizer_config.json", "{\"eos_token\": 5}");
  try {
    load_model_metadata(dir.string());
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("tokenizer_config.json"), std::string::npos);
  }
  write("tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
  write("generation_config.json", "{\"eos_token_id\": [1, \"x\"]}");
  EXPECT_THROW(load_model_metadata(dir.string()), Error);
  write("generation_config.json", "{not json");
  EXPECT_THROW(load_model_metadata(dir.string()), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace megactx
