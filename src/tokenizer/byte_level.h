// GPT-2's byte-level alphabet: every byte maps to one printable character
// (printable Latin-1 bytes map to themselves, the other 68 to U+0100..U+0143),
// so BPE vocabularies can spell any byte string. Used by the ByteLevel
// pre-tokenizer (bytes -> characters) and decoder (characters -> bytes).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace megactx {

class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get();

  // UTF-8 of the character that stands for byte b (1 or 2 bytes).
  std::string_view symbol(unsigned char b) const { return symbols_[b]; }
  // Appends the byte-level spelling of raw bytes.
  void encode(std::string_view bytes, std::string& out) const;
  // The bytes a byte-level spelled token stands for; nullopt when some
  // character is outside the alphabet (HF then keeps the token's own bytes).
  std::optional<std::string> decode(std::string_view token) const;

 private:
  ByteLevelAlphabet();
  std::array<std::string, 256> symbols_;
  std::array<int, 0x144> byte_of_code_point_;  // -1 where no byte maps there
};

}  // namespace megactx
