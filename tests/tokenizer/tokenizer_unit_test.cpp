// Behaviour of the tokenizer pieces against independent references: the
// Unicode standard's own examples, HF's documented rules, and error handling.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "fixture_util.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_normalization.h"
#include "tokenizer/utf8.h"

namespace megactx {
namespace {

using testing::fixture_dir;

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8, MaximalSubpartReplacementAsInUnicodeStandard) {
  // Unicode 15 §3.9, Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64.
  const std::string input = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  EXPECT_EQ(utf8::sanitize(input),
            "a" + kFffd + kFffd + kFffd + "b" + kFffd + "c" + kFffd + kFffd + "d");
  // Surrogates and overlongs: every byte is its own subpart (Table 3-9 / 3-10).
  EXPECT_EQ(utf8::sanitize("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(utf8::sanitize("\xC0\xAF"), kFffd + kFffd);
  EXPECT_EQ(utf8::sanitize("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(utf8::sanitize("ok \xE2\x82\xAC"), "ok \xE2\x82\xAC");
}

TEST(Utf8, IncompleteSuffix) {
  EXPECT_EQ(utf8::incomplete_suffix_length(""), 0u);
  EXPECT_EQ(utf8::incomplete_suffix_length("abc"), 0u);
  EXPECT_EQ(utf8::incomplete_suffix_length("a\xE2\x82"), 2u);
  EXPECT_EQ(utf8::incomplete_suffix_length("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_suffix_length("a\xE2\x82\xAC"), 0u);
  EXPECT_EQ(utf8::incomplete_suffix_length("a\xE2\x41"), 0u);  // already ill-formed
  EXPECT_EQ(utf8::incomplete_suffix_length("\xED\xA0"), 0u);   // surrogate: never completes
}

TEST(ByteLevel, AlphabetIsGpt2s) {
  const auto& alphabet = ByteLevelAlphabet::get();
  EXPECT_EQ(alphabet.symbol(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(alphabet.symbol('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(alphabet.symbol('A'), "A");
  EXPECT_EQ(alphabet.symbol(0xAD), "\xC5\x83");  // soft hyphen -> U+0143, the last
  for (int b = 0; b < 256; ++b) {
    auto back = alphabet.decode(alphabet.symbol(static_cast<unsigned char>(b)));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, std::string(1, static_cast<char>(b)));
  }
  EXPECT_FALSE(alphabet.decode("a b").has_value());  // ' ' is not in the alphabet
}

TEST(UnicodeNormalization, CanonicalCompositionAndOrdering) {
  EXPECT_EQ(unicode::nfc("e\xCC\x81"), "\xC3\xA9");  // e + acute -> é
  EXPECT_EQ(unicode::nfd("\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(unicode::nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // 각
  // q + dot below (220) + dot above (230) is reordered, stays decomposed.
  EXPECT_EQ(unicode::nfc("q\xCC\x87\xCC\xA3"), "q\xCC\xA3\xCC\x87");
  // U+0344 (excluded) decomposes to 0308 0301.
  EXPECT_EQ(unicode::nfc("\xCD\x84"), "\xCC\x88\xCC\x81");
  EXPECT_EQ(unicode::nfc("\xE2\x84\xAB"), "\xC3\x85");  // Angstrom sign -> Å
}

class GlmTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override { tokenizer_ = Tokenizer::load(fixture_dir("glm")); }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(GlmTokenizerTest, InvalidUtf8IsEncodedAsReplacementCharacters) {
  const std::string bad = "ab\xFF\xC3(c\xE2\x82";
  EXPECT_EQ(tokenizer_->encode(bad), tokenizer_->encode(utf8::sanitize(bad)));
  EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(bad)), utf8::sanitize(bad));
}

TEST_F(GlmTokenizerTest, RandomBytesNeverCrashAndRoundTripSanitized) {
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::string bytes(rng() % 64, '\0');
    for (auto& b : bytes) b = static_cast<char>(rng() % 256);
    const auto ids = tokenizer_->encode(bytes, true);
    for (TokenId id : ids) ASSERT_LT(id, tokenizer_->vocab_size());
    EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(bytes)), utf8::sanitize(bytes));
  }
}

TEST_F(GlmTokenizerTest, SpecialTokensAndLookups) {
  const auto user = tokenizer_->token_to_id("<|user|>");
  ASSERT_TRUE(user.has_value());
  EXPECT_TRUE(tokenizer_->is_special(*user));
  EXPECT_EQ(tokenizer_->id_to_token(*user), "<|user|>");
  EXPECT_EQ(tokenizer_->token_bytes(*user), "<|user|>");
  EXPECT_EQ(tokenizer_->encode("<|user|>"), std::vector<TokenId>{*user});
  const auto mark = tokenizer_->token_to_id("<mark>");
  ASSERT_TRUE(mark.has_value());
  EXPECT_FALSE(tokenizer_->is_special(*mark));
  EXPECT_EQ(tokenizer_->id_to_token(-1), "");
  EXPECT_EQ(tokenizer_->id_to_token(static_cast<TokenId>(tokenizer_->vocab_size())), "");
  // Unknown ids are skipped by decode, as HF does.
  EXPECT_EQ(tokenizer_->decode({-5, 1 << 29}), "");
}

TEST(TokenizerErrors, MalformedFilesThrowErrors) {
  EXPECT_THROW(Tokenizer::from_json("not json"), Error);
  EXPECT_THROW(Tokenizer::from_json("[]"), Error);
  EXPECT_THROW(Tokenizer::from_json("{}"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"vocab": {"a": "x"}, "merges": []}})"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"vocab": {"a": 0}, "merges": ["a b"]}})"), Error);
  EXPECT_THROW(Tokenizer::from_json(R"({"model": {"vocab": {"a": 0}, "merges": [],
      "pre_tokenizer": null}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(("},
      "behavior": "Isolated"}})"),
               Error);
  EXPECT_THROW(Tokenizer::load(fixture_dir("no_such_model")), Error);
}

TEST(TokenizerLoad, AcceptsTheFileItself) {
  const auto from_dir = Tokenizer::load(fixture_dir("glm"));
  const auto from_file = Tokenizer::load(fixture_dir("glm") + "/tokenizer.json");
  EXPECT_EQ(from_dir->encode("Hello world <|user|>"), from_file->encode("Hello world <|user|>"));
}

TEST(TokenizerErrors, MinimalFileWithoutPreTokenizerOrDecoder) {
  // No pre-tokenizer: the whole text is one word; no decoder: tokens joined by spaces.
  const auto tokenizer = Tokenizer::from_json(
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3},
          "merges": [["a", "b"]]}})");
  EXPECT_EQ(tokenizer->encode("abcab"), (std::vector<TokenId>{2, 3, 2}));
  // No unk token: 'x' is dropped (HF's merge_word) and "a" "b" then merge.
  EXPECT_EQ(tokenizer->encode("axb"), (std::vector<TokenId>{2}));
  EXPECT_EQ(tokenizer->decode({2, 3}), "ab c");
}

}  // namespace
}  // namespace megactx
