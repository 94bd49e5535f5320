// The host KV tier through the Engine, on the CPU forward pass of the HF
// fixtures: a prompt whose pages were pushed out of a tiny KV pool comes back
// from host memory (a prefix hit, no recompute of those pages) with exactly
// the output and logprobs of its cold run; a batch that preempts under the
// tiny pool gives the same outputs with the tier as without it while pages
// move both ways; flush_cache empties the tier; bad configurations are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "engine_harness.h"
#include "fixture_requests.h"
#include "model/model_loader.h"

namespace megactx::testing {
namespace {

int64_t page_bytes(const ModelConfig& config) {
  return plan_kv_capacity(config, KvDType::F32, int64_t{1} << 30, 64, false).bytes_per_page;
}

// An engine on the fixture with `pages` KV pages and `host_pages` in the host tier.
std::unique_ptr<Engine> make_engine(const std::string& dir, int64_t pages, int64_t host_pages,
                                    int64_t chunk = 4096, bool routed_experts = false) {
  auto model = load_language_model(dir, ModelLoadOptions{});
  EngineConfig config;
  config.record_routed_experts = routed_experts;
  config.run_thread = false;
  config.check_integrity_every_step = true;
  config.kv_dtype = KvDType::F32;
  config.max_prefill_tokens = chunk;
  config.kv_memory_bytes = pages * page_bytes(model->config());
  config.host_kv_memory_bytes = host_pages * page_bytes(model->config());
  GenerationDefaults defaults = load_generation_defaults(dir, model->config().eos_token_ids);
  const int64_t vocab = model->config().vocab_size;
  return Engine::create(config, std::move(model), std::make_shared<FakeTokenizer>(vocab), defaults);
}

class HostKvTierEngine : public ::testing::TestWithParam<std::string> {};

TEST_P(HostKvTierEngine, APrefixPushedToTheHostComesBackWithTheColdOutput) {
  const std::string dir = fixture_dir(GetParam());
  const std::vector<int32_t> stream = fixture_prompt(dir);
  const std::vector<int32_t> prompt = prompt_of(stream, 150, 1);  // 2 full pages + 22
  Harness harness(test_config(), nullptr, 32);
  harness.engine = make_engine(dir, /*pages=*/4, /*host_pages=*/16);
  harness.submit(scored("cold", prompt, 8));
  harness.run();
  // Three other prompts of three pages each push the first one's pages out.
  for (int64_t i = 0; i < 3; ++i) {
    harness.submit(scored("other" + std::to_string(i), prompt_of(stream, 170, 10 + i), 4));
    harness.run();
  }
  EngineStats stats = harness.engine->stats();
  EXPECT_GE(stats.host_kv_saved_pages, 2);
  EXPECT_GT(stats.host_kv_pages_used, 0);
  harness.submit(scored("warm", prompt, 8));
  harness.run();
  const Collected& cold = harness.results["cold"];
  const Collected& warm = harness.results["warm"];
  EXPECT_EQ(cold.cached_tokens, 0);
  EXPECT_EQ(warm.cached_tokens, 128);
  stats = harness.engine->stats();
  EXPECT_EQ(stats.prefix_cache_host_hits, 128);
  EXPECT_GE(stats.host_kv_loaded_pages, 2);
  ASSERT_EQ(warm.tokens, cold.tokens);
  ASSERT_EQ(warm.logprobs.size(), cold.logprobs.size());
  for (size_t i = 0; i < cold.logprobs.size(); ++i) {
    // The pages hold the same bytes; only the chunk split of the forward differs.
    EXPECT_NEAR(warm.logprobs[i].logprob, cold.logprobs[i].logprob, 1e-5) << i;
  }
}

// Routing replay: the routed experts of a prefix travel with its pages to the
// host tier and back, so the warm request (its prompt pages loaded from host
// memory, not computed) reports the cold run's experts; requests that do not
// ask get none, and without the server switch asking is an error.
TEST_P(HostKvTierEngine, RoutedExpertsComeBackWithTheirPages) {
  const std::string dir = fixture_dir(GetParam());
  const std::vector<int32_t> stream = fixture_prompt(dir);
  const std::vector<int32_t> prompt = prompt_of(stream, 150, 1);
  Harness harness(test_config(), nullptr, 32);
  harness.engine = make_engine(dir, /*pages=*/4, /*host_pages=*/16, 4096, /*routed_experts=*/true);
  const ModelConfig& config = harness.engine->model_config();
  GenerationRequest cold = scored("cold", prompt, 8);
  cold.return_routed_experts = true;
  harness.submit(cold);
  harness.run();
  for (int64_t i = 0; i < 3; ++i) {
    harness.submit(scored("other" + std::to_string(i), prompt_of(stream, 170, 10 + i), 4));
    harness.run();
  }
  GenerationRequest warm = scored("warm", prompt, 8);
  warm.return_routed_experts = true;
  harness.submit(warm);
  harness.run();
  EXPECT_EQ(harness.results["warm"].cached_tokens, 128);
  EXPECT_GE(harness.engine->stats().host_kv_loaded_pages, 2);
  const std::vector<int32_t>& want = harness.results["cold"].routed_experts;
  const std::vector<int32_t>& got = harness.results["warm"].routed_experts;
  const int64_t row = config.num_hidden_layers * config.num_experts_per_tok;
  ASSERT_EQ(static_cast<int64_t>(want.size()), (150 + 8 - 1) * row);
  ASSERT_EQ(got.size(), want.size());
  // The prompt's 128 cached positions: loaded, not computed; the rest recomputed the same way.
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 128 * row, want.begin()));
  int64_t moe_ids = 0;
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const bool moe = want[layer * config.num_experts_per_tok] >= 0;
    for (int64_t j = 0; j < config.num_experts_per_tok; ++j) {
      const int32_t id = want[layer * config.num_experts_per_tok + j];
      EXPECT_EQ(id >= 0, moe) << "layer " << layer;
      EXPECT_LT(id, config.n_routed_experts);
      moe_ids += id >= 0;
    }
  }
  EXPECT_GT(moe_ids, 0);  // the fixtures have MoE layers
  EXPECT_TRUE(harness.results["other0"].routed_experts.empty());

  Harness plain(test_config(), nullptr, 32);
  plain.engine = make_engine(dir, 4, 0);
  plain.submit(cold);
  plain.run();
  EXPECT_EQ(plain.results["cold"].finish, FinishReason::Error);
  EXPECT_NE(plain.results["cold"].finish_detail.find("--enable-return-routed-experts"),
            std::string::npos);
}

