// The CPU model spread over 2 and 4 ranks (forked processes on loopback):
// tensor-parallel attention and MLPs (each rank its share of the heads and
// widths), expert parallelism over it, and expert parallelism with
// data-parallel attention (every rank its own tokens, all-to-all dispatch and
// combine) give the single-process model's logits for a prefill then
// token-by-token decoding through the paged cache, on HF fixtures with dense
// and MoE layers (glm_moe_dsa with IndexShare, deepseek_v32 with YaRN); and
// HF's own logits. The MTP layer under tensor and expert parallelism
// matches the PyTorch reference of tests/mtp (step 0, the shared and
// unshared draft steps, greedy draft chains). Context parallelism (every
// prefill's rows split over the group) gives the same logits too. Shapes that
// do not divide, CUDA
// under parallelism and MTP with data-parallel attention are errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "../model/hf_fixture.h"
#include "../mtp/mtp_golden_check.h"
#include "core/error.h"
#include "forked_group.h"
#include "io/checkpoint.h"
#include "model/model_loader.h"
#include "model/mtp_layer.h"
#include "model/sequence_runner.h"
#include "parallel/communicator.h"

namespace megactx::testing {
namespace {

// Prefill of `prompt` (all logits), then `continuation` fed one token at a
// time: [prompt + continuation, vocab].
std::vector<float> prefill_then_decode(LanguageModel& model, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& continuation) {
  SequenceRunner runner(model, KvDType::F32,
                        static_cast<int64_t>(prompt.size() + continuation.size()));
  const Tensor prefill = runner.feed(prompt, true);
  std::vector<float> out(prefill.data<float>(), prefill.data<float>() + prefill.numel());
  for (const int32_t id : continuation) {
    const int32_t token[1] = {id};
    const Tensor logits = runner.feed(token, false);
    out.insert(out.end(), logits.data<float>(), logits.data<float>() + logits.numel());
  }
  return out;
}

struct Layout {
  bool expert_parallel = false;
  bool data_parallel_attention = false;
  bool context_parallel = false;
};

// The fixture's prompt through the group (every rank the same prompt with
// tensor-parallel attention; with data-parallel attention rank r drops its
// first r tokens, so that the ranks' batches differ) against one process on
// the same tokens, and (the whole prompt) against HF's prefill logits.
bool matches_the_whole_model(const std::string& name, parallel::Communicator& group,
                             Layout layout = {}) {
  const HfFixture f = load_fixture(name);
  const int skip = layout.data_parallel_attention ? group.rank() : 0;
  const std::vector<int32_t> prompt(f.input_ids.begin() + skip, f.input_ids.end());
  const std::vector<float> whole =
      prefill_then_decode(*load_language_model(f.dir, {}), prompt, f.greedy_ids);
  ModelLoadOptions options;
  options.group = &group;
  options.expert_parallel = layout.expert_parallel;
  options.data_parallel_attention = layout.data_parallel_attention;
  options.context_parallel = layout.context_parallel;
  auto model = load_language_model(f.dir, options);
  const std::vector<float> split = prefill_then_decode(*model, prompt, f.greedy_ids);
  if (split.size() != whole.size()) return false;
  const double error = relative_error(split.data(), whole.data(), whole.size());
  // HF's prefill logits (the whole prompt only): the single-process parity bound.
  const double hf_error =
      skip == 0 ? relative_error(split.data(), f.prefill_logits.data(), f.prefill_logits.size())
                : 0.0;
  std::printf(
      "%s, rank %d of %d%s%s%s: max relative logit difference %.3g against one process, "
      "%.3g against HF's prefill\n",
      name.c_str(), group.rank(), group.size(), layout.expert_parallel ? ", experts split" : "",
      layout.data_parallel_attention ? ", data-parallel attention" : "",
      layout.context_parallel ? ", context parallel" : "", error, hf_error);
  return error <= 1e-5 && hf_error <= 1e-4;
}

TEST(TensorParallelModel, TwoRanksMatchOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(
        2, [&](parallel::Communicator& group) { return matches_the_whole_model(name, group); });
}

TEST(TensorParallelModel, FourRanksMatchOneProcess) {
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group);
  });
}

