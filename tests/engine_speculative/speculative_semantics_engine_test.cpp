// Request semantics under MTP speculation (models/default, greedy): a stop
// token or stop string met inside an accepted run ends the request there,
// max_new_tokens is never overshot, logprobs (with top alternatives) are
// those of plain decoding, penalties fall back to one token per step, and
// min_new_tokens holds; each compared with the Engine without speculation.
// Aborting speculating requests frees every page; configurations that cannot
// speculate are clear errors at start-up; the stats a finishing update sees
// include the step that finished it.
#include <gtest/gtest.h>

#include <cmath>

#include "spec_engine_util.h"

namespace megactx::testing {
namespace {

const std::string kModel = source_path("models/default");

std::vector<int32_t> prompt_at(size_t offset, size_t length) {
  static const std::vector<int32_t> text = default_text_tokens();
  return std::vector<int32_t>(text.begin() + static_cast<std::ptrdiff_t>(offset),
                              text.begin() + static_cast<std::ptrdiff_t>(offset + length));
}

// The same requests through a plain engine and a speculating one (k = 3).
std::pair<std::map<std::string, SpecResult>, std::map<std::string, SpecResult>> run_both(
    const std::vector<GenerationRequest>& requests, int64_t k = 3,
    int64_t max_prefill_tokens = 4096) {
  std::map<std::string, SpecResult> results[2];
  for (int spec = 0; spec < 2; ++spec) {
    SpecEngineOptions options;
    options.steps = spec ? k : 0;
    options.real_tokenizer = true;
    options.max_prefill_tokens = max_prefill_tokens;
    SpecEngine engine(kModel, options);
    for (const GenerationRequest& request : requests) engine.submit(request);
    engine.run();
    results[spec] = engine.results;
  }
  return {results[0], results[1]};
}

void expect_same_output(const SpecResult& plain, const SpecResult& spec, const std::string& rid) {
  EXPECT_EQ(spec.tokens, plain.tokens) << rid;
  EXPECT_EQ(spec.text, plain.text) << rid;
  EXPECT_EQ(spec.finish, plain.finish) << rid;
  EXPECT_EQ(spec.finish_detail, plain.finish_detail) << rid;
  EXPECT_EQ(spec.completion_tokens, plain.completion_tokens) << rid;
}

TEST(SpeculativeSemantics, StopTokensAndStringsInsideAcceptedRuns) {
  // Reference continuations to pick stops from.
  std::vector<GenerationRequest> probes;
  for (int i = 0; i < 4; ++i) {
    probes.push_back(make_request("probe" + std::to_string(i), prompt_at(700 * i, 40), 40));
  }
  const auto reference = run_both(probes).first;
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) {
    const SpecResult& ref = reference.at("probe" + std::to_string(i));
    ASSERT_EQ(ref.tokens.size(), 40u);
    GenerationRequest by_token =
        make_request("token" + std::to_string(i), prompt_at(700 * i, 40), 40);
    by_token.sampling.stop_token_ids = {ref.tokens[static_cast<size_t>(6 + 3 * i)]};
    requests.push_back(by_token);
    GenerationRequest by_string =
        make_request("string" + std::to_string(i), prompt_at(700 * i, 40), 40);
    const size_t middle = ref.text.size() / 2 + static_cast<size_t>(i);
    by_string.sampling.stop = {ref.text.substr(middle, 3)};
    by_string.sampling.include_stop_str_in_output = i % 2 == 1;
    requests.push_back(by_string);
    for (const int64_t max_new : {1, 2, 5, 9}) {
      requests.push_back(make_request("max" + std::to_string(i) + "_" + std::to_string(max_new),
                                      prompt_at(700 * i, 40), max_new));
    }
  }
  const auto [plain, spec] = run_both(requests);
  int64_t stopped = 0;
  for (const auto& [rid, result] : plain) {
    expect_same_output(result, spec.at(rid), rid);
    stopped += result.finish == FinishReason::Stop;
  }
  EXPECT_GE(stopped, 6);  // the stops were met, not max_new_tokens
  EXPECT_GT(spec.at("token3").verify_ct, 0);
}

TEST(SpeculativeSemantics, LogprobsEqualPlainDecoding) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest request = make_request("lp" + std::to_string(i), prompt_at(1000 * i, 50), 30);
    request.return_logprob = true;
    request.top_logprobs_num = 3;
    if (i == 3) request.logprob_start_len = 7;  // input logprobs too (scoring + generation)
    requests.push_back(request);
  }
  // A long prompt prefilled in several chunks while the others speculate.
  GenerationRequest scored = make_request("lp_scored", prompt_at(4000, 300), 12);
  scored.return_logprob = true;
  scored.logprob_start_len = 0;
  requests.push_back(scored);
  const auto [plain, spec] = run_both(requests, 3, /*max_prefill_tokens=*/64);
  for (const auto& [rid, result] : plain) {
    const SpecResult& s = spec.at(rid);
    expect_same_output(result, s, rid);
    ASSERT_EQ(s.logprobs.size(), result.logprobs.size()) << rid;
    for (size_t i = 0; i < s.logprobs.size(); ++i) {
      EXPECT_EQ(s.logprobs[i].token_id, result.logprobs[i].token_id);
      // Same logits up to batched-GEMM rounding (1 + k rows vs 1).
      EXPECT_NEAR(s.logprobs[i].logprob, result.logprobs[i].logprob, 1e-3) << rid << " " << i;
      const auto& top = result.logprobs[i].top;
      EXPECT_EQ(top.size(), rid == "lp_scored" ? 0u : 3u) << rid;
      ASSERT_EQ(s.logprobs[i].top.size(), top.size());
      for (size_t j = 0; j < top.size(); ++j) {
        EXPECT_EQ(s.logprobs[i].top[j].first, top[j].first) << rid << " " << i;
        EXPECT_NEAR(s.logprobs[i].top[j].second, top[j].second, 1e-3);
      }
    }
    ASSERT_EQ(s.input_logprobs.size(), result.input_logprobs.size()) << rid;
    for (size_t i = 1; i < s.input_logprobs.size(); ++i) {
      EXPECT_EQ(s.input_logprobs[i].token_id, result.input_logprobs[i].token_id) << rid;
      EXPECT_NEAR(s.input_logprobs[i].logprob, result.input_logprobs[i].logprob, 1e-3) << rid;
    }
    EXPECT_GT(s.verify_ct, 0) << rid;
  }
}

