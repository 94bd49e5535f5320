// Test doubles for the server: a byte-level tokenizer (one token per byte,
// 256 = <eos>, 257 = <bos>) and an engine that "generates" a fixed script one
// byte-token per update on its own thread. A request can be held after some
// tokens until it is aborted or released, which the abort and disconnect
// tests need.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "engine/engine_api.h"
#include "grammar/grammar_compiler.h"
#include "io/model_config.h"
#include "tokenizer/tokenizer.h"

namespace megactx::server::testing {

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr TokenId kEos = 256;
  static constexpr TokenId kBos = 257;
  std::vector<TokenId> encode(std::string_view text, bool add_special_tokens) const override {
    std::vector<TokenId> ids;
    if (add_special_tokens) ids.push_back(kBos);
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(const std::vector<TokenId>& ids, bool skip_special_tokens) const override {
    std::string out;
    for (TokenId id : ids) {
      if (id < 256)
        out += static_cast<char>(id);
      else if (!skip_special_tokens)
        out += id == kEos ? "<eos>" : "<bos>";
    }
    return out;
  }
  int64_t vocab_size() const override { return 258; }
  std::optional<TokenId> token_to_id(std::string_view token) const override {
    if (token.size() == 1) return static_cast<unsigned char>(token[0]);
    return std::nullopt;
  }
  std::string id_to_token(TokenId id) const override { return decode({id}, false); }
  bool is_special(TokenId id) const override { return id >= 256; }
  std::string token_bytes(TokenId id) const override { return decode({id}, false); }
};

class FakeEngine : public EngineApi {
 public:
  FakeEngine() : thread_([this] { loop(); }) {
    config_.model_type_name = "glm_moe_dsa";
    config_.bos_token_id = ByteTokenizer::kBos;
  }
  ~FakeEngine() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  // What every request generates, byte by byte (then <eos> -> Stop).
  std::string script = "Hello, world!";
  // When set, what a request generates instead of `script` (chosen at submit).
  std::function<std::string(const GenerationRequest&)> script_for;
  // Requests pause after this many tokens until aborted/released (-1: never).
  std::atomic<int64_t> hold_after{-1};
  std::atomic<int64_t> waiting_requests{0};
  std::atomic<int64_t> context_tokens{4096};
  // Longer prompts fail with FinishReason::Error (the engine-error tests).
  std::atomic<size_t> max_prompt_tokens{1000};
  std::atomic<bool> flush_ok{true};
  bool keep_submitted = true;  // the fuzzer sends millions: it keeps none

