// The CUDA model against the CPU model (the oracle) on the HF fixtures: fp32
// parity mode within 1e-4 relative in prefill, chunked prefill and decode,
// greedy tokens equal to HF's; BF16 and FP8 caches within 2e-2 with equal
// greedy tokens; batching that does not mix sequences; bad input as Errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "../model/hf_fixture.h"
#include "core/error.h"
#include "model/cuda/cuda_model.h"
#include "model_runs.h"

namespace megactx::testing {
namespace {

constexpr const char* kFixtures[] = {"glm_bf16", "glm_fp8", "glm_pattern", "glm_schedule",
                                     "dsv32_yarn"};

ModelLoadOptions cuda_options() {
  ModelLoadOptions options;
  options.device = Device::CUDA;
  return options;
}

// As long a greedy continuation of the fixture's prompt as HF's.
std::vector<int32_t> greedy(LanguageModel& model, const HfFixture& f, KvDType dtype) {
  return greedy_ids(model, f.input_ids, static_cast<int64_t>(f.greedy_ids.size()), f.vocab, dtype);
}

TEST(CudaModel, Fp32PrefillMatchesCpuModel) {
  for (const char* name : kFixtures) {
    const HfFixture f = load_fixture(name);
    auto cpu = load_language_model(f.dir, {});
    auto gpu = load_language_model(f.dir, cuda_options());
    ASSERT_EQ(gpu->device(), Device::CUDA);
    const std::vector<float> want = run_sequence(*cpu, f.input_ids, KvDType::F32, 0);
    const std::vector<float> got = run_sequence(*gpu, f.input_ids, KvDType::F32, 0);
    ASSERT_EQ(got.size(), want.size()) << name;
    EXPECT_LE(relative_error(got.data(), want.data(), want.size()), 1e-4) << name;
    // And HF's own logits (the CPU model's tolerance in hf_parity_test).
    EXPECT_LE(relative_error(got.data(), f.prefill_logits.data(), want.size()), 2e-4) << name;
  }
}

TEST(CudaModel, Fp32DecodeAndChunkedPrefillMatchCpuModel) {
  for (const char* name : {"glm_schedule", "dsv32_yarn"}) {
    const HfFixture f = load_fixture(name);
    auto cpu = load_language_model(f.dir, {});
    auto gpu = load_language_model(f.dir, cuda_options());
    const std::vector<int32_t> ids = prompt_and_greedy(f);
    const std::vector<float> want = run_sequence(*cpu, ids, KvDType::F32, 0);
    for (int64_t chunk : {1, 7, 64}) {
      const std::vector<float> got = run_sequence(*gpu, ids, KvDType::F32, chunk);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_LE(relative_error(got.data(), want.data(), want.size()), 1e-4)
          << name << " chunk " << chunk;
    }
  }
}

TEST(CudaModel, RowBlocksMatchCpuModel) {
  // The attention core and the feed-forward in blocks of 5 rows (prefill
  // chunks of 7 rows: a block of 5 and one of 2; the whole prompt: blocks of
  // 5 and a short last one) stay within the fp32 parity bound.
  ModelLoadOptions options = cuda_options();
  options.cuda.row_block = 5;
  for (const char* name : kFixtures) {
    const HfFixture f = load_fixture(name);
    auto cpu = load_language_model(f.dir, {});
    auto gpu = load_language_model(f.dir, options);
    const std::vector<int32_t> ids = prompt_and_greedy(f);
    const std::vector<float> want = run_sequence(*cpu, ids, KvDType::F32, 0);
    for (int64_t chunk : {0, 7}) {
      const std::vector<float> got = run_sequence(*gpu, ids, KvDType::F32, chunk);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_LE(relative_error(got.data(), want.data(), want.size()), 1e-4)
          << name << " chunk " << chunk;
    }
  }
}

TEST(CudaModel, GreedyTokensEqualHf) {
  for (const char* name : kFixtures) {
    const HfFixture f = load_fixture(name);
    auto gpu = load_language_model(f.dir, cuda_options());
    EXPECT_EQ(greedy(*gpu, f, KvDType::F32), f.greedy_ids) << name;
  }
}

TEST(CudaModel, QuantizedCachesStayCloseAndGreedyEqual) {
  // BF16 and FP8 entries are encoded on the device exactly as the host cache
  // encodes them; fp32 GEMM rounding can still flip one rounding step of a
  // cached value, hence the tolerance (as the CPU BLAS vs loops check).
  for (KvDType dtype : {KvDType::BF16, KvDType::FP8}) {
    for (const char* name : {"glm_bf16", "dsv32_yarn"}) {
      const HfFixture f = load_fixture(name);
      auto cpu = load_language_model(f.dir, {});
      auto gpu = load_language_model(f.dir, cuda_options());
      const std::vector<int32_t> ids = prompt_and_greedy(f);
      const std::vector<float> want = run_sequence(*cpu, ids, dtype, 0);
      const std::vector<float> got = run_sequence(*gpu, ids, dtype, 1);
      const std::vector<float> exact = run_sequence(*gpu, ids, KvDType::F32, 1);
      const std::vector<float> gpu_prefill = run_sequence(*gpu, ids, dtype, 0);
      const std::vector<float> cpu_decode = run_sequence(*cpu, ids, dtype, 1);
      const std::string where =
          std::string(name) + " dtype " + std::to_string(static_cast<int>(dtype));
      // Each side reads its own cache the same way in prefill and decode.
      EXPECT_LE(relative_error(got.data(), gpu_prefill.data(), want.size()), 2e-2) << where;
      EXPECT_LE(relative_error(cpu_decode.data(), want.data(), want.size()), 2e-2) << where;
      // Prefill of both sides, then decode of both sides.
      EXPECT_LE(relative_error(gpu_prefill.data(), want.data(), want.size()), 2e-2) << where;
      EXPECT_LE(relative_error(got.data(), want.data(), want.size()), 2e-2) << where;
      // The quantized cache is really in use on the device.
      EXPECT_GT(relative_error(got.data(), exact.data(), exact.size()), 1e-6) << where;
      EXPECT_EQ(greedy(*gpu, f, dtype), greedy(*cpu, f, dtype)) << where;
    }
  }
}

ModelLoadOptions bf16_options(std::optional<int64_t> topk = std::nullopt) {
  ModelLoadOptions options = cuda_options();
  options.cuda.bf16_weights = true;
  options.index_topk_override = topk;
  return options;
}

// HF's own bf16 error on a fixture (tools/fixtures/measure_bf16_sensitivity.py
// wrote <dir>/bf16_sensitivity.json with transformers): -1 when not measured.
double hf_bf16_error(const std::string& path) {
  std::ifstream file(path);
  if (!file.good()) return -1.0;
  return nlohmann::json::parse(file)["bf16_full_rel"].get<double>();
}

TEST(CudaModel, Bf16ModeOnTheFixtures) {
  // The random tiny fixtures can be ill-conditioned for bf16: a rounding-size
  // perturbation swaps a near-tied sigmoid expert or indexer key and the
  // logits jump. That is a property of the fixture, measured by HF itself
  // with dense selection: HF's bf16 inference moves glm_bf16 / glm_fp8 /
  // glm_pattern / glm_schedule / dsv32_yarn by 0.14 / 0.65 / 0.65 / 0.44 /
  // 0.34, and rounding only the weights to bf16 already moves four of them by
  // 0.27-0.65 (glm_fp8's block-dequantized weights are not bf16 values). The
  // bf16 activations (the MLP's gate / up, CudaModelOptions::bf16_activations)
  // move glm_bf16 from 0.01 to 0.21 and glm_fp8 from 0.006 to 0.58 through the
  // same flips. Tie-free fixtures (HF's bf16 within 2e-2, or not measured) must meet the
  // issue's 2e-2 bound with equal greedy tokens; the ill-conditioned ones
  // must stay within twice HF's own bf16 error (measured here: 0.6-1.6x).
  for (const char* name : kFixtures) {
    const HfFixture f = load_fixture(name);
    // 4096 >= every fixture's context: dense selection (the fp32 attention
    // path stages the top-k row in shared memory, so it cannot be larger).
    ModelLoadOptions dense;
    dense.index_topk_override = 4096;
    auto cpu = load_language_model(f.dir, dense);
    auto gpu = load_language_model(f.dir, bf16_options(4096));
    const std::vector<float> want = run_sequence(*cpu, f.input_ids, KvDType::F32, 0);
    const std::vector<float> got = run_sequence(*gpu, f.input_ids, KvDType::F32, 0);
    const double error = relative_error(got.data(), want.data(), want.size());
    const double hf = hf_bf16_error(f.dir + "/bf16_sensitivity.json");
    const bool tie_free = hf < 2e-2;
    std::printf(
        "bf16 mode, %s (dense selection): relative logit error %.3g; HF's own bf16 %.3g (%s)\n",
        name, error, hf, tie_free ? "tie-free" : "ill-conditioned");
    EXPECT_GT(error, 0.0) << name << ": the bf16 path is really in use";
    if (tie_free) {
      EXPECT_LE(error, 2e-2) << name;
      EXPECT_EQ(greedy_ids(*gpu, f.input_ids, 8, f.vocab),
                greedy_ids(*cpu, f.input_ids, 8, f.vocab))
          << name;
    } else {
      EXPECT_LE(error, 2.0 * hf) << name << ": worse than twice HF's own bf16 inference";
    }
  }
}

TEST(CudaModel, Bf16ModeOnTheDefaultModelStaysClose) {
  // The trained default model, sparse as shipped: the first 600 ids of the
  // passkey prompt (tests/default_model), logits of every position against
  // the fp32 CPU model. HF's own bf16 inference on the same ids moves the
  // logits by 0.154 with 97.3% argmax agreement
  // (tests/default_model/bf16_sensitivity.json); the bf16 mode (fp32 outside
  // the GEMMs) must do at least as well. Measured: 0.054 / 99.3%.
  const std::string dir = std::string(MEGACTX_SOURCE_DIR) + "/models/default";
  const nlohmann::json hf = nlohmann::json::parse(std::ifstream(
      std::string(MEGACTX_SOURCE_DIR) + "/tests/default_model/bf16_sensitivity.json"));
  const std::vector<int32_t> prompt = default_model_prompt(600);
  auto cpu = load_language_model(dir, {});
  auto gpu = load_language_model(dir, bf16_options());
  const int64_t vocab = cpu->config().vocab_size;
  const std::vector<float> want = run_sequence(*cpu, prompt, KvDType::F32, 0);
  const std::vector<float> got = run_sequence(*gpu, prompt, KvDType::F32, 0);
  const double error = relative_error(got.data(), want.data(), want.size());
  const double agreement =
      argmax_agreement(got.data(), want.data(), static_cast<int64_t>(prompt.size()), vocab);
  std::printf(
      "bf16 mode, models/default, 600 tokens: relative logit error %.3g, argmax agreement "
      "%.4f (HF bf16: %.3g, %.4f)\n",
      error, agreement, hf["bf16_full_rel"].get<double>(),
      hf["bf16_full_argmax_agreement"].get<double>());
  EXPECT_LE(error, hf["bf16_full_rel"].get<double>());
  EXPECT_GE(agreement, hf["bf16_full_argmax_agreement"].get<double>());
}

TEST(CudaModel, BatchedSequencesDoNotMix) {
  const HfFixture f = load_fixture("glm_pattern");
  auto gpu = load_language_model(f.dir, cuda_options());
  const std::vector<int32_t> a = f.input_ids;
  const std::vector<int32_t> b(f.input_ids.rbegin(), f.input_ids.rend() - 3);
  const std::vector<float> alone_a = run_sequence(*gpu, a, KvDType::F32, 0);
  const std::vector<float> alone_b = run_sequence(*gpu, b, KvDType::F32, 0);
  auto cache = cache_for(*gpu, KvDType::F32, 6);
  const std::vector<int32_t> pages_a = {5, 0, 3}, pages_b = {1, 4, 2};
  ForwardBatch batch;
  batch.sequences.push_back({a, 0, pages_a, 0});
  batch.sequences.push_back({b, 0, pages_b, 0});
  const Tensor logits = to_host(gpu->forward(batch, *cache).logits);
  ASSERT_EQ(static_cast<size_t>(logits.numel()), alone_a.size() + alone_b.size());
  const float* data = logits.data<float>();
  EXPECT_LE(relative_error(data, alone_a.data(), alone_a.size()), 1e-5);
  EXPECT_LE(relative_error(data + alone_a.size(), alone_b.data(), alone_b.size()), 1e-5);
}

TEST(CudaModel, BadInputIsAnError) {
  const HfFixture f = load_fixture("glm_pattern");
  auto gpu = load_language_model(f.dir, cuda_options());
  const std::vector<int32_t> pages = {0};
  const std::vector<int32_t> ok = {1, 2, 3};
  // A host cache.
  PagedKvCache host(make_kv_cache_spec(gpu->config(), 1, KvDType::F32));
  ForwardBatch batch;
  batch.sequences.push_back({ok, 0, pages, -1});
  EXPECT_THROW(gpu->forward(batch, host), Error);
  // A token outside the vocabulary, a page outside the cache.
  auto cache = cache_for(*gpu, KvDType::F32, 1);
  const std::vector<int32_t> bad_token = {1, static_cast<int32_t>(f.vocab)};
  batch.sequences[0].tokens = bad_token;
  EXPECT_THROW(gpu->forward(batch, *cache), Error);
  const std::vector<int32_t> bad_pages = {7};
  batch.sequences[0] = {ok, 0, bad_pages, -1};
  EXPECT_THROW(gpu->forward(batch, *cache), Error);
  // A cache built for another model.
  KvCacheSpec other = make_kv_cache_spec(gpu->config(), 1, KvDType::F32);
  other.kv_lora_rank += 1;
  auto mismatched = make_cuda_kv_cache(other);
  batch.sequences[0] = {ok, 0, pages, -1};
  EXPECT_THROW(gpu->forward(batch, *mismatched), Error);
}

}  // namespace
}  // namespace megactx::testing
