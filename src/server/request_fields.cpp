#include "server/request_fields.h"

#include <cmath>
#include <limits>

#include "server/api_error.h"

namespace megactx::server {

bool has_field(const nlohmann::json& object, const std::string& name) {
  auto it = object.find(name);
  return it != object.end() && !it->is_null();
}

std::string string_or_empty(const nlohmann::json& object, const std::string& name) {
  if (!object.is_object()) return {};
  auto it = object.find(name);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::optional<double> get_number(const nlohmann::json& object, const std::string& name) {
  if (!has_field(object, name)) return std::nullopt;
  const auto& value = object.at(name);
  if (!value.is_number()) throw_invalid(name, "'" + name + "' must be a number");
  double number = value.get<double>();
  if (!std::isfinite(number)) throw_invalid(name, "'" + name + "' must be finite");
  return number;
}

std::optional<int64_t> get_integer(const nlohmann::json& object, const std::string& name) {
  if (!has_field(object, name)) return std::nullopt;
  const auto& value = object.at(name);
  // Unsigned values past int64 (e.g. a seed of 2^63) would wrap to negative.
  if (value.is_number_unsigned() &&
      value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw_invalid(name,
                  "'" + name + "' is out of range: " + value.dump() + " is larger than 2^63 - 1");
  if (value.is_number_integer()) return value.get<int64_t>();
  // 16.0 is accepted as 16, as Python clients sometimes send floats.
  if (value.is_number_float()) {
    double number = value.get<double>();
    if (std::isfinite(number) && std::floor(number) == number && std::fabs(number) < 9e15)
      return static_cast<int64_t>(number);
  }
  throw_invalid(name, "'" + name + "' must be an integer");
}

std::optional<bool> get_bool(const nlohmann::json& object, const std::string& name) {
  if (!has_field(object, name)) return std::nullopt;
  const auto& value = object.at(name);
  if (!value.is_boolean()) throw_invalid(name, "'" + name + "' must be a boolean");
  return value.get<bool>();
}

std::optional<std::string> get_string(const nlohmann::json& object, const std::string& name) {
  if (!has_field(object, name)) return std::nullopt;
  const auto& value = object.at(name);
  if (!value.is_string()) throw_invalid(name, "'" + name + "' must be a string");
  return value.get<std::string>();
}

std::vector<std::string> get_string_or_list(const nlohmann::json& object, const std::string& name) {
  std::vector<std::string> out;
  if (!has_field(object, name)) return out;
  const auto& value = object.at(name);
  if (value.is_string()) {
    out.push_back(value.get<std::string>());
    return out;
  }
  if (!value.is_array())
    throw_invalid(name, "'" + name + "' must be a string or a list of strings");
  for (const auto& item : value) {
    if (!item.is_string()) throw_invalid(name, "'" + name + "' must contain only strings");
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::vector<int32_t> get_token_list(const nlohmann::json& value, const std::string& name) {
  if (!value.is_array()) throw_invalid(name, "'" + name + "' must be a list of token ids");
  std::vector<int32_t> out;
  out.reserve(value.size());
  for (const auto& item : value) {
    if (!item.is_number_integer())
      throw_invalid(name, "'" + name + "' must contain only integer token ids");
    int64_t id = item.get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw_invalid(name, "token id " + std::to_string(id) + " in '" + name + "' is out of range");
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

void check_range(const std::string& name, double value, double low, double high) {
  if (value < low || value > high) {
    nlohmann::json low_json = low, high_json = high;
    throw_invalid(name, "'" + name + "' must be in [" + low_json.dump() + ", " + high_json.dump() +
                            "], got " + nlohmann::json(value).dump());
  }
}

namespace {

std::string percent_decode(const std::string& text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 &&
               hex(text[i + 2]) >= 0) {
      out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];  // a stray '%' stays as written
    }
  }
  return out;
}

}  // namespace

std::map<std::string, std::string> query_fields(const std::string& target) {
  std::map<std::string, std::string> fields;
  const size_t at = target.find('?');
  if (at == std::string::npos) return fields;
  size_t start = at + 1;
  while (start < target.size()) {
    size_t end = target.find('&', start);
    if (end == std::string::npos) end = target.size();
    const std::string pair = target.substr(start, end - start);
    const size_t equals = pair.find('=');
    if (!pair.empty())
      fields[percent_decode(pair.substr(0, equals))] =
          equals == std::string::npos ? "" : percent_decode(pair.substr(equals + 1));
    start = end + 1;
  }
  return fields;
}

}  // namespace megactx::server
