// Deterministic stand-ins for the model and the tokenizer, for engine tests
// and the host-overhead benchmark.
//
// FakeModel keeps its own per-slot "KV" (the position and a running state)
// and derives each position's state from the token, the previous position's
// state and states one, two and three pages back, all read through the page
// table. Logits are a hash of the state. So a wrong page table, a wrongly
// shared prefix page or a stale page changes the output (or fails the
// position check), while batching, chunking and prefix reuse do not.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "model/language_model.h"
#include "tokenizer/tokenizer.h"

namespace megactx::testing {

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline ModelConfig fake_model_config(int64_t vocab) {
  ModelConfig config;
  config.model_type_name = "glm_moe_dsa";
  config.vocab_size = vocab;
  config.hidden_size = 8;
  config.num_hidden_layers = 4;
  config.max_position_embeddings = 1 << 20;
  config.kv_lora_rank = 512;
  config.qk_rope_head_dim = 64;
  config.index_head_dim = 128;
  config.indexer_types = {IndexerType::Full, IndexerType::Shared, IndexerType::Shared,
                          IndexerType::Full};
  config.mlp_layer_types.assign(4, MlpType::Dense);
  config.num_nextn_predict_layers = 1;
  config.eos_token_ids = {vocab - 1};
  return config;
}

class FakeModel : public LanguageModel {
 public:
  // `peak`: how strongly the best token wins (large = nearly greedy-stable).
  explicit FakeModel(int64_t vocab = 32, float peak = 4.0f)
      : config_(fake_model_config(vocab)), peak_(peak) {}

  const ModelConfig& config() const override { return config_; }
  Device device() const override { return Device::CPU; }

  ForwardOutput forward(const ForwardBatch& batch, PagedKvCache& cache) override {
    if (failing_forwards_ > 0) {
      --failing_forwards_;
      fail("fake model: an injected device failure");
    }
    const int64_t page_size = cache.spec().page_size;
    const auto slots = static_cast<size_t>(cache.spec().num_pages * page_size);
    if (entries_.size() != slots) entries_.assign(slots, Entry{});
    int64_t rows = 0;
    for (const auto& sequence : batch.sequences) {
      const auto n = static_cast<int64_t>(sequence.tokens.size());
      MEGACTX_CHECK(n > 0, "fake model: empty sequence");
      rows += sequence.logits_from >= 0 ? n - sequence.logits_from : 1;
    }
    Tensor logits = Tensor::empty({rows, config_.vocab_size});
    int64_t row = 0;
    ++forward_calls_;
    for (const auto& sequence : batch.sequences) {
      const auto n = static_cast<int64_t>(sequence.tokens.size());
      MEGACTX_CHECK(static_cast<int64_t>(sequence.page_table.size()) * page_size >=
                        sequence.start_position + n,
                    "fake model: page table too short");
      auto slot_of = [&](int64_t position) {
        const int32_t page = sequence.page_table[static_cast<size_t>(position / page_size)];
        MEGACTX_CHECK(page >= 0 && page < cache.spec().num_pages, "fake model: bad page {}", page);
        return static_cast<size_t>(page * page_size + position % page_size);
      };
      auto state_at = [&](int64_t position) -> uint64_t {
        if (position < 0) return 0x1234;
        const Entry& entry = entries_[slot_of(position)];
        MEGACTX_CHECK(entry.position == position,
                      "fake model: slot of position {} holds position {}", position,
                      entry.position);
        return entry.state;
      };
      for (int64_t i = 0; i < n; ++i) {
        const int64_t position = sequence.start_position + i;
        const uint64_t state =
            next_state(sequence.tokens[static_cast<size_t>(i)], position, page_size, state_at);
        entries_[slot_of(position)] = Entry{position, state};
        ++tokens_processed_;
        const int64_t from = sequence.logits_from >= 0 ? sequence.logits_from : n - 1;
        if (i >= from) write_logits(state, logits.data<float>() + row++ * config_.vocab_size);
      }
    }
    ForwardOutput out;
    out.logits = logits;
    return out;
  }

  // The same computation over a plain token list (no pages, no cache):
  // logits after each position, [tokens.size()][vocab].
  std::vector<std::vector<float>> reference_logits(const std::vector<int32_t>& tokens,
                                                   int64_t page_size = 64) const {
    std::vector<uint64_t> states;
    std::vector<std::vector<float>> rows;
    for (size_t p = 0; p < tokens.size(); ++p) {
      auto state_at = [&](int64_t position) -> uint64_t {
        return position < 0 ? 0x1234 : states[static_cast<size_t>(position)];
      };
      states.push_back(next_state(tokens[p], static_cast<int64_t>(p), page_size, state_at));
      rows.emplace_back(static_cast<size_t>(config_.vocab_size));
      write_logits(states.back(), rows.back().data());
    }
    return rows;
  }

