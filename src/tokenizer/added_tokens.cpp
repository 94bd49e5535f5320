#include "tokenizer/added_tokens.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace megactx {

AddedToken parse_added_token(const nlohmann::json& spec) {
  AddedToken token;
  const auto& id = json_field(spec, "id", "added token");
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 30))
    fail("tokenizer.json: added token id is not a valid integer");
  token.id = static_cast<TokenId>(id.get<int64_t>());
  token.content = json_string(spec, "content", "added token");
  if (!utf8::is_valid(token.content)) fail("tokenizer.json: added token content is not UTF-8");
  token.single_word = json_bool(spec, "single_word", false);
  token.lstrip = json_bool(spec, "lstrip", false);
  token.rstrip = json_bool(spec, "rstrip", false);
  token.special = json_bool(spec, "special", false);
  token.normalized = json_bool(spec, "normalized", !token.special);
  return token;
}

void AddedTokenMatcher::add(const AddedToken& token, std::string pattern) {
  if (pattern.empty()) return;
  // The same content twice: the first added wins (as HF's map keeps one).
  if (std::find(strings_.begin(), strings_.end(), pattern) != strings_.end()) return;
  patterns_.push_back(token);
  strings_.push_back(std::move(pattern));
  finalized_ = false;
}

void AddedTokenMatcher::finalize() {
  // Build a map-based trie first, then flatten it into sorted edge runs.
  struct MapNode {
    std::map<unsigned char, int> children;
    int pattern = -1;
  };
  std::vector<MapNode> tree(1);
  for (size_t p = 0; p < strings_.size(); ++p) {
    int node = 0;
    for (char ch : strings_[p]) {
      const auto b = static_cast<unsigned char>(ch);
      auto it = tree[node].children.find(b);
      if (it == tree[node].children.end()) {
        tree.emplace_back();
        it = tree[node].children.emplace(b, static_cast<int>(tree.size() - 1)).first;
      }
      node = it->second;
    }
    if (tree[node].pattern < 0) tree[node].pattern = static_cast<int>(p);
  }
  nodes_.assign(tree.size(), Node{});
  edges_.clear();
  for (size_t n = 0; n < tree.size(); ++n) {
    nodes_[n].pattern = tree[n].pattern;
    nodes_[n].children_begin = static_cast<int>(edges_.size());
    nodes_[n].children_count = static_cast<int>(tree[n].children.size());
    for (const auto& [b, child] : tree[n].children) edges_.emplace_back(b, child);
  }
  std::fill(std::begin(first_byte_), std::end(first_byte_), false);
  for (const auto& s : strings_) first_byte_[static_cast<unsigned char>(s[0])] = true;
  finalized_ = true;
}

int AddedTokenMatcher::longest_match(std::string_view text, size_t pos, size_t* length) const {
  int node = 0, best = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    const Node& current = nodes_[node];
    const auto begin = edges_.begin() + current.children_begin;
    const auto end = begin + current.children_count;
    const auto it =
        std::lower_bound(begin, end, std::make_pair(b, 0),
                         [](const auto& a, const auto& v) { return a.first < v.first; });
    if (it == end || it->first != b) break;
    node = it->second;
    if (nodes_[node].pattern >= 0) {
      best = nodes_[node].pattern;
      *length = i + 1 - pos;
    }
  }
  return best;
}

namespace {

// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector
// punctuation, join controls (used by single_word).
bool is_word_char(std::string_view text, size_t pos) {
  static const Regex word(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])", false);
  return word.matches_at(text, pos, nullptr);
}

size_t previous_char_start(std::string_view text, size_t pos) {
  size_t p = pos - 1;
  while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
  return p;
}

bool ends_with_word(std::string_view text, size_t end) {
  return end > 0 && is_word_char(text, previous_char_start(text, end));
}

// Start of the run of whitespace that ends at `end`.
size_t whitespace_run_start(std::string_view text, size_t end) {
  while (end > 0) {
    const size_t p = previous_char_start(text, end);
    size_t length = 0;
    if (!utf8::is_white_space(utf8::decode(text, p, &length))) break;
    end = p;
  }
  return end;
}

size_t whitespace_run_end(std::string_view text, size_t begin) {
  while (begin < text.size()) {
    size_t length = 0;
    if (!utf8::is_white_space(utf8::decode(text, begin, &length))) break;
    begin += length;
  }
  return begin;
}

}  // namespace

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSegment>& segments) const {
  segments.clear();
  if (!patterns_.empty() && !finalized_) fail("AddedTokenMatcher::split before finalize()");
  size_t covered = 0;  // end of the last emitted segment
  size_t pos = 0;
  while (!patterns_.empty() && pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t length = 0;
    const int p = longest_match(text, pos, &length);
    if (p < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = patterns_[p];
    size_t start = pos, stop = pos + length;
    pos = stop;  // the matcher resumes after this match even when it is discarded
    if (token.single_word) {
      const bool start_ok = start == 0 || !ends_with_word(text, start);
      const bool stop_ok = stop == text.size() || !is_word_char(text, stop);
      if (!start_ok || !stop_ok) continue;
    }
    if (token.lstrip) start = std::max(whitespace_run_start(text, start), covered);
    if (token.rstrip) stop = whitespace_run_end(text, stop);
    if (covered < start) segments.push_back({covered, start, -1});
    segments.push_back({start, stop, token.id});
    covered = stop;
    pos = std::max(pos, stop);
  }
  if (covered < text.size() || segments.empty()) segments.push_back({covered, text.size(), -1});
}

}  // namespace megactx
