// Typed access to request JSON fields. Every mismatch is an ApiError 400
// naming the field ("'temperature' must be a number"), never a JSON exception.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace megactx::server {

// A field that is absent or null reads as "not given".
bool has_field(const nlohmann::json& object, const std::string& name);
// The string value of `name`, or "" when it is absent or not a string (for
// shape checks; nlohmann's value(name, "") throws on a value of another type).
std::string string_or_empty(const nlohmann::json& object, const std::string& name);

std::optional<double> get_number(const nlohmann::json& object, const std::string& name);
std::optional<int64_t> get_integer(const nlohmann::json& object, const std::string& name);
std::optional<bool> get_bool(const nlohmann::json& object, const std::string& name);
std::optional<std::string> get_string(const nlohmann::json& object, const std::string& name);
// A string or a list of strings (OpenAI's `stop`).
std::vector<std::string> get_string_or_list(const nlohmann::json& object, const std::string& name);
// A list of integers that fit int32 (token ids).
std::vector<int32_t> get_token_list(const nlohmann::json& value, const std::string& name);

// key=value pairs of a request target's query string, percent-decoded ('+'
// is a space); a key without '=' maps to "", a repeated key keeps its last value.
std::map<std::string, std::string> query_fields(const std::string& target);

// Range checks that throw ApiError 400 naming the field.
void check_range(const std::string& name, double value, double low, double high);

}  // namespace megactx::server
