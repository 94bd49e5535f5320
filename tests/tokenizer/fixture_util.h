// Shared helpers for the tokenizer tests: fixture paths and JSON loading.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>
#include <string>

namespace megactx::testing {

inline std::string fixture_dir(const std::string& variant) {
  return std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/tokenizer/" + variant;
}

inline std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

inline nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_file(path));
}

}  // namespace megactx::testing
