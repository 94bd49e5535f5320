// GBNF (llama.cpp's grammar format) to the grammar IR:
//
//   root   ::= "{" ws pair ("," ws pair)* "}"   # comment
//   pair   ::= [a-z]+ ws ":" ws ( [0-9]+ | "\"" [^"]* "\"" )
//   ws     ::= [ \t\n]{0,20}
//
// Literals "..." (escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH),
// classes [...] with ranges and ^, `.` (any character), grouping, | , the
// repetitions * + ? {m} {m,} {m,n} {,n}, and whole tokens: <[id]> by id,
// <text> for the token whose bytes are exactly "<text>", and !<...> for any
// one token but that one. A rule continues across lines until the next
// `name ::=` (llama.cpp requires continuation lines to sit inside
// parentheses; both forms parse).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>

#include "grammar/grammar_ir.h"

namespace megactx::grammar {

// Maps the text of a <...> token reference to its id.
using TokenResolver = std::function<std::optional<int32_t>(std::string_view)>;

// Parses `text` into `grammar` and sets its root to the rule `root_rule`.
// Throws megactx::Error naming the problem, its line and column.
void parse_ebnf(Grammar& grammar, std::string_view text, std::string_view root_rule,
                const TokenResolver& resolve_token);

}  // namespace megactx::grammar
