// The one flag the GPU benchmarks without other options take.
#pragma once

namespace megactx::cuda {

// `program [--quick]`: true with --quick; anything else prints the usage and
// exits with status 2.
bool quick_flag(int argc, char** argv, const char* program);

}  // namespace megactx::cuda
