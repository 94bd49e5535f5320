// Drives an Engine synchronously for tests: collects every update per request
// and checks the cache and scheduler invariants after every step.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "fake_model.h"

namespace megactx::testing {

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<std::string> text_pieces;  // new_text of each update
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> input_logprobs;
  FinishReason finish = FinishReason::None;
  std::string finish_detail;
  bool server_error = false;
  std::optional<int32_t> matched_stop_token;
  int64_t updates = 0;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  std::vector<int32_t> routed_experts;  // the final update's (return_routed_experts)
  std::vector<float> hidden_states;     // the final update's (return_hidden_states)
  bool finished_twice = false;
};

// Bytes of one KV page for the fake model config (4 layers, 2 indexer layers, bf16).
inline int64_t fake_page_bytes(bool mtp = false) {
  const int64_t latent = (512 + 64) * 2, indexer = 128 * 2;
  return 64 * ((4 + mtp) * latent + (2 + mtp) * indexer);
}

inline EngineConfig test_config(int64_t pages = 64) {
  EngineConfig config;
  config.run_thread = false;
  config.check_integrity_every_step = true;
  config.kv_memory_bytes = pages * fake_page_bytes();
  config.max_running_requests = 64;
  config.max_prefill_tokens = 4096;
  return config;
}

class Harness {
 public:
  explicit Harness(EngineConfig config = test_config(),
                   std::unique_ptr<LanguageModel> model = nullptr, int64_t vocab = 32) {
    if (!model) model = std::make_unique<FakeModel>(vocab);
    GenerationDefaults defaults;
    defaults.eos_token_ids = {static_cast<int32_t>(vocab - 1)};
    engine = Engine::create(std::move(config), std::move(model),
                            std::make_shared<FakeTokenizer>(vocab), defaults);
  }

  std::string submit(GenerationRequest request) {
    const std::string rid = request.rid;
    engine->submit(std::move(request), [this](const RequestUpdate& update) { record(update); });
    return rid;
  }

  void record(const RequestUpdate& update) {
    Collected& c = results[update.rid];
    if (c.finish != FinishReason::None) c.finished_twice = true;
    ++c.updates;
    c.tokens.insert(c.tokens.end(), update.new_token_ids.begin(), update.new_token_ids.end());
    c.text += update.new_text;
    c.text_pieces.push_back(update.new_text);
    c.logprobs.insert(c.logprobs.end(), update.new_logprobs.begin(), update.new_logprobs.end());
    c.input_logprobs.insert(c.input_logprobs.end(), update.input_logprobs.begin(),
                            update.input_logprobs.end());
    c.finish = update.finish;
    c.finish_detail = update.finish_detail;
    c.server_error = update.server_error;
    if (update.matched_stop_token) c.matched_stop_token = update.matched_stop_token;
    c.prompt_tokens = update.prompt_tokens;
    c.completion_tokens = update.completion_tokens;
    c.cached_tokens = update.cached_tokens;
    if (update.finish != FinishReason::None) {
      c.routed_experts = update.routed_experts;
      c.hidden_states = update.hidden_states;
    }
  }

  // Steps until idle (at most `max_steps`), checking integrity after each step.
  int64_t run(int64_t max_steps = 100000) {
    int64_t steps = 0;
    while (steps < max_steps && engine->step()) {
      engine->check_integrity();
      ++steps;
    }
    engine->check_integrity();
    return steps;
  }

  std::unique_ptr<Engine> engine;
  std::map<std::string, Collected> results;
};

inline GenerationRequest greedy_request(std::string rid, std::vector<int32_t> prompt,
                                        int64_t max_new_tokens, bool ignore_eos = false) {
  GenerationRequest request;
  request.sampling.ignore_eos = ignore_eos;
  request.rid = std::move(rid);
  request.input_ids = std::move(prompt);
  request.sampling.temperature = 0.0;
  request.sampling.max_new_tokens = max_new_tokens;
  return request;
}

inline std::vector<int32_t> make_prompt(uint64_t seed, int64_t length, int64_t vocab = 32) {
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < length; ++i) {
    prompt.push_back(static_cast<int32_t>(mix64(seed * 1000 + static_cast<uint64_t>(i)) %
                                          static_cast<uint64_t>(vocab - 1)));
  }
  return prompt;
}

// Greedy continuation by the plain-list reference: argmax after the prompt,
// until eos (included) or max_new_tokens.
inline std::vector<int32_t> reference_greedy(const FakeModel& model, std::vector<int32_t> tokens,
                                             int64_t max_new_tokens, bool ignore_eos = false) {
  std::vector<int32_t> output;
  const int32_t eos = static_cast<int32_t>(model.config().vocab_size - 1);
  while (static_cast<int64_t>(output.size()) < max_new_tokens) {
    const std::vector<float> last = model.reference_logits(tokens).back();
    int32_t best = 0;
    for (size_t v = 1; v < last.size(); ++v) {
      if (last[v] > last[static_cast<size_t>(best)]) best = static_cast<int32_t>(v);
    }
    output.push_back(best);
    tokens.push_back(best);
    if (best == eos && !ignore_eos) break;
  }
  return output;
}

}  // namespace megactx::testing
