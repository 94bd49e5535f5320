// The logprob fields an RL trainer reads, through the Engine on the default
// model: token_ids_logprob gives at every decode and input position exactly
// the values the full distribution (top_logprobs_num = vocabulary) has for
// those ids; temp_scaled_logprobs gives log_softmax(logits / T); both are
// the same under MTP speculation as without it.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/engine.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"

namespace megactx {
namespace {

const std::string kModel = std::string(MEGACTX_SOURCE_DIR) + "/models/default";
const std::vector<int32_t> kAsked = {0, 5, 100, 4000};

struct Collected {
  std::vector<TokenLogprob> output, input;
  std::vector<int32_t> tokens;
};

Collected run(GenerationRequest request, int64_t speculative_steps = 0, int64_t max_logit_rows = 0,
              bool deterministic = false) {
  EngineConfig config;
  config.run_thread = false;
  config.kv_memory_bytes = int64_t{64} << 20;
  config.kv_dtype = KvDType::F32;
  config.model_dir = kModel;
  config.speculative_steps = speculative_steps;
  config.max_logit_rows = max_logit_rows;
  config.max_running_requests = 4;
  config.deterministic = deterministic;
  ModelLoadOptions load;
  load.deterministic = deterministic;
  auto engine = Engine::create(config, load_language_model(kModel, load), Tokenizer::load(kModel),
                               load_generation_defaults(kModel, {}));
  Collected c;
  engine->submit(std::move(request), [&](const RequestUpdate& update) {
    c.output.insert(c.output.end(), update.new_logprobs.begin(), update.new_logprobs.end());
    c.input.insert(c.input.end(), update.input_logprobs.begin(), update.input_logprobs.end());
    c.tokens.insert(c.tokens.end(), update.new_token_ids.begin(), update.new_token_ids.end());
  });
  engine->run_until_idle();
  return c;
}

GenerationRequest request(double temperature, bool scaled, int64_t top) {
  GenerationRequest r;
  r.rid = "r";
  r.input_ids = {3, 17, 99, 42, 7, 1, 250, 31, 64, 12};
  r.sampling.temperature = temperature;
  r.sampling.seed = 11;
  r.sampling.max_new_tokens = 8;
  r.sampling.ignore_eos = true;
  r.return_logprob = true;
  r.logprob_start_len = 0;
  r.top_logprobs_num = top;
  r.token_ids_logprob = kAsked;
  r.temp_scaled_logprobs = scaled;
  return r;
}

void expect_asked_match_full(const std::vector<TokenLogprob>& entries, const std::string& what) {
  ASSERT_FALSE(entries.empty()) << what;
  for (const TokenLogprob& entry : entries) {
    if (std::isnan(entry.logprob)) continue;  // prompt position 0: nothing precedes it
    std::map<int32_t, float> full(entry.top.begin(), entry.top.end());
    ASSERT_EQ(entry.token_ids.size(), kAsked.size()) << what;
    for (size_t i = 0; i < kAsked.size(); ++i) {
      EXPECT_EQ(entry.token_ids[i].first, kAsked[i]) << what;
      EXPECT_EQ(entry.token_ids[i].second, full.at(kAsked[i])) << what;
    }
    EXPECT_EQ(entry.logprob, full.at(entry.token_id)) << what;
  }
}

TEST(LogprobFields, TokenIdsEqualTheFullDistribution) {
  const int64_t vocab = load_model_config(kModel).vocab_size;
  const Collected greedy = run(request(0.0, false, vocab));
  expect_asked_match_full(greedy.output, "decode");
  expect_asked_match_full(greedy.input, "input");
  const Collected sampled = run(request(0.7, true, vocab));
  expect_asked_match_full(sampled.output, "decode, temperature-scaled");
}

TEST(LogprobFields, TemperatureScaledIsLogSoftmaxOfScaledLogits) {
  const int64_t vocab = load_model_config(kModel).vocab_size;
  const double t = 0.7;
  const Collected raw = run(request(t, false, vocab));
  const Collected scaled = run(request(t, true, vocab));
  EXPECT_EQ(raw.tokens, scaled.tokens);  // only the reported numbers differ
  ASSERT_EQ(raw.output.size(), scaled.output.size());
  for (size_t p = 0; p < raw.output.size(); ++p) {
    // raw log p_i = l_i - logZ: l_i / t up to a constant, so
    // scaled_i = raw_i / t - log sum_j exp(raw_j / t).
    double z = 0;
    for (const auto& [id, lp] : raw.output[p].top) z += std::exp(lp / t);
    for (size_t i = 0; i < kAsked.size(); ++i) {
      const double expected = raw.output[p].token_ids[i].second / t - std::log(z);
      EXPECT_NEAR(scaled.output[p].token_ids[i].second, expected, 1e-4) << p;
    }
  }
  // Greedy requests keep the raw distribution (no temperature to scale by).
  const Collected greedy_raw = run(request(0.0, false, 0));
  const Collected greedy_scaled = run(request(0.0, true, 0));
  for (size_t p = 0; p < greedy_raw.output.size(); ++p)
    EXPECT_EQ(greedy_raw.output[p].token_ids, greedy_scaled.output[p].token_ids);
}

TEST(LogprobFields, SpeculationReportsTheSameValues) {
  const Collected plain = run(request(0.0, false, 0));
  const Collected speculated = run(request(0.0, false, 0), /*speculative_steps=*/3);
  EXPECT_EQ(speculated.tokens, plain.tokens);
  ASSERT_EQ(speculated.output.size(), plain.output.size());
  for (size_t p = 0; p < plain.output.size(); ++p) {
    ASSERT_EQ(speculated.output[p].token_ids.size(), kAsked.size());
    for (size_t i = 0; i < kAsked.size(); ++i)
      EXPECT_NEAR(speculated.output[p].token_ids[i].second, plain.output[p].token_ids[i].second,
                  2e-3)
          << p;
  }
}

// --max-logit-rows: a scoring prompt whose positions want more logits rows
// than a step may have is prefilled in chunks that fit; in the deterministic
// mode (chunking-invariant) every value equals the unchunked run's.
TEST(LogprobFields, LogitRowLimitChunksScoringWithTheSameValues) {
  GenerationRequest r = request(1.0, false, 3);
  r.input_ids.clear();
  for (int32_t i = 0; i < 45; ++i) r.input_ids.push_back((i * 37 + 5) % 3000);
  r.sampling.max_new_tokens = 0;
  r.logprob_start_len = 2;
  const Collected whole = run(r, 0, 0, true);
  const Collected chunked = run(r, 0, 6, true);
  ASSERT_EQ(whole.input.size(), 43u);  // positions 2..44
  ASSERT_EQ(chunked.input.size(), whole.input.size());
  for (size_t i = 0; i < whole.input.size(); ++i) {
    EXPECT_EQ(chunked.input[i].token_id, whole.input[i].token_id) << i;
    EXPECT_EQ(chunked.input[i].logprob, whole.input[i].logprob) << i;
    EXPECT_EQ(chunked.input[i].top, whole.input[i].top) << i;
    ASSERT_EQ(chunked.input[i].token_ids.size(), kAsked.size());
    EXPECT_EQ(chunked.input[i].token_ids, whole.input[i].token_ids) << i;
  }
}

}  // namespace
}  // namespace megactx
