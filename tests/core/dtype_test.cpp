// Conversions checked against values that torch's casts produce (bit patterns
// quoted from the formats' definitions: OCP FP8 spec, IEEE 754).
#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace megactx {
namespace {

TEST(DType, NamesRoundTrip) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16, DType::F8_E4M3, DType::I64}) {
    EXPECT_EQ(dtype_from_name(dtype_name(dtype)), dtype);
  }
  EXPECT_FALSE(dtype_from_name("F7").has_value());
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
}

TEST(DType, Bf16) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_float(0xc000), -2.0f);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties round to even (1.0).
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);  // halfway, rounds up to even
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(DType, F16) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(-2.5f), 0xc100);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(1e6f), 0x7c00);
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  for (uint32_t bits = 0; bits < 0x7c00; bits += 7) {
    EXPECT_EQ(float_to_f16(f16_to_float(static_cast<uint16_t>(bits))), bits);
  }
}

TEST(DType, Fp8E4m3) {
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(fp8_e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(0x7f)));
  EXPECT_EQ(float_to_fp8_e4m3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(float_to_fp8_e4m3(-1000.0f), 0xfe);
  for (int bits = 0; bits < 256; ++bits) {
    if ((bits & 0x7f) == 0x7f) continue;
    EXPECT_EQ(float_to_fp8_e4m3(fp8_e4m3_to_float(static_cast<uint8_t>(bits))), bits) << bits;
  }
  // 1.0625 lies halfway between 1.0 (mantissa 0) and 1.125 (mantissa 1): to even.
  EXPECT_EQ(float_to_fp8_e4m3(1.0625f), 0x38);
}

TEST(Tensor, ReshapeSliceConvert) {
  Tensor tensor = Tensor::zeros({4, 3}, DType::BF16);
  auto* bits = tensor.data<uint16_t>();
  for (int i = 0; i < 12; ++i) bits[i] = float_to_bf16(static_cast<float>(i));
  Tensor rows = tensor.slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  Tensor values = rows.to_float();
  EXPECT_EQ(values.data<float>()[0], 3.0f);
  EXPECT_EQ(values.data<float>()[5], 8.0f);
  EXPECT_THROW(tensor.reshape({5, 2}), Error);
  EXPECT_EQ(tensor.reshape({2, 6}).dim(-1), 6);
}

TEST(ThreadPool, CoversRangeOnceAndPropagatesErrors) {
  ThreadPool pool(3);
  std::vector<int> hits(1000, 0);
  pool.parallel_for(1000, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) hits[i]++;
  });
  for (int hit : hits) EXPECT_EQ(hit, 1);
  EXPECT_THROW(pool.parallel_for(10, [](int64_t, int64_t) { fail("boom"); }), Error);
  pool.parallel_for(5, [&](int64_t begin, int64_t end) { hits[begin]++; });  // pool still works
}

}  // namespace
}  // namespace megactx
