// A/B switches read from the environment: "0" or "1" (unset or empty: the
// built-in default); any other value is an error naming the variable, so a
// mistyped A/B run does not silently measure the default.
#pragma once

namespace megactx {

bool env_switch(const char* variable, bool fallback);

}  // namespace megactx
