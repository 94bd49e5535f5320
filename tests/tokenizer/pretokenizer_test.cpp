// Split delimiter behaviours on the examples HF documents for
// NormalizedString::split ("the-final--countdown" split on '-'), plus invert,
// ByteLevel's prefix space, and nesting.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"

namespace megactx {
namespace {

std::vector<std::string> pieces(const std::string& spec, const std::string& text) {
  const PreTokenizerPipeline pipeline = make_pre_tokenizer(nlohmann::json::parse(spec));
  std::vector<std::string> out;
  auto collect = [&](std::string_view piece) { out.emplace_back(piece); };
  pipeline.root->split(text, collect);
  return out;
}

std::string split_spec(const std::string& behavior, bool invert = false,
                       const std::string& pattern = R"({"String": "-"})") {
  return R"({"type": "Split", "pattern": )" + pattern + R"(, "behavior": ")" + behavior +
         R"(", "invert": )" + (invert ? "true" : "false") + "}";
}

using Pieces = std::vector<std::string>;

TEST(SplitPreTokenizer, HfDocumentedBehaviours) {
  const std::string text = "the-final--countdown";
  // HF's doc lists empty strings for Removed; pre-tokenization drops them.
  EXPECT_EQ(pieces(split_spec("Removed"), text), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(pieces(split_spec("Isolated"), text),
            (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pieces(split_spec("MergedWithPrevious"), text),
            (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pieces(split_spec("MergedWithNext"), text),
            (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces(split_spec("Contiguous"), text),
            (Pieces{"the", "-", "final", "--", "countdown"}));
}

TEST(SplitPreTokenizer, InvertKeepsTheMatchesAsContent) {
  // Inverted and Removed: what the pattern does NOT match is removed.
  EXPECT_EQ(pieces(split_spec("Removed", true, R"({"Regex": "\\p{L}+"})"), "ab, cd!"),
            (Pieces{"ab", "cd"}));
  // Inverted, the letters are the "matches": each merges onto the spaces before it.
  EXPECT_EQ(pieces(split_spec("MergedWithPrevious", true, R"({"Regex": "\\s+"})"), "a b  c"),
            (Pieces{"a", " b", "  c"}));
}

TEST(ByteLevelPreTokenizer, PrefixSpaceAndGpt2Regex) {
  // Not last in a Sequence, so the bytes are mapped to the alphabet (' ' -> 'Ġ').
  const std::string spec = R"({"type": "Sequence", "pretokenizers": [
      {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true},
      {"type": "Split", "pattern": {"String": "@"}, "behavior": "Isolated"}]})";
  EXPECT_EQ(pieces(spec, "Hello world's"), (Pieces{"\xC4\xA0Hello", "\xC4\xA0world", "'s"}));
  EXPECT_EQ(pieces(spec, " x"), (Pieces{"\xC4\xA0x"}));  // already starts with a space
}

TEST(PreTokenizerErrors, BadSpecsThrow) {
  EXPECT_THROW(pieces(R"({"type": "Whitespace"})", "x"), Error);
  EXPECT_THROW(pieces(split_spec("Sideways"), "x"), Error);
  EXPECT_THROW(pieces(R"({"type": "Split", "pattern": {}, "behavior": "Isolated"})", "x"), Error);
  std::string nested = R"({"type": "Split", "pattern": {"String": "-"}, "behavior": "Isolated"})";
  for (int i = 0; i < 40; ++i)
    nested = R"({"type": "Sequence", "pretokenizers": [)" + nested + "]}";
  EXPECT_THROW(pieces(nested, "x"), Error);
}

}  // namespace
}  // namespace megactx
