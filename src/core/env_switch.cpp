#include "core/env_switch.h"

#include <cstdlib>
#include <string_view>

#include "core/error.h"

namespace megactx {

bool env_switch(const char* variable, bool fallback) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return fallback;
  const std::string_view text(value);
  MEGACTX_CHECK(text == "0" || text == "1", "{}={}: expected 0 or 1", variable, text);
  return text == "1";
}

}  // namespace megactx
