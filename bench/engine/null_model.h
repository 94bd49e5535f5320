// A model that does no math: forward() returns rows of a preallocated logits
// tensor. With NullSampler (no vocabulary work) an engine step then costs only
// the host work around the model: scheduling, batch building, output
// processing (detokenization, stop checks, updates).
#pragma once

#include <string>

#include "engine/sampler.h"
#include "model/language_model.h"
#include "tokenizer/tokenizer.h"

namespace megactx::bench {

inline ModelConfig null_model_config(int64_t vocab) {
  ModelConfig config;
  config.model_type_name = "glm_moe_dsa";
  config.vocab_size = vocab;
  config.num_hidden_layers = 2;
  config.max_position_embeddings = 1 << 20;
  // Tiny pools: the benchmark measures host work, not memory.
  config.kv_lora_rank = 16;
  config.qk_rope_head_dim = 16;
  config.index_head_dim = 16;
  config.indexer_types = {IndexerType::Full, IndexerType::Shared};
  config.mlp_layer_types.assign(2, MlpType::Dense);
  config.eos_token_ids = {vocab - 1};
  return config;
}

class NullModel : public LanguageModel {
 public:
  NullModel(int64_t vocab, int64_t max_rows)
      : config_(null_model_config(vocab)), logits_(Tensor::zeros({max_rows, vocab})) {}
  const ModelConfig& config() const override { return config_; }
  Device device() const override { return Device::CPU; }
  ForwardOutput forward(const ForwardBatch& batch, PagedKvCache&) override {
    int64_t rows = 0;
    for (const auto& sequence : batch.sequences) rows += sequence.logits_rows();
    ForwardOutput out;
    out.logits = logits_.slice_rows(0, rows);
    return out;
  }

 private:
  ModelConfig config_;
  Tensor logits_;
};

// Picks a letter token from the draw index: no work per vocabulary entry.
class NullSampler : public Sampler {
 public:
  void sample(const Tensor&, std::span<const SamplingRow> rows,
              std::span<SampleResult> results) override {
    for (size_t i = 0; i < rows.size(); ++i) {
      results[i].token = static_cast<int32_t>((rows[i].seed + rows[i].draw_index) % 26);
      results[i].logprob = -1.0f;
    }
  }
  void score(const Tensor&, std::span<const LogprobQuery> queries,
             std::span<TokenLogprob> results) override {
    for (size_t i = 0; i < queries.size(); ++i)
      results[i] = TokenLogprob{queries[i].token, -1.0f, {}, {}};
  }
};

// Token i < 26 is one letter; everything else "#".
class LetterTokenizer : public Tokenizer {
 public:
  explicit LetterTokenizer(int64_t vocab) : vocab_(vocab) {}
  std::vector<TokenId> encode(std::string_view, bool) const override { return {}; }
  std::string decode(const std::vector<TokenId>& ids, bool) const override {
    std::string text;
    for (const TokenId id : ids) text += token_bytes(id);
    return text;
  }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<TokenId> token_to_id(std::string_view) const override { return std::nullopt; }
  std::string id_to_token(TokenId id) const override { return token_bytes(id); }
  bool is_special(TokenId id) const override { return id == vocab_ - 1; }
  std::string token_bytes(TokenId id) const override {
    return id < 26 ? std::string(1, static_cast<char>('a' + id)) : "#";
  }

 private:
  int64_t vocab_;
};

}  // namespace megactx::bench
