#include "grammar/regex_parser.h"

#include <optional>

#include "core/error.h"

namespace megactx::grammar {

namespace {

constexpr int kMaxGroupDepth = 200;
constexpr int64_t kMaxRepeat = 100'000;

std::vector<CodeRange> digit_class() {
  return {{'0', '9'}};
}
std::vector<CodeRange> word_class() {
  return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
}
std::vector<CodeRange> space_class(bool ecma) {
  std::vector<CodeRange> s = {{'\t', '\r'}, {' ', ' '}};
  if (ecma) {
    for (CodeRange r : std::vector<CodeRange>{{0xA0, 0xA0},
                                              {0x1680, 0x1680},
                                              {0x2000, 0x200A},
                                              {0x2028, 0x2029},
                                              {0x202F, 0x202F},
                                              {0x205F, 0x205F},
                                              {0x3000, 0x3000},
                                              {0xFEFF, 0xFEFF}}) {
      s.push_back(r);
    }
  }
  return s;
}

class RegexParser {
 public:
  RegexParser(Grammar& grammar, std::string_view pattern, const RegexOptions& options)
      : g_(grammar), p_(pattern), options_(options) {}

  ExprId parse() {
    // Top level: each alternative may carry its own ^ and $.
    std::vector<ExprId> branches;
    for (;;) {
      bool anchored_start = false;
      if (peek_is('^')) {
        ++pos_;
        anchored_start = true;
      }
      bool anchored_end = false;
      ExprId body = parse_sequence(0, true, &anchored_end);
      if (options_.search) {
        const ExprId any = g_.star(chars({{0, 0x10FFFF}}));
        body = g_.seq({anchored_start ? g_.empty() : any, body, anchored_end ? g_.empty() : any});
      }
      branches.push_back(body);
      if (at_end()) break;
      if (p_[pos_] == '|') {
        ++pos_;
        continue;
      }
      error("unmatched ')'");
    }
    return g_.alt(std::move(branches));
  }

 private:
  [[noreturn]] void error(std::string_view message) const {
    fail("regex /{}/: {} at offset {}", p_, message, pos_);
  }
  bool at_end() const { return pos_ >= p_.size(); }
  bool peek_is(char c) const { return !at_end() && p_[pos_] == c; }

  ExprId chars(const std::vector<CodeRange>& ranges) {
    if (options_.encode) return options_.encode(g_, ranges);
    return g_.code_points(ranges);
  }

