// PCRE2 (UTF + UCP, JIT) wrapper for the regexes in tokenizer.json. HF
// `tokenizers` compiles them with Oniguruma; translate_onig_pattern() bridges
// the differences that matter for real files (Oniguruma's \s also matches
// U+0085, its \w is letters, marks, decimal digits and connector punctuation).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace megactx {

std::string translate_onig_pattern(std::string_view pattern);

class Regex {
 public:
  // Throws megactx::Error naming the pattern and PCRE2's message on failure.
  explicit Regex(std::string_view pattern, bool translate = true);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches left to right, [start, end) byte offsets; an empty
  // match advances by one character (as Oniguruma's find_iter). `text` must be
  // valid UTF-8 (callers sanitize first).
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const;
  // The same matches handed to `on_match(start, end)` one by one (no vector).
  template <typename OnMatch>
  void for_each_match(std::string_view text, OnMatch&& on_match) const {
    size_t start = 0, match_start = 0, match_end = 0;
    while (next_match(text, &start, &match_start, &match_end)) on_match(match_start, match_end);
  }
  bool matches_at(std::string_view text, size_t pos, size_t* end) const;  // anchored match
  const std::string& pattern() const { return pattern_; }

 private:
  // Finds the next match at or after *start and advances *start past it.
  bool next_match(std::string_view text, size_t* start, size_t* match_start,
                  size_t* match_end) const;

  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megactx
