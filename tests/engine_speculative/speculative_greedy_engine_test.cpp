// Greedy MTP speculation through the serving Engine must emit exactly the
// tokens of the Engine without speculation, token for token, for many
// requests submitted together (different lengths, so different accept counts
// per step), for k = 1, 3, 7 with and without IndexShare/KVShare, with
// chunked prefill, under a KV budget that forces preemption, from prefix
// cache hits and with the live host tier; every step ends with Engine::check_integrity(). The spec_*
// counters of every request and of EngineStats must be consistent.
// Models: models/default (trained MTP layer: drafts are accepted) and the HF
// fixtures with MTP weights (random: drafts mostly rejected).
#include <gtest/gtest.h>

#include <cmath>

#include "spec_engine_util.h"

namespace megactx::testing {
namespace {

using ModelCase = SpecModelCase;

class SpeculativeEngine : public ::testing::TestWithParam<ModelCase> {
 protected:
  // Runs every prompt through one engine (all submitted together).
  static std::map<std::string, SpecResult> run_all(const ModelCase& c,
                                                   const SpecEngineOptions& options,
                                                   const std::vector<std::vector<int32_t>>& prompts,
                                                   int64_t* preemptions = nullptr,
                                                   EngineStats* stats = nullptr) {
    SpecEngine spec(c.dir, options);
    for (size_t i = 0; i < prompts.size(); ++i) {
      spec.submit(make_request("r" + std::to_string(i), prompts[i], c.new_tokens));
    }
    spec.run();
    if (preemptions) *preemptions = spec.engine->num_preemptions();
    if (stats) *stats = spec.engine->stats();
    return spec.results;
  }

  const std::vector<std::vector<int32_t>>& prompts() {
    if (prompts_.empty()) {
      SpecEngine probe(GetParam().dir, SpecEngineOptions{});
      prompts_ = spec_prompts_for(GetParam(), probe.vocab);
    }
    return prompts_;
  }
  const std::map<std::string, SpecResult>& reference() {
    if (reference_.empty()) reference_ = run_all(GetParam(), SpecEngineOptions{}, prompts());
    return reference_;
  }

  void expect_equal(const std::map<std::string, SpecResult>& got, const std::string& what) {
    const auto& expected = reference();
    ASSERT_EQ(got.size(), expected.size()) << what;
    for (const auto& [rid, result] : expected) {
      ASSERT_TRUE(got.contains(rid)) << what << " " << rid;
      EXPECT_EQ(got.at(rid).tokens, result.tokens) << what << " " << rid;
      EXPECT_EQ(got.at(rid).finish, FinishReason::Length) << what << " " << rid;
      EXPECT_EQ(got.at(rid).completion_tokens, GetParam().new_tokens) << what << " " << rid;
    }
  }

