// The fused router's A/B switch (router.h), host side: .cu files do not
// format messages.
#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "kernels/cuda/moe/router.h"

namespace megactx::cuda {

bool fused_router_enabled() {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_FUSED_ROUTER");
    if (value == nullptr || *value == '\0') return kFusedRouter;
    const std::string_view text(value);
    MEGACTX_CHECK(text == "0" || text == "1", "MEGACTX_FUSED_ROUTER={}: expected 0 or 1", text);
    return text == "1";
  }();
  return on;
}

}  // namespace megactx::cuda
