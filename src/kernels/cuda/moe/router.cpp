// The fused router's A/B switch (router.h), host side.
#include "kernels/cuda/moe/router.h"
#include "core/env_switch.h"

namespace megactx::cuda {

bool fused_router_enabled() {
  static const bool on = env_switch("MEGACTX_FUSED_ROUTER", kFusedRouter);
  return on;
}

}  // namespace megactx::cuda
