// Constrained generation for tests: random walks that sample only tokens the
// matcher's mask allows, with the default model's real vocabulary.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/matcher.h"
#include "grammar/vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace megactx::grammar::test {

// models/default/tokenizer.json (8,192 byte-level BPE tokens; id 0,
// <|endoftext|>, as the stop token).
inline std::shared_ptr<const Vocabulary> default_model_vocab() {
  static const std::shared_ptr<const Vocabulary> vocab = [] {
    auto tokenizer = Tokenizer::load(std::string(MEGACTX_SOURCE_DIR) + "/models/default");
    return Vocabulary::from_tokenizer(*tokenizer, {0});
  }();
  return vocab;
}

struct Walk {
  std::string text;
  bool terminated = false;  // ended with the stop token
  int steps = 0;
};

// Samples allowed tokens until the stop token or max_steps. The stop token,
// when allowed, is taken with probability stop_bias; otherwise tokens are
// uniform over the allowed ones.
inline Walk random_walk(const std::shared_ptr<const CompiledGrammar>& grammar, std::mt19937& rng,
                        int max_steps, double stop_bias = 0.5) {
  GrammarMatcher m(grammar);
  const Vocabulary& vocab = grammar->vocabulary();
  std::vector<uint32_t> mask(vocab.mask_words());
  std::vector<int32_t> allowed;
  Walk walk;
  std::uniform_real_distribution<double> coin(0, 1);
  for (; walk.steps < max_steps; ++walk.steps) {
    m.fill_next_token_bitmask(mask.data());
    allowed.clear();
    bool stop_allowed = false;
    for (int32_t id = 0; id < vocab.size(); ++id) {
      if (!((mask[id >> 5] >> (id & 31)) & 1)) continue;
      if (vocab.is_eos(id)) {
        stop_allowed = true;
      } else {
        allowed.push_back(id);
      }
    }
    if (stop_allowed && (allowed.empty() || coin(rng) < stop_bias)) {
      if (!m.accept_token(vocab.eos_ids()[0])) break;
      walk.terminated = true;
      break;
    }
    if (allowed.empty()) break;  // a dead end: the caller's check fails
    const int32_t id = allowed[rng() % allowed.size()];
    if (!m.accept_token(id)) break;
    walk.text += vocab.bytes(id);
  }
  return walk;
}

}  // namespace megactx::grammar::test