  void submit(GenerationRequest request, UpdateCallback on_update) override {
    std::lock_guard lock(mutex_);
    if (request.rid.empty()) request.rid = "auto-" + std::to_string(next_++);
    if (keep_submitted) submitted_.push_back(request);
    Live live;
    live.script = script_for ? script_for(request) : script;
    live.request = std::move(request);
    live.callback = std::move(on_update);
    live_.emplace(live.request.rid, std::move(live));
    wake_.notify_all();
  }
  bool abort(const std::string& rid) override {
    std::lock_guard lock(mutex_);
    auto it = live_.find(rid);
    if (it == live_.end()) return false;
    it->second.aborted = true;
    if (keep_submitted) aborted_.push_back(rid);
    wake_.notify_all();
    return true;
  }
  void abort_all() override {
    std::lock_guard lock(mutex_);
    for (auto& [rid, live] : live_) {
      live.aborted = true;
      aborted_.push_back(rid);
    }
    wake_.notify_all();
  }
  void release_all() {
    std::lock_guard lock(mutex_);
    for (auto& [rid, live] : live_) live.released = true;
    wake_.notify_all();
  }
  bool flush_cache() override {
    ++flushes;
    return flush_ok.load();
  }
  EngineStats stats() const override {
    EngineStats stats;
    stats.waiting_requests = waiting_requests.load();
    stats.running_requests = 1;
    stats.kv_pages_total = 100;
    stats.kv_pages_used = 7;
    stats.kv_page_size = 64;
    stats.prefix_cache_queries = 10;
    stats.prefix_cache_hits = 4;
    stats.spec_accepted_tokens = 30;
    stats.spec_verify_steps = 10;
    stats.steps = 12;
    stats.step_tokens = 300;
    stats.graph_replays = 9;
    stats.graph_eager_steps = 3;
    stats.mtp_graph_replays = 5;
    stats.step_microseconds = 1500000;
    return stats;
  }
  // RL control: recorded; a weight update with a bucket named "bad" fails.
  void pause(PauseMode mode) override {
    std::lock_guard lock(mutex_);
    paused_ = true;
    pauses_.push_back(mode);
    if (mode == PauseMode::Abort)
      for (auto& [rid, live] : live_) live.aborted = true;
    wake_.notify_all();
  }
  void resume() override {
    std::lock_guard lock(mutex_);
    paused_ = false;
  }
  bool paused() const override {
    std::lock_guard lock(mutex_);
    return paused_;
  }
  WeightUpdateResult update_weights(const WeightUpdateRequest& request) override {
    std::lock_guard lock(mutex_);
    updates_.push_back(request);
    if (request.model_path == "bad") fail("weight update: the model has no tensor 'x'");
    if (request.commit && !request.weight_version.empty()) version_ = request.weight_version;
    return WeightUpdateResult{version_, 1, request.commit};
  }
  std::string weight_version() const override {
    std::lock_guard lock(mutex_);
    return version_;
  }
  void set_weight_version(const std::string& version) override {
    std::lock_guard lock(mutex_);
    version_ = version;
  }
  // One tensor, "w" [2, 3] = 0, 1, .. 5.
  Tensor weight_by_name(const std::string& name) override {
    if (name != "w") fail("the model has no tensor '{}'", name);
    Tensor w = Tensor::empty({2, 3});
    for (int i = 0; i < 6; ++i) w.data<float>()[i] = static_cast<float>(i);
    return w;
  }
  void release_memory(const MemoryTags& tags) override {
    std::lock_guard lock(mutex_);
    released_.push_back({tags.weights, tags.kv_cache});
  }
  void resume_memory(const MemoryTags& tags) override {
    std::lock_guard lock(mutex_);
    resumed_.push_back({tags.weights, tags.kv_cache});
  }
  std::vector<PauseMode> pauses() {
    std::lock_guard lock(mutex_);
    return pauses_;
  }
  std::vector<WeightUpdateRequest> weight_updates() {
    std::lock_guard lock(mutex_);
    return updates_;
  }
  std::vector<std::pair<bool, bool>> released() {
    std::lock_guard lock(mutex_);
    return released_;
  }
  std::vector<std::pair<bool, bool>> resumed() {
    std::lock_guard lock(mutex_);
    return resumed_;
  }

  const Tokenizer& tokenizer() const override { return tokenizer_; }
  const ModelConfig& model_config() const override { return config_; }
  int64_t max_context_tokens() const override { return context_tokens.load(); }
  // Structured output over the byte vocabulary, <eos> the stop token. The
  // fake engine does not apply the grammar; tests check what the server
  // compiled (submitted()[i].sampling.grammar) against the script.
  grammar::GrammarCompiler* grammar_compiler() override {
    std::call_once(grammar_once_, [this] {
      compiler_ = std::make_unique<grammar::GrammarCompiler>(
          grammar::Vocabulary::from_tokenizer(tokenizer_, {ByteTokenizer::kEos}));
    });
    return compiler_.get();
  }

  std::vector<GenerationRequest> submitted() {
    std::lock_guard lock(mutex_);
    return submitted_;
  }
  std::vector<std::string> aborted() {
    std::lock_guard lock(mutex_);
    return aborted_;
  }
  // Blocks until `count` requests are live and held (or 5 s pass).
  bool wait_for_held(size_t count) {
    std::unique_lock lock(mutex_);
    return held_cv_.wait_for(lock, std::chrono::seconds(5), [&] {
      size_t held = 0;
      for (auto& [rid, live] : live_) held += live.held ? 1 : 0;
      return held >= count;
    });
  }
  std::atomic<int> flushes{0};

