// UTF-8 helpers for the Jinja interpreter. Python strings are sequences of code
// points, so len(), indexing, slicing and reversing must work on code points
// while megactx keeps strings as UTF-8 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace megactx::jinja {

// Decodes one code point at `pos` and advances `pos`; invalid bytes decode as
// themselves (one byte each) so that no input can make the interpreter fail.
char32_t utf8_next(std::string_view text, size_t& pos);
void utf8_append(std::string& out, char32_t cp);

std::vector<char32_t> utf8_decode(std::string_view text);
std::string utf8_encode(const std::vector<char32_t>& cps);
size_t utf8_length(std::string_view text);
bool is_ascii(std::string_view text);

// Python's str.isspace() on one code point (also what `\s` matches in re).
bool is_py_space(char32_t cp);
// Python's str.strip()/lstrip()/rstrip() without arguments.
std::string py_strip(std::string_view text, bool left, bool right);
// str.strip(chars): strips any code point contained in `chars`.
std::string py_strip_chars(std::string_view text, std::string_view chars, bool left, bool right);

// Case mapping for ASCII, Latin-1, Greek and Cyrillic (what chat templates meet).
char32_t to_lower(char32_t cp);
char32_t to_upper(char32_t cp);
bool is_alpha(char32_t cp);
std::string py_lower(std::string_view text);
std::string py_upper(std::string_view text);
std::string py_title(std::string_view text);
std::string py_capitalize(std::string_view text);

}  // namespace megactx::jinja
