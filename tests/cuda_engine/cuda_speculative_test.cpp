// MTP speculative decoding on the GPU (the CUDA model):
//  * the CUDA MTP layer's draft logits against the PyTorch reference's
//    goldens (tests/mtp/mtp_golden_check.h: step 0 row by row and batched,
//    the step-0 top-k, chained draft steps with and without IndexShare +
//    KVShare), in the fp32 mode, within 1e-4 as on the CPU; a refill with
//    placeholder rows and its greedy drafts chained on the device, padded
//    to a batch bucket and replayed as a CUDA Graph;
//  * greedy speculation through the Engine on the CUDA model equals the same
//    Engine without speculation token for token, for k = 1, 3, 7, without
//    sharing, with chunked prefill and under preemption, with
//    Engine::check_integrity() after every step; on models/default (a
//    trained MTP layer: drafts are accepted, so acceptance and rollback both
//    run) and the MTP fixtures (GLM and DeepSeek-V3.2 hand-offs);
//  * rejection sampling (and target-only verification) on the GPU keeps the
//    target distribution: the chi-square test of the CPU suite
//    (tests/engine_speculative/chi_square_check.h, false-failure rate 1e-6)
//    with the Engine, the MTP drafts and the sampler on the GPU;
//  * the CUDA Engine's accepted counts equal the CPU Engine's on the trained
//    model (the same drafts: fp32 on both devices), and the FP8 KV cache
//    speculates too (greedy equal to plain FP8 on the GPU).
#include <gtest/gtest.h>

#include "../engine_speculative/chi_square_check.h"
#include "../engine_speculative/spec_engine_util.h"
#include "../mtp/mtp_golden_check.h"
#include "model/cuda/cuda_model.h"

namespace megactx::testing {
namespace {

TEST(CudaMtpGolden, DraftLogitsMatchReference) {
  for (const std::string name : {"glm_schedule", "dsv32_yarn"}) {
    SCOPED_TRACE(name);
    const std::string dir = mtp_fixture(name);
    auto host = load_language_model(dir, ModelLoadOptions{});
    auto* dsa = dynamic_cast<DsaModel*>(host.get());
    ASSERT_NE(dsa, nullptr);
    auto model = make_cuda_dsa_model(*dsa);
    const std::unique_ptr<MtpLayer> mtp = make_cuda_mtp_layer(*model, dir);
    check_mtp_goldens(dir, *mtp, [&] {
      return make_cuda_kv_cache(
          make_kv_cache_spec(model->config(), 4, KvDType::F32, 64, /*with_mtp_layer=*/true));
    });
  }
}

TEST(CudaMtpGolden, GreedyDraftChainOnTheDeviceAndInAGraph) {
  for (const std::string name : {"glm_schedule", "dsv32_yarn"}) {
    SCOPED_TRACE(name);
    const std::string dir = mtp_fixture(name);
    auto host = load_language_model(dir, ModelLoadOptions{});
    auto model = make_cuda_dsa_model(*dynamic_cast<DsaModel*>(host.get()));
    const std::unique_ptr<MtpLayer> mtp = make_cuda_mtp_layer(*model, dir);
    EXPECT_TRUE(mtp->prefers_uniform_rows());
    check_greedy_draft_chain(dir, *mtp, [&] {
      return make_cuda_kv_cache(
          make_kv_cache_spec(model->config(), 4, KvDType::F32, 64, /*with_mtp_layer=*/true));
    });
  }
}

TEST(CudaMtpGolden, MalformedRowsAreErrors) {
  const std::string dir = mtp_fixture("glm_schedule");
  auto host = load_language_model(dir, ModelLoadOptions{});
  auto model = make_cuda_dsa_model(*dynamic_cast<DsaModel*>(host.get()));
  const std::unique_ptr<MtpLayer> mtp = make_cuda_mtp_layer(*model, dir);
  auto cache = make_cuda_kv_cache(
      make_kv_cache_spec(model->config(), 4, KvDType::F32, 64, /*with_mtp_layer=*/true));
  const int64_t H = model->config().hidden_size;
  std::vector<float> hidden(static_cast<size_t>(2 * H), 0.5f);
  const std::vector<int32_t> pages{0};
  std::vector<int32_t> tokens{1, static_cast<int32_t>(model->config().vocab_size)};
  MtpLayer::Rows r;
  r.count = 2;
  r.pages = pages;
  r.next_tokens = tokens;
  r.hidden = hidden.data();
  std::vector<MtpLayer::Rows> rows{r};
  EXPECT_THROW(mtp->run(rows, *cache), Error);  // token id out of range
  tokens[1] = 2;
  rows[0].start = 63;  // rows 63..64 need a second page
  EXPECT_THROW(mtp->run(rows, *cache), Error);
  // Without the MTP pools.
  auto plain = make_cuda_kv_cache(make_kv_cache_spec(model->config(), 4, KvDType::F32, 64));
  rows[0].start = 0;
  EXPECT_THROW(mtp->run(rows, *plain), Error);
  EXPECT_NO_THROW(mtp->run(rows, *cache));
}

using ModelCase = SpecModelCase;

struct RunStats {
  int64_t preemptions = 0;
  int64_t verify = 0;
  int64_t accepted = 0;
};

std::map<std::string, SpecResult> run_all(const ModelCase& c, SpecEngineOptions options,
                                          const std::vector<std::vector<int32_t>>& prompts,
                                          RunStats* stats = nullptr) {
  SpecEngine spec(c.dir, options);
  for (size_t i = 0; i < prompts.size(); ++i) {
    spec.submit(make_request("r" + std::to_string(i), prompts[i], c.new_tokens));
  }
  spec.run();
  if (stats) {
    stats->preemptions = spec.engine->num_preemptions();
    stats->verify = spec.engine->stats().spec_verify_steps;
    stats->accepted = spec.engine->stats().spec_accepted_tokens;
  }
  return spec.results;
}

SpecEngineOptions on_cuda(int64_t steps, KvDType dtype = KvDType::F32) {
  SpecEngineOptions options;
  options.device = Device::CUDA;
  options.steps = steps;
  options.kv_dtype = dtype;
  return options;
}

class CudaSpeculativeEngine : public ::testing::TestWithParam<ModelCase> {
 protected:
  const std::vector<std::vector<int32_t>>& prompts() {
    if (prompts_.empty()) {
      SpecEngine probe(GetParam().dir, SpecEngineOptions{});
      prompts_ = spec_prompts_for(GetParam(), probe.vocab);
    }
    return prompts_;
  }
  // The CUDA Engine without speculation.
  const std::map<std::string, SpecResult>& reference() {
    if (reference_.empty()) reference_ = run_all(GetParam(), on_cuda(0), prompts());
    return reference_;
  }
  void expect_equal(const std::map<std::string, SpecResult>& got,
                    const std::map<std::string, SpecResult>& expected, const std::string& what) {
    ASSERT_EQ(got.size(), expected.size()) << what;
    for (const auto& [rid, result] : expected) {
      ASSERT_TRUE(got.contains(rid)) << what << " " << rid;
      EXPECT_EQ(got.at(rid).tokens, result.tokens) << what << " " << rid;
      EXPECT_EQ(got.at(rid).completion_tokens, GetParam().new_tokens) << what << " " << rid;
    }
  }