TEST(SpeculativeSemantics, PenaltiesAndMinNewTokensKeepTheirMeaning) {
  std::vector<GenerationRequest> requests;
  GenerationRequest repetition = make_request("repetition", prompt_at(100, 30), 24);
  repetition.sampling.repetition_penalty = 1.3;
  requests.push_back(repetition);
  GenerationRequest frequency = make_request("frequency", prompt_at(200, 30), 24);
  frequency.sampling.frequency_penalty = 0.8;
  frequency.sampling.presence_penalty = 0.4;
  requests.push_back(frequency);
  GenerationRequest min_tokens = make_request("min_tokens", prompt_at(300, 30), 40);
  min_tokens.sampling.ignore_eos = false;
  min_tokens.sampling.min_new_tokens = 12;
  requests.push_back(min_tokens);
  const auto [plain, spec] = run_both(requests);
  for (const auto& [rid, result] : plain) expect_same_output(result, spec.at(rid), rid);
  // Penalties: plain one-token steps; min_new_tokens: speculation after it.
  EXPECT_EQ(spec.at("repetition").verify_ct, 0);
  EXPECT_EQ(spec.at("frequency").verify_ct, 0);
  if (spec.at("min_tokens").completion_tokens > 13) {
    EXPECT_GT(spec.at("min_tokens").verify_ct, 0);
  }
}

TEST(SpeculativeSemantics, SpeculationTurnsOffForLargeBatches) {
  // Three requests decode together until the shortest ends: with the
  // threshold at 3 those steps run without drafts, the remaining two
  // speculate; the output is plain decoding's either way.
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 3; ++i) {
    requests.push_back(
        make_request("r" + std::to_string(i), prompt_at(200 + 300 * i, 48), 12 + 12 * i));
    requests.back().sampling.ignore_eos = true;
  }
  std::map<std::string, SpecResult> plain;
  {
    SpecEngineOptions options;
    options.real_tokenizer = true;
    SpecEngine engine(kModel, options);
    for (const GenerationRequest& request : requests) engine.submit(request);
    engine.run();
    plain = engine.results;
  }
  SpecEngineOptions options;
  options.steps = 3;
  options.real_tokenizer = true;
  options.disable_batch_size = 3;
  SpecEngine engine(kModel, options);
  for (const GenerationRequest& request : requests) engine.submit(request);
  engine.run();
  for (const auto& [rid, result] : plain) expect_same_output(result, engine.results.at(rid), rid);
  const EngineStats stats = engine.engine->stats();
  EXPECT_GT(stats.spec_off_steps, 0);
  EXPECT_GT(stats.spec_verify_steps, 0);  // once the batch is below 3
}

