// generation_config.json: eos ids (int or list) merged with config.json's,
// sampling defaults, and a clear error for a malformed file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/engine_config.h"

namespace megactx {
namespace {

std::string write_dir(const std::string& name, const std::string& json) {
  const auto dir = std::filesystem::path(MEGACTX_BINARY_DIR) / "generation_defaults_test" / name;
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "generation_config.json") << json;
  return dir.string();
}

TEST(GenerationDefaults, MergesEosIdsAndReadsSamplingDefaults) {
  const std::string dir = write_dir(
      "list", R"({"eos_token_id": [5, 7, 1], "temperature": 0.6, "top_p": 0.95, "top_k": 40})");
  const GenerationDefaults defaults = load_generation_defaults(dir, {1});
  EXPECT_EQ(defaults.eos_token_ids, (std::vector<int32_t>{1, 5, 7}));
  EXPECT_DOUBLE_EQ(defaults.temperature.value(), 0.6);
  EXPECT_DOUBLE_EQ(defaults.top_p.value(), 0.95);
  EXPECT_EQ(defaults.top_k.value(), 40);
}

TEST(GenerationDefaults, SingleIdMissingFileAndErrors) {
  EXPECT_EQ(
      load_generation_defaults(write_dir("single", R"({"eos_token_id": 9})"), {}).eos_token_ids,
      (std::vector<int32_t>{9}));
  const GenerationDefaults none = load_generation_defaults("/nonexistent-dir", {2});
  EXPECT_EQ(none.eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_FALSE(none.temperature.has_value());
  EXPECT_THROW(load_generation_defaults(write_dir("broken", "{not json"), {}), Error);
  EXPECT_THROW(load_generation_defaults(write_dir("wrong", R"({"eos_token_id": "x"})"), {}), Error);
  EXPECT_THROW(load_generation_defaults(write_dir("negative", R"({"eos_token_id": -3})"), {}),
               Error);
}

}  // namespace
}  // namespace megactx
