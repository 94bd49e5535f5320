// Logging goes through spdlog to stderr; stdout is reserved for command output
// (ids, JSON, rendered prompts) so that scripts can consume it.
#pragma once

#include <spdlog/spdlog.h>

namespace megactx {

// Sends the default logger to stderr at `level` ("info", "debug", "warn", ...).
void setup_logging(const std::string& level);

}  // namespace megactx