  int64_t forward_calls() const { return forward_calls_; }
  int64_t tokens_processed() const { return tokens_processed_; }

  // The next `count` forwards throw (a device or parallel group failure).
  void fail_next_forwards(int count) { failing_forwards_ = count; }

 private:
  struct Entry {
    int64_t position = -1;
    uint64_t state = 0;
  };

  template <typename StateAt>
  static uint64_t next_state(int32_t token, int64_t position, int64_t page_size,
                             StateAt&& state_at) {
    uint64_t state = mix64(state_at(position - 1) ^ (static_cast<uint64_t>(token) << 1));
    for (int64_t back = 1; back <= 3; ++back) {
      state = mix64(state + state_at(position - 1 - back * page_size));
    }
    return state;
  }

  void write_logits(uint64_t state, float* out) const {
    const int64_t vocab = config_.vocab_size;
    for (int64_t v = 0; v < vocab; ++v) {
      const uint64_t bits = mix64(state * 31 + static_cast<uint64_t>(v));
      out[v] = static_cast<float>(static_cast<double>(bits >> 11) * 0x1.0p-53 * 2.0);
    }
    // One clear winner, never eos (so greedy runs last until max_new_tokens),
    // except when the state says so (1 in 16).
    const auto best = static_cast<int64_t>(mix64(state) % static_cast<uint64_t>(vocab - 1));
    out[best] += peak_;
    if (mix64(state ^ 0xE05) % 16 == 0) out[vocab - 1] += peak_ * 2;
  }

  ModelConfig config_;
  float peak_;
  std::vector<Entry> entries_;
  int64_t forward_calls_ = 0;
  int failing_forwards_ = 0;
  int64_t tokens_processed_ = 0;
};

// ScriptedModel: after a sequence of length L it strongly prefers
// script[L - prompt_len] (cycling), other logits 0; no cache use.
class ScriptedModel : public LanguageModel {
 public:
  ScriptedModel(std::vector<int32_t> script, int64_t prompt_len, int64_t vocab = 32)
      : config_(fake_model_config(vocab)), script_(std::move(script)), prompt_len_(prompt_len) {}
  const ModelConfig& config() const override { return config_; }
  Device device() const override { return Device::CPU; }
  ForwardOutput forward(const ForwardBatch& batch, PagedKvCache&) override {
    int64_t rows = 0;
    for (const auto& sequence : batch.sequences) {
      const auto n = static_cast<int64_t>(sequence.tokens.size());
      rows += sequence.logits_from >= 0 ? n - sequence.logits_from : 1;
    }
    Tensor logits = Tensor::zeros({rows, config_.vocab_size});
    int64_t row = 0;
    for (const auto& sequence : batch.sequences) {
      const auto n = static_cast<int64_t>(sequence.tokens.size());
      const int64_t from = sequence.logits_from >= 0 ? sequence.logits_from : n - 1;
      for (int64_t i = from; i < n; ++i) {
        const int64_t length = sequence.start_position + i + 1;
        const int64_t index = std::max<int64_t>(length - prompt_len_, 0);
        const int32_t token = script_[static_cast<size_t>(index) % script_.size()];
        logits.data<float>()[row++ * config_.vocab_size + token] = 10.0f;
      }
    }
    ForwardOutput out;
    out.logits = logits;
    return out;
  }

 private:
  ModelConfig config_;
  std::vector<int32_t> script_;
  int64_t prompt_len_;
};

// Token i < 26 is the letter 'a' + i; 26 and 27 are the two bytes of "é";
// 28 is "<|", 29 is "|>" (to split stop strings), the last id is "<eos>" (special).
class FakeTokenizer : public Tokenizer {
 public:
  explicit FakeTokenizer(int64_t vocab = 32) : vocab_(vocab) {}
  std::vector<TokenId> encode(std::string_view text, bool) const override {
    std::vector<TokenId> ids;
    for (const char c : text) ids.push_back(static_cast<TokenId>((c - 'a') % 26));
    return ids;
  }
  std::string decode(const std::vector<TokenId>& ids, bool skip_special) const override {
    std::string text;
    for (const TokenId id : ids) {
      if (!(skip_special && is_special(id))) text += token_bytes(id);
    }
    return text;
  }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<TokenId> token_to_id(std::string_view) const override { return std::nullopt; }
  std::string id_to_token(TokenId id) const override { return token_bytes(id); }
  bool is_special(TokenId id) const override { return id == vocab_ - 1; }
  std::string token_bytes(TokenId id) const override {
    if (id < 26) return std::string(1, static_cast<char>('a' + id));
    if (id == 26) return "\xC3";
    if (id == 27) return "\xA9";
    if (id == 28) return "<|";
    if (id == 29) return "|>";
    if (id == vocab_ - 1) return "<eos>";
    return "#";
  }

 private:
  int64_t vocab_;
};

}  // namespace megactx::testing
