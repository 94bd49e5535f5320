// Fuzzes the tokenizer.json loader and, when a file loads, encode / decode /
// streaming on text taken from the same input (arbitrary bytes) and on fixed
// tricky text. Every outcome must be a tokenizer or a megactx::Error, never a
// crash; ids stay in range and decoded text is valid UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
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