  std::vector<std::vector<int32_t>> prompts_;
  std::map<std::string, SpecResult> reference_;
};

TEST_P(CudaSpeculativeEngine, GreedyEqualsPlainForK1K3K7) {
  for (const int64_t k : {1, 3, 7}) {
    RunStats stats;
    const auto got = run_all(GetParam(), on_cuda(k), prompts(), &stats);
    expect_equal(got, reference(), "k=" + std::to_string(k));
    EXPECT_GT(stats.verify, 0) << "k=" << k;
    std::printf("[ %s k=%ld ] verifications %ld, accepted %ld, accepted length %.2f\n",
                GetParam().name.c_str(), static_cast<long>(k), static_cast<long>(stats.verify),
                static_cast<long>(stats.accepted),
                1.0 + static_cast<double>(stats.accepted) / static_cast<double>(stats.verify));
    if (GetParam().trained) {
      EXPECT_GT(stats.accepted, 0) << "the trained MTP layer accepts drafts on the GPU";
    }
  }
}

TEST_P(CudaSpeculativeEngine, GreedyEqualsPlainWithoutSharingAndWithChunks) {
  SpecEngineOptions unshared = on_cuda(3);
  unshared.share = false;
  expect_equal(run_all(GetParam(), unshared, prompts()), reference(), "unshared k=3");
  SpecEngineOptions chunked = on_cuda(3);
  chunked.max_prefill_tokens = 19;
  expect_equal(run_all(GetParam(), chunked, prompts()), reference(), "chunked k=3");
}

TEST_P(CudaSpeculativeEngine, GreedyEqualsPlainUnderPreemption) {
  for (const int64_t k : {3, 7}) {
    SpecEngineOptions options = on_cuda(k);
    options.pages = 5;
    options.max_prefill_tokens = 64;
    RunStats stats;
    expect_equal(run_all(GetParam(), options, prompts(), &stats), reference(),
                 "preemption k=" + std::to_string(k));
    EXPECT_GT(stats.preemptions, 0) << "k=" << k;
  }
}

TEST_P(CudaSpeculativeEngine, SameAcceptanceAsTheCpuEngine) {
  // fp32 on both devices: the same target tokens and (up to near-ties in the
  // draft argmax) the same drafts, so the same accepted counts.
  SpecEngineOptions cpu;
  cpu.steps = 3;
  RunStats on_host, on_device;
  const auto host = run_all(GetParam(), cpu, prompts(), &on_host);
  const auto device = run_all(GetParam(), on_cuda(3), prompts(), &on_device);
  expect_equal(device, host, "CPU vs CUDA k=3");
  EXPECT_EQ(on_device.verify, on_host.verify);
  EXPECT_EQ(on_device.accepted, on_host.accepted);
}

TEST_P(CudaSpeculativeEngine, Fp8KvCacheGreedyEqualsPlain) {
  const auto plain = run_all(GetParam(), on_cuda(0, KvDType::FP8), prompts());
  expect_equal(run_all(GetParam(), on_cuda(3, KvDType::FP8), prompts()), plain, "fp8 k=3");
}

TEST(CudaSpeculativeSampled, RejectionSamplingKeepsTheTargetDistribution) {
  EXPECT_GT(p_value_of_engine_samples(VerifyMode::RejectionSampling, 3000, Device::CUDA), 1e-6);
}

TEST(CudaSpeculativeSampled, TargetOnlyVerificationKeepsTheTargetDistribution) {
  EXPECT_GT(p_value_of_engine_samples(VerifyMode::TargetOnly, 3000, Device::CUDA), 1e-6);
}

const ModelCase kCases[] = {
    {"default", source_path("models/default"), 24, true},
    {"glm_schedule", source_path("tests/fixtures/mtp/glm_schedule"), 40, false},
    {"dsv32_yarn", source_path("tests/fixtures/mtp/dsv32_yarn"), 40, false},
};
INSTANTIATE_TEST_SUITE_P(Models, CudaSpeculativeEngine, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace megactx::testing
