// Element types of tensors, and conversions of the low-precision ones to and
// from float. Names follow safetensors ("F32", "BF16", "F16", "F8_E4M3").
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace megactx {

enum class DType : uint8_t { F32, BF16, F16, F8_E4M3, I32, I64, U8, F64, I8, I16, BOOL };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);
std::optional<DType> dtype_from_name(std::string_view name);

// ---- bf16: the top 16 bits of an IEEE float; round to nearest even. -------------
inline float bf16_to_float(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, 4);
  return value;
}
inline uint16_t float_to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, 4);
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((word >> 16) | 0x40);  // NaN
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}

// ---- f16 (IEEE half) ---------------------------------------------------------
float f16_to_float(uint16_t bits);
uint16_t float_to_f16(float value);

// ---- fp8 e4m3 (OCP "fn" variant: no infinities, 0x7f/0xff are NaN, max 448) ----
float fp8_e4m3_to_float(uint8_t bits);
// Saturates to +-448 like torch's float8_e4m3fn cast with clamping; NaN stays NaN.
uint8_t float_to_fp8_e4m3(float value);

}  // namespace megactx
