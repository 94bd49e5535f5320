// Every golden encoding/decoding made by HF tokenizers 0.23
// (tools/fixtures/make_tokenizer_fixtures.py) must be reproduced exactly.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "fixture_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace megactx {
namespace {

using testing::fixture_dir;
using testing::read_json;

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    tokenizer_ = Tokenizer::load(fixture_dir(GetParam()));
    golden_ = read_json(fixture_dir(GetParam()) + "/golden.json");
  }
  std::unique_ptr<Tokenizer> tokenizer_;
  nlohmann::json golden_;
};

std::string printable(const std::string& text) {
  return nlohmann::json(text).dump();  // escapes control characters
}

TEST_P(GoldenTest, VocabSize) {
  EXPECT_EQ(tokenizer_->vocab_size(), golden_["vocab_size"].get<int64_t>());
}

TEST_P(GoldenTest, EncodeMatchesHf) {
  int mismatches = 0;
  for (const auto& c : golden_["cases"]) {
    const std::string text = c["text"];
    const auto expected = c["ids"].get<std::vector<TokenId>>();
    const auto ids = tokenizer_->encode(text, false);
    EXPECT_EQ(ids, expected) << "text " << printable(text) << " HF tokens " << c["tokens"].dump();
    mismatches += ids != expected;
    EXPECT_EQ(tokenizer_->encode(text, true), c["ids_with_special"].get<std::vector<TokenId>>())
        << "with special tokens: " << printable(text);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_P(GoldenTest, DecodeMatchesHf) {
  for (const auto& c : golden_["cases"]) {
    const auto ids = c["ids"].get<std::vector<TokenId>>();
    const std::string decoded = tokenizer_->decode(ids, false);
    EXPECT_EQ(decoded, c["decoded"].get<std::string>()) << printable(c["text"]);
    EXPECT_EQ(tokenizer_->decode(ids, true), c["decoded_skip_special"].get<std::string>());
    if (c["roundtrip"].get<bool>()) {
      EXPECT_EQ(decoded, c["text"].get<std::string>());
    }
  }
  for (const auto& c : golden_["decode_cases"]) {
    const auto ids = c["ids"].get<std::vector<TokenId>>();
    EXPECT_EQ(tokenizer_->decode(ids, false), c["decoded"].get<std::string>()) << c["ids"].dump();
    EXPECT_EQ(tokenizer_->decode(ids, true), c["decoded_skip_special"].get<std::string>());
  }
}

// After every token, the streamed text is the decoded prefix minus at most one
// U+FFFD standing for a character that is not complete yet; the whole stream
// equals decode().
void check_stream(const Tokenizer& tokenizer, const std::vector<TokenId>& ids, bool skip) {
  StreamingDetokenizer stream(tokenizer, skip);
  std::string streamed;
  std::vector<TokenId> prefix;
  for (TokenId id : ids) {
    const std::string piece = stream.push(id);
    ASSERT_TRUE(utf8::is_valid(piece));
    ASSERT_EQ(utf8::incomplete_suffix_length(piece), 0u);
    streamed += piece;
    prefix.push_back(id);
    const std::string decoded = tokenizer.decode(prefix, skip);
    ASSERT_EQ(decoded.compare(0, streamed.size(), streamed), 0) << "prefix " << prefix.size();
    const std::string rest = decoded.substr(streamed.size());
    ASSERT_TRUE(rest.empty() || rest == utf8::kReplacement) << "held back: " << printable(rest);
  }
  streamed += stream.flush();
  EXPECT_EQ(streamed, tokenizer.decode(ids, skip));
}

TEST_P(GoldenTest, StreamingDetokenizerEveryPrefix) {
  for (const auto& c : golden_["cases"])
    for (bool skip : {false, true})
      check_stream(*tokenizer_, c["ids"].get<std::vector<TokenId>>(), skip);
  for (const auto& c : golden_["decode_cases"])
    check_stream(*tokenizer_, c["ids"].get<std::vector<TokenId>>(), false);
}

// encode() is const and shared by request threads: the caches must not mix
// results up under concurrency, nor between two tokenizers on one thread.
TEST_P(GoldenTest, ConcurrentEncodesAgree) {
  const auto other = Tokenizer::load(fixture_dir(GetParam() == "glm" ? "deepseek" : "glm"));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  const nlohmann::json& cases = golden_["cases"];  // threads only read it
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t i = t; i < cases.size(); ++i) {
          const auto& c = cases[i];
          if (tokenizer_->encode(c["text"].get<std::string>()) !=
              c["ids"].get<std::vector<TokenId>>())
            ++mismatches;
          (void)other->encode(c["text"].get<std::string>());  // interleave another model
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest,
                         ::testing::Values("glm", "glm_legacy_merges", "deepseek", "gpt2_nfc",
                                           "split_behaviors"));

}  // namespace
}  // namespace megactx
