// Typed reads of JSON object fields with errors that name the field, shared by
// the config.json parser and the safetensors index reader.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace megactx {

class JsonFields {
 public:
  // `where` prefixes every error, e.g. "config.json" or "config.json: rope_parameters".
  JsonFields(const nlohmann::json& object, std::string where);

  bool has(const std::string& key) const;                    // present and not null
  const nlohmann::json* find(const std::string& key) const;  // null when absent or null

  int64_t integer(const std::string& key, int64_t fallback) const;
  std::optional<int64_t> optional_integer(const std::string& key) const;
  double number(const std::string& key, double fallback) const;
  bool boolean(const std::string& key, bool fallback) const;
  std::string string(const std::string& key, const std::string& fallback) const;
  // An int or a list of ints (eos_token_id); empty when absent.
  std::vector<int64_t> integer_or_list(const std::string& key) const;
  std::vector<int64_t> integer_list(const std::string& key) const;
  std::vector<std::string> string_list(const std::string& key) const;

  // Element readers used for values that are not plain fields.
  static int64_t as_integer(const nlohmann::json& value, const std::string& what);

  const std::string& where() const { return where_; }

 private:
  std::string field_name(const std::string& key) const;

  const nlohmann::json& object_;
  std::string where_;
};

// "string", "number", "array", ... for error messages.
std::string json_type_name(const nlohmann::json& value);

}  // namespace megactx
