// JSON parsing with the nesting depth bounded while parsing. nlohmann's parser
// is iterative, but everything after it (copies, comparisons, dumps, the chat
// template's value conversion) recurses once per level, so a 23 KB body of
// 12,000 nested brackets overflows the stack after a successful parse. Every
// parse of text the process did not write itself (request bodies, tool-call
// arguments, model output, files) goes through here, so no value deeper than
// kMaxJsonDepth ever exists.
#pragma once

#include <nlohmann/json.hpp>

#include <string_view>

namespace megactx {

// Containers inside containers, counted from the outermost (1 = a flat object).
inline constexpr int kMaxJsonDepth = 512;

// Parses `text`; throws megactx::Error naming the limit when the nesting is
// deeper than `max_depth`, and nlohmann's parse_error on malformed JSON.
nlohmann::json parse_json(std::string_view text, int max_depth = kMaxJsonDepth);
nlohmann::ordered_json parse_ordered_json(std::string_view text, int max_depth = kMaxJsonDepth);

// The same without exceptions: a discarded value (is_discarded()) when the
// text is malformed or nested too deeply.
nlohmann::json try_parse_json(std::string_view text, int max_depth = kMaxJsonDepth);
nlohmann::ordered_json try_parse_ordered_json(std::string_view text, int max_depth = kMaxJsonDepth);

}  // namespace megactx
