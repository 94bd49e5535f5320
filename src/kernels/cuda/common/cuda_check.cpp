#include "kernels/cuda/common/cuda_check.h"

#include "core/error.h"

namespace megactx::cuda {
void throw_cuda_error(int status, const char* status_text, const char* file, int line) {
  fail("CUDA error {} at {}:{}: {}", status, file, line, status_text);
}
}  // namespace megactx::cuda
