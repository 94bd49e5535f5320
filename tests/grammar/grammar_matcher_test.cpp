// GrammarMatcher semantics on a small vocabulary: the token mask agrees with
// accepting each token one by one, stop tokens, special and empty tokens,
// rollback, partial UTF-8 tokens, nesting bounds, errors, the cache.
#include <gtest/gtest.h>

#include <random>

#include "../../bench/grammar/synthetic_vocab.h"
#include "core/error.h"
#include "grammar/grammar_compiler.h"
#include "grammar/matcher.h"
#include "test_vocab.h"
#include "walk_util.h"

namespace megactx::grammar {
namespace {

using test::make_test_vocab;

bool bit(const std::vector<uint32_t>& mask, int32_t id) {
  return (mask[id >> 5] >> (id & 31)) & 1;
}

bool accepts(const std::shared_ptr<const CompiledGrammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_string(text) && m.can_terminate();
}

// Every bit of the mask equals whether accept_token succeeds (then undone).
void expect_mask_consistent(GrammarMatcher& m) {
  const Vocabulary& vocab = m.grammar().vocabulary();
  std::vector<uint32_t> mask(vocab.mask_words());
  m.fill_next_token_bitmask(mask.data());
  for (int32_t id = 0; id < vocab.mask_size(); ++id) {
    bool ok = false;
    if (id < vocab.size()) {
      ok = m.accept_token(id);
      if (ok) m.rollback(1);
    }
    ASSERT_EQ(bit(mask, id), ok) << "token " << id << " '"
                                 << (id < vocab.size() ? vocab.bytes(id) : "") << "' after "
                                 << m.num_steps() << " steps";
  }
}

// A random walk through the mask, checking consistency at every step.
std::string random_walk(const std::shared_ptr<const CompiledGrammar>& g, std::mt19937& rng,
                        int max_steps, bool check_consistency) {
  GrammarMatcher m(g);
  const Vocabulary& vocab = g->vocabulary();
  std::vector<uint32_t> mask(vocab.mask_words());
  std::string out;
  for (int step = 0; step < max_steps && !m.is_terminated(); ++step) {
    if (check_consistency) expect_mask_consistent(m);
    m.fill_next_token_bitmask(mask.data());
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < vocab.mask_size(); ++id) {
      if (bit(mask, id)) allowed.push_back(id);
    }
    if (allowed.empty()) {
      ADD_FAILURE() << "empty mask after '" << out << "'";
      break;
    }
    const int32_t id = allowed[rng() % allowed.size()];
    EXPECT_TRUE(m.accept_token(id));
    if (!vocab.is_eos(id)) out += vocab.bytes(id);
  }
  return out;
}

TEST(GrammarMatcher, RegexAcceptsExactly) {
  GrammarCompiler compiler(make_test_vocab().vocab);
  auto g = compiler.compile_regex("a[bc]+d?");
  EXPECT_TRUE(accepts(g, "abcbd"));
  EXPECT_TRUE(accepts(g, "ab"));
  EXPECT_FALSE(accepts(g, "a"));
  EXPECT_FALSE(accepts(g, "abx"));
  EXPECT_FALSE(accepts(g, "abdd"));
}

TEST(GrammarMatcher, MaskAgreesWithAcceptOnRandomWalks) {
  auto v = make_test_vocab();
  GrammarCompiler compiler(v.vocab);
  JsonSchemaOptions compact;
  compact.any_whitespace = false;
  const std::vector<std::shared_ptr<const CompiledGrammar>> grammars = {
      compiler.compile_regex("(ab|abc|\xC3\xA9)+[0-9]{2,4}"),
      compiler.compile_ebnf("root ::= item (\",\" item)*\nitem ::= \"[\" root? \"]\" | [a-c]+"),
      compiler.compile_json_object(),
      compiler.compile_json_schema(
          R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"array","items":{"type":"integer","minimum":-3,"maximum":12}},"c":{"enum":["x",1.5,null]}},"required":["a"]})",
          compact),
  };
  std::mt19937 rng(7);
  for (const auto& g : grammars) {
    for (int walk = 0; walk < 6; ++walk) random_walk(g, rng, 25, true);
  }
}

