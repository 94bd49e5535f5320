// Helpers of the engine_speculative tests: an Engine over a checkpoint with
// MTP weights (models/default, tests/fixtures/mtp/*) driven synchronously,
// with integrity checks after every step and every update collected.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "../engine/fake_model.h"
#include "../mtp/mtp_test_util.h"
#include "engine/engine.h"
#include "model/model_loader.h"
#include "model/sequence_runner.h"

namespace megactx::testing {

inline std::string source_path(const std::string& relative) {
  return std::string(MEGACTX_SOURCE_DIR) + "/" + relative;
}

struct SpecResult {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;
  std::vector<TokenLogprob> input_logprobs;
  std::string text;
  FinishReason finish = FinishReason::None;
  std::string finish_detail;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t verify_ct = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  int64_t updates = 0;
};

struct SpecEngineOptions {
  int64_t steps = 0;  // speculative_steps
  bool share = true;
  VerifyMode sampled_mode = VerifyMode::RejectionSampling;
  bool masked_drafts = true;  // structured output: drafts from the masked draft logits
  int64_t disable_batch_size = 0;  // speculative_disable_batch_size
  bool automatic = false;          // speculative_auto
  int64_t pages = 64;         // KV budget in pages
  int64_t max_prefill_tokens = 4096;
  int64_t max_running_requests = 64;
  bool prefix_cache = true;
  bool real_tokenizer = false;
  KvDType kv_dtype = KvDType::F32;  // the checkpoint's tokenizer.json (else FakeTokenizer)
  // The CUDA model (tests/cuda_engine): device KV pools, device logits and
  // sampler, the MTP layer on the GPU.
  Device device = Device::CPU;
  bool cuda_bf16 = false;
  // The live host tier: offload pages (their indexer keys added to the KV
  // budget, so that the device page count stays `pages`).
  int64_t offload_pages = 0;
};

class SpecEngine {
 public:
  SpecEngine(const std::string& dir, const SpecEngineOptions& options) {
    ModelLoadOptions load;
    load.device = options.device;
    load.cuda.logits_on_device = options.device == Device::CUDA;
    load.cuda.bf16_weights = options.cuda_bf16;
    auto model = load_language_model(dir, load);
    EngineConfig config;
    config.run_thread = false;
    config.check_integrity_every_step = true;
    config.kv_dtype = options.kv_dtype;
    config.max_prefill_tokens = options.max_prefill_tokens;
    config.max_running_requests = options.max_running_requests;
    config.enable_prefix_cache = options.prefix_cache;
    config.speculative_steps = options.steps;
    config.speculative_share = options.share;
    config.speculative_sampled_mode = options.sampled_mode;
    config.speculative_masked_drafts = options.masked_drafts;
    config.speculative_disable_batch_size = options.disable_batch_size;
    config.speculative_auto = options.automatic;
    config.model_dir = dir;
    // Same page count with and without the MTP layer's pools.
    const KvCapacityPlan one = plan_kv_capacity(model->config(), options.kv_dtype, int64_t{1} << 30,
                                                64, options.steps > 0);
    const int64_t indexer_bytes = options.offload_pages * one.spec.indexer_bytes_per_page();
    config.kv_memory_bytes =
        (options.pages + (indexer_bytes + one.bytes_per_page - 1) / one.bytes_per_page) *
        one.bytes_per_page;
    config.host_latent_memory_bytes = options.offload_pages * one.spec.latent_bytes_per_page();
    vocab = model->config().vocab_size;
    GenerationDefaults defaults = load_generation_defaults(dir, model->config().eos_token_ids);
    std::shared_ptr<const Tokenizer> tokenizer;
    if (options.real_tokenizer) {
      tokenizer = Tokenizer::load(dir);
    } else {
      tokenizer = std::make_shared<FakeTokenizer>(vocab);
    }
    engine = Engine::create(config, std::move(model), tokenizer, defaults);
  }

