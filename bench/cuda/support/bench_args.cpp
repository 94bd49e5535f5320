#include "bench/cuda/support/bench_args.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace megactx::cuda {

bool quick_flag(int argc, char** argv, const char* program) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") != 0) {
      std::fprintf(stderr, "usage: %s [--quick]\n", program);
      std::exit(2);
    }
    quick = true;
  }
  return quick;
}

}  // namespace megactx::cuda
