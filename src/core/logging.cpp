#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

namespace megactx {

void setup_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("megactx");
  logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace megactx