// Expert parallelism over tensor-parallel attention (each rank its experts,
// the sum over the group) and over data-parallel attention (every rank its
// own tokens, rows sent to their experts' ranks and back by all-to-all).
TEST(TensorParallelModel, ExpertParallelOverTensorParallelAttention) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_schedule", group, {true, false});
  });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("dsv32_yarn", group, {true, false});
  });
}

TEST(TensorParallelModel, ExpertParallelOverDataParallelAttention) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_schedule", group, {true, true});
  });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group, {true, true});
  });
}

// Context parallelism: every rank the whole weights and cache, each its share
// of a prefill's rows (the prompt split across the group), the new latents and
// indexer keys gathered into every rank's cache; decode steps of one row run
// whole on every rank. 2 ranks on both architectures, 3 ranks (shares of
// unequal length) and 4.
TEST(TensorParallelModel, ContextParallelPrefillMatchesOneProcess) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(2, [&](parallel::Communicator& group) {
      return matches_the_whole_model(name, group, {false, false, true});
    });
  parallel::run_forked_group(3, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_pattern", group, {false, false, true});
  });
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    return matches_the_whole_model("glm_schedule", group, {false, false, true});
  });
}

TEST(TensorParallelModel, ShapesThatDoNotDivideAreErrors) {
  // glm_fp8 has 2 heads: a group of 4 cannot split them.
  parallel::run_forked_group(4, [](parallel::Communicator& group) {
    ModelLoadOptions options;
    options.group = &group;
    try {
      load_language_model(fixture_dir("glm_fp8"), options);
    } catch (const megactx::Error& error) {
      return std::string(error.what()).find("heads") != std::string::npos;
    }
    return false;
  });
}

TEST(TensorParallelModel, CudaIsRefusedUnderTensorParallelism) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    ModelLoadOptions options;
    options.group = &group;
    options.device = Device::CUDA;
    try {
      load_language_model(fixture_dir("glm_schedule"), options);
    } catch (const megactx::Error& error) {
      return std::string(error.what()).find("parallelism") != std::string::npos;
    }
    return false;
  });
}

// Every rank runs the same checks on its share (the collectives inside the
// MTP layer's decoder layer then match), against the PyTorch goldens; a
// child's failed expectation makes it exit 1.
bool mtp_matches_reference(const std::string& name, parallel::Communicator& group,
                           bool expert_parallel) {
  const std::string dir = mtp_fixture(name);
  ModelLoadOptions options;
  options.group = &group;
  options.expert_parallel = expert_parallel;
  auto model = load_language_model(dir, options);
  const auto mtp = model->load_mtp_layer(dir);
  const auto fresh_cache = [&] {
    return std::make_unique<PagedKvCache>(
        make_kv_cache_spec(model->config(), 4, KvDType::F32, 64, /*with_mtp_layer=*/true));
  };
  check_mtp_goldens(dir, *mtp, fresh_cache);
  check_greedy_draft_chain(dir, *mtp, fresh_cache);
  std::printf(
      "%s MTP layer, rank %d of %d%s: %s\n", name.c_str(), group.rank(), group.size(),
      expert_parallel ? ", experts split" : "",
      ::testing::Test::HasFailure() ? "differs from the reference" : "matches the reference");
  return !::testing::Test::HasFailure();
}

TEST(TensorParallelModel, MtpLayerMatchesTheReference) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"})
    parallel::run_forked_group(2, [&](parallel::Communicator& group) {
      return mtp_matches_reference(name, group, false);
    });
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    return mtp_matches_reference("glm_schedule", group, true);
  });
}

TEST(TensorParallelModel, MtpWithDataParallelAttentionIsRefused) {
  parallel::run_forked_group(2, [](parallel::Communicator& group) {
    ModelLoadOptions options;
    options.group = &group;
    options.expert_parallel = options.data_parallel_attention = true;
    auto model = load_language_model(mtp_fixture("glm_schedule"), options);
    try {
      model->load_mtp_layer(mtp_fixture("glm_schedule"));
    } catch (const megactx::Error& error) {
      return std::string(error.what()).find("data-parallel attention") != std::string::npos;
    }
    return false;
  });
}

}  // namespace
}  // namespace megactx::testing
