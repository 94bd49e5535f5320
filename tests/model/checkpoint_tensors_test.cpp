// Weights are asked for by name and shape: MTP tensors
// (model.layers.{num_hidden_layers}.*) are accepted but not run, any other
// tensor the model does not use is an Error naming it, and so is a missing one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "hf_fixture.h"

namespace megactx::testing {
namespace {

namespace fs = std::filesystem;

// A copy of glm_schedule (8 layers, sharded) plus one extra shard holding
// `extra` (F32 [4] tensors), registered in the index; `pattern` (optional)
// replaces the IndexShare schedule in config.json.
std::string patched_copy(const std::string& tag, const std::vector<std::string>& extra,
                         const std::string& pattern = "") {
  const fs::path dir = fs::temp_directory_path() / ("megactx_ckpt_" + tag);
  fs::remove_all(dir);
  fs::copy(fixture_dir("glm_schedule"), dir);
  // Safetensors: u64 header size, JSON header, then the data.
  nlohmann::json header = nlohmann::json::object();
  for (size_t i = 0; i < extra.size(); ++i) {
    header[extra[i]] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {16 * i, 16 * (i + 1)}}};
  }
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';
  std::ofstream shard(dir / "extra.safetensors", std::ios::binary);
  const uint64_t size = text.size();
  shard.write(reinterpret_cast<const char*>(&size), 8);
  shard.write(text.data(), static_cast<std::streamsize>(text.size()));
  const std::vector<float> zeros(4 * extra.size(), 0.5f);
  shard.write(reinterpret_cast<const char*>(zeros.data()),
              static_cast<std::streamsize>(zeros.size() * 4));
  shard.close();
  const fs::path index_path = dir / "model.safetensors.index.json";
  nlohmann::json index = nlohmann::json::parse(std::ifstream(index_path));
  for (const std::string& name : extra) index["weight_map"][name] = "extra.safetensors";
  std::ofstream(index_path) << index.dump();
  if (!pattern.empty()) {
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    config.erase("index_topk_freq");
    config.erase("index_skip_topk_offset");
    config["index_topk_pattern"] = pattern;
    std::ofstream(dir / "config.json") << config.dump();
  }
  return dir.string();
}

TEST(CheckpointTensors, MtpTensorsAreAcceptedButNotRun) {
  const HfFixture f = load_fixture("glm_schedule");
  const std::string dir =
      patched_copy("mtp", {"model.layers.8.enorm.weight", "model.layers.8.hnorm.weight"});
  auto model = load_language_model(dir, {});
  SequenceRunner runner(*model, KvDType::F32, 64);
  const Tensor logits = runner.feed(f.input_ids, true);
  EXPECT_LE(relative_error(logits.data<float>(), f.prefill_logits.data(), f.prefill_logits.size()),
            1e-4);
  fs::remove_all(dir);
}

TEST(CheckpointTensors, UnexpectedAndMissingTensorsAreNamed) {
  const std::string dir = patched_copy("unexpected", {"model.layers.3.self_attn.indexer.wk.bias"});
  try {
    load_language_model(dir, {});
    ADD_FAILURE() << "an unexpected tensor was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("model.layers.3.self_attn.indexer.wk.bias"),
              std::string::npos)
        << error.what();
  }
  fs::remove_all(dir);
  // Layer 3 made full by the config, but the checkpoint has no indexer for it.
  const std::string missing = patched_copy("missing", {}, "FFFFSSFS");
  try {
    load_language_model(missing, {});
    ADD_FAILURE() << "a missing tensor was accepted";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("model.layers.3.self_attn.indexer"), std::string::npos)
        << error.what();
  }
  fs::remove_all(missing);
}

}  // namespace
}  // namespace megactx::testing
