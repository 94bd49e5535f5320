#include "core/base64.h"

#include <array>
#include <cstdint>

namespace megactx {
namespace {

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> decode_table() {
  std::array<int8_t, 256> table{};
  for (auto& entry : table) entry = -1;
  for (size_t i = 0; i < kAlphabet.size(); ++i)
    table[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  return table;
}

}  // namespace

std::string base64_encode(std::span<const std::byte> bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = std::to_integer<uint32_t>(bytes[i]) << 16 |
                       std::to_integer<uint32_t>(bytes[i + 1]) << 8 |
                       std::to_integer<uint32_t>(bytes[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += kAlphabet[(v >> shift) & 63];
  }
  const size_t left = bytes.size() - i;
  if (left > 0) {
    uint32_t v = std::to_integer<uint32_t>(bytes[i]) << 16;
    if (left == 2) v |= std::to_integer<uint32_t>(bytes[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += left == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::vector<std::byte>> base64_decode(std::string_view text) {
  static constexpr std::array<int8_t, 256> table = decode_table();
  if (text.size() % 4 != 0) return std::nullopt;
  std::vector<std::byte> out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    if (pad == 1 && text[i + 2] == '=') return std::nullopt;
    uint32_t v = 0;
    for (int j = 0; j < 4; ++j) {
      int8_t digit = 0;
      if (j < 4 - pad) {
        digit = table[static_cast<unsigned char>(text[i + j])];
        if (digit < 0) return std::nullopt;
      }
      v = v << 6 | static_cast<uint32_t>(digit);
    }
    out.push_back(static_cast<std::byte>(v >> 16));
    if (pad < 2) out.push_back(static_cast<std::byte>(v >> 8 & 0xff));
    if (pad < 1) out.push_back(static_cast<std::byte>(v & 0xff));
  }
  return out;
}

}  // namespace megactx