// The same with real vocabularies: the default model's 8,192 tokens and the
// benchmark's synthetic 154,880, where whole trie subtrees are accepted at
// once and context-dependent tokens are grouped by suffix.
void check_real_vocabulary(const std::shared_ptr<const Vocabulary>& vocab, int walks, int steps) {
  GrammarCompiler compiler(vocab);
  const std::vector<std::shared_ptr<const CompiledGrammar>> grammars = {
      compiler.compile_json_object(),
      compiler.compile_json_schema(
          R"({"type":"object","properties":{"email":{"type":"string","format":"email"},"note":{"type":"string","maxLength":40},"when":{"type":"string","format":"date"},"n":{"type":"array","items":{"type":"number","minimum":0}}},"required":["email"]})"),
      compiler.compile_ebnf("root ::= \"[\" ws (item (ws \",\" ws item)*)? ws \"]\"\n"
                            "item ::= [a-z]+ | \"\\\"\" [^\"]* \"\\\"\" | root\nws ::= [ \\n]*"),
      compiler.compile_regex("([A-Z][a-z]+ ){1,3}(is|was) [0-9]{1,4}\\."),
  };
  std::mt19937 rng(17);
  for (const auto& g : grammars) {
    for (int walk = 0; walk < walks; ++walk) random_walk(g, rng, steps, true);
  }
}

TEST(GrammarMatcher, MaskAgreesWithAcceptOnTheDefaultModelVocabulary) {
  check_real_vocabulary(test::default_model_vocab(), 4, 25);
}

TEST(GrammarMatcher, MaskAgreesWithAcceptOnA154880TokenVocabulary) {
  check_real_vocabulary(bench::make_synthetic_vocab().vocab, 1, 6);
}

TEST(GrammarMatcher, StopTokenOnlyWhenComplete) {
  auto v = make_test_vocab();
  GrammarCompiler compiler(v.vocab);
  GrammarMatcher m(compiler.compile_regex("ab"));
  std::vector<uint32_t> mask(m.mask_words());
  m.fill_next_token_bitmask(mask.data());
  EXPECT_FALSE(bit(mask, v.eos));
  EXPECT_FALSE(m.accept_token(v.eos));
  ASSERT_TRUE(m.accept_string("ab"));
  EXPECT_TRUE(m.can_terminate());
  m.fill_next_token_bitmask(mask.data());
  EXPECT_TRUE(bit(mask, v.eos));
  int count = 0;
  for (uint32_t w : mask) count += __builtin_popcount(w);
  EXPECT_EQ(count, 1);  // nothing can follow "ab"
  EXPECT_TRUE(m.accept_token(v.eos));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.accept_token(3 + 'a'));
  expect_mask_consistent(m);  // only the stop token, which keeps it terminated
  EXPECT_TRUE(m.accept_token(v.eos));
  m.rollback(2);
  EXPECT_FALSE(m.is_terminated());
}

TEST(GrammarMatcher, SpecialAndEmptyTokensOnlyWhenNamed) {
  auto v = make_test_vocab();
  GrammarCompiler compiler(v.vocab);
  const int32_t plain_special_text = v.vocab->size() - 1;  // "<|special|>" as plain text
  GrammarMatcher free_text(compiler.compile_regex(".*"));
  std::vector<uint32_t> mask(free_text.mask_words());
  free_text.fill_next_token_bitmask(mask.data());
  EXPECT_FALSE(bit(mask, v.special));
  EXPECT_FALSE(bit(mask, v.empty));
  EXPECT_TRUE(bit(mask, plain_special_text));  // its bytes are ordinary text
  EXPECT_FALSE(free_text.accept_token(v.empty));
  EXPECT_FALSE(free_text.accept_token(v.special));
  for (int32_t id = v.vocab->size(); id < v.vocab->mask_size(); ++id) EXPECT_FALSE(bit(mask, id));

  GrammarMatcher named(compiler.compile_ebnf("root ::= \"a\" <|special|> \"b\" !<[0]>"));
  ASSERT_TRUE(named.accept_string("a"));
  named.fill_next_token_bitmask(mask.data());
  EXPECT_TRUE(bit(mask, v.special));
  EXPECT_FALSE(bit(mask, plain_special_text));
  EXPECT_TRUE(named.accept_token(v.special));
  EXPECT_TRUE(named.accept_token(3 + 'b'));
  // !<[0]>: any one ordinary token but EOS.
  named.fill_next_token_bitmask(mask.data());
  EXPECT_TRUE(bit(mask, 3 + 'z'));
  EXPECT_FALSE(bit(mask, v.special));
  EXPECT_FALSE(bit(mask, v.eos));
  EXPECT_TRUE(named.accept_token(3 + 'z'));
  EXPECT_TRUE(named.can_terminate());
  expect_mask_consistent(named);
}

