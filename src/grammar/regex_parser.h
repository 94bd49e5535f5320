// Regular expressions (the common PCRE / ECMAScript subset that vLLM, SGLang
// and JSON Schema `pattern` use) lowered to a grammar expression: literals,
// escapes (\d \w \s and negations, \t \n \r \f \v \0 \xHH \x{...} \uHHHH
// \u{...}), classes with ranges and negation, `.`, groups ((...), (?:...),
// (?<name>...)), alternation, quantifiers * + ? {n} {n,} {n,m} (lazy forms
// match the same strings). Constructs with no regular meaning over whole
// strings (backreferences, lookaround, \b, possessive quantifiers, inline
// flags) are errors naming the construct.
#pragma once

#include <functional>
#include <string_view>
#include <vector>

#include "grammar/grammar_ir.h"

namespace megactx::grammar {

// Lowers one character class to bytes: UTF-8 by default, JSON string content
// (with escapes) for schema patterns.
using CharEncoder = std::function<ExprId(Grammar&, const std::vector<CodeRange>&)>;

struct RegexOptions {
  // ECMAScript classes (JSON Schema): `.` also excludes \r, U+2028, U+2029 and
  // \s includes the Unicode spaces. Otherwise PCRE: `.` excludes only \n and
  // \s is [\t\n\v\f\r ].
  bool ecma = false;
  // Search semantics (JSON Schema `pattern`): a side not anchored by ^ / $
  // may be preceded / followed by anything. Otherwise the whole string must
  // match and ^ / $ at the ends are no-ops.
  bool search = false;
  CharEncoder encode;  // empty: UTF-8
};

// Throws megactx::Error naming the problem and its offset.
ExprId parse_regex(Grammar& grammar, std::string_view pattern, const RegexOptions& options = {});

}  // namespace megactx::grammar
