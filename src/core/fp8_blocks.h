// The block-scaled fp8 weight format of DeepSeek-V3.x / GLM-5.x fp8
// checkpoints: a [rows, cols] matrix as e4m3 codes with one float32 scale
// (`<name>_scale_inv`) per 128 x 128 block, value = e4m3 * scale. The one
// quantiser into it: weight updates re-quantise what a trainer sends with it
// (io/weight_update.cpp), benchmarks and tests make fp8 weights with it.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace megactx {

inline constexpr int64_t kFp8WeightBlock = 128;
inline constexpr float kFp8E4m3Max = 448.0f;

struct Fp8Blocks {
  Tensor codes;   // F8_E4M3 [rows, cols]
  Tensor scales;  // F32 [ceil(rows / 128), ceil(cols / 128)]
};

// float32 [rows, cols] -> codes and scales: scale = block amax / 448 (1 for
// an all-zero block), code = the nearest e4m3 of value / scale.
Fp8Blocks quantize_fp8_blocks(const Tensor& values);

}  // namespace megactx
