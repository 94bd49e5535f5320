// JSON <-> text for the wire. Model output may hold invalid UTF-8 (a token
// that is half a character); dumping replaces it with U+FFFD instead of
// throwing as nlohmann does by default.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace megactx::server {

std::string dump_json(const nlohmann::json& value);
// Parses a request body; throws ApiError 400 with the parser's message.
nlohmann::json parse_request_json(std::string_view body);
// Replaces invalid UTF-8 sequences by U+FFFD (for strings that go into JSON).
std::string sanitize_utf8(std::string_view text);

}  // namespace megactx::server
