// The operands of a bf16 linear of a few rows, y [rows, out] = x [rows, in] .
// w [out, in]^T, as the decode kernels take them (bf16_gemv.h,
// bf16_skinny.h); each adds its own options.
#pragma once

#include <cstdint>

namespace megactx::cuda {

struct Bf16Product {
  const void* x = nullptr;  // bf16 [rows, x_stride]
  int64_t x_stride = 0;
  const void* w = nullptr;  // bf16 [out, in]
  void* y = nullptr;        // float32 or bf16 [rows, y_stride]
  int64_t y_stride = 0;
  bool y_f32 = true;
  int64_t rows = 0, in = 0, out = 0;
};

}  // namespace megactx::cuda
