// Lexer for Jinja templates with the environment HF uses: default delimiters,
// trim_blocks and lstrip_blocks on, keep_trailing_newline off. Whitespace
// control ({%- -%} {{- -}} {#- -#}, and + to keep) is applied here, so the
// parser only sees final template data.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace megactx::jinja {

enum class TokenType {
  Data,           // literal template text
  VariableBegin,  // {{
  VariableEnd,    // }}
  BlockBegin,     // {%
  BlockEnd,       // %}
  Name,
  String,   // value holds the decoded text
  Integer,  // value holds the digits (underscores removed, base prefix kept)
  Float,
  Operator,  // value holds the operator text: + - * / // % ** ~ ( ) [ ] { } . , : | = == != < <= >
             // >=
  End,
};

struct Token {
  TokenType type;
  std::string value;
  size_t offset;  // byte offset in the normalized source, for line/column
};

// Source after jinja's newline handling (\r\n and \r become \n, one trailing
// newline dropped); offsets in tokens refer to it.
std::string normalize_template_source(const std::string& source);

// Throws megactx::Error "line L, column C: ..." on lexical errors.
std::vector<Token> tokenize(const std::string& normalized_source);

// 1-based line and column (in code points) of a byte offset.
struct SourcePosition {
  size_t line;
  size_t column;
};
SourcePosition position_of(const std::string& source, size_t offset);
[[noreturn]] void fail_at(const std::string& source, size_t offset, const std::string& message);

}  // namespace megactx::jinja
