// UTF-8 helpers for the tokenizer: validation with the "maximal subpart"
// replacement that Rust's String::from_utf8_lossy (and so HF `tokenizers`)
// uses, code point iteration, and completeness checks for streaming.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace megactx::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence starting at text[pos], or 0 when
// the bytes there are not a complete, well-formed sequence.
size_t sequence_length(std::string_view text, size_t pos);

// Length of the maximal subpart of an ill-formed sequence at text[pos] (>= 1):
// the bytes one U+FFFD replaces, as in Unicode §3.9 and from_utf8_lossy.
size_t invalid_length(std::string_view text, size_t pos);

bool is_valid(std::string_view text);

// Replaces each maximal ill-formed subpart by U+FFFD (from_utf8_lossy).
std::string sanitize(std::string_view text);

// Bytes at the end of `text` that begin a well-formed sequence but are not
// complete yet (0..3); everything before them is settled.
size_t incomplete_suffix_length(std::string_view text);

// Decodes the well-formed character at text[pos] (caller checked validity);
// stores its byte length in *length.
char32_t decode(std::string_view text, size_t pos, size_t* length);

void append(std::string& out, char32_t code_point);

// Unicode White_Space (what Rust's char::is_whitespace and regex \s match).
bool is_white_space(char32_t c);

}  // namespace megactx::utf8
