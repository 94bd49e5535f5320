#include "chat/jinja/lexer.h"

#include <cstring>

#include "chat/jinja/utf8.h"
#include "core/error.h"

namespace megactx::jinja {

std::string normalize_template_source(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

SourcePosition position_of(const std::string& source, size_t offset) {
  SourcePosition position{1, 1};
  size_t pos = 0;
  offset = std::min(offset, source.size());
  while (pos < offset) {
    char32_t cp = utf8_next(source, pos);
    if (cp == '\n') {
      ++position.line;
      position.column = 1;
    } else {
      ++position.column;
    }
  }
  return position;
}

void fail_at(const std::string& source, size_t offset, const std::string& message) {
  SourcePosition p = position_of(source, offset);
  fail("line {}, column {}: {}", p.line, p.column, message);
}

namespace {

bool starts_with(const std::string& s, size_t pos, const char* prefix) {
  return s.compare(pos, std::strlen(prefix), prefix) == 0;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// Length of the run of Python whitespace starting at pos.
size_t whitespace_run(const std::string& s, size_t pos) {
  size_t end = pos;
  while (end < s.size()) {
    size_t next = end;
    if (!is_py_space(utf8_next(s, next))) break;
    end = next;
  }
  return end - pos;
}

bool all_whitespace(const std::string& s, size_t begin, size_t end) {
  size_t pos = begin;
  while (pos < end) {
    if (!is_py_space(utf8_next(s, pos))) return false;
  }
  return true;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(source) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) lex_root();
    tokens_.push_back({TokenType::End, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  enum class Tag { Variable, Block, Comment };

  [[noreturn]] void error(size_t offset, const std::string& message) {
    fail_at(src_, offset, message);
  }

  // Finds the next tag opening at or after pos_; returns npos when none.
  size_t next_tag(size_t from) const {
    size_t pos = src_.find('{', from);
    while (pos != std::string::npos && pos + 1 < src_.size()) {
      char c = src_[pos + 1];
      if (c == '{' || c == '%' || c == '#') return pos;
      pos = src_.find('{', pos + 1);
    }
    return std::string::npos;
  }

  // Whitespace control of the text before a tag whose sign is `sign`.
  void emit_data(size_t begin, size_t end, char sign, bool lstrip_applies) {
    if (end <= begin) return;
    if (sign == '-') {
      while (end > begin) {
        // strip trailing Python whitespace (multi-byte aware)
        size_t probe = end - 1;
        while (probe > begin && (static_cast<unsigned char>(src_[probe]) & 0xC0) == 0x80) --probe;
        size_t next = probe;
        if (!is_py_space(utf8_next(src_, next))) break;
        end = probe;
      }
    } else if (sign != '+' && lstrip_applies) {
      size_t newline = src_.rfind('\n', end == 0 ? std::string::npos : end - 1);
      size_t line_start = (newline == std::string::npos || newline < begin) ? begin : newline + 1;
      if ((line_start > begin || line_starting_) && line_start < end &&
          all_whitespace(src_, line_start, end))
        end = line_start;
    }
    if (end > begin) tokens_.push_back({TokenType::Data, src_.substr(begin, end - begin), begin});
  }

  void lex_root() {
    size_t start = next_tag(pos_);
    if (start == std::string::npos) {
      tokens_.push_back({TokenType::Data, src_.substr(pos_), pos_});
      pos_ = src_.size();
      return;
    }
    char kind = src_[start + 1];
    size_t after = start + 2;
    char sign =
        (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) ? src_[after] : 0;
    if (kind == '%' && lex_raw(start, sign)) return;
    emit_data(pos_, start, sign, kind != '{');
    pos_ = after + (sign ? 1 : 0);
    if (kind == '#') {
      lex_comment(start);
    } else {
      lex_tag(kind == '{' ? Tag::Variable : Tag::Block, start);
    }
  }

  // {% raw %}...{% endraw %}: the body is data, untouched.
  bool lex_raw(size_t start, char sign) {
    size_t p = start + 2 + (sign ? 1 : 0);
    p += whitespace_run(src_, p);
    if (!starts_with(src_, p, "raw")) return false;
    p += 3;
    p += whitespace_run(src_, p);
    bool strip_after = false;
    if (starts_with(src_, p, "-%}")) {
      strip_after = true;
      p += 3;
    } else if (starts_with(src_, p, "%}")) {
      p += 2;
    } else {
      return false;
    }
    emit_data(pos_, start, sign, true);
    if (strip_after) p += whitespace_run(src_, p);
    line_starting_ = p > 0 && src_[p - 1] == '\n';
    // Find "{%[-+]? endraw [-+]?%}".
    size_t search = p;
    while (true) {
      size_t open = src_.find("{%", search);
      if (open == std::string::npos) error(start, "Missing end of raw directive");
      size_t q = open + 2;
      char end_sign = (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ? src_[q] : 0;
      if (end_sign) ++q;
      q += whitespace_run(src_, q);
      if (!starts_with(src_, q, "endraw")) {
        search = open + 2;
        continue;
      }
      q += 6;
      q += whitespace_run(src_, q);
      size_t close = q;
      if (starts_with(src_, q, "+%}")) {
        q += 3;
      } else if (starts_with(src_, q, "-%}")) {
        q += 3;
        q += whitespace_run(src_, q);
      } else if (starts_with(src_, q, "%}")) {
        q += 2;
        if (q < src_.size() && src_[q] == '\n') ++q;
      } else {
        search = open + 2;
        continue;
      }
      (void)close;
      pos_ = p;
      emit_data(p, open, end_sign, true);
      pos_ = q;
      line_starting_ = q > 0 && src_[q - 1] == '\n';
      return true;
    }
  }

  void lex_comment(size_t start) {
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) error(start, "Missing end of comment tag");
    size_t p = end + 2;
    if (end > pos_ && src_[end - 1] == '-') {
      p += whitespace_run(src_, p);
    } else if (end > pos_ && src_[end - 1] == '+') {
      // keep what follows
    } else if (p < src_.size() && src_[p] == '\n') {
      ++p;  // trim_blocks
    }
    pos_ = p;
    line_starting_ = src_[p - 1] == '\n';
  }

  void lex_tag(Tag tag, size_t start) {
    tokens_.push_back(
        {tag == Tag::Variable ? TokenType::VariableBegin : TokenType::BlockBegin, "", start});
    std::vector<char> balance;
    while (true) {
      if (pos_ >= src_.size())
        error(start, tag == Tag::Variable ? "unexpected end of template, expected '}}'"
                                          : "unexpected end of template, expected '%}'");
      if (balance.empty() && lex_tag_end(tag)) return;
      char c = src_[pos_];
      size_t ws = whitespace_run(src_, pos_);
      if (ws) {
        pos_ += ws;
        continue;
      }
      if (is_digit(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        size_t b = pos_;
        while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
        tokens_.push_back({TokenType::Name, src_.substr(b, pos_ - b), b});
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else {
        lex_operator(balance);
      }
    }
  }

  bool lex_tag_end(Tag tag) {
    size_t p = pos_;
    if (tag == Tag::Block) {
      if (starts_with(src_, p, "+%}")) {
        p += 3;
      } else if (starts_with(src_, p, "-%}")) {
        p += 3;
        p += whitespace_run(src_, p);
      } else if (starts_with(src_, p, "%}")) {
        p += 2;
        if (p < src_.size() && src_[p] == '\n') ++p;  // trim_blocks
      } else {
        return false;
      }
      tokens_.push_back({TokenType::BlockEnd, "", pos_});
    } else {
      if (starts_with(src_, p, "-}}")) {
        p += 3;
        p += whitespace_run(src_, p);
      } else if (starts_with(src_, p, "}}")) {
        p += 2;
      } else {
        return false;
      }
      tokens_.push_back({TokenType::VariableEnd, "", pos_});
    }
    pos_ = p;
    line_starting_ = src_[p - 1] == '\n';
    return true;
  }

  void lex_number() {
    size_t b = pos_;
    auto digits = [&](auto accept) {
      // digits with single underscores between them, as Python literals allow
      size_t p = pos_;
      if (p >= src_.size() || !accept(src_[p])) return false;
      while (p < src_.size()) {
        if (accept(src_[p])) {
          ++p;
        } else if (src_[p] == '_' && p + 1 < src_.size() && accept(src_[p + 1])) {
          p += 2;
        } else {
          break;
        }
      }
      pos_ = p;
      return true;
    };
    auto dec = [](char ch) { return is_digit(ch); };
    char c1 = pos_ + 1 < src_.size() ? static_cast<char>(src_[pos_ + 1] | 0x20) : 0;
    if (src_[pos_] == '0' && (c1 == 'x' || c1 == 'o' || c1 == 'b')) {
      pos_ += 2;
      if (pos_ < src_.size() && src_[pos_] == '_') ++pos_;
      bool ok =
          c1 == 'x'
              ? digits([](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) != 0; })
          : c1 == 'o' ? digits([](char ch) { return ch >= '0' && ch <= '7'; })
                      : digits([](char ch) { return ch == '0' || ch == '1'; });
      if (!ok) error(b, "invalid integer literal");
      tokens_.push_back({TokenType::Integer, strip_underscores(b), b});
      return;
    }
    digits(dec);
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      ++pos_;
      digits(dec);
      is_float = true;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t save = pos_;
      ++pos_;
      if (pos_ < src_.size() && (src_[pos_] == '+' || src_[pos_] == '-')) ++pos_;
      if (digits(dec)) {
        is_float = true;
      } else {
        pos_ = save;
      }
    }
    tokens_.push_back({is_float ? TokenType::Float : TokenType::Integer, strip_underscores(b), b});
  }

  std::string strip_underscores(size_t b) const {
    std::string out;
    for (size_t i = b; i < pos_; ++i)
      if (src_[i] != '_') out.push_back(src_[i]);
    return out;
  }

  void lex_string() {
    size_t b = pos_;
    char quote = src_[pos_++];
    std::string out;
    while (true) {
      if (pos_ >= src_.size())
        error(b, "unexpected char " + std::string(1, quote) + " (unterminated string)");
      char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= src_.size()) error(b, "unterminated string");
      char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case '\n':
          break;  // line continuation
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
          append_code(out, 2, b);
          break;
        case 'u':
          append_code(out, 4, b);
          break;
        case 'U':
          append_code(out, 8, b);
          break;
        default:
          if (e >= '0' && e <= '7') {
            unsigned value = e - '0';
            for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7';
                 ++i)
              value = value * 8 + (src_[pos_++] - '0');
            utf8_append(out, value);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    tokens_.push_back({TokenType::String, std::move(out), b});
  }

  void append_code(std::string& out, int width, size_t b) {
    if (pos_ + width > src_.size()) error(b, "truncated \\x/\\u escape in string");
    char32_t value = 0;
    for (int i = 0; i < width; ++i) {
      char c = src_[pos_ + i];
      if (!std::isxdigit(static_cast<unsigned char>(c)))
        error(b, "truncated \\x/\\u escape in string");
      value = value * 16 + (is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    if (value > 0x10FFFF) error(b, "illegal Unicode character in string");
    pos_ += width;
    utf8_append(out, value);
  }

  void lex_operator(std::vector<char>& balance) {
    static const char* const kTwo[] = {"**", "//", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (starts_with(src_, pos_, op)) {
        tokens_.push_back({TokenType::Operator, op, pos_});
        pos_ += 2;
        return;
      }
    }
    char c = src_[pos_];
    if (!std::strchr("+-/*%~[](){}><=.:|,;", c) || c == 0) {
      size_t next = pos_;
      char32_t cp = utf8_next(src_, next);
      std::string shown;
      utf8_append(shown, cp);
      error(pos_, "unexpected char '" + shown + "'");
    }
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) error(pos_, std::string("unexpected '") + c + "'");
      if (balance.back() != c)
        error(pos_, std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
      balance.pop_back();
    }
    tokens_.push_back({TokenType::Operator, std::string(1, c), pos_});
    ++pos_;
  }

  const std::string& src_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(const std::string& normalized_source) {
  return Lexer(normalized_source).run();
}

}  // namespace megactx::jinja
