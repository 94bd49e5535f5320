// The PDL switch of launch.h (host side).
#include <cstdlib>

#include "kernels/cuda/common/launch.h"

namespace megactx::cuda {

bool programmatic_launch() {
  static const bool on = [] {
    const char* value = std::getenv("MEGACTX_PDL");
    if (value == nullptr || *value == '\0') return kProgrammaticLaunch;
    return value[0] != '0';
  }();
  return on;
}

}  // namespace megactx::cuda
