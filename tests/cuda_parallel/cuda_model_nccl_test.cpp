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

#include "cuda_group_helpers.h"
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
    const std::vector<float> expected = prefill_and_decode_logits(*plain, f, 6);
    const std::vector<float> got = prefill_and_decode_logits(*grouped, f, 6);
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
