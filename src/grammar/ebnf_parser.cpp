#include "grammar/ebnf_parser.h"

#include <string>
#include <vector>

#include "core/error.h"

namespace megactx::grammar {

namespace {

constexpr int kMaxNesting = 200;
constexpr int64_t kMaxRepeat = 100'000;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class EbnfParser {
 public:
  EbnfParser(Grammar& grammar, std::string_view text, const TokenResolver& resolve)
      : g_(grammar), s_(text), resolve_(resolve) {}

  void parse(std::string_view root_rule) {
    skip_space(true);
    while (!at_end()) {
      const size_t name_at = pos_;
      const std::string name = parse_name();
      skip_space(false);
      if (s_.substr(pos_, 3) != "::=") error("expected '::=' after the rule name");
      pos_ += 3;
      skip_space(true);
      const int32_t rule = rule_id(name);
      if (g_.rules()[rule].body >= 0) {
        pos_ = name_at;
        error("rule '" + name + "' is defined twice");
      }
      defined_.push_back(rule);
      g_.set_body(rule, parse_alternatives(0));
      skip_space(true);
    }
    for (size_t i = 0; i < g_.rules().size(); ++i) {
      if (g_.rules()[i].body < 0) {
        pos_ = first_use_[i];
        error("rule '" + g_.rules()[i].name + "' is used but never defined");
      }
    }
    const int32_t root = g_.find_rule(root_rule);
    if (root < 0) fail("grammar has no rule named '{}' (the root)", root_rule);
    g_.root = root;
  }

 private:
  [[noreturn]] void error(const std::string& message) const {
    size_t line = 1;
    size_t column = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    fail("grammar: {} at line {} column {}", message, line, column);
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  // Spaces, tabs, comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  // At a newline outside parentheses: does a new rule (or the end) follow?
  bool rule_ends_here() {
    const size_t save = pos_;
    skip_space(true);
    bool ends = at_end();
    if (!ends) {
      size_t p = pos_;
      while (p < s_.size() && is_name_char(s_[p])) ++p;
      if (p > pos_) {
        while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
        ends = s_.substr(p, 3) == "::=";
      }
    }
    pos_ = save;
    return ends;
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(s_[pos_])) ++pos_;
    if (pos_ == start) error("expected a rule name");
    return std::string(s_.substr(start, pos_ - start));
  }

  int32_t rule_id(const std::string& name) {
    int32_t id = g_.find_rule(name);
    if (id < 0) {
      id = g_.add_rule(name);
      first_use_.resize(id + 1, pos_);
    }
    return id;
  }

  ExprId parse_alternatives(int depth) {
    if (depth > kMaxNesting) error("groups nested too deeply");
    std::vector<ExprId> options = {parse_sequence(depth)};
    while (peek() == '|') {
      ++pos_;
      skip_space(true);
      options.push_back(parse_sequence(depth));
    }
    return g_.alt(std::move(options));
  }

  ExprId parse_sequence(int depth) {
    std::vector<ExprId> items;
    for (;;) {
      skip_space(depth > 0);
      if (peek() == '\n') {
        if (rule_ends_here()) break;
        skip_space(true);
      }
      const char c = peek();
      if (at_end() || c == '|' || c == ')') break;
      items.push_back(parse_repetition(parse_item(depth), depth));
    }
    return g_.seq(std::move(items));
  }

  ExprId parse_item(int depth) {
    const char c = peek();
    if (c == '"') return parse_literal();
    if (c == '[') return g_.code_points(parse_class());
    if (c == '.') {
      ++pos_;
      return g_.code_points({{0, 0x10FFFF}});
    }
    if (c == '(') {
      ++pos_;
      skip_space(true);
      const ExprId inner = parse_alternatives(depth + 1);
      skip_space(true);
      if (peek() != ')') error("expected ')'");
      ++pos_;
      return inner;
    }
    if (c == '<' || (c == '!' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '<')) {
      return parse_token();
    }
    if (is_name_char(c)) {
      const std::string name = parse_name();
      return g_.rule_ref(rule_id(name));
    }
    error(std::string("unexpected character '") + c + "'");
  }

  ExprId parse_token() {
    const bool negate = peek() == '!';
    if (negate) ++pos_;
    const size_t start = pos_;  // at '<'
    int32_t id;
    if (pos_ + 1 < s_.size() && s_[pos_ + 1] == '[') {
      pos_ += 2;
      int64_t value = 0;
      const size_t digits = pos_;
      while (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        value = value * 10 + (s_[pos_] - '0');
        if (value > INT32_MAX) error("token id too large");
        ++pos_;
      }
      if (pos_ == digits || s_.substr(pos_, 2) != "]>") error("expected <[token id]>");
      pos_ += 2;
      id = static_cast<int32_t>(value);
    } else {
      const size_t close = s_.find('>', pos_ + 1);
      if (close == std::string_view::npos) error("unterminated token reference <...>");
      const std::string_view text = s_.substr(start, close - start + 1);
      pos_ = close + 1;
      std::optional<int32_t> found = resolve_ ? resolve_(text) : std::nullopt;
      if (!found) {
        pos_ = start;
        error("no single token in the vocabulary is " + std::string(text));
      }
      id = *found;
    }
    return negate ? g_.any_token_except({id}) : g_.token({id});
  }

