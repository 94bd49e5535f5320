#include "grammar/vocabulary.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace megactx::grammar {

Vocabulary::Vocabulary(std::vector<std::string> token_bytes,
                       const std::vector<int32_t>& special_ids, std::vector<int32_t> eos_ids,
                       int32_t mask_size)
    : bytes_(std::move(token_bytes)), eos_ids_(std::move(eos_ids)) {
  const int32_t n = size();
  mask_size_ = mask_size == 0 ? n : mask_size;
  MEGACTX_CHECK(mask_size_ >= n, "mask size {} is smaller than the vocabulary ({} tokens)",
                mask_size_, n);
  special_.assign(n, 0);
  for (int32_t id : special_ids) {
    MEGACTX_CHECK(id >= 0 && id < n, "special token id {} is outside the vocabulary", id);
    special_[id] = 1;
  }
  for (int32_t id : eos_ids_) {
    MEGACTX_CHECK(id >= 0 && id < n, "eos token id {} is outside the vocabulary", id);
  }
  matchable_.assign(n, 0);
  matchable_mask_.assign(mask_words(), 0);
  for (int32_t id = 0; id < n; ++id) {
    if (special_[id] || bytes_[id].empty() || is_eos(id)) continue;
    matchable_[id] = 1;
    matchable_mask_[id >> 5] |= 1u << (id & 31);
    ++num_matchable_;
    max_token_bytes_ = std::max(max_token_bytes_, static_cast<int32_t>(bytes_[id].size()));
  }
  build_trie();
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const Tokenizer& tokenizer,
                                                             std::vector<int32_t> eos_ids,
                                                             int32_t mask_size) {
  const auto n = static_cast<int32_t>(tokenizer.vocab_size());
  std::vector<std::string> bytes(n);
  std::vector<int32_t> special;
  for (int32_t id = 0; id < n; ++id) {
    bytes[id] = tokenizer.token_bytes(id);
    if (tokenizer.is_special(id)) special.push_back(id);
  }
  return std::make_shared<const Vocabulary>(std::move(bytes), special, std::move(eos_ids),
                                            mask_size);
}

bool Vocabulary::is_eos(int32_t id) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
}

std::optional<int32_t> Vocabulary::find_token(std::string_view text) const {
  std::optional<int32_t> found;
  for (int32_t id = 0; id < size(); ++id) {
    if (bytes_[id] != text) continue;
    if (special_[id]) return id;
    if (!found) found = id;
  }
  return found;
}

void Vocabulary::build_trie() {
  std::vector<int32_t> ids;
  ids.reserve(num_matchable_);
  for (int32_t id = 0; id < size(); ++id) {
    if (matchable_[id]) ids.push_back(id);
  }
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  trie_byte_ = {0};
  trie_depth_ = {0};
  trie_end_ = {0};
  trie_token_begin_ = {0};
  std::vector<int32_t> path = {0};  // path[d]: the node at depth d of the current token
  const std::string* previous = nullptr;
  auto close_nodes_deeper_than = [&](size_t depth) {
    while (path.size() > depth + 1) {
      trie_end_[path.back()] = static_cast<int32_t>(trie_byte_.size());
      path.pop_back();
    }
  };
  for (int32_t id : ids) {
    const std::string& s = bytes_[id];
    size_t lcp = 0;
    if (previous != nullptr) {
      const size_t limit = std::min(previous->size(), s.size());
      while (lcp < limit && (*previous)[lcp] == s[lcp]) ++lcp;
    }
    close_nodes_deeper_than(lcp);
    for (size_t k = lcp; k < s.size(); ++k) {
      path.push_back(static_cast<int32_t>(trie_byte_.size()));
      trie_byte_.push_back(static_cast<uint8_t>(s[k]));
      trie_depth_.push_back(static_cast<int32_t>(k + 1));
      trie_end_.push_back(0);
      trie_token_begin_.push_back(static_cast<int32_t>(trie_tokens_.size()));
    }
    // Tokens arrive in byte order, so each lands on the newest node.
    trie_tokens_.push_back(id);
    previous = &s;
  }
  close_nodes_deeper_than(0);
  trie_end_[0] = static_cast<int32_t>(trie_byte_.size());
  trie_token_begin_.push_back(static_cast<int32_t>(trie_tokens_.size()));
  // Subtree summaries, children before parents (reverse pre-order); a
  // node's parent is the nearest earlier node one level up.
  const auto n = static_cast<int32_t>(trie_byte_.size());
  trie_subtree_bytes_.assign(4 * static_cast<size_t>(n), 0);
  trie_height_.assign(n, 0);
  std::vector<int32_t> parent(n, -1);
  std::vector<int32_t> last_at_depth(max_token_bytes_ + 2, 0);
  for (int32_t i = 1; i < n; ++i) {
    parent[i] = last_at_depth[trie_depth_[i] - 1];
    last_at_depth[trie_depth_[i]] = i;
  }
  for (int32_t i = n - 1; i > 0; --i) {
    const int32_t p = parent[i];
    for (int w = 0; w < 4; ++w) trie_subtree_bytes_[4 * p + w] |= trie_subtree_bytes_[4 * i + w];
    trie_subtree_bytes_[4 * p + trie_byte_[i] / 64] |= 1ull << (trie_byte_[i] % 64);
    trie_height_[p] = std::max(trie_height_[p], trie_height_[i] + 1);
  }
}

}  // namespace megactx::grammar
