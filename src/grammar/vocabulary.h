// The tokenizer's vocabulary as the grammar engine sees it: the raw bytes of
// every token id (byte-level BPE undone, so a token may hold part of a UTF-8
// character), which ids are special (never matched by their bytes, only when a
// grammar names them), the stop ids, and a byte trie over the matchable tokens
// that lets one walk of the grammar automaton classify every token sharing a
// prefix at once. Built once per model and shared by every compiled grammar.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megactx {
class Tokenizer;
}

namespace megactx::grammar {

class Vocabulary {
 public:
  // token_bytes[id] are the bytes of token id; special ids are never matched
  // by bytes; eos ids end the output. mask_size (the model's logit count,
  // 0: the number of tokens) may exceed the token count: ids past it are
  // padding and never allowed.
  Vocabulary(std::vector<std::string> token_bytes, const std::vector<int32_t>& special_ids,
             std::vector<int32_t> eos_ids, int32_t mask_size = 0);

  // Every id below tokenizer.vocab_size(); special = Tokenizer::is_special.
  static std::shared_ptr<const Vocabulary> from_tokenizer(const Tokenizer& tokenizer,
                                                          std::vector<int32_t> eos_ids,
                                                          int32_t mask_size = 0);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  int32_t mask_size() const { return mask_size_; }
  int32_t mask_words() const { return (mask_size_ + 31) / 32; }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  bool is_special(int32_t id) const { return special_[id] != 0; }
  bool is_eos(int32_t id) const;
  // Matchable: neither special nor empty, so its bytes are checked against
  // the grammar. Empty tokens would let a sampler loop without progress.
  bool is_matchable(int32_t id) const { return matchable_[id] != 0; }
  const std::vector<int32_t>& eos_ids() const { return eos_ids_; }
  // Bits of the matchable tokens, mask_words() words.
  const std::vector<uint32_t>& matchable_mask() const { return matchable_mask_; }
  int32_t num_matchable() const { return num_matchable_; }
  int32_t max_token_bytes() const { return max_token_bytes_; }

  // The id whose bytes are exactly `text`, preferring special tokens; used
  // for tokens a grammar names (`<|tool_call|>` in GBNF).
  std::optional<int32_t> find_token(std::string_view text) const;

  // Byte trie of the matchable tokens in pre-order: node 0 is the root
  // (depth 0); node i's subtree is [i, trie_end(i)). The tokens of node i are
  // trie_tokens()[token_begin(i) .. token_begin(i + 1)).
  int32_t trie_size() const { return static_cast<int32_t>(trie_byte_.size()); }
  uint8_t trie_byte(int32_t node) const { return trie_byte_[node]; }
  int32_t trie_depth(int32_t node) const { return trie_depth_[node]; }
  int32_t trie_end(int32_t node) const { return trie_end_[node]; }
  int32_t token_begin(int32_t node) const { return trie_token_begin_[node]; }
  // Bytes occurring strictly below `node` (4 words of 64 bits) and how many
  // levels its subtree reaches below it: lets a walk accept a whole subtree
  // when the grammar reads any such string.
  const uint64_t* trie_subtree_bytes(int32_t node) const { return &trie_subtree_bytes_[4 * node]; }
  int32_t trie_height(int32_t node) const { return trie_height_[node]; }
  const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }

 private:
  void build_trie();

  std::vector<std::string> bytes_;
  std::vector<uint8_t> special_;
  std::vector<uint8_t> matchable_;
  std::vector<int32_t> eos_ids_;
  std::vector<uint32_t> matchable_mask_;
  int32_t mask_size_ = 0;
  int32_t num_matchable_ = 0;
  int32_t max_token_bytes_ = 0;

  std::vector<uint8_t> trie_byte_;
  std::vector<int32_t> trie_depth_;
  std::vector<int32_t> trie_end_;
  std::vector<int32_t> trie_token_begin_;  // trie_size() + 1 entries
  std::vector<int32_t> trie_tokens_;       // matchable ids in byte order
  std::vector<uint64_t> trie_subtree_bytes_;
  std::vector<int32_t> trie_height_;
};

}  // namespace megactx::grammar