TEST(SpeculativeSemantics, StatsCountAStepBeforeItsTokensAreDelivered) {
  // A client that reads the stats (/metrics) as soon as its last token
  // arrives must see the step that produced it: the last request to finish
  // sees the final counters in its finishing update.
  SpecEngineOptions options;
  options.steps = 3;
  options.real_tokenizer = true;
  SpecEngine engine(kModel, options);
  std::vector<std::pair<std::string, EngineStats>> finishes;
  for (int i = 0; i < 2; ++i) {
    const std::string rid = "r" + std::to_string(i);
    engine.engine->submit(make_request(rid, prompt_at(300 + 500 * i, 40), 10 + 9 * i),
                          [&, rid](const RequestUpdate& update) {
                            if (update.finish != FinishReason::None)
                              finishes.emplace_back(rid, engine.engine->stats());
                          });
  }
  engine.run();
  ASSERT_EQ(finishes.size(), 2u);
  const EngineStats& seen = finishes.back().second;
  const EngineStats final_stats = engine.engine->stats();
  EXPECT_GT(final_stats.spec_verify_steps, 0);
  EXPECT_EQ(seen.steps, final_stats.steps);
  EXPECT_EQ(seen.spec_verify_steps, final_stats.spec_verify_steps);
  EXPECT_EQ(seen.spec_accepted_tokens, final_stats.spec_accepted_tokens);
}

TEST(SpeculativeSemantics, AbortFreesEveryPage) {
  SpecEngineOptions options;
  options.steps = 3;
  SpecEngine spec(kModel, options);
  EXPECT_EQ(spec.engine->stats().kv_pages_used, 0);
  for (int i = 0; i < 4; ++i) {
    spec.submit(make_request("a" + std::to_string(i), prompt_at(900 * i, 70 + 30 * i), 300));
  }
  for (int step = 0; step < 4; ++step) ASSERT_TRUE(spec.engine->step());
  EXPECT_TRUE(spec.engine->abort("a1"));
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(spec.engine->step());
  spec.engine->check_integrity();
  spec.engine->abort_all();
  spec.run();
  for (int i = 0; i < 4; ++i) {
    const SpecResult& r = spec.results.at("a" + std::to_string(i));
    EXPECT_EQ(r.finish, FinishReason::Abort) << i;
    EXPECT_GT(r.verify_ct, 0) << i;
    EXPECT_EQ(r.completion_tokens, static_cast<int64_t>(r.tokens.size())) << i;
  }
  const EngineStats stats = spec.engine->stats();
  EXPECT_EQ(stats.running_requests + stats.waiting_requests, 0);
  // Only the prefix cache holds pages now; flushing it frees all of them.
  EXPECT_EQ(stats.kv_pages_used, stats.prefix_cache_pages);
  EXPECT_TRUE(spec.engine->flush_cache());
  EXPECT_EQ(spec.engine->stats().kv_pages_used, 0);
}

TEST(SpeculativeSemantics, ConfigurationsThatCannotSpeculateAreErrors) {
  auto make = [](const std::string& dir, int64_t steps, std::string mtp_dir,
                 std::unique_ptr<LanguageModel> model = nullptr) {
    if (!model) model = load_language_model(dir, ModelLoadOptions{});
    EngineConfig config;
    config.run_thread = false;
    config.kv_memory_bytes = int64_t{64} << 20;
    config.speculative_steps = steps;
    config.model_dir = std::move(mtp_dir);
    const int64_t vocab = model->config().vocab_size;
    return Engine::create(config, std::move(model), std::make_shared<FakeTokenizer>(vocab), {});
  };
  EXPECT_THROW(make(kModel, 8, kModel), Error);
  EXPECT_THROW(make(kModel, 3, ""), Error);
  // A checkpoint without an MTP layer.
  const std::string no_mtp = source_path("tests/fixtures/hf/glm_bf16");
  EXPECT_THROW(make(no_mtp, 3, no_mtp), Error);
  // A model that cannot run an MTP layer (not a DSA model).
  try {
    make("", 3, kModel, std::make_unique<FakeModel>(32));
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("DSA model"), std::string::npos) << error.what();
  }
  EXPECT_NO_THROW(make(kModel, 7, kModel));
}

}  // namespace
}  // namespace megactx::testing
