// GBNF grammars against simple references: a JSON grammar against
// nlohmann::json::accept, an arithmetic grammar against a hand-written
// recursive-descent recognizer. Strings generated through the mask are
// accepted by the reference; random and mutated strings get the same
// decision from the grammar and the reference.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "grammar/grammar_compiler.h"
#include "test_vocab.h"
#include "walk_util.h"

namespace megactx::grammar {
namespace {

// llama.cpp's GBNF style: continuation lines inside parentheses, comments.
const char* kJsonGbnf = R"GBNF(# JSON (RFC 8259) with surrounding whitespace
root   ::= ws value ws
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member ::= string ws ":" ws value
array  ::= "[" ws (
             value ( ws "," ws value )*
           )? ws "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" hex{4} ) )* "\""
hex    ::= [0-9a-fA-F]
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n\r]*
)GBNF";

// The same shape as a rule per line, alternatives continued on new lines.
const char* kArithmeticGbnf = R"GBNF(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor
       (("*" | "/") factor)*
factor ::= [0-9]+
  | "(" expr ")"
  | "-" factor
)GBNF";

// Recursive descent for kArithmeticGbnf.
class Arithmetic {
 public:
  static bool accepts(const std::string& s) {
    Arithmetic p(s);
    return p.expr(0) && p.pos_ == s.size();
  }

 private:
  explicit Arithmetic(const std::string& s) : s_(s) {}
  bool peek(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  bool expr(int depth) {
    if (!term(depth)) return false;
    while (peek('+') || peek('-')) {
      const size_t save = pos_++;
      if (!term(depth)) {
        pos_ = save;
        return true;  // the longest match is what a full-string check needs
      }
    }
    return true;
  }
  bool term(int depth) {
    if (!factor(depth)) return false;
    while (peek('*') || peek('/')) {
      const size_t save = pos_++;
      if (!factor(depth)) {
        pos_ = save;
        return true;
      }
    }
    return true;
  }
  bool factor(int depth) {
    if (depth > 200) return false;
    if (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
      return true;
    }
    const size_t save = pos_;
    if (peek('(')) {
      ++pos_;
      if (expr(depth + 1) && peek(')')) {
        ++pos_;
        return true;
      }
      pos_ = save;
      return false;
    }
    if (peek('-')) {
      ++pos_;
      if (factor(depth + 1)) return true;
      pos_ = save;
    }
    return false;
  }
  const std::string& s_;
  size_t pos_ = 0;
};

bool accepts(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
  GrammarMatcher m(g);
  return m.accept_string(s) && m.can_terminate();
}

std::string mutate(std::string s, std::mt19937& rng, const std::string& alphabet) {
  const int edits = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < edits; ++i) {
    const size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
    const char c = alphabet[rng() % alphabet.size()];
    switch (rng() % 3) {
      case 0:
        s.insert(s.begin() + at, c);
        break;
      case 1:
        if (at < s.size()) s.erase(at, 1);
        break;
      default:
        if (at < s.size()) s[at] = c;
        break;
    }
  }
  return s;
}

TEST(Ebnf, JsonGrammarAgreesWithNlohmann) {
  GrammarCompiler compiler(test::default_model_vocab());
  auto g = compiler.compile_ebnf(kJsonGbnf);
  std::mt19937 rng(21);
  const std::vector<std::string> seeds = {
      R"({"a": [1, 2.5e-3, -0, true, null], "b": {"c": "x\"y\\u00e9"}})",
      R"([[], {}, "", -12.0E+2, false])",
      " \"\\t\\n caf\xC3\xA9 \" ",
      R"({"k":{"k":{"k":[0.1,{"z":[]}]}}})",
  };
  // Mutations avoid 'u' so no \u escape of an unpaired surrogate appears,
  // which the JSON grammar allows and nlohmann's parser refuses.
  const std::string alphabet = "{}[]\",:. -+0123456789eEtrfalsn\\\n\t abc";
  int valid = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string s = mutate(seeds[i % seeds.size()], rng, alphabet);
    if (i % 5 == 0) s = mutate(s, rng, alphabet);
    const bool expected = nlohmann::json::accept(s);
    valid += expected;
    ASSERT_EQ(accepts(g, s), expected) << "on " << s;
  }
  EXPECT_GT(valid, 100);
  for (const std::string& seed : seeds) EXPECT_TRUE(accepts(g, seed)) << seed;
  // Generated through the mask with the real vocabulary.
  int terminated = 0;
  for (int i = 0; i < 40; ++i) {
    const test::Walk walk = test::random_walk(g, rng, 300, 0.9);
    if (!walk.terminated) continue;
    ++terminated;
    if (walk.text.find("\\u") != std::string::npos) continue;  // surrogates, as above
    if (walk.text.find_first_of("eE") != std::string::npos && walk.text.size() > 300) {
      continue;  // a huge exponent overflows the reference's doubles
    }
    EXPECT_TRUE(nlohmann::json::accept(walk.text)) << walk.text;
  }
  EXPECT_GT(terminated, 3);
}

TEST(Ebnf, ArithmeticGrammarAgreesWithRecursiveDescent) {
  GrammarCompiler compiler(test::default_model_vocab());
  auto g = compiler.compile_ebnf(kArithmeticGbnf);
  std::mt19937 rng(22);
  const std::string alphabet = "0123456789+-*/()";
  int valid = 0;
  for (int i = 0; i < 6000; ++i) {
    std::string s;
    const int length = 1 + static_cast<int>(rng() % 10);
    for (int k = 0; k < length; ++k) s += alphabet[rng() % alphabet.size()];
    const bool expected = Arithmetic::accepts(s);
    valid += expected;
    ASSERT_EQ(accepts(g, s), expected) << "on " << s;
  }
  EXPECT_GT(valid, 100);
  for (int i = 0; i < 60; ++i) {
    const test::Walk walk = test::random_walk(g, rng, 60, 0.5);
    if (!walk.terminated) continue;
    EXPECT_TRUE(Arithmetic::accepts(walk.text)) << walk.text;
    // Mutations of generated strings: the reference decides.
    for (int k = 0; k < 20; ++k) {
      const std::string m = mutate(walk.text, rng, alphabet);
      ASSERT_EQ(accepts(g, m), Arithmetic::accepts(m)) << "on " << m;
    }
  }
}

TEST(Ebnf, SyntaxCoverage) {
  GrammarCompiler compiler(test::make_test_vocab().vocab);
  auto g = compiler.compile_ebnf(R"GBNF(
root ::= greeting ", " name{1,2} "!"? tail   # a comment
greeting ::= ("hi" | "hello") [ \t]{0,2}
name ::= [A-Z] [a-z\-]* ( "\x41" | "\u00e9" )?
tail ::= .{0,3} "\n"
)GBNF");
  EXPECT_TRUE(accepts(g, "hi, Ann!\n"));
  EXPECT_TRUE(accepts(g, "hello  , Bo-bAAnn\xC3\xA9!xyz\n"));
  EXPECT_FALSE(accepts(g, "hey, Ann!\n"));
  EXPECT_FALSE(accepts(g, "hi, ann\n"));
  EXPECT_FALSE(accepts(g, "hi, Ann!wxyz\n"));
  auto other_root = compiler.compile_ebnf("start ::= \"x\" | \"y\"", "start");
  EXPECT_TRUE(accepts(other_root, "y"));
}

}  // namespace
}  // namespace megactx::grammar