  // One UTF-8 character of the pattern itself.
  uint32_t next_char() {
    const auto b0 = static_cast<uint8_t>(p_[pos_]);
    int length = 1;
    uint32_t cp = b0;
    if (b0 >= 0xF0 && b0 < 0xF8) {
      length = 4;
      cp = b0 & 0x07;
    } else if (b0 >= 0xE0) {
      length = 3;
      cp = b0 & 0x0F;
    } else if (b0 >= 0xC2 && b0 < 0xE0) {
      length = 2;
      cp = b0 & 0x1F;
    } else if (b0 >= 0x80) {
      error("invalid UTF-8");
    }
    if (pos_ + length > p_.size()) error("invalid UTF-8");
    for (int i = 1; i < length; ++i) {
      const auto b = static_cast<uint8_t>(p_[pos_ + i]);
      if ((b & 0xC0) != 0x80) error("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += length;
    if ((length == 3 && cp < 0x800) || (length == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      error("invalid UTF-8");
    }
    return cp;
  }

  // Alternatives up to ')' or the end of the pattern.
  ExprId parse_alternation(int depth) {
    std::vector<ExprId> branches;
    for (;;) {
      branches.push_back(parse_sequence(depth, false, nullptr));
      if (peek_is('|')) {
        ++pos_;
        continue;
      }
      break;
    }
    return g_.alt(std::move(branches));
  }

  // Items up to '|', ')' or the end. At the top level a '$' that ends the
  // branch is an anchor (reported through anchored_end).
  ExprId parse_sequence(int depth, bool top, bool* anchored_end) {
    std::vector<ExprId> items;
    while (!at_end() && p_[pos_] != '|' && p_[pos_] != ')') {
      if (p_[pos_] == '$') {
        const bool ends_branch =
            pos_ + 1 == p_.size() || p_[pos_ + 1] == '|' || (!top && p_[pos_ + 1] == ')');
        if (top && ends_branch) {
          ++pos_;
          *anchored_end = true;
          break;
        }
        error("'$' is only supported at the end of the pattern");
      }
      if (p_[pos_] == '^') error("'^' is only supported at the start of the pattern");
      const ExprId atom = parse_atom(depth);
      items.push_back(parse_quantifier(atom));
    }
    if (top && peek_is(')')) error("unmatched ')'");
    return g_.seq(std::move(items));
  }

  std::optional<int64_t> parse_number() {
    const size_t start = pos_;
    int64_t value = 0;
    while (!at_end() && p_[pos_] >= '0' && p_[pos_] <= '9') {
      value = value * 10 + (p_[pos_] - '0');
      if (value > kMaxRepeat) error("repetition count too large");
      ++pos_;
    }
    if (pos_ == start) return std::nullopt;
    return value;
  }

  ExprId parse_quantifier(ExprId atom) {
    for (;;) {
      if (at_end()) return atom;
      const char c = p_[pos_];
      int64_t min = 0;
      int64_t max = -1;
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        ++pos_;
        min = 1;
      } else if (c == '?') {
        ++pos_;
        max = 1;
      } else if (c == '{') {
        // "{" not followed by a valid count is a literal in both dialects.
        const size_t save = pos_;
        ++pos_;
        auto lo = parse_number();
        if (!lo) {
          pos_ = save;
          return atom;
        }
        min = *lo;
        max = *lo;
        if (peek_is(',')) {
          ++pos_;
          auto hi = parse_number();
          max = hi ? *hi : -1;
        }
        if (!peek_is('}')) {
          pos_ = save;
          return atom;
        }
        ++pos_;
        if (max != -1 && max < min) error("repetition {n,m} with m < n");
      } else {
        return atom;
      }
      if (peek_is('?')) {
        ++pos_;  // lazy: the same strings
      } else if (peek_is('+')) {
        error("possessive quantifiers are not supported");
      }
      atom = g_.repeat(atom, static_cast<int32_t>(min), static_cast<int32_t>(max));
    }
  }

  ExprId parse_atom(int depth) {
    const char c = p_[pos_];
    switch (c) {
      case '(': {
        if (depth >= kMaxGroupDepth) error("groups nested too deeply");
        ++pos_;
        if (peek_is('?')) {
          ++pos_;
          if (peek_is(':')) {
            ++pos_;
          } else if (peek_is('<') && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' &&
                     p_[pos_ + 1] != '!') {
            skip_group_name('>');
          } else if (peek_is('P') && pos_ + 1 < p_.size() && p_[pos_ + 1] == '<') {
            ++pos_;
            skip_group_name('>');
          } else if (peek_is('=') || peek_is('!') || peek_is('<')) {
            error("lookaround assertions are not supported");
          } else {
            error("inline flags and other (? groups are not supported");
          }
        }
        const ExprId inner = parse_alternation(depth + 1);
        if (!peek_is(')')) error("missing ')'");
        ++pos_;
        return inner;
      }
      case '[':
        return chars(parse_class());
      case '.':
        ++pos_;
        if (options_.ecma)
          return chars(normalize_ranges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}, true));
        return chars(normalize_ranges({{'\n', '\n'}}, true));
      case '*':
      case '+':
      case '?':
        error("quantifier without an operand");
      case '{': {
        ++pos_;
        return chars({{'{', '{'}});
      }
      case '\\': {
        ++pos_;
        if (at_end()) error("trailing backslash");
        return chars(parse_escape(false));
      }
      default: {
        const uint32_t cp = next_char();
        return chars({{cp, cp}});
      }
    }
  }

  void skip_group_name(char close) {
    ++pos_;  // '<'
    const size_t start = pos_;
    while (!at_end() && p_[pos_] != close) ++pos_;
    if (at_end() || pos_ == start) error("bad group name");
    ++pos_;
  }