TEST(GrammarMatcher, TokensSplittingUtf8Characters) {
  auto v = make_test_vocab();
  GrammarCompiler compiler(v.vocab);
  GrammarMatcher m(compiler.compile_regex("(é|€ )+"));
  const int32_t c3 = 3 + 256 + 13;  // "\xC3" (first byte of é)
  const int32_t a9 = c3 + 1;        // "\xA9"
  ASSERT_EQ(v.vocab->bytes(c3), "\xC3");
  ASSERT_EQ(v.vocab->bytes(a9), "\xA9");
  std::vector<uint32_t> mask(m.mask_words());
  m.fill_next_token_bitmask(mask.data());
  EXPECT_TRUE(bit(mask, c3));
  EXPECT_FALSE(bit(mask, a9));
  ASSERT_TRUE(m.accept_token(c3));
  EXPECT_FALSE(m.can_terminate());
  m.fill_next_token_bitmask(mask.data());
  EXPECT_TRUE(bit(mask, a9));
  EXPECT_FALSE(bit(mask, c3));
  ASSERT_TRUE(m.accept_token(a9));
  EXPECT_TRUE(m.can_terminate());
  EXPECT_TRUE(m.accept_string("\xE2\x82\xAC "));
  expect_mask_consistent(m);
}

TEST(GrammarMatcher, RollbackRestoresEveryEarlierState) {
  auto v = make_test_vocab();
  GrammarCompiler compiler(v.vocab);
  auto g = compiler.compile_json_object();
  GrammarMatcher m(g);
  std::mt19937 rng(3);
  std::vector<std::vector<uint32_t>> masks;
  std::vector<uint32_t> mask(m.mask_words());
  for (int step = 0; step < 30; ++step) {
    m.fill_next_token_bitmask(mask.data());
    masks.push_back(mask);
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < v.vocab->size(); ++id) {
      if (bit(mask, id) && id != v.eos) allowed.push_back(id);
    }
    if (allowed.empty()) break;
    ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
  }
  // Roll back by varying amounts (as speculative decoding does) and compare.
  while (m.num_steps() > 0) {
    const int32_t n = std::min<int32_t>(m.num_steps(), 1 + static_cast<int32_t>(rng() % 4));
    m.rollback(n);
    m.fill_next_token_bitmask(mask.data());
    EXPECT_EQ(mask, masks[m.num_steps()]) << "after rolling back to step " << m.num_steps();
  }
  EXPECT_THROW(m.rollback(1), Error);
}

TEST(GrammarMatcher, RejectedTokenLeavesStateUnchanged) {
  auto v = make_test_vocab();
  GrammarCompiler compiler(v.vocab);
  GrammarMatcher m(compiler.compile_regex("abc"));
  ASSERT_TRUE(m.accept_string("a"));
  EXPECT_FALSE(m.accept_token(3 + 'c'));
  EXPECT_FALSE(m.accept_string("bx"));
  EXPECT_EQ(m.num_steps(), 1);
  EXPECT_TRUE(m.accept_string("bc"));
  EXPECT_TRUE(m.can_terminate());
}

TEST(GrammarMatcher, JumpForwardString) {
  auto v = make_test_vocab();
  GrammarCompiler compiler(v.vocab);
  JsonSchemaOptions compact;
  compact.any_whitespace = false;
  GrammarMatcher m(compiler.compile_json_schema(
      R"({"type":"object","properties":{"name":{"type":"string"},"id":{"const":7}},"required":["name","id"]})",
      compact));
  EXPECT_EQ(m.find_jump_forward_string(), "{\"name\":\"");
  ASSERT_TRUE(m.accept_string("{\"name\":\"x\""));
  EXPECT_EQ(m.find_jump_forward_string(), ",\"id\":7");
  EXPECT_EQ(m.num_steps(), 1);  // finding it changes nothing
}

TEST(GrammarMatcher, DeepNestingIsBoundedNotACrash) {
  auto v = make_test_vocab();
  CompileOptions options;
  options.max_stack_depth = 100;
  GrammarCompiler compiler(v.vocab, options);
  auto g = compiler.compile_json_value();
  EXPECT_TRUE(accepts(g, std::string(40, '[') + std::string(40, ']')));
  GrammarMatcher m(g);
  EXPECT_FALSE(m.accept_string(std::string(200, '[')));
  // The default bound handles deep but sane nesting without recursion.
  GrammarCompiler deep(v.vocab);
  auto value = deep.compile_json_value();
  EXPECT_TRUE(accepts(value, std::string(900, '[') + std::string(900, ']')));
  EXPECT_FALSE(accepts(value, std::string(5000, '[') + std::string(5000, ']')));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GrammarCompiler, ErrorsNameTheProblem) {
  GrammarCompiler c(make_test_vocab().vocab);
  EXPECT_NE(error_of([&] { c.compile_regex("(ab"); }).find("missing ')'"), std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_regex("a{3,1}"); }).find("m < n"), std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_regex("(a)\\1"); }).find("backreferences"), std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_regex("(?=a)"); }).find("lookaround"), std::string::npos);
  EXPECT_NE(error_of([&] {
              c.compile_regex(std::string(500, '(') + std::string(500, ')'));
            }).find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_ebnf("root ::= foo"); }).find("'foo' is used but never"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_ebnf("root ::= root \"a\" | \"b\""); }).find("left-recursive"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_ebnf("start ::= \"a\""); }).find("no rule named 'root'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_ebnf("root ::= \"a\" <[0]>"); }).find("stop token"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_ebnf("root ::= \"a\" <|nope|>"); }).find("<|nope|>"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_ebnf("root ::= \"a\nb\""); }).find("line 1"),
            std::string::npos);
  EXPECT_NE(
      error_of([&] { c.compile_ebnf("root ::= x\nx ::= \"a\" x"); }).find("matches no string"),
      std::string::npos);
  EXPECT_NE(error_of([&] {
              c.compile_json_schema("{\"type\": \"string\", \"not\": {}}");
            }).find("keyword 'not' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_json_schema("{\"type\": \"strin\"}"); }).find("unknown type"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_json_schema("{\"$ref\": \"http://x/y\"}"); }).find("outside"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              c.compile_json_schema("{\"format\": \"color\"}");
            }).find("format 'color' is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.compile_json_schema("{\"type\": "); }).find("not valid JSON"),
            std::string::npos);
  std::string deep = "true";
  for (int i = 0; i < 300; ++i) deep = "{\"items\": " + deep + "}";
  EXPECT_NE(error_of([&] { c.compile_json_schema(deep); }).find("nested deeper"),
            std::string::npos);
}

