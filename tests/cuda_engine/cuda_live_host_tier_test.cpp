// The live host tier through the Engine on the CUDA model (fp8 KV, the fast
// DSA kernels, a small random GLM-5.x-shaped model): decoding requests move
// their full pages to offload pages in pinned host memory and decode from
// there (kept in the hot cache, staged every step, or read over the bus),
// with exactly the
// tokens and logprobs of an engine without the tier (the same batches: the
// same bytes reach the same kernels); under a tiny device pool the long
// request is parked and resumes, and its tokens stay the plain engine's
// (logprobs within the rounding of other batch compositions).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "../cuda_model/glm_shaped_model.h"
#include "../engine/engine_harness.h"
#include "engine/kv_capacity.h"
#include "model/cuda/cuda_model.h"
#include "model/dsa_model.h"

namespace megactx::testing {
namespace {

struct TierSetup {
  int64_t pages = 64;
  int64_t offload_pages = 0;
  int64_t min_tokens = 0;
  int64_t chunk = 4096;
  // The deterministic mode (CudaModelOptions::batch_invariant): selections in
  // position order, one split, so that results do not depend on the order in
  // which the radix top-k's atomics place the selected positions.
  bool deterministic = false;
  int64_t row_block = 0;  // CudaModelOptions::row_block (0: its default)
};

std::unique_ptr<Engine> make_engine(const LanguageModel& host, const TierSetup& setup) {
  CudaModelOptions options;
  options.fast_attention = true;
  options.logits_on_device = true;
  options.batch_invariant = setup.deterministic;
  if (setup.row_block > 0) options.row_block = setup.row_block;
  auto model = make_cuda_dsa_model(static_cast<const DsaModel&>(host), options);
  const KvCacheSpec spec = make_kv_cache_spec(model->config(), 0, KvDType::FP8, 64, false);
  EngineConfig config;
  config.run_thread = false;
  config.check_integrity_every_step = true;
  config.kv_dtype = KvDType::FP8;
  config.max_prefill_tokens = setup.chunk;
  config.max_running_requests = 8;
  // Both engines get `pages` device pages: the tier's indexer keys are added.
  const int64_t indexer_bytes = setup.offload_pages * spec.indexer_bytes_per_page();
  config.kv_memory_bytes =
      (setup.pages + (indexer_bytes + spec.bytes_per_page() - 1) / spec.bytes_per_page()) *
      spec.bytes_per_page();
  config.host_latent_memory_bytes = setup.offload_pages * spec.latent_bytes_per_page();
  config.host_latent_min_tokens = setup.min_tokens;
  GenerationDefaults defaults;
  defaults.eos_token_ids = {0};
  const int64_t vocab = model->config().vocab_size;
  return Engine::create(config, std::move(model), std::make_shared<FakeTokenizer>(vocab), defaults);
}

GenerationRequest scored(const std::string& rid, int64_t length, uint64_t seed, int64_t tokens) {
  GenerationRequest request = greedy_request(rid, make_prompt(seed, length, 510), tokens, true);
  for (int32_t& id : request.input_ids) id += 2;  // ids 0 and 1 are eos / bos
  request.return_logprob = true;
  request.top_logprobs_num = 2;
  return request;
}

using Results = std::map<std::string, Collected>;

Results run(const LanguageModel& host, const TierSetup& setup,
            const std::vector<GenerationRequest>& requests, EngineStats* stats) {
  Harness harness(test_config(), nullptr, 512);
  harness.engine = make_engine(host, setup);
  for (const GenerationRequest& request : requests) harness.submit(request);
  harness.run();
  if (stats) *stats = harness.engine->stats();
  return harness.results;
}

TEST(CudaLiveHostTier, DecodeFromHostMemoryEqualsThePlainEngineBitForBit) {
  auto host = host_model({64, 32}, 2048);
  const std::vector<GenerationRequest> requests = {scored("a", 300, 1, 40), scored("b", 170, 2, 40),
                                                   scored("c", 90, 3, 40)};
  const Results plain = run(*host, {}, requests, nullptr);
  // The hot cache (its misses copied on the side stream, or each layer's on
  // the compute stream; also with 300 lines: collisions, the 2048 offload
  // slots in seven rotated cycles, or plain modulo lines), staging every step,
  // and reads straight from host memory.
  for (const char* mode : {"hot", "hot-one-stream", "hot300", "modulo300", "staging", "direct"}) {
    const std::string m = mode;
    const bool hot = m.starts_with("hot") || m.ends_with("300");
    setenv("MEGACTX_OFFLOAD_STAGING", m == "direct" ? "0" : "1", 1);
    setenv("MEGACTX_OFFLOAD_HOT", m == "staging" ? "0" : "1", 1);
    setenv("MEGACTX_OFFLOAD_HOT_LINES", m.ends_with("300") ? "300" : "0", 1);
    setenv("MEGACTX_OFFLOAD_LINE_MAP", m == "modulo300" ? "modulo" : "rotated", 1);
    setenv("MEGACTX_OFFLOAD_SIDE_STREAM", m == "hot-one-stream" ? "0" : "1", 1);
    EngineStats stats;
    const Results tiered = run(*host, {.offload_pages = 32}, requests, &stats);
    EXPECT_GE(stats.host_latent_moved_pages, 7) << "mode " << mode;
    EXPECT_EQ(stats.host_latent_pages_used, 0);
    // What the staging counted: consecutive steps select mostly the same
    // entries, so the hot cache hits; staging copies every selected entry in
    // every layer; direct reads copy nothing.
    const int64_t selected = stats.host_latent_selected_entries;
    if (m == "direct") {
      EXPECT_EQ(selected, 0);
      EXPECT_EQ(stats.host_latent_copied_bytes, 0);
    } else {
      EXPECT_GT(selected, 0) << mode;
      EXPECT_GT(stats.host_latent_read_steps, 0) << mode;
      EXPECT_LE(stats.host_latent_read_steps, 3 * 40) << mode;  // at most one per forward
      EXPECT_GE(stats.host_latent_copied_bytes, 656) << mode;
    }
    if (hot) {
      EXPECT_GT(stats.host_latent_hot_hits, selected / 4) << mode;
      EXPECT_LE(stats.host_latent_hot_hits, selected) << mode;
    } else {
      EXPECT_EQ(stats.host_latent_hot_hits, 0) << mode;
    }
    if (m == "staging") {
      EXPECT_GE(stats.host_latent_copied_bytes, selected * 656) << mode;
    }
    std::printf(
        "mode %s: %lld offload entries selected, %lld hot hits, %lld bytes copied in %lld "
        "steps\n",
        mode, static_cast<long long>(selected), static_cast<long long>(stats.host_latent_hot_hits),
        static_cast<long long>(stats.host_latent_copied_bytes),
        static_cast<long long>(stats.host_latent_read_steps));
    for (const auto& [rid, want] : plain) {
      const Collected& got = tiered.at(rid);
      EXPECT_EQ(got.tokens, want.tokens) << rid << " mode " << mode;
      ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << rid;
      for (size_t i = 0; i < want.logprobs.size(); ++i)
        EXPECT_EQ(got.logprobs[i].logprob, want.logprobs[i].logprob) << rid << " " << i;
    }
  }
  unsetenv("MEGACTX_OFFLOAD_STAGING");
  unsetenv("MEGACTX_OFFLOAD_HOT");
  unsetenv("MEGACTX_OFFLOAD_HOT_LINES");
  unsetenv("MEGACTX_OFFLOAD_LINE_MAP");
  unsetenv("MEGACTX_OFFLOAD_SIDE_STREAM");
}

// A prompt longer than the device pages hold prefills into the tier: chunks
// of 128 rows (past the per-step staging) read the offload entries their
// top-k selects from the union staging (every row's selection copied once per
// layer), from a union staging smaller than the union (the rest over the
// bus), from the union of a chunk of several row blocks (40 rows: its
// blocks rewrite their slots to the one union), or straight from host
// memory; the deterministic mode makes every
// row's result independent of the order of its selection and of its chunk,
// so tokens and logprobs are the plain engine's bit for bit.
TEST(CudaLiveHostTier, APromptLongerThanTheDevicePagesPrefillsIntoTheTier) {
  auto host = host_model({64, 32}, 256);
  const std::vector<GenerationRequest> requests = {scored("long", 700, 21, 24)};
  const Results plain = run(*host, {.chunk = 128, .deterministic = true}, requests, nullptr);
  for (const char* mode : {"union", "union100", "union-blocks", "direct"}) {
    const std::string m = mode;
    setenv("MEGACTX_OFFLOAD_STAGING", m == "direct" ? "0" : "1", 1);
    setenv("MEGACTX_OFFLOAD_UNION_ROWS", m == "union100" ? "100" : "1048576", 1);
    EngineStats stats;
    const Results tiered = run(*host,
                               {.pages = 4,
                                .offload_pages = 16,
                                .chunk = 128,
                                .deterministic = true,
                                .row_block = m == "union-blocks" ? 40 : 0},
                               requests, &stats);
    EXPECT_EQ(stats.max_context_tokens, 18 * 64) << mode;  // 16 offload + 4 - 2 device pages
    EXPECT_GE(stats.host_latent_moved_pages, 10) << mode;
    EXPECT_EQ(stats.host_latent_pages_used, 0) << mode;
    const Collected& got = tiered.at("long");
    const Collected& want = plain.at("long");
    EXPECT_EQ(got.tokens, want.tokens) << mode;
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size()) << mode;
    for (size_t i = 0; i < want.logprobs.size(); ++i)
      EXPECT_EQ(got.logprobs[i].logprob, want.logprobs[i].logprob) << mode << " " << i;
  }
  unsetenv("MEGACTX_OFFLOAD_STAGING");
  unsetenv("MEGACTX_OFFLOAD_UNION_ROWS");
}

// Two short requests under the length threshold keep their device pages as
// they grow; the long one, admitted after them, moves its pages to the tier
// and is the preemption victim: parked, then resumed from its offload pages.
// Its batches differ from the plain engine's, so logprobs may differ by
// rounding: a token may differ only where the plain engine's top two were
// within that rounding (a near tie), and the run is compared up to there.
TEST(CudaLiveHostTier, AParkedRequestResumesWithThePlainTokens) {
  auto host = host_model({64, 32}, 2048);
  const std::vector<GenerationRequest> requests = {
      scored("short0", 40, 11, 90), scored("short1", 40, 12, 90), scored("long", 140, 13, 150)};
  EngineStats stats;
  const Results plain = run(*host, {.pages = 5, .chunk = 48}, requests, nullptr);
  const Results tiered = run(
      *host, {.pages = 5, .offload_pages = 24, .min_tokens = 131, .chunk = 48}, requests, &stats);
  EXPECT_GT(stats.host_latent_parked, 0);
  for (const auto& [rid, want] : plain) {
    const Collected& got = tiered.at(rid);
    ASSERT_EQ(got.tokens.size(), want.tokens.size()) << rid;
    for (size_t i = 0; i < want.tokens.size(); ++i) {
      if (got.tokens[i] != want.tokens[i]) {
        const auto& top = want.logprobs[i].top;
        ASSERT_GE(top.size(), 2u);
        EXPECT_LT(std::fabs(top[0].second - top[1].second), 2e-2)
            << rid << " token " << i << " differs without a near tie";
        break;
      }
      EXPECT_NEAR(got.logprobs[i].logprob, want.logprobs[i].logprob, 2e-2) << rid << " " << i;
    }
  }
}

}  // namespace
}  // namespace megactx::testing
