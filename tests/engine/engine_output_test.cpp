// What the engine streams back: text with stop strings across tokens, UTF-8
// held until complete, eos/stop ids, min_new_tokens, output and input
// logprobs against the model's own log_softmax, seeded sampling independent
// of batch composition.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/cpu_sampler.h"
#include "engine_harness.h"

namespace megactx::testing {
namespace {

constexpr int32_t kEos = 31;
// Tokens: a=0 b=1 c=2 ..., 26+27 = "é", 28 = "<|", 29 = "|>".
const std::vector<int32_t> kPrompt = {0, 1, 2};

Harness scripted(std::vector<int32_t> script, EngineConfig config = test_config()) {
  return Harness(config, std::make_unique<ScriptedModel>(std::move(script), 3));
}

TEST(EngineOutput, StopStringSplitAcrossTokens) {
  Harness harness = scripted({0, 2, 28, 29, 3, 4});  // "a" "c" "<|" "|>" "d" "e"
  GenerationRequest request = greedy_request("r", kPrompt, 10);
  request.sampling.stop = {"c<||>"};
  harness.submit(request);
  harness.run();
  const Collected& c = harness.results["r"];
  EXPECT_EQ(c.finish, FinishReason::Stop);
  EXPECT_EQ(c.finish_detail, "c<||>");
  EXPECT_EQ(c.text, "a");
  EXPECT_EQ(c.tokens, (std::vector<int32_t>{0, 2, 28, 29}));
  // "c" and "<|" were held back until the match decided.
  EXPECT_EQ(c.text_pieces, (std::vector<std::string>{"a", "", "", ""}));
}

TEST(EngineOutput, IncludeStopStringAndReleaseOfNonMatches) {
  Harness harness = scripted({2, 28, 3, 28, 29});  // "c" "<|" "d" "<|" "|>"
  GenerationRequest request = greedy_request("r", kPrompt, 10);
  request.sampling.stop = {"<||>"};
  request.sampling.include_stop_str_in_output = true;
  harness.submit(request);
  harness.run();
  EXPECT_EQ(harness.results["r"].text, "c<|d<||>");
  EXPECT_EQ(harness.results["r"].text_pieces,
            (std::vector<std::string>{"c", "", "<|d", "", "<||>"}));
}

TEST(EngineOutput, HeldTextIsReleasedAtTheLengthLimit) {
  Harness harness = scripted({0, 28});
  GenerationRequest request = greedy_request("r", kPrompt, 2);
  request.sampling.stop = {"<||>"};
  harness.submit(request);
  harness.run();
  EXPECT_EQ(harness.results["r"].finish, FinishReason::Length);
  EXPECT_EQ(harness.results["r"].text, "a<|");
}

TEST(EngineOutput, Utf8CharacterSplitAcrossTokens) {
  Harness harness = scripted({0, 26, 27, 1});
  harness.submit(greedy_request("r", kPrompt, 4));
  harness.run();
  EXPECT_EQ(harness.results["r"].text_pieces, (std::vector<std::string>{"a", "", "\xC3\xA9", "b"}));
}

TEST(EngineOutput, EosStopIdsMinNewTokensAndIgnoreEos) {
  {
    Harness harness = scripted({0, kEos, 1});
    harness.submit(greedy_request("eos", kPrompt, 10));
    harness.run();
    const Collected& c = harness.results["eos"];
    EXPECT_EQ(c.finish, FinishReason::Stop);
    EXPECT_EQ(c.matched_stop_token, kEos);
    EXPECT_EQ(c.tokens, (std::vector<int32_t>{0, kEos}));
    EXPECT_EQ(c.text, "a");  // the eos text is not output
  }
  {
    Harness harness = scripted({0, 5, 1});
    GenerationRequest request = greedy_request("stop_id", kPrompt, 10);
    request.sampling.stop_token_ids = {5};
    harness.submit(request);
    harness.run();
    EXPECT_EQ(harness.results["stop_id"].tokens, (std::vector<int32_t>{0, 5}));
    EXPECT_EQ(harness.results["stop_id"].matched_stop_token, 5);
  }
  {
    // eos is masked for the first 3 tokens: the argmax falls to token 0.
    Harness harness = scripted({kEos});
    GenerationRequest request = greedy_request("min", kPrompt, 10);
    request.sampling.min_new_tokens = 3;
    harness.submit(request);
    harness.run();
    EXPECT_EQ(harness.results["min"].tokens, (std::vector<int32_t>{0, 0, 0, kEos}));
  }
  {
    Harness harness = scripted({kEos});
    GenerationRequest request = greedy_request("ignore", kPrompt, 4);
    request.sampling.ignore_eos = true;
    request.sampling.skip_special_tokens = false;
    harness.submit(request);
    harness.run();
    EXPECT_EQ(harness.results["ignore"].tokens, std::vector<int32_t>(4, kEos));
    EXPECT_EQ(harness.results["ignore"].finish, FinishReason::Length);
    EXPECT_EQ(harness.results["ignore"].text, "<eos><eos><eos><eos>");
  }
}

std::vector<float> log_softmax_of(const std::vector<float>& logits) {
  std::vector<float> out(logits.size());
  log_softmax(logits, out);
  return out;
}

TEST(EngineOutput, OutputLogprobsMatchTheModelDistribution) {
  FakeModel reference;
  Harness harness;
  GenerationRequest request = greedy_request("r", make_prompt(9, 70), 12, true);
  request.return_logprob = true;
  request.top_logprobs_num = 3;
  harness.submit(request);
  harness.run();
  const Collected& c = harness.results["r"];
  ASSERT_EQ(c.logprobs.size(), 12u);
  std::vector<int32_t> tokens = make_prompt(9, 70);
  tokens.insert(tokens.end(), c.tokens.begin(), c.tokens.end());
  const auto rows = reference.reference_logits(tokens);
  for (size_t i = 0; i < 12; ++i) {
    const auto expected = log_softmax_of(rows[69 + i]);
    EXPECT_EQ(c.logprobs[i].token_id, c.tokens[i]);
    EXPECT_NEAR(c.logprobs[i].logprob, expected[static_cast<size_t>(c.tokens[i])], 1e-5);
    ASSERT_EQ(c.logprobs[i].top.size(), 3u);
    EXPECT_EQ(c.logprobs[i].top[0].first, c.tokens[i]);  // greedy picks the best
    EXPECT_GE(c.logprobs[i].top[1].second, c.logprobs[i].top[2].second);
  }
}

// Scoring (max_new_tokens 0, logprob_start_len): the same logprobs cold, after
// the prompt was cached, and with small prefill chunks.
TEST(EngineOutput, InputLogprobsForScoring) {
  FakeModel reference;
  const std::vector<int32_t> prompt = make_prompt(21, 150);
  const auto rows = reference.reference_logits(prompt);
  for (const int64_t start : {0, 1, 100}) {
    for (const int64_t chunk : {4096, 16}) {
      EngineConfig config = test_config();
      config.max_prefill_tokens = chunk;
      Harness harness(config);
      harness.submit(greedy_request("warm", prompt, 1));  // fills the prefix cache
      harness.run();
      GenerationRequest request = greedy_request("score", prompt, 0);
      request.return_logprob = true;
      request.logprob_start_len = start;
      harness.submit(request);
      harness.run();
      const Collected& c = harness.results["score"];
      EXPECT_EQ(c.finish, FinishReason::Length);
      EXPECT_TRUE(c.tokens.empty());
      ASSERT_EQ(static_cast<int64_t>(c.input_logprobs.size()), 150 - start);
      for (int64_t q = start; q < 150; ++q) {
        const TokenLogprob& entry = c.input_logprobs[static_cast<size_t>(q - start)];
        EXPECT_EQ(entry.token_id, prompt[static_cast<size_t>(q)]);
        if (q == 0) {
          EXPECT_TRUE(std::isnan(entry.logprob));
          continue;
        }
        const auto expected = log_softmax_of(rows[static_cast<size_t>(q - 1)]);
        EXPECT_NEAR(entry.logprob, expected[static_cast<size_t>(entry.token_id)], 1e-5)
            << "position " << q << " start " << start << " chunk " << chunk;
      }
    }
  }
}

TEST(EngineOutput, SeededSamplingIsIndependentOfTheBatch) {
  auto sampled = [](int64_t neighbours, int64_t chunk, uint64_t seed) {
    EngineConfig config = test_config();
    config.max_prefill_tokens = chunk;
    Harness harness(config, std::make_unique<FakeModel>(32, /*peak=*/0.5f));
    for (int64_t i = 0; i < neighbours; ++i) {
      GenerationRequest other =
          greedy_request(std::string("n").append(std::to_string(i)), make_prompt(50 + i, 30), 25);
      other.sampling.temperature = 0.8;
      harness.submit(other);
    }
    GenerationRequest request = greedy_request("r", make_prompt(1, 90), 40, true);
    request.sampling.temperature = 1.0;
    request.sampling.top_p = 0.9;
    request.sampling.seed = seed;
    harness.submit(request);
    harness.run();
    return harness.results["r"].tokens;
  };
  const auto alone = sampled(0, 4096, 1234);
  EXPECT_EQ(alone.size(), 40u);
  EXPECT_EQ(sampled(5, 4096, 1234), alone);
  EXPECT_EQ(sampled(3, 32, 1234), alone);
  EXPECT_NE(sampled(0, 4096, 4321), alone);
}

TEST(EngineOutput, SeededSamplingSurvivesPreemption) {
  auto run = [](int64_t pages) {
    EngineConfig config = test_config(pages);
    config.max_prefill_tokens = 64;
    Harness harness(config, std::make_unique<FakeModel>(32, /*peak=*/0.5f));
    for (int i = 0; i < 6; ++i) {
      GenerationRequest request =
          greedy_request("r" + std::to_string(i), make_prompt(i, 50), 80, true);
      request.sampling.temperature = 1.0;
      request.sampling.seed = 77 + static_cast<uint64_t>(i);
      request.sampling.frequency_penalty = 0.3;
      harness.submit(request);
    }
    harness.run();
    std::vector<std::vector<int32_t>> outputs;
    for (int i = 0; i < 6; ++i) outputs.push_back(harness.results["r" + std::to_string(i)].tokens);
    return std::make_pair(outputs, harness.engine->num_preemptions());
  };
  const auto [roomy, roomy_preemptions] = run(64);
  const auto [tight, tight_preemptions] = run(5);
  EXPECT_EQ(roomy_preemptions, 0);
  EXPECT_GT(tight_preemptions, 0);
  EXPECT_EQ(tight, roomy);
}

}  // namespace
}  // namespace megactx::testing
