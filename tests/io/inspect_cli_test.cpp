// `megactx inspect` end to end: the JSON facts for the GLM-5.2-shaped config,
// and bad input giving one error line and a non-zero exit. Runs the built
// binary (skipped when the megactx target has not been built in this tree).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "test_files.h"

namespace megactx {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

std::string binary() {
  return std::string(MEGACTX_BINARY_DIR) + "/megactx";
}

std::string slurp(const std::string& path) {
  std::ifstream file(path);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

RunResult run(const std::string& arguments) {
  testing::TempDir scratch;
  const std::string command =
      binary() + " " + arguments + " >" + scratch.file("out") + " 2>" + scratch.file("err");
  const int status = std::system(command.c_str());
  RunResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = slurp(scratch.file("out"));
  result.err = slurp(scratch.file("err"));
  return result;
}

// GTEST_SKIP only leaves the function it is in, so this is a macro.
#define SKIP_WITHOUT_BINARY() \
  if (!std::filesystem::exists(binary())) GTEST_SKIP() << binary() << " not built"

std::string config_dir(const testing::TempDir& dir, const std::string& fixture) {
  std::filesystem::copy_file(std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/configs/" + fixture,
                             dir.file("config.json"));
  return dir.path();
}

TEST(InspectCli, Glm52Json) {
  SKIP_WITHOUT_BINARY();
  testing::TempDir dir;
  const RunResult result =
      run("inspect --model " + config_dir(dir, "glm5_2.json") + " --json --memory 80GiB");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto j = nlohmann::json::parse(result.out);
  EXPECT_EQ(j["full_indexer_layers"], 21);
  EXPECT_EQ(j["kv_bytes_per_token_fp8"], 53940);
  EXPECT_EQ(j["kv_bytes_per_token_bf16"], 95232);
  EXPECT_EQ(j["tokens_fit_fp8"], (80ull << 30) / 53940);
  EXPECT_GT(j["params_total"].get<int64_t>(), j["params_active"].get<int64_t>());
  EXPECT_EQ(j["mtp_layers"], 1);
}

TEST(InspectCli, TextOutput) {
  SKIP_WITHOUT_BINARY();
  testing::TempDir dir;
  const RunResult result = run("inspect --model " + config_dir(dir, "glm5_2.json"));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("21 full, 57 shared"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("53940"), std::string::npos);
  EXPECT_NE(result.out.find("[MTP]"), std::string::npos);
}

void expect_one_line_error(const RunResult& result, const std::string& needle) {
  EXPECT_NE(result.exit_code, 0);
  EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  EXPECT_NE(result.err.find(needle), std::string::npos) << result.err;
}

TEST(InspectCli, BadInput) {
  SKIP_WITHOUT_BINARY();
  testing::TempDir dir;
  expect_one_line_error(run("inspect --model " + dir.file("absent")), "config.json");
  testing::write_bytes(dir.file("config.json"), "{\"model_type\": \"glm_moe_dsa\",");
  expect_one_line_error(run("inspect --model " + dir.path()), "not valid JSON");
  testing::write_bytes(dir.file("config.json"), "{\"model_type\": \"llama\"}");
  expect_one_line_error(run("inspect --model " + dir.path()), "model_type");

  testing::TempDir weights;
  config_dir(weights, "tiny_glm.json");
  testing::write_bytes(weights.file("model.safetensors"), testing::u64_le(16) + "{\"a\":");
  expect_one_line_error(run("inspect --check-weights --model " + weights.path()),
                        "model.safetensors");
  expect_one_line_error(run("inspect --model " + weights.path() + " --memory 12parsecs"), "unit");
}

}  // namespace
}  // namespace megactx
