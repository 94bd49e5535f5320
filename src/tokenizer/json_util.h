// Checked access to tokenizer.json / config fields: a missing or mistyped
// field becomes a megactx::Error that names it, never a nlohmann exception.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "core/error.h"

namespace megactx {

inline const nlohmann::json& json_field(const nlohmann::json& object, const char* key,
                                        const char* context) {
  if (!object.is_object()) fail("tokenizer.json: {} is not an object", context);
  auto it = object.find(key);
  if (it == object.end()) fail("tokenizer.json: {} has no '{}'", context, key);
  return *it;
}

inline std::string json_string(const nlohmann::json& object, const char* key, const char* context) {
  const auto& value = json_field(object, key, context);
  if (!value.is_string()) fail("tokenizer.json: '{}' of {} is not a string", key, context);
  return value.get<std::string>();
}

inline const nlohmann::json& json_array(const nlohmann::json& object, const char* key,
                                        const char* context) {
  const auto& value = json_field(object, key, context);
  if (!value.is_array()) fail("tokenizer.json: '{}' of {} is not an array", key, context);
  return value;
}

inline const nlohmann::json& json_object(const nlohmann::json& object, const char* key,
                                         const char* context) {
  const auto& value = json_field(object, key, context);
  if (!value.is_object()) fail("tokenizer.json: '{}' of {} is not an object", key, context);
  return value;
}

// Optional boolean: absent or null gives the default.
inline bool json_bool(const nlohmann::json& object, const char* key, bool fallback) {
  if (!object.is_object()) return fallback;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail("tokenizer.json: '{}' is not a boolean", key);
  return it->get<bool>();
}

}  // namespace megactx