  void submit(GenerationRequest request) {
    engine->submit(std::move(request), [this](const RequestUpdate& update) {
      SpecResult& r = results[update.rid];
      ++r.updates;
      r.tokens.insert(r.tokens.end(), update.new_token_ids.begin(), update.new_token_ids.end());
      r.logprobs.insert(r.logprobs.end(), update.new_logprobs.begin(), update.new_logprobs.end());
      r.input_logprobs.insert(r.input_logprobs.end(), update.input_logprobs.begin(),
                              update.input_logprobs.end());
      r.text += update.new_text;
      r.finish = update.finish;
      r.finish_detail = update.finish_detail;
      r.completion_tokens = update.completion_tokens;
      r.cached_tokens = update.cached_tokens;
      r.verify_ct = update.spec_verify_ct;
      r.draft_tokens = update.spec_draft_token_num;
      r.accepted_tokens = update.spec_accept_token_num;
    });
  }

  // Steps until idle; the engine checks its integrity after every step.
  int64_t run(int64_t max_steps = 1000000) {
    int64_t steps = 0;
    while (steps < max_steps && engine->step()) ++steps;
    engine->check_integrity();
    return steps;
  }

  std::unique_ptr<Engine> engine;
  std::map<std::string, SpecResult> results;
  int64_t vocab = 0;
};

inline GenerationRequest make_request(const std::string& rid, std::vector<int32_t> prompt,
                                      int64_t max_new_tokens, double temperature = 0.0) {
  GenerationRequest request;
  request.rid = rid;
  request.input_ids = std::move(prompt);
  request.sampling.temperature = temperature;
  request.sampling.max_new_tokens = max_new_tokens;
  request.sampling.ignore_eos = true;
  return request;
}

// Token ids of real text (the default model's tokenizer), for models/default.
inline std::vector<int32_t> default_text_tokens() {
  return text_tokens();
}

// Pseudo-random prompt over [2, vocab) (the fixtures' eos ids are small).
inline std::vector<int32_t> hashed_prompt(uint64_t seed, int64_t length, int64_t vocab) {
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < length; ++i) {
    prompt.push_back(static_cast<int32_t>(2 + mix64(seed * 7919 + static_cast<uint64_t>(i)) %
                                                  static_cast<uint64_t>(vocab - 2)));
  }
  return prompt;
}

// A model the speculative tests run on: models/default (a trained MTP layer,
// drafts are accepted) or an MTP fixture (random: drafts mostly rejected).
struct SpecModelCase {
  std::string name;
  std::string dir;
  int64_t new_tokens = 24;
  bool trained = false;  // a trained MTP layer accepts drafts
};

inline std::ostream& operator<<(std::ostream& os, const SpecModelCase& c) {
  return os << c.name;
}

// Prompts of different lengths; some longer than index_topk (sparse attention
// in the target and in the MTP layer) and than a page: real text for the
// trained model, hashed ids for the fixtures.
inline std::vector<std::vector<int32_t>> spec_prompts_for(const SpecModelCase& c, int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts;
  if (c.trained) {
    const std::vector<int32_t> text = default_text_tokens();
    const std::pair<size_t, size_t> cuts[] = {{0, 5},      {40, 17},   {300, 64},  {900, 150},
                                              {2000, 230}, {5000, 33}, {6100, 97}, {7000, 1}};
    for (const auto& [offset, length] : cuts) {
      prompts.emplace_back(text.begin() + static_cast<std::ptrdiff_t>(offset),
                           text.begin() + static_cast<std::ptrdiff_t>(offset + length));
    }
  } else {
    const int64_t lengths[] = {3, 17, 40, 64, 90, 130, 1};
    for (size_t i = 0; i < std::size(lengths); ++i) {
      prompts.push_back(hashed_prompt(i + 1, lengths[i], vocab));
    }
  }
  return prompts;
}

}  // namespace megactx::testing
