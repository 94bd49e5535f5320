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
  bool matches_at(std::string_view text, size_t pos, size_t* end) const;  // anchored match
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megactx