 private:
  std::once_flag grammar_once_;
  std::unique_ptr<grammar::GrammarCompiler> compiler_;

  struct Live {
    GenerationRequest request;
    UpdateCallback callback;
    std::string script;
    int64_t generated = 0;
    bool aborted = false, released = false, held = false, sent_input = false;
  };

  // One token for every live request per "step", like continuous batching.
  void loop() {
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || has_work(); });
      if (stopping_) return;
      std::vector<std::pair<UpdateCallback, RequestUpdate>> out;
      for (auto it = live_.begin(); it != live_.end();) {
        Live& live = it->second;
        RequestUpdate update;
        bool done = step(live, update);
        if (update.finish != FinishReason::None || !update.new_token_ids.empty() ||
            !update.input_logprobs.empty())
          out.emplace_back(live.callback, std::move(update));
        it = done ? live_.erase(it) : std::next(it);
      }
      held_cv_.notify_all();
      lock.unlock();
      for (auto& [callback, update] : out) callback(update);
      lock.lock();
    }
  }
  bool has_work() const {
    for (auto& [rid, live] : live_)
      if (!live.held || live.aborted || live.released) return true;
    return false;
  }
  bool step(Live& live, RequestUpdate& update) {
    const GenerationRequest& request = live.request;
    update.rid = request.rid;
    update.prompt_tokens = static_cast<int64_t>(request.input_ids.size());
    update.cached_tokens = request.input_ids.size() >= 4 ? 2 : 0;
    if (!live.sent_input && request.logprob_start_len >= 0) {
      // Positions max(start, 1) .. end: position 0 has no logprob.
      for (size_t i = std::max<int64_t>(request.logprob_start_len, 1); i < request.input_ids.size();
           ++i)
        update.input_logprobs.push_back({request.input_ids[i], -1.0f, {}, {}});
    }
    live.sent_input = true;
    if (live.aborted) {
      update.finish = FinishReason::Abort;
      update.finish_detail = "aborted by request";
      update.completion_tokens = live.generated;
      return true;
    }
    if (request.input_ids.size() > max_prompt_tokens.load()) {
      update.finish = FinishReason::Error;
      update.finish_detail = "prompt too long for the fake engine";
      return true;
    }
    int64_t hold = hold_after.load();
    if (hold >= 0 && live.generated >= hold && !live.released) {
      live.held = true;
      update.completion_tokens = live.generated;
      return false;
    }
    if (live.generated >= request.sampling.max_new_tokens) {
      update.finish = FinishReason::Length;
      update.completion_tokens = live.generated;
      return true;
    }
    TokenId token = live.generated < static_cast<int64_t>(live.script.size())
                        ? static_cast<unsigned char>(live.script[live.generated])
                        : ByteTokenizer::kEos;
    live.generated += 1;
    update.completion_tokens = live.generated;
    if (token == ByteTokenizer::kEos && !request.sampling.ignore_eos) {
      update.finish = FinishReason::Stop;
      update.matched_stop_token = token;
      return true;
    }
    update.new_token_ids.push_back(token);
    update.new_text = tokenizer_.decode({token}, true);
    if (request.return_logprob) {
      TokenLogprob logprob{token, -0.5f, {}, {}};
      for (int64_t k = 0; k < request.top_logprobs_num; ++k)
        logprob.top.push_back(
            {(token + static_cast<TokenId>(k)) % 256, -0.5f - static_cast<float>(k)});
      update.new_logprobs.push_back(logprob);
    }
    return false;
  }

  ByteTokenizer tokenizer_;
  ModelConfig config_;
  mutable std::mutex mutex_;
  bool paused_ = false;
  std::string version_ = "default";
  std::vector<PauseMode> pauses_;
  std::vector<WeightUpdateRequest> updates_;
  std::vector<std::pair<bool, bool>> released_, resumed_;
  std::condition_variable wake_, held_cv_;
  std::map<std::string, Live> live_;
  std::vector<GenerationRequest> submitted_;
  std::vector<std::string> aborted_;
  int next_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace megactx::server::testing
