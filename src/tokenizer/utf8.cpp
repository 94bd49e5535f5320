#include "tokenizer/utf8.h"

namespace megactx::utf8 {
namespace {

// Allowed range of the second byte for each lead byte (Unicode Table 3-7);
// later continuation bytes are always 80..BF.
bool second_byte_ok(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

// Expected length from the lead byte, 0 for bytes that never start a sequence.
size_t expected_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Number of leading bytes of the sequence at pos that are a valid prefix.
size_t valid_prefix(std::string_view text, size_t pos, size_t* expected) {
  const auto lead = static_cast<unsigned char>(text[pos]);
  *expected = expected_length(lead);
  if (*expected <= 1) return *expected;
  size_t n = 1;
  while (n < *expected && pos + n < text.size()) {
    const auto b = static_cast<unsigned char>(text[pos + n]);
    const bool ok = n == 1 ? second_byte_ok(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
    ++n;
  }
  return n;
}

}  // namespace

size_t sequence_length(std::string_view text, size_t pos) {
  size_t expected = 0;
  const size_t n = valid_prefix(text, pos, &expected);
  return n == expected ? n : 0;
}

size_t invalid_length(std::string_view text, size_t pos) {
  size_t expected = 0;
  const size_t n = valid_prefix(text, pos, &expected);
  return n == 0 ? 1 : n;
}

bool is_valid(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const size_t n = sequence_length(text, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string sanitize(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t n = sequence_length(text, pos);
    if (n > 0) {
      out.append(text.substr(pos, n));
      pos += n;
    } else {
      out.append(kReplacement);
      pos += invalid_length(text, pos);
    }
  }
  return out;
}

size_t incomplete_suffix_length(std::string_view text) {
  // A sequence is at most 4 bytes: look for its start in the last 3 bytes.
  const size_t lookback = text.size() < 3 ? text.size() : 3;
  for (size_t back = 1; back <= lookback; ++back) {
    const size_t pos = text.size() - back;
    const auto b = static_cast<unsigned char>(text[pos]);
    if (b >= 0x80 && b <= 0xBF) continue;  // continuation byte: keep looking left
    size_t expected = 0;
    const size_t n = valid_prefix(text, pos, &expected);
    // Incomplete only if every byte present is a valid prefix and more are due.
    return (expected > back && n == back) ? back : 0;
  }
  return 0;
}

char32_t decode(std::string_view text, size_t pos, size_t* length) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) {
    *length = 1;
    return b0;
  }
  const size_t n = expected_length(b0);
  *length = n;
  char32_t c = n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t i = 1; i < n; ++i) c = (c << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3F);
  return c;
}

void append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

bool is_white_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace megactx::utf8
