#include "core/dtype.h"

#include <array>
#include <cmath>

namespace megactx {

namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, 11> kDTypes = {{
    {DType::F32, "F32", 4},
    {DType::BF16, "BF16", 2},
    {DType::F16, "F16", 2},
    {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::I32, "I32", 4},
    {DType::I64, "I64", 8},
    {DType::U8, "U8", 1},
    {DType::F64, "F64", 8},
    {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},
    {DType::BOOL, "BOOL", 1},
}};
}  // namespace

size_t dtype_size(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].size; }
std::string_view dtype_name(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }
std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& info : kDTypes)
    if (info.name == name) return info.dtype;
  return std::nullopt;
}

float f16_to_float(uint16_t bits) {
  const uint32_t sign = (bits >> 15) & 1u;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t float_to_f16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00u;
  if (magnitude >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (magnitude < std::ldexp(1.0f, -14)) {           // subnormal: units of 2^-24
    const float units = std::nearbyint(magnitude * std::ldexp(1.0f, 24));
    return sign | static_cast<uint16_t>(units);
  }
  int exponent;
  const float fraction = std::frexp(magnitude, &exponent);  // [0.5, 1)
  // 11 significant bits, round to nearest even via nearbyint.
  uint32_t significand = static_cast<uint32_t>(std::nearbyint(std::ldexp(fraction, 11)));
  if (significand == 2048u) {
    significand = 1024u;
    ++exponent;
  }
  const uint32_t biased = static_cast<uint32_t>(exponent - 1 + 15);
  if (biased >= 31) return sign | 0x7c00u;
  return sign | static_cast<uint16_t>((biased << 10) | (significand & 0x3ffu));
}

float fp8_e4m3_to_float(uint8_t bits) {
  const uint32_t sign = bits >> 7;
  const uint32_t exponent = (bits >> 3) & 0xfu;
  const uint32_t mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 8u), static_cast<int>(exponent) - 10);
  }
  return sign ? -magnitude : magnitude;
}

uint8_t float_to_fp8_e4m3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  float magnitude = std::fmin(std::fabs(value), 448.0f);
  if (magnitude < std::ldexp(1.0f, -6)) {  // subnormal: units of 2^-9
    const float units = std::nearbyint(magnitude * 512.0f);
    if (units >= 8.0f) return sign | 0x08;  // rounds up to the smallest normal
    return sign | static_cast<uint8_t>(units);
  }
  int exponent;
  const float fraction = std::frexp(magnitude, &exponent);  // [0.5, 1)
  uint32_t significand = static_cast<uint32_t>(std::nearbyint(std::ldexp(fraction, 4)));  // 8..16
  if (significand == 16u) {
    significand = 8u;
    ++exponent;
  }
  const uint32_t biased = static_cast<uint32_t>(exponent - 1 + 7);
  if (biased > 15 || (biased == 15 && (significand & 7u) == 7u)) return sign | 0x7e;  // 448
  return sign | static_cast<uint8_t>((biased << 3) | (significand & 7u));
}

}  // namespace megactx
