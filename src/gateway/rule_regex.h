// A PCRE2 pattern of a guard rule: searched anywhere in a value, caseless
// unless asked otherwise, on any bytes (invalid UTF-8 never matches as a
// character and is never an error), with match and depth limits so that no
// pattern and argument pair can take long or recurse deeply.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace megactx::gateway {

class RulePattern {
 public:
  // Throws megactx::Error naming the pattern and PCRE2's message.
  RulePattern(std::string pattern, bool case_sensitive);
  ~RulePattern();
  RulePattern(RulePattern&&) noexcept;
  RulePattern& operator=(RulePattern&&) noexcept;

  // The matched text when the pattern occurs in `text` (a limit hit counts
  // as no match), else nothing.
  bool search(std::string_view text, std::string* matched = nullptr) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megactx::gateway
