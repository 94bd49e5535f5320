#include "io/json_fields.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace megactx {

std::string json_type_name(const nlohmann::json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "number";
  return value.type_name();
}

JsonFields::JsonFields(const nlohmann::json& object, std::string where)
    : object_(object), where_(std::move(where)) {
  MEGACTX_CHECK(object_.is_object(), "{}: expected a JSON object, got {}", where_,
                json_type_name(object_));
}

std::string JsonFields::field_name(const std::string& key) const {
  return fmt::format("{}: field '{}'", where_, key);
}

const nlohmann::json* JsonFields::find(const std::string& key) const {
  auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonFields::has(const std::string& key) const {
  return find(key) != nullptr;
}

int64_t JsonFields::as_integer(const nlohmann::json& value, const std::string& what) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    MEGACTX_CHECK(v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                  "{} is too large: {}", what, v);
    return static_cast<int64_t>(v);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  // Some configs on the Hub store integers as 4096.0; accept exact integral floats.
  if (value.is_number_float()) {
    const double v = value.get<double>();
    if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9.0e15)
      return static_cast<int64_t>(v);
  }
  fail("{} must be an integer, got {} {}", what, json_type_name(value), value.dump());
}

int64_t JsonFields::integer(const std::string& key, int64_t fallback) const {
  const nlohmann::json* value = find(key);
  return value ? as_integer(*value, field_name(key)) : fallback;
}

std::optional<int64_t> JsonFields::optional_integer(const std::string& key) const {
  const nlohmann::json* value = find(key);
  if (!value) return std::nullopt;
  return as_integer(*value, field_name(key));
}

double JsonFields::number(const std::string& key, double fallback) const {
  const nlohmann::json* value = find(key);
  if (!value) return fallback;
  MEGACTX_CHECK(value->is_number(), "{} must be a number, got {}", field_name(key),
                json_type_name(*value));
  const double v = value->get<double>();
  MEGACTX_CHECK(std::isfinite(v), "{} must be finite", field_name(key));
  return v;
}

bool JsonFields::boolean(const std::string& key, bool fallback) const {
  const nlohmann::json* value = find(key);
  if (!value) return fallback;
  MEGACTX_CHECK(value->is_boolean(), "{} must be true or false, got {}", field_name(key),
                json_type_name(*value));
  return value->get<bool>();
}

std::string JsonFields::string(const std::string& key, const std::string& fallback) const {
  const nlohmann::json* value = find(key);
  if (!value) return fallback;
  MEGACTX_CHECK(value->is_string(), "{} must be a string, got {}", field_name(key),
                json_type_name(*value));
  return value->get<std::string>();
}

std::vector<int64_t> JsonFields::integer_or_list(const std::string& key) const {
  const nlohmann::json* value = find(key);
  if (!value) return {};
  if (!value->is_array()) return {as_integer(*value, field_name(key))};
  return integer_list(key);
}

std::vector<int64_t> JsonFields::integer_list(const std::string& key) const {
  const nlohmann::json* value = find(key);
  if (!value) return {};
  MEGACTX_CHECK(value->is_array(), "{} must be a list, got {}", field_name(key),
                json_type_name(*value));
  std::vector<int64_t> result;
  for (size_t i = 0; i < value->size(); ++i)
    result.push_back(as_integer((*value)[i], fmt::format("{}[{}]", field_name(key), i)));
  return result;
}

std::vector<std::string> JsonFields::string_list(const std::string& key) const {
  const nlohmann::json* value = find(key);
  if (!value) return {};
  MEGACTX_CHECK(value->is_array(), "{} must be a list, got {}", field_name(key),
                json_type_name(*value));
  std::vector<std::string> result;
  for (size_t i = 0; i < value->size(); ++i) {
    const auto& element = (*value)[i];
    MEGACTX_CHECK(element.is_string(), "{}[{}] must be a string, got {}", field_name(key), i,
                  json_type_name(element));
    result.push_back(element.get<std::string>());
  }
  return result;
}

}  // namespace megactx
