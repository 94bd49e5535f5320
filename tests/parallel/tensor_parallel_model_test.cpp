// Tensor parallelism of the CPU model: 2 and 4 ranks (forked processes on
// loopback, each with its share of the heads and MLP / expert widths) give
// the single-process model's logits, for a prefill then token-by-token
// decoding through the paged cache, on HF fixtures with dense and MoE layers
// (glm_moe_dsa with IndexShare, deepseek_v32 with YaRN); and against HF's own
// logits. Shapes that do not divide, and MTP or CUDA under tensor
// parallelism, are errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "../model/hf_fixture.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "model/model_loader.h"
#include "model/mtp_layer.h"
#include "model/sequence_runner.h"
#include "parallel/communicator.h"

namespace megactx::testing {
namespace {

std::string rendezvous_folder() {
  static int groups = 0;
  const auto folder = std::filesystem::temp_directory_path() /
                      ("megactx_tp_" + std::to_string(::getpid()) + "_" + std::to_string(groups++));
  std::filesystem::remove_all(folder);
  std::filesystem::create_directories(folder);
  return folder.string();
}

// Runs body(group) in `size` forked processes (models are built in the
// children only: a thread pool made before fork() would not survive it).
void run_group(int size, const std::function<bool(parallel::Communicator&)>& body) {
  const std::string folder = rendezvous_folder();
  std::vector<pid_t> children;
  for (int rank = 0; rank < size; ++rank) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      int status = 1;
      try {
        parallel::CpuCommunicatorOptions options;
        options.rank = rank;
        options.size = size;
        options.rendezvous_dir = folder;
        options.timeout = std::chrono::milliseconds(60000);
        auto group = parallel::make_cpu_communicator(options);
        status = body(*group) ? 0 : 1;
      } catch (const std::exception& error) {
        std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
      }
      std::fflush(stderr);
      std::fflush(stdout);
      ::_exit(status);
    }
    children.push_back(child);
  }
  for (size_t rank = 0; rank < children.size(); ++rank) {
    int status = 0;
    ASSERT_EQ(::waitpid(children[rank], &status, 0), children[rank]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "rank " << rank << " failed";
  }
  std::filesystem::remove_all(folder);
}

// Prefill of the prompt (all logits), then the greedy continuation fed one
// token at a time: [prompt + continuation, vocab].
std::vector<float> prefill_then_decode(LanguageModel& model, const HfFixture& f) {
  SequenceRunner runner(model, KvDType::F32,
                        static_cast<int64_t>(f.input_ids.size() + f.greedy_ids.size()));
  const Tensor prefill = runner.feed(f.input_ids, true);
  std::vector<float> out(prefill.data<float>(), prefill.data<float>() + prefill.numel());
  for (const int32_t id : f.greedy_ids) {
    const int32_t token[1] = {id};
    const Tensor logits = runner.feed(token, false);
    out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
  }
  return out;
}

bool matches_the_whole_model(const std::string& name, parallel::Communicator& group) {
  const HfFixture f = load_fixture(name);
  const std::vector<float> whole = prefill_then_decode(*load_language_model(f.dir, {}), f);
  ModelLoadOptions options;
  options.tensor_parallel = &group;
  auto model = load_language_model(f.dir, options);
  const std::vector<float> split = prefill_then_decode(*model, f);
  if (split.size() != whole.size()) return false;
  const double error = relative_error(split.data(), whole.data(), whole.size());
  // HF's prefill logits: the same bound as the single-process parity test.
  const double hf_error =
      relative_error(split.data(), f.prefill_logits.data(), f.prefill_logits.size());
  std::printf(
      "%s, rank %d of %d: max relative logit difference %.3g against one process, %.3g "
      "against HF's prefill\n",
      name.c_str(), group.rank(), group.size(), error, hf_error);
  return error <= 1e-5 && hf_error <= 1e-4;
}

TEST(TensorParallelModel, TwoRanksMatchOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    run_group(2,
              [&](parallel::Communicator& group) { return matches_the_whole_model(name, group); });
}

TEST(TensorParallelModel, FourRanksMatchOneProcess) {
  run_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group);
  });
}

TEST(TensorParallelModel, ShapesThatDoNotDivideAreErrors) {
  // glm_fp8 has 2 heads: a group of 4 cannot split them.
  run_group(4, [](parallel::Communicator& group) {
    ModelLoadOptions options;
    options.tensor_parallel = &group;
    try {
      load_language_model(fixture_dir("glm_fp8"), options);
    } catch (const megactx::Error& error) {
      return std::string(error.what()).find("heads") != std::string::npos;
    }
    return false;
  });
}

TEST(TensorParallelModel, CudaAndMtpAreRefusedUnderTensorParallelism) {
  run_group(2, [](parallel::Communicator& group) {
    ModelLoadOptions options;
    options.tensor_parallel = &group;
    options.device = Device::CUDA;
    bool refused = false;
    try {
      load_language_model(fixture_dir("glm_schedule"), options);
    } catch (const megactx::Error& error) {
      refused = std::string(error.what()).find("tensor parallelism") != std::string::npos;
    }
    if (!refused) return false;
    options.device = Device::CPU;
    auto model = load_language_model(fixture_dir("glm_schedule"), options);
    const auto checkpoint = Checkpoint::open(fixture_dir("glm_schedule"));
    try {
      model->load_mtp_layer(*checkpoint);
    } catch (const megactx::Error& error) {
      return std::string(error.what()).find("tensor parallelism") != std::string::npos;
    }
    return false;
  });
}

}  // namespace
}  // namespace megactx::testing
