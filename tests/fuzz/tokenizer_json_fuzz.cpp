// Fuzzes the tokenizer.json loader and, when a file loads, encode / decode /
// streaming on text taken from the same input (arbitrary bytes) and on fixed
// tricky text. Every outcome must be a tokenizer or a megactx::Error, never a
// crash; ids stay in range and decoded text is valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_normalization.h"
#include "tokenizer/utf8.h"

namespace {

void exercise(const megactx::Tokenizer& tokenizer, std::string_view text) {
  for (bool special : {false, true}) {
    const auto ids = tokenizer.encode(text, special);
    for (megactx::TokenId id : ids)
      if (id < 0 || id >= tokenizer.vocab_size()) std::abort();
    const std::string decoded = tokenizer.decode(ids, false);
    if (!megactx::utf8::is_valid(decoded)) std::abort();
    // Streaming must add up to decode() of the same ids.
    megactx::StreamingDetokenizer stream(tokenizer);
    std::string streamed;
    for (megactx::TokenId id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    if (!megactx::utf8::is_valid(streamed)) std::abort();
  }
}

// A fixed GLM-shaped tokenizer (byte alphabet, a few merges, the GLM split
// regex, special and lstrip/rstrip/single_word added tokens) so every input is
// also fuzzed as text to encode, even when it is not a loadable file.
std::unique_ptr<megactx::Tokenizer> make_fixed_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& alphabet = megactx::ByteLevelAlphabet::get();
  for (int b = 0; b < 256; ++b)
    vocab[std::string(alphabet.symbol(static_cast<unsigned char>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"\xC4\xA0", "t"},        {"h", "e"}, {"\xC4\xA0t", "he"},
      {"\xC4\xA0", "\xC4\xA0"}, {"1", "2"}, {"12", "3"}};
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [a, b] : merges) {
    vocab[a + b] = static_cast<int>(vocab.size());
    merge_list.push_back({a, b});
  }
  const int base = static_cast<int>(vocab.size());
  nlohmann::json added = nlohmann::json::array();
  const char* specials[] = {"<|user|>", "[gMASK]", "<sop>", "<think>", "</think>"};
  for (int i = 0; i < 5; ++i)
    added.push_back(
        {{"id", base + i}, {"content", specials[i]}, {"special", true}, {"normalized", false}});
  added.push_back({{"id", base + 5}, {"content", "<m>"}, {"lstrip", true}, {"rstrip", true}});
  added.push_back({{"id", base + 6}, {"content", "word"}, {"single_word", true}});
  const nlohmann::json spec = {
      {"added_tokens", added},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "[gMASK]"}}}}, {{"Sequence", {{"id", "A"}}}}}},
        {"special_tokens", {{"[gMASK]", {{"id", "[gMASK]"}, {"ids", {base + 1}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
  return megactx::Tokenizer::from_json(spec.dump());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  static const auto fixed = make_fixed_tokenizer();
  exercise(*fixed, input);
  // Byte-level, no lossy normalization for plain text: decode gives the input back.
  if (megactx::utf8::is_valid(input) && input.find_first_of("<[w") == std::string::npos &&
      megactx::unicode::nfc(input) == input && fixed->decode(fixed->encode(input)) != input)
    std::abort();
  try {
    const auto tokenizer = megactx::Tokenizer::from_json(input);
    // Text to encode: the input itself (arbitrary bytes) and fixed tricky text.
    exercise(*tokenizer, std::string_view(input).substr(0, 512));
    exercise(
        *tokenizer,
        "Hello  world\n\n\t 123456 你好 👨‍👩‍👧 e\xCC\x81 <|user|>[gMASK]\xFF\xC3");
  } catch (const megactx::Error&) {
  }
  return 0;
}
