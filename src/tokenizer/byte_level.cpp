#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace megactx {

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of_code_point_.fill(-1);
  int next_extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t c = printable ? static_cast<char32_t>(b) : 0x100 + next_extra++;
    utf8::append(symbols_[b], c);
    byte_of_code_point_[c] = b;
  }
}

void ByteLevelAlphabet::encode(std::string_view bytes, std::string& out) const {
  for (char ch : bytes) out.append(symbols_[static_cast<unsigned char>(ch)]);
}

std::optional<std::string> ByteLevelAlphabet::decode(std::string_view token) const {
  std::string bytes;
  bytes.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const size_t n = utf8::sequence_length(token, pos);
    if (n == 0) return std::nullopt;
    size_t length = 0;
    const char32_t c = utf8::decode(token, pos, &length);
    if (c >= byte_of_code_point_.size() || byte_of_code_point_[c] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(byte_of_code_point_[c]));
    pos += n;
  }
  return bytes;
}

}  // namespace megactx
