// Checkpoint: single-file and sharded directories, name/shape/dtype checks,
// the list of tensors never asked for, and broken directories.
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "test_files.h"

namespace megactx {
namespace {

using testing::pod_bytes;
using testing::RawTensor;
using testing::safetensors_bytes;

void copy_config(const testing::TempDir& dir) {
  std::filesystem::copy_file(
      std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/configs/tiny_glm.json",
      dir.file("config.json"));
}

void expect_error(const std::function<void()>& action, const std::string& needle) {
  try {
    action();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
        << "message: " << error.what();
  }
}

TEST(Checkpoint, SingleFile) {
  testing::TempDir dir;
  copy_config(dir);
  const std::vector<float> norm = {1, 2, 3, 4};
  testing::write_bytes(dir.file("model.safetensors"),
                       safetensors_bytes({{"model.norm.weight", "F32", {4}, pod_bytes(norm)},
                                          {"model.embed", "BF16", {2, 2}, std::string(8, '\0')},
                                          {"extra", "U8", {1}, "x"}}));
  auto checkpoint = Checkpoint::open(dir.path());
  EXPECT_EQ(checkpoint->config().num_hidden_layers, 4);
  EXPECT_EQ(checkpoint->directory(), dir.path());
  EXPECT_TRUE(checkpoint->has("model.norm.weight"));
  EXPECT_FALSE(checkpoint->has("nope"));
  EXPECT_EQ(checkpoint->dtype_of("model.embed"), DType::BF16);
  EXPECT_EQ(checkpoint->shape_of("model.embed"), (Shape{2, 2}));
  EXPECT_EQ(checkpoint->names(),
            (std::vector<std::string>{"extra", "model.embed", "model.norm.weight"}));

  const Tensor weight = checkpoint->get("model.norm.weight", {4}, DType::F32);
  EXPECT_EQ(weight.data<float>()[3], 4.0f);
  EXPECT_EQ(checkpoint->get_float("model.embed", {2, 2}).dtype(), DType::BF16);
  EXPECT_EQ(checkpoint->unrequested(), (std::vector<std::string>{"extra"}));

  expect_error([&] { checkpoint->get("model.norm.weight", {2, 2}, DType::F32); }, "shape [4]");
  expect_error([&] { checkpoint->get("model.norm.weight", {4}, DType::BF16); }, "dtype F32");
  expect_error([&] { checkpoint->get("missing.weight", {4}, DType::F32); }, "missing.weight");
  expect_error([&] { checkpoint->get_float("extra", {1}); }, "floating");
  // A failed request does not count as requested.
  EXPECT_EQ(checkpoint->unrequested(), (std::vector<std::string>{"extra"}));
}

TEST(Checkpoint, Sharded) {
  testing::TempDir dir;
  copy_config(dir);
  testing::write_bytes(dir.file("model-00001-of-00002.safetensors"),
                       safetensors_bytes({{"a", "F32", {1}, pod_bytes(std::vector<float>{1.0f})},
                                          {"b", "F32", {1}, pod_bytes(std::vector<float>{2.0f})}}));
  testing::write_bytes(dir.file("model-00002-of-00002.safetensors"),
                       safetensors_bytes({{"c", "F32", {1}, pod_bytes(std::vector<float>{3.0f})}}));
  testing::write_bytes(dir.file("model.safetensors.index.json"),
                       R"({"metadata": {"total_size": 12}, "weight_map": {)"
                       R"("a": "model-00001-of-00002.safetensors",)"
                       R"("b": "model-00001-of-00002.safetensors",)"
                       R"("c": "model-00002-of-00002.safetensors"}})");
  auto checkpoint = Checkpoint::open(dir.path());
  EXPECT_EQ(checkpoint->names().size(), 3u);
  EXPECT_EQ(checkpoint->get("a", {1}, DType::F32).data<float>()[0], 1.0f);
  EXPECT_EQ(checkpoint->get("c", {1}, DType::F32).data<float>()[0], 3.0f);
  EXPECT_EQ(checkpoint->unrequested(), (std::vector<std::string>{"b"}));
}

TEST(Checkpoint, ShardedErrors) {
  testing::TempDir dir;
  copy_config(dir);
  testing::write_bytes(dir.file("s1.safetensors"),
                       safetensors_bytes({{"a", "F32", {1}, pod_bytes(std::vector<float>{1.0f})}}));
  testing::write_bytes(dir.file("model.safetensors.index.json"),
                       R"({"weight_map": {"a": "s2.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.path()); }, "s2.safetensors");
  testing::write_bytes(dir.file("model.safetensors.index.json"),
                       R"({"weight_map": {"zz": "s1.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.path()); }, "does not contain it");
  testing::write_bytes(dir.file("model.safetensors.index.json"),
                       R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_error([&] { Checkpoint::open(dir.path()); }, "invalid shard");
  testing::write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": [1]})");
  expect_error([&] { Checkpoint::open(dir.path()); }, "weight_map");
  testing::write_bytes(dir.file("model.safetensors.index.json"), R"({"weight_map": )");
  expect_error([&] { Checkpoint::open(dir.path()); }, "not valid JSON");
}

TEST(Checkpoint, MissingPieces) {
  testing::TempDir dir;
  expect_error([&] { Checkpoint::open(dir.file("absent")); }, "does not exist");
  expect_error([&] { Checkpoint::open(dir.path()); }, "config.json");
  copy_config(dir);
  expect_error([&] { Checkpoint::open(dir.path()); }, "no model.safetensors");
  testing::write_bytes(dir.file("model.safetensors"), "12345");
  expect_error([&] { Checkpoint::open(dir.path()); }, "truncated");
}

}  // namespace
}  // namespace megactx
