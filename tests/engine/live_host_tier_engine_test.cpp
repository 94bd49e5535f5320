// The live host tier through the Engine, on the CPU forward pass of the HF
// fixtures: decoding requests move their full pages to offload pages (latents
// in a second host pool, indexer keys beside the pools) and decode on from
// there with exactly the tokens and logprobs of a run without the tier; under
// a tiny device pool, preempted offloaded requests are parked (their offload
// pages kept, only the device tail recomputed) and still give the outputs of
// the plain run; the length threshold, routing replay, a retract and bad
// sizes behave as documented in engine_config.h.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/error.h"
#include "engine_harness.h"
#include "fixture_requests.h"
#include "model/model_loader.h"

namespace megactx::testing {
namespace {

KvCapacityPlan plan_of(const ModelConfig& config) {
  return plan_kv_capacity(config, KvDType::F32, int64_t{1} << 30, 64, false);
}

struct TierSetup {
  int64_t pages = 64;         // device pages (before the tier's indexer keys come off)
  int64_t offload_pages = 0;  // 0: no live host tier
  int64_t min_tokens = 0;     // host_latent_min_tokens
  int64_t chunk = 4096;       // max_prefill_tokens
  bool routed_experts = false;
};

std::unique_ptr<Engine> make_engine(const std::string& dir, const TierSetup& setup) {
  auto model = load_language_model(dir, ModelLoadOptions{});
  const KvCapacityPlan plan = plan_of(model->config());
  EngineConfig config;
  config.run_thread = false;
  config.check_integrity_every_step = true;
  config.record_routed_experts = setup.routed_experts;
  config.kv_dtype = KvDType::F32;
  config.max_prefill_tokens = setup.chunk;
  // The tier's indexer keys come out of the KV budget: add them, so that
  // both runs have `pages` device pages.
  const int64_t indexer_bytes = setup.offload_pages * plan.spec.indexer_bytes_per_page();
  config.kv_memory_bytes =
      (setup.pages + (indexer_bytes + plan.bytes_per_page - 1) / plan.bytes_per_page) *
      plan.bytes_per_page;
  config.host_latent_memory_bytes = setup.offload_pages * plan.spec.latent_bytes_per_page();
  config.host_latent_min_tokens = setup.min_tokens;
  GenerationDefaults defaults = load_generation_defaults(dir, model->config().eos_token_ids);
  const int64_t vocab = model->config().vocab_size;
  return Engine::create(config, std::move(model), std::make_shared<FakeTokenizer>(vocab), defaults);
}

class LiveHostTierEngine : public ::testing::TestWithParam<std::string> {};

// Room for everything on the device either way, so both runs schedule the
// same batches: the forward reads the same bytes, from host memory for the
// offloaded pages, and every logprob is bit-identical.
TEST_P(LiveHostTierEngine, DecodeFromOffloadPagesEqualsDecodeWithoutThem) {
  const std::string dir = fixture_dir(GetParam());
  const std::vector<int32_t> stream = fixture_prompt(dir);
  auto run = [&](int64_t offload_pages, EngineStats* stats) {
    Harness harness(test_config(), nullptr, 32);
    harness.engine = make_engine(dir, {.pages = 24, .offload_pages = offload_pages, .chunk = 96});
    // Prompts of 1 to 3 pages (chunked), decoding past page ends.
    for (int64_t i = 0; i < 4; ++i) {
      harness.submit(scored("r" + std::to_string(i), prompt_of(stream, 40 + 50 * i, i), 90));
    }
    EngineStats peak;
    while (harness.engine->step()) {
      const EngineStats now = harness.engine->stats();
      if (now.host_latent_pages_used > peak.host_latent_pages_used) peak = now;
    }
    if (stats) *stats = peak;
    EXPECT_EQ(harness.engine->stats().host_latent_pages_used, 0);  // all given back
    return harness.results;
  };
  EngineStats tier;
  const Results plain = run(0, nullptr);
  const Results tiered = run(32, &tier);
  std::printf("[ %s ] offload pages in use at most %ld of %ld, moved %ld\n", GetParam().c_str(),
              static_cast<long>(tier.host_latent_pages_used),
              static_cast<long>(tier.host_latent_pages_total),
              static_cast<long>(tier.host_latent_moved_pages));
  EXPECT_EQ(tier.host_latent_pages_total, 32);
  EXPECT_GE(tier.host_latent_pages_used, 8);  // the four requests' full pages, together
  EXPECT_GE(tier.host_latent_moved_pages, tier.host_latent_pages_used);
  expect_same(tiered, plain, 0.0);
}

// A device pool too small for the batch: running requests preempt each
// other. Two short requests stay under the length threshold and keep their
// device pages as they grow; the long one, admitted after them, moves its
// full pages to the tier and is the preemption victim: it is parked (its
// offload pages kept, only its device tail recomputed on resumption). The
// outputs are the plain run's (logprobs within the rounding of other chunk
// splits).
TEST_P(LiveHostTierEngine, ParkedRequestsResumeWithThePlainOutputs) {
  const std::string dir = fixture_dir(GetParam());
  const std::vector<int32_t> stream = fixture_prompt(dir);
  auto run = [&](int64_t offload_pages, EngineStats* stats) {
    Harness harness(test_config(), nullptr, 32);
    harness.engine = make_engine(
        dir, {.pages = 5, .offload_pages = offload_pages, .min_tokens = 131, .chunk = 48});
    harness.submit(scored("short0", prompt_of(stream, 40, 21), 90));  // at most 130 tokens
    harness.submit(scored("short1", prompt_of(stream, 40, 22), 90));
    harness.submit(scored("long", prompt_of(stream, 140, 23), 150));
    harness.run();
    if (stats) *stats = harness.engine->stats();
    return harness.results;
  };
  EngineStats plain_stats, tier;
  const Results plain = run(0, &plain_stats);
  const Results tiered = run(24, &tier);
  std::printf(
      "[ %s ] preemptions %ld without the tier; with it %ld, %ld of them parked, %ld "
      "pages moved\n",
      GetParam().c_str(), static_cast<long>(plain_stats.preemptions),
      static_cast<long>(tier.preemptions), static_cast<long>(tier.host_latent_parked),
      static_cast<long>(tier.host_latent_moved_pages));
  EXPECT_GT(tier.host_latent_parked, 0);
  EXPECT_EQ(tier.host_latent_pages_used, 0);
  expect_same(tiered, plain, 1e-4);
}

// Only requests whose context reaches host_latent_min_tokens move; routed
// experts move with their pages (the offload pages' rows of the table).
TEST_P(LiveHostTierEngine, ThresholdAndRoutedExperts) {
  const std::string dir = fixture_dir(GetParam());
  const std::vector<int32_t> stream = fixture_prompt(dir);
  Harness plain(test_config(), nullptr, 32);
  plain.engine = make_engine(dir, {.pages = 16, .routed_experts = true});
  Harness tiered(test_config(), nullptr, 32);
  tiered.engine = make_engine(
      dir, {.pages = 16, .offload_pages = 8, .min_tokens = 150, .routed_experts = true});
  for (Harness* harness : {&plain, &tiered}) {
    GenerationRequest shorter = scored("short", prompt_of(stream, 70, 3), 40);  // ends at 110
    harness->submit(shorter);
    harness->run();
  }
  EXPECT_EQ(tiered.engine->stats().host_latent_moved_pages, 0);
  for (Harness* harness : {&plain, &tiered}) {
    GenerationRequest longer = scored("long", prompt_of(stream, 140, 4), 60);
    longer.return_routed_experts = true;
    harness->submit(longer);
    harness->run();
  }
  EXPECT_GE(tiered.engine->stats().host_latent_moved_pages, 2);
  expect_same(tiered.results, plain.results, 0.0);
  EXPECT_FALSE(plain.results["long"].routed_experts.empty());
  EXPECT_EQ(tiered.results["long"].routed_experts, plain.results["long"].routed_experts);
}

// A prompt longer than the device pages hold: alone, it prefills in chunks
// that fit, its full pages moving to the tier after every step, and decodes
// on from there; the output is a large device pool's (logprobs within the
// rounding of other chunk splits).
TEST_P(LiveHostTierEngine, PromptLongerThanTheDevicePagesPrefillsIntoTheTier) {
  const std::string dir = fixture_dir(GetParam());
  const std::vector<int32_t> stream = fixture_prompt(dir);
  auto run = [&](int64_t pages, int64_t offload_pages, EngineStats* stats) {
    Harness harness(test_config(), nullptr, 32);
    harness.engine = make_engine(dir, {.pages = pages, .offload_pages = offload_pages});
    harness.submit(scored("long", prompt_of(stream, 230, 7), 20));  // 250 tokens, 3.9 pages
    harness.run();
    if (stats) *stats = harness.engine->stats();
    return harness.results;
  };
  EngineStats tier;
  const Results plain = run(16, 0, nullptr);
  const Results tiered = run(3, 8, &tier);
  EXPECT_EQ(tier.max_context_tokens, 256);  // the model's context, past the 192 device tokens
  EXPECT_GE(tier.host_latent_moved_pages, 3);
  EXPECT_EQ(tier.host_latent_pages_used, 0);
  expect_same(tiered, plain, 1e-4);
}

// Two long requests whose latents do not fit the offload pages together: the
// later one is preempted and parked, and the earlier one, which cannot finish
// on the device pages, takes its offload pages (the parked one recomputes).
TEST_P(LiveHostTierEngine, ARequestThatMustMoveTakesParkedOffloadPages) {
  const std::string dir = fixture_dir(GetParam());
  const std::vector<int32_t> stream = fixture_prompt(dir);
  auto run = [&](int64_t pages, int64_t offload_pages, EngineStats* stats) {
    Harness harness(test_config(), nullptr, 32);
    harness.engine =
        make_engine(dir, {.pages = pages, .offload_pages = offload_pages, .chunk = 48});
    // 240 tokens each: three full pages each, on four offload pages.
    harness.submit(scored("first", prompt_of(stream, 150, 8), 90));
    harness.submit(scored("second", prompt_of(stream, 150, 9), 90));
    harness.run();
    if (stats) *stats = harness.engine->stats();
    return harness.results;
  };
  EngineStats tier;
  const Results plain = run(16, 0, nullptr);
  const Results tiered = run(3, 4, &tier);
  std::printf(
      "[ %s ] preemptions %ld, parked %ld, dropped %ld, pages moved %ld\n", GetParam().c_str(),
      static_cast<long>(tier.preemptions), static_cast<long>(tier.host_latent_parked),
      static_cast<long>(tier.host_latent_dropped), static_cast<long>(tier.host_latent_moved_pages));
  EXPECT_GT(tier.host_latent_dropped, 0);
  EXPECT_EQ(tier.host_latent_pages_used, 0);
  expect_same(tiered, plain, 1e-4);
}

// pause_generation's retract drops offloaded requests' pages (they recompute
// with the weights they resume with) and the outputs stay the plain run's.
TEST_P(LiveHostTierEngine, RetractDropsOffloadPages) {
  const std::string dir = fixture_dir(GetParam());
  const std::vector<int32_t> stream = fixture_prompt(dir);
  auto run = [&](int64_t offload_pages) {
    Harness harness(test_config(), nullptr, 32);
    harness.engine = make_engine(dir, {.pages = 16, .offload_pages = offload_pages});
    harness.submit(scored("a", prompt_of(stream, 130, 5), 40));
    harness.submit(scored("b", prompt_of(stream, 90, 6), 40));
    for (int i = 0; i < 6; ++i) harness.engine->step();
    if (offload_pages > 0) {
      EXPECT_GT(harness.engine->stats().host_latent_pages_used, 0);
    }
    harness.engine->pause(PauseMode::Retract);
    EXPECT_EQ(harness.engine->stats().host_latent_pages_used, 0);
    harness.engine->resume();
    harness.run();
    return harness.results;
  };
  expect_same(run(8), run(0), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LiveHostTierEngine, ::testing::Values("glm_bf16", "dsv32_yarn"));

TEST(LiveHostTierEngineSetup, BadSizesAreErrors) {
  const std::string dir = fixture_dir("glm_bf16");
  auto model = load_language_model(dir, ModelLoadOptions{});
  const KvCapacityPlan plan = plan_of(model->config());
  auto attempt = [&](int64_t kv_bytes, int64_t latent_bytes) {
    EngineConfig config;
    config.run_thread = false;
    config.kv_dtype = KvDType::F32;
    config.kv_memory_bytes = kv_bytes;
    config.host_latent_memory_bytes = latent_bytes;
    return Engine::create(config, load_language_model(dir, ModelLoadOptions{}),
                          std::make_shared<FakeTokenizer>(model->config().vocab_size), {});
  };
  // Less than one page of latents.
  EXPECT_THROW(attempt(8 * plan.bytes_per_page, plan.spec.latent_bytes_per_page() - 1), Error);
  // Indexer keys of more offload pages than the KV budget can hold beside a device page.
  const int64_t too_many = 8 * plan.bytes_per_page / plan.spec.indexer_bytes_per_page() + 1;
  EXPECT_THROW(attempt(8 * plan.bytes_per_page, too_many * plan.spec.latent_bytes_per_page()),
               Error);
  EXPECT_NO_THROW(attempt(8 * plan.bytes_per_page, 4 * plan.spec.latent_bytes_per_page()));
}

}  // namespace
}  // namespace megactx::testing
