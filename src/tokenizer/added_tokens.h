// Added tokens of tokenizer.json ("added_tokens"): special or not, with HF's
// lstrip / rstrip / single_word / normalized options. Before normalization and
// pre-tokenization the input is cut at every occurrence of an added token
// (leftmost-longest, non-overlapping, as HF's Aho-Corasick matcher does).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/tokenizer.h"

namespace megactx {

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

AddedToken parse_added_token(const nlohmann::json& spec);

// One part of a split input: [begin, end) bytes, and the token id when the
// part is an added token (-1 otherwise).
struct TextSegment {
  size_t begin;
  size_t end;
  TokenId token;
};

// Finds added tokens of one kind (non-normalized or normalized) in a string.
class AddedTokenMatcher {
 public:
  void add(const AddedToken& token, std::string pattern);
  // Builds the matcher after the last add(); split() is then safe to call
  // from many threads at once.
  void finalize();
  bool empty() const { return patterns_.empty(); }
  // Covers `text` with segments; added-token segments include the whitespace
  // their lstrip/rstrip swallow.
  void split(std::string_view text, std::vector<TextSegment>& segments) const;

 private:
  struct Node {
    int children_begin = 0;  // children are sorted runs in edges_
    int children_count = 0;
    int pattern = -1;  // index into patterns_ when a pattern ends here
  };
  // Longest pattern starting at text[pos], or -1.
  int longest_match(std::string_view text, size_t pos, size_t* length) const;

  std::vector<AddedToken> patterns_;
  std::vector<std::string> strings_;
  // Byte trie made by finalize().
  bool finalized_ = false;
  std::vector<Node> nodes_;
  std::vector<std::pair<unsigned char, int>> edges_;
  bool first_byte_[256] = {};
};

}  // namespace megactx
