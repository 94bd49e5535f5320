#include "tokenizer/unicode_normalization.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "tokenizer/utf8.h"

namespace megactx::unicode {
namespace {

struct CombiningRange {
  char32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  char32_t code_point, first, second;  // second == 0: singleton
};
struct Composition {
  char32_t first, second, composite;
};

#include "tokenizer/unicode_tables.inc"

// Hangul syllable arithmetic (Unicode §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;
  auto it = std::upper_bound(std::begin(kCombiningRanges), std::end(kCombiningRanges), c,
                             [](char32_t v, const CombiningRange& r) { return v < r.first; });
  if (it == std::begin(kCombiningRanges)) return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t index = c - kSBase;
    out.push_back(kLBase + index / kNCount);
    out.push_back(kVBase + (index % kNCount) / kTCount);
    if (index % kTCount != 0) out.push_back(kTBase + index % kTCount);
    return;
  }
  if (c >= 0xC0) {
    auto it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), c,
                               [](const Decomposition& d, char32_t v) { return d.code_point < v; });
    if (it != std::end(kDecompositions) && it->code_point == c) {
      decompose(it->first, out);
      if (it->second != 0) decompose(it->second, out);
      return;
    }
  }
  out.push_back(c);
}

char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  static const auto* table = [] {
    auto* map = new std::unordered_map<uint64_t, char32_t>();
    for (const auto& c : kCompositions)
      map->emplace((static_cast<uint64_t>(c.first) << 21) | c.second, c.composite);
    return map;
  }();
  auto it = table->find((static_cast<uint64_t>(a) << 21) | b);
  return it == table->end() ? 0 : it->second;
}

// Decomposes and puts combining marks in canonical order.
std::vector<char32_t> canonical_decomposition(std::string_view text) {
  std::vector<char32_t> chars;
  chars.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t length = 1;
    decompose(utf8::decode(text, pos, &length), chars);
    pos += length;
  }
  // Stable sort of each run of non-starters by combining class.
  for (size_t i = 0; i < chars.size();) {
    if (combining_class(chars[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < chars.size() && combining_class(chars[j]) != 0) ++j;
    std::stable_sort(chars.begin() + i, chars.begin() + j, [](char32_t a, char32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = j;
  }
  return chars;
}

bool is_ascii(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

}  // namespace

std::string nfd(std::string_view text) {
  if (is_ascii(text)) return std::string(text);
  std::string out;
  for (char32_t c : canonical_decomposition(text)) utf8::append(out, c);
  return out;
}

std::string nfc(std::string_view text) {
  if (is_ascii(text)) return std::string(text);
  const std::vector<char32_t> chars = canonical_decomposition(text);
  std::vector<char32_t> result;
  result.reserve(chars.size());
  long starter = -1;  // index in result of the last starter
  for (char32_t c : chars) {
    const uint8_t ccc = combining_class(c);
    if (starter >= 0) {
      const bool adjacent = static_cast<long>(result.size()) - 1 == starter;
      const uint8_t last_ccc = adjacent ? 0 : combining_class(result.back());
      // Not blocked: right after the starter, or every mark between has a lower class.
      if (adjacent || (last_ccc != 0 && last_ccc < ccc)) {
        if (char32_t composite = compose(result[starter], c)) {
          result[starter] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) starter = static_cast<long>(result.size());
    result.push_back(c);
  }
  std::string out;
  out.reserve(text.size());
  for (char32_t c : result) utf8::append(out, c);
  return out;
}

}  // namespace megactx::unicode