  std::vector<std::vector<int32_t>> prompts_;
  std::map<std::string, SpecResult> reference_;
};

// spec counters: per request and summed into EngineStats.
void expect_consistent_stats(const std::map<std::string, SpecResult>& results, int64_t k,
                             const EngineStats& stats, bool trained) {
  int64_t verify = 0, accepted = 0, drafted = 0;
  for (const auto& [rid, r] : results) {
    EXPECT_GT(r.verify_ct, 0) << rid;
    EXPECT_LE(r.accepted_tokens, r.draft_tokens) << rid;
    // k drafts per verification, fewer only near max_new_tokens (at most k
    // verifications there, each with at least one draft).
    EXPECT_LE(r.draft_tokens, k * r.verify_ct) << rid;
    EXPECT_GE(r.draft_tokens, k * (r.verify_ct - k) + std::min(k, r.verify_ct)) << rid;
    // The prefill gives the first token, every verification accepted + 1
    // (never past max_new_tokens), a plain step at most the last one.
    const int64_t plain = r.completion_tokens - 1 - r.verify_ct - r.accepted_tokens;
    EXPECT_TRUE(plain == 0 || plain == 1) << rid << " " << plain;
    verify += r.verify_ct;
    accepted += r.accepted_tokens;
    drafted += r.draft_tokens;
  }
  EXPECT_EQ(stats.spec_verify_steps, verify);
  EXPECT_EQ(stats.spec_accepted_tokens, accepted);
  if (trained) {
    // The trained MTP layer gets some drafts accepted and some rejected: the
    // batch exercised both acceptance and rollback.
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, drafted);
  }
}

TEST_P(SpeculativeEngine, GreedyEqualsPlainForK1K3K7) {
  for (const int64_t k : {1, 3, 7}) {
    SpecEngineOptions options;
    options.steps = k;
    EngineStats stats;
    const auto got = run_all(GetParam(), options, prompts(), nullptr, &stats);
    expect_equal(got, "k=" + std::to_string(k));
    expect_consistent_stats(got, k, stats, GetParam().trained);
  }
}

// --speculative-auto: the policy measures drafting and plain steps (both run
// while it warms up), and whatever it chooses per step, the tokens are the
// plain engine's.
TEST_P(SpeculativeEngine, GreedyEqualsPlainWithTheMeasuredPolicy) {
  SpecEngineOptions options;
  options.steps = 3;
  options.automatic = true;
  EngineStats stats;
  const auto got = run_all(GetParam(), options, prompts(), nullptr, &stats);
  expect_equal(got, "auto k=3");
  EXPECT_GT(stats.spec_verify_steps, 0);
  EXPECT_GT(stats.spec_off_steps, 0);
}

TEST_P(SpeculativeEngine, GreedyEqualsPlainWithoutSharing) {
  SpecEngineOptions options;
  options.steps = 3;
  options.share = false;
  expect_equal(run_all(GetParam(), options, prompts()), "unshared k=3");
}

TEST_P(SpeculativeEngine, GreedyEqualsPlainWithChunkedPrefill) {
  SpecEngineOptions options;
  options.steps = 3;
  options.max_prefill_tokens = 19;  // chunks end mid-page and mid-prompt
  expect_equal(run_all(GetParam(), options, prompts()), "chunked k=3");
}

TEST_P(SpeculativeEngine, GreedyEqualsPlainUnderPreemption) {
  for (const int64_t k : {3, 7}) {
    SpecEngineOptions options;
    options.steps = k;
    options.pages = 5;  // 320 tokens for all requests together
    options.max_prefill_tokens = 64;
    int64_t preemptions = 0;
    expect_equal(run_all(GetParam(), options, prompts(), &preemptions),
                 "preemption k=" + std::to_string(k));
    EXPECT_GT(preemptions, 0) << "k=" << k;
  }
}

// The live host tier: full pages (target and MTP layer entries) move to
// offload pages as requests decode, drafts and verification read them from
// there; with a tiny device pool offloaded requests are parked and resume.
TEST_P(SpeculativeEngine, GreedyEqualsPlainWithTheLiveHostTier) {
  for (const int64_t pages : {64, 5}) {
    SpecEngineOptions options;
    options.steps = 3;
    options.pages = pages;
    options.max_prefill_tokens = 64;
    options.offload_pages = 48;
    EngineStats stats;
    expect_equal(run_all(GetParam(), options, prompts(), nullptr, &stats),
                 "live host tier, " + std::to_string(pages) + " device pages");
    EXPECT_GT(stats.host_latent_moved_pages, 0) << pages << " device pages";
    EXPECT_EQ(stats.host_latent_pages_used, 0) << pages << " device pages";
  }
}

// The same prompt twice and prompts sharing a prefix of whole pages: later
// requests start from cached pages (target and MTP entries).
TEST_P(SpeculativeEngine, PrefixCacheHitsEqualPlain) {
  const ModelCase& c = GetParam();
  std::vector<int32_t> base = prompts()[5];
  if (base.size() < 129) base.insert(base.end(), prompts()[3].begin(), prompts()[3].end());
  std::vector<std::vector<int32_t>> sequence = {base, base};
  for (const size_t shared : {64u, 100u, 128u}) {
    std::vector<int32_t> p(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(shared));
    const std::vector<int32_t> tail = prompts()[1];
    p.insert(p.end(), tail.begin(), tail.end());
    sequence.push_back(p);
  }
  auto run = [&](int64_t k) {
    SpecEngineOptions options;
    options.steps = k;
    SpecEngine spec(c.dir, options);
    // One after the other, so each finds the pages of the previous ones.
    for (size_t i = 0; i < sequence.size(); ++i) {
      spec.submit(make_request("p" + std::to_string(i), sequence[i], c.new_tokens));
      spec.run();
    }
    return spec.results;
  };
  const auto plain = run(0);
  for (const int64_t k : {1, 3}) {
    const auto got = run(k);
    for (size_t i = 0; i < sequence.size(); ++i) {
      const std::string rid = "p" + std::to_string(i);
      EXPECT_EQ(got.at(rid).tokens, plain.at(rid).tokens) << rid << " k=" << k;
      if (i > 0) {
        EXPECT_GE(got.at(rid).cached_tokens, 64) << rid;
      }
      EXPECT_GT(got.at(rid).verify_ct, 0) << rid;
    }
  }
}

// Requests that run into the context length (the fixture's 256 positions):
// drafts never reach past it and the output ends where plain decoding ends.
TEST(SpeculativeEngineContext, DraftsStopAtTheContextLength) {
  const std::string dir = source_path("tests/fixtures/mtp/glm_schedule");
  std::map<std::string, SpecResult> results[2];
  for (const int64_t k : {0, 7}) {
    SpecEngineOptions options;
    options.steps = k;
    SpecEngine spec(dir, options);
    for (const int64_t length : {200, 230, 250, 255}) {
      spec.submit(make_request("c" + std::to_string(length),
                               hashed_prompt(static_cast<uint64_t>(length), length, spec.vocab),
                               100));
    }
    spec.run();
    results[k ? 1 : 0] = spec.results;
  }
  for (const auto& [rid, plain] : results[0]) {
    const SpecResult& spec = results[1].at(rid);
    EXPECT_EQ(spec.tokens, plain.tokens) << rid;
    EXPECT_EQ(spec.finish, FinishReason::Length) << rid;
    EXPECT_EQ(spec.completion_tokens, plain.completion_tokens) << rid;
    EXPECT_LE(spec.draft_tokens, 7 * spec.verify_ct) << rid;
  }
  EXPECT_EQ(results[1].at("c200").completion_tokens, 56);
  EXPECT_GT(results[1].at("c200").verify_ct, 0);
}

// After verification rounds with rejections (rolled-back drafts, then the MTP
// refill of the accepted rows), every cache entry of the target layers and
// of the MTP layer at computed positions equals what a fresh prefill of the
// same tokens writes (float32 cache, so up to GEMM rounding).
TEST(SpeculativeEngineCache, EntriesAfterRollbackEqualAFreshPrefill) {
  const std::string dir = source_path("models/default");
  const std::vector<int32_t> text = default_text_tokens();
  const std::vector<int32_t> prompt(text.begin() + 900, text.begin() + 1030);
  SpecEngineOptions options;
  options.steps = 7;
  SpecEngine speculating(dir, options);
  speculating.submit(make_request("long", prompt, 1000));  // read mid-way below
  for (int step = 0; step < 7; ++step) speculating.engine->step();
  const auto held = speculating.engine->held_sequence("long");
  ASSERT_TRUE(held.has_value());
  ASSERT_GT(speculating.results["long"].verify_ct, 2);
  const int64_t computed = held->num_computed;
  ASSERT_GT(computed, static_cast<int64_t>(prompt.size()) + 8);

  // Fresh: a prefill of the same computed tokens (target and MTP layer), one
  // new token; its pages stay held while it runs its only step.
  SpecEngine fresh(dir, options);
  fresh.submit(make_request(
      "fresh", std::vector<int32_t>(held->tokens.begin(), held->tokens.begin() + computed), 2));
  fresh.engine->step();
  const auto fresh_held = fresh.engine->held_sequence("fresh");
  ASSERT_TRUE(fresh_held.has_value());
  ASSERT_EQ(fresh_held->num_computed, computed);

  const PagedKvCache& a_cache = speculating.engine->kv_cache();
  const PagedKvCache& b_cache = fresh.engine->kv_cache();
  const ModelConfig& c = speculating.engine->model_config();
  const int64_t lora = c.kv_lora_rank, rope = c.qk_rope_head_dim, dim = c.index_head_dim;
  std::vector<float> a(lora + rope), b(lora + rope), ka(dim), kb(dim);
  auto slot = [](const Engine::HeldSequence& s, int64_t p) {
    return int64_t{s.page_table[static_cast<size_t>(p / 64)]} * 64 + p % 64;
  };
  double worst = 0.0;
  for (int64_t layer = 0; layer <= c.num_hidden_layers; ++layer) {
    for (int64_t p = 0; p < computed; ++p) {
      a_cache.read_latent(layer, slot(*held, p), a.data(), a.data() + lora);
      b_cache.read_latent(layer, slot(*fresh_held, p), b.data(), b.data() + lora);
      for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
      if (a_cache.has_indexer(layer)) {
        a_cache.read_indexer_key(layer, slot(*held, p), ka.data());
        b_cache.read_indexer_key(layer, slot(*fresh_held, p), kb.data());
        for (int64_t i = 0; i < dim; ++i) worst = std::max(worst, double(std::fabs(ka[i] - kb[i])));
      }
    }
  }
  EXPECT_LT(worst, 1e-3) << "cache entries differ from a fresh prefill";
}

const ModelCase kCases[] = {
    {"default", source_path("models/default"), 24, true},
    {"glm_schedule", source_path("tests/fixtures/mtp/glm_schedule"), 40, false},
    {"dsv32_yarn", source_path("tests/fixtures/mtp/dsv32_yarn"), 40, false},
};
INSTANTIATE_TEST_SUITE_P(Models, SpeculativeEngine, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace megactx::testing
