#include "chat/jinja/utf8.h"

namespace megactx::jinja {

char32_t utf8_next(std::string_view text, size_t& pos) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char lead = byte(pos);
  int extra = lead < 0x80           ? 0
              : (lead >> 5) == 0x6  ? 1
              : (lead >> 4) == 0xE  ? 2
              : (lead >> 3) == 0x1E ? 3
                                    : -1;
  if (extra <= 0 || pos + extra >= text.size()) {
    ++pos;
    return lead;
  }
  char32_t cp = lead & (0x3F >> extra);
  for (int i = 1; i <= extra; ++i) {
    unsigned char next = byte(pos + i);
    if ((next & 0xC0) != 0x80) {
      ++pos;
      return lead;
    }
    cp = (cp << 6) | (next & 0x3F);
  }
  pos += extra + 1;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<char32_t> utf8_decode(std::string_view text) {
  std::vector<char32_t> cps;
  cps.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) cps.push_back(utf8_next(text, pos));
  return cps;
}

std::string utf8_encode(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t cp : cps) utf8_append(out, cp);
  return out;
}

bool is_ascii(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

size_t utf8_length(std::string_view text) {
  if (is_ascii(text)) return text.size();
  size_t pos = 0, count = 0;
  while (pos < text.size()) {
    utf8_next(text, pos);
    ++count;
  }
  return count;
}

bool is_py_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

namespace {
template <typename Predicate>
std::string strip_if(std::string_view text, bool left, bool right, Predicate strip) {
  std::vector<char32_t> cps = utf8_decode(text);
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strip(cps[begin])) ++begin;
  if (right)
    while (end > begin && strip(cps[end - 1])) --end;
  return utf8_encode(std::vector<char32_t>(cps.begin() + begin, cps.begin() + end));
}
}  // namespace

std::string py_strip(std::string_view text, bool left, bool right) {
  return strip_if(text, left, right, is_py_space);
}

std::string py_strip_chars(std::string_view text, std::string_view chars, bool left, bool right) {
  std::vector<char32_t> set = utf8_decode(chars);
  return strip_if(text, left, right, [&](char32_t cp) {
    for (char32_t c : set)
      if (c == cp) return true;
    return false;
  });
}

char32_t to_lower(char32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp < 0x80) return cp;
  if ((cp >= 0xC0 && cp <= 0xDE && cp != 0xD7)) return cp + 32;
  if (cp >= 0x391 && cp <= 0x3AB && cp != 0x3A2) return cp + 32;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  return cp;
}

char32_t to_upper(char32_t cp) {
  if (cp >= 'a' && cp <= 'z') return cp - 32;
  if (cp < 0x80) return cp;
  if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7)) return cp - 32;
  if (cp >= 0x3B1 && cp <= 0x3CB && cp != 0x3C2) return cp - 32;
  if (cp >= 0x430 && cp <= 0x44F) return cp - 32;
  if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
  return cp;
}

bool is_alpha(char32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  // Outside ASCII, treat letters of the cased scripts above and CJK/other
  // scripts as letters; punctuation blocks are not.
  if (cp >= 0x2000 && cp <= 0x2BFF) return false;
  if (cp >= 0x3000 && cp <= 0x303F) return false;
  if (cp >= 0xFF00 && cp <= 0xFF0F) return false;
  if (cp == 0xD7 || cp == 0xF7 || (cp >= 0x80 && cp <= 0xBF)) return false;
  return true;
}

namespace {
template <typename Map>
std::string map_chars(std::string_view text, Map map) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) utf8_append(out, map(utf8_next(text, pos)));
  return out;
}
}  // namespace

std::string py_lower(std::string_view text) {
  return map_chars(text, to_lower);
}
std::string py_upper(std::string_view text) {
  return map_chars(text, to_upper);
}

std::string py_title(std::string_view text) {
  // Python's str.title(): a cased character following an uncased one starts a word.
  bool previous_cased = false;
  return map_chars(text, [&](char32_t cp) {
    bool cased = to_lower(cp) != to_upper(cp) || is_alpha(cp);
    char32_t result = cased ? (previous_cased ? to_lower(cp) : to_upper(cp)) : cp;
    previous_cased = cased;
    return result;
  });
}

std::string py_capitalize(std::string_view text) {
  bool first = true;
  return map_chars(text, [&](char32_t cp) {
    char32_t result = first ? to_upper(cp) : to_lower(cp);
    first = false;
    return result;
  });
}

}  // namespace megactx::jinja
