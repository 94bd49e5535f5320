// The CUDA model in a group of one rank (CudaModelOptions::group): every
// attention and feed-forward partial sum goes through a one-rank NCCL
// communicator on the model's stream, eagerly and inside captured decode
// graphs, exactly the calls a rank of a tensor-parallel group makes (with
// its shares of the weights, model_plan.h). With one rank the sums are the
// identity, so the logits must equal those of the model without a group, bit
// for bit; the graphs must really replay with NCCL inside. Several GPUs (the
// shares, the sums over ranks) need a machine with several GPUs. Skipped,
// saying why, without a GPU or where NCCL cannot be loaded.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../model/hf_fixture.h"
#include "model/cuda/cuda_model.h"
#include "model/model_loader.h"
#include "parallel/communicator.h"
#include "parallel/nccl_communicator.h"

namespace megactx::testing {
namespace {

std::unique_ptr<parallel::Communicator> one_rank_group() {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "megactx_cuda_model_nccl_test";
  std::filesystem::create_directories(dir);
  parallel::CpuCommunicatorOptions options;
  options.rendezvous_dir = dir.string();
  static int groups = 0;  // a fresh rendezvous name per group (the store's files stay)
  options.group = "one_rank_" + std::to_string(::getpid()) + "_" + std::to_string(groups++);
  return parallel::make_cpu_communicator(options);
}

std::unique_ptr<LanguageModel> load(const std::string& fixture, parallel::Communicator* group,
                                    bool bf16) {
  ModelLoadOptions options;
  options.device = Device::CUDA;
  options.kv_dtype = KvDType::F32;
  options.cuda.bf16_weights = bf16;
  options.group = group;
  return load_language_model(fixture_dir(fixture), options);
}

// Prefill of the fixture's prompt in two chunks, then `steps` greedy decode
// steps (CUDA graphs from the second): every logit, in order.
std::vector<float> run(LanguageModel& model, const HfFixture& f, int64_t steps) {
  const int64_t prompt = static_cast<int64_t>(f.input_ids.size());
  const int64_t pages = (prompt + steps + 63) / 64 + 1;
  auto cache = make_cuda_kv_cache(make_kv_cache_spec(model.config(), pages, KvDType::F32));
  std::vector<int32_t> table;
  for (int64_t p = 0; p < pages; ++p) table.push_back(static_cast<int32_t>(p));
  std::vector<float> out;
  auto step = [&](std::span<const int32_t> tokens, int64_t start) {
    ForwardBatch batch;
    batch.sequences.push_back({tokens, start, table, 0});
    const Tensor logits = model.to_host(model.forward(batch, *cache).logits);
    out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
    return argmax(logits.data<float>() + logits.numel() - f.vocab, f.vocab);
  };
  const int64_t half = prompt / 2;
  step(std::span<const int32_t>(f.input_ids.data(), static_cast<size_t>(half)), 0);
  int32_t next =
      step(std::span<const int32_t>(f.input_ids.data() + half, static_cast<size_t>(prompt - half)),
           half);
  for (int64_t i = 0; i < steps; ++i) {
    const std::vector<int32_t> token = {next};
    next = step(token, prompt + i);
  }
  return out;
}

class CudaModelNccl : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
      GTEST_SKIP() << "no CUDA device";
    std::string why;
    if (!parallel::nccl_available("", &why)) GTEST_SKIP() << "NCCL is not available: " << why;
  }
};

TEST_P(CudaModelNccl, OneRankGroupGivesTheModelsOwnLogitsBitForBit) {
  const bool bf16 = GetParam();
  for (const char* fixture : {"glm_schedule", "dsv32_yarn"}) {
    SCOPED_TRACE(fixture);
    const HfFixture f = load_fixture(fixture);
    auto group = one_rank_group();
    auto plain = load(fixture, nullptr, bf16);
    auto grouped = load(fixture, group.get(), bf16);
    const std::vector<float> expected = run(*plain, f, 6);
    const std::vector<float> got = run(*grouped, f, 6);
    ASSERT_EQ(got.size(), expected.size());
    int64_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) differing += got[i] != expected[i];
    EXPECT_EQ(differing, 0) << "of " << got.size() << " logits";
    // The decode steps replayed graphs with the NCCL calls captured in them.
    EXPECT_GT(cuda_graph_stats(*grouped).replays, 0);
    EXPECT_EQ(cuda_graph_stats(*grouped).failed_captures, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Precision, CudaModelNccl, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "bf16" : "fp32"; });

}  // namespace
}  // namespace megactx::testing
