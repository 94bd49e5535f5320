// Regexes against PCRE2 (the reference): the automaton's accept decision on
// random strings equals PCRE2's anchored full match, and outputs generated
// through the token mask of the default model's vocabulary match fully.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <gtest/gtest.h>

#include <random>

#include "grammar/grammar_compiler.h"
#include "grammar/grammar_ir.h"
#include "test_vocab.h"
#include "walk_util.h"

namespace megactx::grammar {
namespace {

class Pcre2 {
 public:
  explicit Pcre2(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_DOLLAR_ENDONLY,
                          &error, &offset, nullptr);
    EXPECT_NE(code_, nullptr) << "PCRE2 rejects " << pattern;
    data_ = pcre2_match_data_create(16, nullptr);
  }
  ~Pcre2() {
    pcre2_match_data_free(data_);
    pcre2_code_free(code_);
  }
  bool full_match(const std::string& s) const {
    return pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, data_,
                       nullptr) >= 0;
  }

 private:
  pcre2_code* code_ = nullptr;
  pcre2_match_data* data_ = nullptr;
};

bool accepts(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
  GrammarMatcher m(g);
  return m.accept_string(s) && m.can_terminate();
}

// Patterns covering the supported syntax; each with the characters its
// random strings are drawn from.
struct Case {
  std::string pattern;
  std::vector<std::string> alphabet;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"[a-c]+x?", {"a", "b", "c", "x", "d"}},
      {"(ab|a)(bc|c)*", {"a", "b", "c"}},
      {"\\d{2,3}-\\w+", {"1", "2", "-", "a", "_", " ", "Z"}},
      {"[^a-z]{1,3}", {"a", "B", "1", " ", "é", "\n"}},
      {"(é|ü)+[0-9]", {"é", "ü", "1", "e", "\xE2\x82\xAC"}},
      {".{2}a", {"a", "b", "\n", "é", "\r"}},
      {"a(b|c{2})*d?", {"a", "b", "c", "d"}},
      {"x[\\s,]+y", {"x", "y", " ", ",", "\t", "\n", "\v"}},
      {"(a|b)*a(a|b){3}", {"a", "b"}},
      {"[\\x41-\\x43]{2,}|z", {"A", "B", "C", "D", "z"}},
      {"\\x{e9}|\\x{20ac}+", {"é", "€", "e"}},
      {"(?:ab)+(?<n>c)?", {"a", "b", "c"}},
      {"[-a]+\\.[\\]b]", {"-", "a", ".", "]", "b"}},
      {"a.b|[^\\d\\s]c", {"a", "b", "c", "1", " ", "\n"}},
      {"(a?){3}b+?", {"a", "b"}},
      {"[\\S]\\W\\D", {"a", " ", "1", "-", "_"}},
      {"(x|xy|xyz){1,3}", {"x", "y", "z"}},
      {"(\\t|\\n|\\\\|\\+|\\*|\\?)+", {"\t", "\n", "\\", "+", "*", "?", "a"}},
      {"[α-ω]+[^\\x00-\\x7F]", {"α", "ω", "β", "a", "€", "😀"}},
      {"(()|a)+b{0,2}", {"a", "b"}},
  };
  return c;
}

TEST(RegexVsPcre2, RandomStringsDecideTheSame) {
  GrammarCompiler compiler(test::make_test_vocab().vocab);
  std::mt19937 rng(11);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.pattern);
    Pcre2 reference(c.pattern);
    auto g = compiler.compile_regex(c.pattern);
    int matched = 0;
    for (int i = 0; i < 3000; ++i) {
      std::string s;
      const int length = static_cast<int>(rng() % 9);
      for (int k = 0; k < length; ++k) s += c.alphabet[rng() % c.alphabet.size()];
      const bool expected = reference.full_match(s);
      matched += expected;
      ASSERT_EQ(accepts(g, s), expected) << "on '" << s << "'";
    }
    EXPECT_GT(matched, 0) << "no random string matched; the case tests little";
  }
}

TEST(RegexVsPcre2, GeneratedOutputsMatch) {
  GrammarCompiler compiler(test::default_model_vocab());
  std::mt19937 rng(5);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.pattern);
    Pcre2 reference(c.pattern);
    auto g = compiler.compile_regex(c.pattern);
    int terminated = 0;
    for (int i = 0; i < 30; ++i) {
      const test::Walk walk = test::random_walk(g, rng, 40);
      if (!walk.terminated) continue;
      ++terminated;
      EXPECT_TRUE(reference.full_match(walk.text)) << "generated '" << walk.text << "'";
    }
    EXPECT_GT(terminated, 0);
  }
}

TEST(RegexVsPcre2, EmailLikePatternWithRealVocabulary) {
  // A longer pattern in the style of vLLM guided_regex requests.
  const std::string pattern =
      "[a-z0-9._%+-]{1,20}@[a-z0-9-]{1,10}\\.(com|org|net)( \\((work|home)\\))?";
  GrammarCompiler compiler(test::default_model_vocab());
  Pcre2 reference(pattern);
  auto g = compiler.compile_regex(pattern);
  std::mt19937 rng(9);
  int terminated = 0;
  for (int i = 0; i < 100; ++i) {
    const test::Walk walk = test::random_walk(g, rng, 80);
    if (!walk.terminated) continue;
    ++terminated;
    EXPECT_TRUE(reference.full_match(walk.text)) << walk.text;
  }
  EXPECT_GT(terminated, 50);
}

}  // namespace
}  // namespace megactx::grammar