TEST_P(HostKvTierEngine, PreemptionUnderATinyPoolGivesTheSameOutputsWithTheTier) {
  const std::string dir = fixture_dir(GetParam());
  const std::vector<int32_t> stream = fixture_prompt(dir);
  auto run = [&](int64_t host_pages, EngineStats* stats) {
    Harness harness(test_config(), nullptr, 32);
    harness.engine = make_engine(dir, /*pages=*/5, host_pages, /*chunk=*/48);
    // Two families of prompts sharing their first page; every request grows
    // to three pages while decoding, so running ones preempt each other.
    for (int64_t i = 0; i < 10; ++i) {
      std::vector<int32_t> prompt = prompt_of(stream, 64, i % 2);
      const std::vector<int32_t> tail = prompt_of(stream, 6 + 3 * i, 100 + i);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      harness.submit(scored("r" + std::to_string(i), prompt, 100));
    }
    harness.run();
    if (stats) *stats = harness.engine->stats();
    return harness.results;
  };
  EngineStats with_tier;
  const auto plain = run(0, nullptr);
  const auto tiered = run(24, &with_tier);
  std::printf("[ %s ] preemptions %ld, pages saved %ld, loaded %ld, host hit tokens %ld\n",
              GetParam().c_str(), static_cast<long>(with_tier.preemptions),
              static_cast<long>(with_tier.host_kv_saved_pages),
              static_cast<long>(with_tier.host_kv_loaded_pages),
              static_cast<long>(with_tier.prefix_cache_host_hits));
  EXPECT_GT(with_tier.preemptions, 0);
  EXPECT_GT(with_tier.host_kv_saved_pages, 0);
  EXPECT_GT(with_tier.host_kv_loaded_pages, 0);
  EXPECT_GT(with_tier.prefix_cache_host_hits, 0);
  expect_same(tiered, plain, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HostKvTierEngine, ::testing::Values("glm_bf16", "dsv32_yarn"));

TEST(HostKvTierEngineSetup, FlushEmptiesTheTierAndBadSizesAreErrors) {
  const std::string dir = fixture_dir("glm_bf16");
  const std::vector<int32_t> stream = fixture_prompt(dir);
  Harness harness(test_config(), nullptr, 32);
  harness.engine = make_engine(dir, 4, 8);
  EXPECT_EQ(harness.engine->stats().host_kv_pages_total, 8);
  for (int64_t i = 0; i < 3; ++i) {
    harness.submit(scored("p" + std::to_string(i), prompt_of(stream, 170, i), 2));
    harness.run();
  }
  EXPECT_GT(harness.engine->stats().host_kv_pages_used, 0);
  EXPECT_TRUE(harness.engine->flush_cache());
  EXPECT_EQ(harness.engine->stats().host_kv_pages_used, 0);
  EXPECT_EQ(harness.engine->stats().prefix_cache_pages, 0);
  harness.engine->check_integrity();

  auto model = load_language_model(dir, ModelLoadOptions{});
  EngineConfig config;
  config.run_thread = false;
  config.kv_dtype = KvDType::F32;
  config.kv_memory_bytes = 4 * page_bytes(model->config());
  config.host_kv_memory_bytes = page_bytes(model->config()) - 1;  // less than a page
  EXPECT_THROW(Engine::create(config, load_language_model(dir, ModelLoadOptions{}),
                              std::make_shared<FakeTokenizer>(32), GenerationDefaults{}),
               Error);
  config.host_kv_memory_bytes = 4 * page_bytes(model->config());
  config.enable_prefix_cache = false;  // the tier holds prefix-cache pages
  EXPECT_THROW(Engine::create(config, std::move(model), std::make_shared<FakeTokenizer>(32),
                              GenerationDefaults{}),
               Error);
}

}  // namespace
}  // namespace megactx::testing
