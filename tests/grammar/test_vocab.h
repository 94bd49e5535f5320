// Small vocabularies for grammar tests: every single byte, some multi-byte
// tokens (including ones that split UTF-8 characters), specials and EOS.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grammar/vocabulary.h"

namespace megactx::grammar::test {

struct TestVocab {
  std::shared_ptr<const Vocabulary> vocab;
  int32_t eos = 0;
  int32_t special = 1;  // "<|special|>"
  int32_t empty = 2;    // a token with no bytes
};

// ids: 0 EOS "</s>", 1 "<|special|>", 2 "" (empty), 3..258 the bytes 0..255,
// then `extra` tokens; mask_size pads to a multiple of 32 plus 7.
inline TestVocab make_test_vocab(const std::vector<std::string>& extra = {}) {
  std::vector<std::string> bytes = {"</s>", "<|special|>", ""};
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  const std::vector<std::string> defaults = {
      "{\"", "\":", "\",", "\"}",  "\": \"", "true",     "false",    "null",  "12",  "3.",
      "-1",  "ab",  "abc", "\xC3", "\xA9",   "\xC3\xA9", "\xE2\x82", "\xAC ", "  ",  "\n",
      "},",  "]}",  "[{",  "\"a",  "a\"",    "\\\"",     "\\u00",    "e+",    "0.5", "<|special|>"};
  for (const auto& s : defaults) bytes.push_back(s);
  for (const auto& s : extra) bytes.push_back(s);
  const auto n = static_cast<int32_t>(bytes.size());
  TestVocab v;
  v.vocab = std::make_shared<const Vocabulary>(std::move(bytes), std::vector<int32_t>{0, 1},
                                               std::vector<int32_t>{0}, ((n + 31) / 32) * 32 + 7);
  return v;
}

}  // namespace megactx::grammar::test