// A schema that no value satisfies compiles to a grammar matching nothing;
// the error names the contradiction and where it is, not only the rule.
TEST(GrammarCompiler, UnsatisfiableSchemasNameTheContradiction) {
  GrammarCompiler c(make_test_vocab().vocab);
  auto message = [&](const std::string& schema) {
    return error_of([&] { c.compile_json_schema(schema); });
  };
  EXPECT_NE(message(R"({"type":"integer","minimum":5,"maximum":3})")
                .find("at #: no integer satisfies minimum 5, maximum 3"),
            std::string::npos);
  EXPECT_NE(
      message(
          R"({"type":"object","properties":{"n":{"type":"number","exclusiveMinimum":1,"maximum":1}},"required":["n"]})")
          .find("at #/properties/n: no number satisfies exclusiveMinimum 1, maximum 1"),
      std::string::npos);
  EXPECT_NE(message(R"({"type":"string","minLength":4,"maxLength":2})")
                .find("no string satisfies minLength 4, maxLength 2"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"string","pattern":"^[0-9]+$","format":"date"})")
                .find("no string satisfies pattern \"^[0-9]+$\", format \"date\""),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"array","items":{"type":"integer"},"minItems":3,"maxItems":1})")
                .find("no array satisfies minItems 3, maxItems 1"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"object","required":["x"],"additionalProperties":false})")
                .find("required property 'x' is not in properties"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"object","properties":{"x":false},"required":["x"]})")
                .find("at #/properties/x: the schema false allows no value"),
            std::string::npos);
  EXPECT_NE(message(R"({"type":"string","enum":[1,2]})").find("no value of enum/const"),
            std::string::npos);
  // A branch that matches nothing is fine when another one matches something.
  EXPECT_NO_THROW(c.compile_json_schema(
      R"({"anyOf":[{"type":"integer","minimum":5,"maximum":3},{"type":"boolean"}]})"));
  EXPECT_NO_THROW(c.compile_json_schema(
      R"({"type":"object","properties":{"x":false,"y":{"type":"integer","minimum":1,"maximum":0}}})"));
}

TEST(GrammarCompiler, CachesByTextAndOptions) {
  GrammarCompiler c(make_test_vocab().vocab);
  auto a = c.compile_regex("a+");
  auto b = c.compile_regex("a+");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(c.compile_regex("a*").get(), a.get());
  JsonSchemaOptions compact;
  compact.any_whitespace = false;
  EXPECT_NE(c.compile_json_object().get(), c.compile_json_object(compact).get());
  EXPECT_EQ(c.compile_json_object().get(), c.compile_json_object().get());
  EXPECT_THROW(c.compile_regex("("), Error);
  EXPECT_THROW(c.compile_regex("("), Error);  // errors are not cached
  const auto stats = c.cache_stats();
  EXPECT_EQ(stats.hits, 3u);
  EXPECT_EQ(stats.entries, 4u);
}

TEST(GrammarCompiler, SharedAcrossThreads) {
  GrammarCompiler c(make_test_vocab().vocab);
  CompileOptions lazy;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto g = c.compile_json_object();  // one compilation, shared
      std::mt19937 rng(t);
      for (int i = 0; i < 5; ++i) {
        const std::string out = random_walk(g, rng, 40, false);
        if (out.empty() || out[0] != '{') ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace megactx::grammar
