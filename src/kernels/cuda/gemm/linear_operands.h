// The shape and operands of one product y [rows, out] = x [rows, in] .
// w [out, in]^T, which every product struct (InvariantGemm, Bf16Gemv,
// Bf16Skinny, Bf16LtGemm) names alike; callers set the fields they differ in
// (element types, y_f32, split, ...).
#pragma once

#include <cstdint>

namespace megactx::cuda {

template <typename Product>
Product linear_operands(const void* x, int64_t x_stride, const void* w, void* y, int64_t y_stride,
                        int64_t rows, int64_t in, int64_t out) {
  Product g;
  g.x = x;
  g.x_stride = x_stride;
  g.w = w;
  g.y = y;
  g.y_stride = y_stride;
  g.rows = rows;
  g.in = in;
  g.out = out;
  return g;
}

}  // namespace megactx::cuda