  uint32_t parse_hex(size_t digits, bool braced) {
    uint32_t value = 0;
    size_t count = 0;
    while (!at_end() && (braced || count < digits)) {
      const char h = p_[pos_];
      int v;
      if (h >= '0' && h <= '9') {
        v = h - '0';
      } else if (h >= 'a' && h <= 'f') {
        v = h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        v = h - 'A' + 10;
      } else {
        break;
      }
      value = value * 16 + v;
      if (value > 0x10FFFF) error("code point out of range");
      ++pos_;
      ++count;
    }
    if (count == 0 || (!braced && count != digits)) error("bad hex escape");
    if (braced) {
      if (!peek_is('}')) error("missing '}' in escape");
      ++pos_;
    }
    return value;
  }

  // After a backslash: the set of characters the escape stands for.
  std::vector<CodeRange> parse_escape(bool in_class) {
    const char c = p_[pos_++];
    auto one = [](uint32_t cp) { return std::vector<CodeRange>{{cp, cp}}; };
    switch (c) {
      case 'd':
        return digit_class();
      case 'D':
        return normalize_ranges(digit_class(), true);
      case 'w':
        return word_class();
      case 'W':
        return normalize_ranges(word_class(), true);
      case 's':
        return normalize_ranges(space_class(options_.ecma));
      case 'S':
        return normalize_ranges(space_class(options_.ecma), true);
      case 't':
        return one('\t');
      case 'n':
        return one('\n');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case 'a':
        return one(7);
      case 'e':
        return one(27);
      case '0':
        return one(0);
      case 'b':
        if (in_class) return one('\b');
        error("word boundaries (\\b) are not supported");
      case 'x':
        if (peek_is('{')) {
          ++pos_;
          return one(parse_hex(0, true));
        }
        return one(parse_hex(2, false));
      case 'u':
        if (peek_is('{')) {
          ++pos_;
          return one(parse_hex(0, true));
        }
        return one(parse_hex(4, false));
      case 'c': {
        if (at_end()) error("bad control escape");
        const char letter = p_[pos_++];
        if (!((letter >= 'a' && letter <= 'z') || (letter >= 'A' && letter <= 'Z'))) {
          error("bad control escape");
        }
        return one(static_cast<uint32_t>(letter) % 32);
      }
      default:
        break;
    }
    if (c >= '1' && c <= '9') error("backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      error(std::string("unsupported escape \\") + c);
    }
    --pos_;
    const uint32_t cp = next_char();  // an escaped punctuation or other character
    return one(cp);
  }

  std::vector<CodeRange> parse_class() {
    ++pos_;  // '['
    bool negate = false;
    if (peek_is('^')) {
      ++pos_;
      negate = true;
    }
    std::vector<CodeRange> ranges;
    bool first = true;
    for (;;) {
      if (at_end()) error("missing ']'");
      if (p_[pos_] == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (p_[pos_] == '[' && pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
        error("POSIX classes ([:name:]) are not supported");
      }
      // One class item: a character (possibly starting a range) or a set.
      std::vector<CodeRange> item;
      bool single = false;
      uint32_t lo = 0;
      if (p_[pos_] == '\\') {
        ++pos_;
        if (at_end()) error("trailing backslash");
        item = parse_escape(true);
        single = item.size() == 1 && item[0].lo == item[0].hi;
        lo = item[0].lo;
      } else {
        lo = next_char();
        single = true;
        item = {{lo, lo}};
      }
      if (single && pos_ + 1 < p_.size() && p_[pos_] == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t hi;
        if (p_[pos_] == '\\') {
          ++pos_;
          if (at_end()) error("trailing backslash");
          auto end = parse_escape(true);
          if (end.size() != 1 || end[0].lo != end[0].hi) error("bad range end in class");
          hi = end[0].lo;
        } else {
          hi = next_char();
        }
        if (hi < lo) error("range out of order in class");
        item = {{lo, hi}};
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    return normalize_ranges(std::move(ranges), negate);
  }

  Grammar& g_;
  std::string_view p_;
  const RegexOptions& options_;
  size_t pos_ = 0;
};

}  // namespace

ExprId parse_regex(Grammar& grammar, std::string_view pattern, const RegexOptions& options) {
  RegexParser parser(grammar, pattern, options);
  return parser.parse();
}

}  // namespace megactx::grammar
