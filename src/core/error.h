// Errors: one exception type carrying a complete, human-readable message.
// Every bad input (file, JSON, request) becomes an Error whose message names
// what was wrong; the CLI prints it as one line and exits non-zero.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace megactx {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace megactx

// MEGACTX_CHECK(condition, "format {}", args...): throws megactx::Error when false.
#define MEGACTX_CHECK(condition, ...)       \
  do {                                      \
    if (!(condition)) {                     \
      ::megactx::fail(__VA_ARGS__);         \
    }                                       \
  } while (0)
