// End to end with the real CPU forward pass on the HF fixtures
// (tests/fixtures/hf/*, made by HF transformers): the engine's greedy output
// equals transformers' greedy continuation whether requests run alone,
// batched, from a prefix-cache hit, in small prefill chunks or through
// preemption under a tiny KV budget; scoring gives transformers' logprobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/cpu_sampler.h"
#include "engine_harness.h"
#include "model/model_loader.h"

namespace megactx::testing {
namespace {

struct Fixture {
  std::string dir;
  std::vector<int32_t> input_ids;
  std::vector<int32_t> greedy_ids;
  std::vector<float> prefill_logits;  // [T, vocab]
  int64_t vocab = 0;
};

Fixture load(const std::string& name) {
  Fixture f;
  f.dir = std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/hf/" + name;
  std::ifstream file(f.dir + "/reference.json");
  const nlohmann::json meta = nlohmann::json::parse(file);
  f.input_ids = meta["input_ids"].get<std::vector<int32_t>>();
  f.greedy_ids = meta["greedy_ids"].get<std::vector<int32_t>>();
  const auto shape = meta["prefill_logits"]["shape"].get<std::vector<int64_t>>();
  f.vocab = shape[1];
  f.prefill_logits.resize(static_cast<size_t>(shape[0] * shape[1]));
  std::ifstream logits(f.dir + "/prefill_logits.f32", std::ios::binary);
  logits.read(reinterpret_cast<char*>(f.prefill_logits.data()),
              static_cast<std::streamsize>(f.prefill_logits.size() * 4));
  EXPECT_TRUE(logits.good()) << f.dir;
  return f;
}

std::unique_ptr<Engine> make_engine(const Fixture& f, int64_t pages, int64_t chunk = 4096) {
  auto model = load_language_model(f.dir, ModelLoadOptions{});
  EngineConfig config;
  config.run_thread = false;
  config.check_integrity_every_step = true;
  config.kv_dtype = KvDType::F32;  // the parity tests' dtype: HF runs in fp32
  config.max_prefill_tokens = chunk;
  KvCapacityPlan one_page =
      plan_kv_capacity(model->config(), KvDType::F32, int64_t{1} << 30, 64, false);
  config.kv_memory_bytes = pages * one_page.bytes_per_page;
  GenerationDefaults defaults = load_generation_defaults(f.dir, model->config().eos_token_ids);
  return Engine::create(config, std::move(model), std::make_shared<FakeTokenizer>(f.vocab),
                        defaults);
}

class EngineOnHfModel : public ::testing::TestWithParam<std::string> {};

// Prompt = fixture prompt + the first k greedy tokens; expected = the rest.
GenerationRequest continuation(const Fixture& f, size_t k, const std::string& rid) {
  std::vector<int32_t> prompt = f.input_ids;
  prompt.insert(prompt.end(), f.greedy_ids.begin(), f.greedy_ids.begin() + static_cast<long>(k));
  // transformers' reference ran without stopping at eos.
  return greedy_request(rid, prompt, static_cast<int64_t>(f.greedy_ids.size() - k), true);
}

std::vector<int32_t> rest(const Fixture& f, size_t k) {
  return std::vector<int32_t>(f.greedy_ids.begin() + static_cast<long>(k), f.greedy_ids.end());
}

TEST_P(EngineOnHfModel, GreedyMatchesTransformersInEverySchedule) {
  const Fixture f = load(GetParam());
  // Alone, then a batch with a prefix-cache hit (the first page of the prompt).
  Harness harness(test_config(), nullptr, 32);
  harness.engine = make_engine(f, /*pages=*/16);
  harness.submit(continuation(f, 0, "alone"));
  harness.run();
  EXPECT_EQ(harness.results["alone"].tokens, f.greedy_ids);
  for (const size_t k : {1u, 5u, 9u}) harness.submit(continuation(f, k, "k" + std::to_string(k)));
  harness.run();
  for (const size_t k : {1u, 5u, 9u}) {
    const Collected& c = harness.results["k" + std::to_string(k)];
    EXPECT_EQ(c.tokens, rest(f, k)) << "k " << k;
    EXPECT_EQ(c.cached_tokens, 64) << "k " << k;
  }
  // Small chunks.
  Harness chunked(test_config(), nullptr, 32);
  chunked.engine = make_engine(f, 16, /*chunk=*/24);
  chunked.submit(continuation(f, 3, "chunked"));
  chunked.run();
  EXPECT_EQ(chunked.results["chunked"].tokens, rest(f, 3));
}

// Four requests of up to 170 tokens in 3 pages (192 tokens): preemption is
// unavoidable; each output must equal the same request run alone.
TEST_P(EngineOnHfModel, PreemptionUnderATinyKvBudget) {
  const Fixture f = load(GetParam());
  auto request = [&](int64_t length) {
    std::vector<int32_t> prompt(f.input_ids.begin(), f.input_ids.begin() + length);
    std::reverse(prompt.begin(), prompt.end());  // no prefix shared with the others
    prompt[0] = static_cast<int32_t>(length);
    return greedy_request("p" + std::to_string(length), prompt, 130, true);
  };
  const std::vector<int64_t> lengths = {10, 20, 30, 40};
  std::map<int64_t, std::vector<int32_t>> alone;
  for (const int64_t length : lengths) {
    Harness single(test_config(), nullptr, 32);
    single.engine = make_engine(f, 8);
    single.submit(request(length));
    single.run();
    alone[length] = single.results["p" + std::to_string(length)].tokens;
    ASSERT_EQ(alone[length].size(), 130u);
  }
  Harness harness(test_config(), nullptr, 32);
  harness.engine = make_engine(f, /*pages=*/3, /*chunk=*/32);
  for (const int64_t length : lengths) harness.submit(request(length));
  harness.run();
  EXPECT_GT(harness.engine->num_preemptions(), 0);
  for (const int64_t length : lengths) {
    EXPECT_EQ(harness.results["p" + std::to_string(length)].tokens, alone[length]) << length;
  }
}

TEST_P(EngineOnHfModel, ScoringGivesTransformersLogprobs) {
  const Fixture f = load(GetParam());
  Harness harness(test_config(), nullptr, 32);
  harness.engine = make_engine(f, 8, /*chunk=*/20);
  GenerationRequest request = greedy_request("score", f.input_ids, 0);
  request.return_logprob = true;
  request.logprob_start_len = 1;
  harness.submit(request);
  harness.run();
  const Collected& c = harness.results["score"];
  const auto length = static_cast<int64_t>(f.input_ids.size());
  ASSERT_EQ(static_cast<int64_t>(c.input_logprobs.size()), length - 1);
  float scale = 0.0f;
  for (const float x : f.prefill_logits) scale = std::max(scale, std::fabs(x));
  std::vector<float> expected(static_cast<size_t>(f.vocab));
  for (int64_t q = 1; q < length; ++q) {
    log_softmax(std::span<const float>(f.prefill_logits.data() + (q - 1) * f.vocab,
                                       static_cast<size_t>(f.vocab)),
                expected);
    const TokenLogprob& entry = c.input_logprobs[static_cast<size_t>(q - 1)];
    EXPECT_EQ(entry.token_id, f.input_ids[static_cast<size_t>(q)]);
    // Logits agree within 1e-4 of max |logit| (the parity bound); a logprob
    // moves by at most twice that.
    EXPECT_NEAR(entry.logprob, expected[static_cast<size_t>(entry.token_id)], 2e-4 * scale + 1e-6)
        << "position " << q;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineOnHfModel,
                         ::testing::Values("glm_bf16", "glm_pattern", "dsv32_yarn", "glm_fp8"));

}  // namespace
}  // namespace megactx::testing