  ExprId parse_repetition(ExprId item, int depth) {
    for (;;) {
      const char c = peek();
      if (c == '*') {
        ++pos_;
        item = g_.star(item);
      } else if (c == '+') {
        ++pos_;
        item = g_.plus(item);
      } else if (c == '?') {
        ++pos_;
        item = g_.optional(item);
      } else if (c == '{') {
        ++pos_;
        skip_space(false);
        int64_t min = 0;
        int64_t max = -1;
        const bool has_min = peek() >= '0' && peek() <= '9';
        if (has_min) min = parse_count();
        skip_space(false);
        if (peek() == ',') {
          ++pos_;
          skip_space(false);
          if (peek() >= '0' && peek() <= '9') max = parse_count();
        } else {
          if (!has_min) error("expected a count in {}");
          max = min;
        }
        skip_space(false);
        if (peek() != '}') error("expected '}'");
        ++pos_;
        if (max != -1 && max < min) error("repetition {m,n} with n < m");
        item = g_.repeat(item, static_cast<int32_t>(min), static_cast<int32_t>(max));
      } else {
        return item;
      }
    }
  }

  int64_t parse_count() {
    int64_t value = 0;
    while (peek() >= '0' && peek() <= '9') {
      value = value * 10 + (peek() - '0');
      if (value > kMaxRepeat) error("repetition count too large");
      ++pos_;
    }
    return value;
  }

  uint32_t parse_hex(int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      int v;
      if (h >= '0' && h <= '9') {
        v = h - '0';
      } else if (h >= 'a' && h <= 'f') {
        v = h - 'a' + 10;
      } else if (h >= 'A' && h <= 'F') {
        v = h - 'A' + 10;
      } else {
        error("bad hex escape");
      }
      value = value * 16 + v;
      ++pos_;
    }
    if (value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) error("bad code point");
    return value;
  }

  // One character of a literal or class, escapes resolved.
  uint32_t parse_char() {
    if (at_end()) error("unterminated literal or class");
    if (s_[pos_] == '\\') {
      ++pos_;
      if (at_end()) error("trailing backslash");
      const char c = s_[pos_++];
      switch (c) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case 'x':
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<uint8_t>(c);
        default:
          --pos_;
          error(std::string("unknown escape \\") + c);
      }
    }
    const auto b0 = static_cast<uint8_t>(s_[pos_]);
    int length = b0 < 0x80 ? 1 : b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : b0 >= 0xC2 ? 2 : 0;
    if (length == 0 || pos_ + length > s_.size()) error("invalid UTF-8");
    uint32_t cp = length == 1 ? b0 : b0 & (0xFF >> (length + 1));
    for (int i = 1; i < length; ++i) {
      const auto b = static_cast<uint8_t>(s_[pos_ + i]);
      if ((b & 0xC0) != 0x80) error("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += length;
    return cp;
  }

  ExprId parse_literal() {
    ++pos_;  // '"'
    std::string bytes;
    while (peek() != '"') {
      if (at_end() || peek() == '\n') error("unterminated string literal");
      append_utf8(parse_char(), bytes);
    }
    ++pos_;
    return g_.literal(bytes);
  }

  std::vector<CodeRange> parse_class() {
    ++pos_;  // '['
    bool negate = false;
    if (peek() == '^') {
      ++pos_;
      negate = true;
    }
    std::vector<CodeRange> ranges;
    while (peek() != ']') {
      if (at_end() || peek() == '\n') error("unterminated character class");
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error("range out of order in character class");
      }
      ranges.push_back({lo, hi});
    }
    ++pos_;
    return normalize_ranges(std::move(ranges), negate);
  }

  Grammar& g_;
  std::string_view s_;
  const TokenResolver& resolve_;
  size_t pos_ = 0;
  std::vector<int32_t> defined_;
  std::vector<size_t> first_use_;
};

}  // namespace

void parse_ebnf(Grammar& grammar, std::string_view text, std::string_view root_rule,
                const TokenResolver& resolve_token) {
  EbnfParser parser(grammar, text, resolve_token);
  parser.parse(root_rule);
}

}  // namespace megactx::grammar
