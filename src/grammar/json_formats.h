// Regexes (full match over the decoded string) for the JSON Schema string
// formats structured outputs support: date, time, date-time (RFC 3339, real
// month lengths and leap years), email
// (dot-atom local part), hostname (RFC 1123 labels), ipv4, ipv6 (RFC 4291
// text forms), uuid, uri (scheme ':' and URI characters; an approximation of
// RFC 3986 that accepts no character a URI cannot hold).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace megactx::grammar {

// nullopt for a format outside that list.
std::optional<std::string> format_regex(std::string_view format);

}  // namespace megactx::grammar
