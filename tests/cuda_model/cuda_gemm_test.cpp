// The CUDA model's GEMMs against host double-precision loops: cuBLAS fp32
// (plain, strided, per-head batched), bf16 with fp32 accumulation, and the
// fp8 e4m3 128x128 block-scaled weights dequantized on the fly.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/elementwise/elementwise_ops.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/bf16_skinny.h"
#include "kernels/cuda/gemm/fp8_block_gemm.h"
#include "kernels/cuda/gemm/gemm.h"
#include "kernels/cuda/gemm/linear_operands.h"

namespace megactx::cuda {
namespace {

template <typename T>
T* to_device(const std::vector<T>& values) {
  T* data = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&data, std::max<size_t>(values.size(), 1) * sizeof(T)));
  MEGACTX_CUDA_CHECK(
      cudaMemcpy(data, values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice));
  return data;
}

template <typename T>
std::vector<T> to_host(const T* data, size_t count) {
  std::vector<T> values(count);
  MEGACTX_CUDA_CHECK(cudaMemcpy(values.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost));
  return values;
}

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = uniform(rng);
  return values;
}

// values rounded to bf16 in place; their bf16 bits.
std::vector<uint16_t> round_to_bf16(std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = bf16_to_float(bits[i] = float_to_bf16(values[i]));
  return bits;
}

// y[r, o] = sum_i x[r, i] * w[o, i], in double.
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w,
                              int64_t rows, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0.0;
      for (int64_t i = 0; i < in; ++i) sum += static_cast<double>(x[r * in + i]) * w[o * in + i];
      y[r * out + o] = sum;
    }
  return y;
}

double max_relative(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return diff / scale;
}

// The decode kernels' test shapes: glm_1b-sized weights, an output that is
// not a multiple of 16 or 128, a long `in`, and a tiny one (a partial k chunk).
struct LinearShape {
  int64_t in, out;
};
constexpr LinearShape kDecodeLinearShapes[] = {{2048, 1344}, {768, 3075}, {5632, 2048}, {72, 5}};

// A bf16 linear's operands on the device with strides that are not the
// widths: x [max_rows, in + 8] and w [out, in] rounded to bf16, y [max_rows,
// out + 3] float32; and the double-loop product of every row.
struct StridedBf16Case {
  int64_t in, out, max_rows, x_stride, y_stride;
  std::vector<double> want;  // [max_rows, out]
  uint16_t* dx = nullptr;
  uint16_t* dw = nullptr;
  float* dy = nullptr;

  StridedBf16Case(int64_t in_, int64_t out_, int64_t rows, uint32_t seed)
      : in(in_), out(out_), max_rows(rows), x_stride(in_ + 8), y_stride(out_ + 3) {
    auto x = random_values(static_cast<size_t>(max_rows * x_stride), seed);
    auto w = random_values(static_cast<size_t>(out * in), seed + 1);
    const std::vector<uint16_t> xb = round_to_bf16(x), wb = round_to_bf16(w);
    std::vector<float> x_dense(static_cast<size_t>(max_rows * in));
    for (int64_t r = 0; r < max_rows; ++r)
      for (int64_t i = 0; i < in; ++i) x_dense[r * in + i] = x[r * x_stride + i];
    want = reference(x_dense, w, max_rows, in, out);
    dx = to_device(xb);
    dw = to_device(wb);
    MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(max_rows * y_stride) * sizeof(float)));
  }
  ~StridedBf16Case() {
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
  }
  StridedBf16Case(const StridedBf16Case&) = delete;
  StridedBf16Case& operator=(const StridedBf16Case&) = delete;
  // y's first `rows` float32 rows without the stride's padding.
  std::vector<float> dense_y(int64_t rows) const {
    const auto y = to_host(dy, static_cast<size_t>(rows * y_stride));
    std::vector<float> got(static_cast<size_t>(rows * out));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o) got[r * out + o] = y[r * y_stride + o];
    return got;
  }
  // The same rows' bf16 outputs are got rounded, element for element.
  void expect_bf16_y(int64_t rows, const std::vector<float>& got) const {
    const auto yb =
        to_host(reinterpret_cast<const uint16_t*>(dy), static_cast<size_t>(rows * y_stride));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < out; ++o)
        EXPECT_EQ(yb[r * y_stride + o], float_to_bf16(got[r * out + o]));
  }
  std::vector<double> want_rows(int64_t rows) const {
    return {want.begin(), want.begin() + rows * out};
  }
  // got (the first `rows` float32 rows) is within rounding of the double
  // loops, and its row 0 has the bits of the first call's (row0_alone, set
  // by that call): a row's result does not depend on the rows beside it.
  void expect_product(int64_t rows, const std::vector<float>& got,
                      std::vector<float>& row0_alone) const {
    EXPECT_LE(max_relative(got, want_rows(rows)), 1e-5);
    const std::vector<float> row0(got.begin(), got.begin() + out);
    if (row0_alone.empty()) row0_alone = row0;
    EXPECT_EQ(row0, row0_alone);
  }
  // kernel(g) declines (false) more rows than max_rows, an x that is not
  // 16-byte aligned and an `in` that is not a multiple of 8.
  template <typename Product, typename Kernel>
  void expect_declines(Kernel kernel) const {
    Product other = operands<Product>(max_rows + 1);
    EXPECT_FALSE(kernel(other));  // too many rows
    other.rows = 2;
    other.x = dx + 1;
    EXPECT_FALSE(kernel(other));  // x not 16-byte aligned
    other.x = dx;
    other.in = in - 4;
    EXPECT_FALSE(kernel(other));  // in not a multiple of 8
  }
  // The operands of `rows` rows as a decode kernel takes them (Bf16Product).
  template <typename Product>
  Product operands(int64_t rows) const {
    return linear_operands<Product>(dx, x_stride, dw, dy, y_stride, rows, in, out);
  }
};

// bf16_skinny's split-K scratch for shapes up to weight_rows weight rows: the
// parts, and the per-tile counters zeroed once (each launch leaves them zero).
struct SkinnyScratch {
  float* parts = nullptr;
  int32_t* done = nullptr;
  int64_t parts_floats = 0, tiles = 0;
  explicit SkinnyScratch(int64_t weight_rows)
      : parts_floats(kBf16SkinnyMaxSplit * kBf16SkinnyMaxRows * weight_rows),
        tiles(weight_rows / 64 + 1) {
    MEGACTX_CUDA_CHECK(cudaMalloc(&parts, static_cast<size_t>(parts_floats) * sizeof(float)));
    MEGACTX_CUDA_CHECK(cudaMalloc(&done, static_cast<size_t>(tiles) * sizeof(int32_t)));
    MEGACTX_CUDA_CHECK(cudaMemset(done, 0, static_cast<size_t>(tiles) * sizeof(int32_t)));
  }
  ~SkinnyScratch() {
    cudaFree(parts);
    cudaFree(done);
  }
  SkinnyScratch(const SkinnyScratch&) = delete;
  SkinnyScratch& operator=(const SkinnyScratch&) = delete;
  void attach(Bf16Skinny& g) const {
    g.parts = parts;
    g.parts_capacity = parts_floats;
    g.done = done;
    g.done_capacity = tiles;
  }
  // Every counter back at zero after the launches.
  void expect_counters_clear() const {
    for (const int32_t v : to_host(done, static_cast<size_t>(tiles))) EXPECT_EQ(v, 0);
  }
};

TEST(CudaGemm, Fp32LinearAndBatchedMatchDoubleLoops) {
  const int64_t rows = 37, in = 300, out = 129, heads = 3;
  const auto x = random_values(static_cast<size_t>(rows * in), 1);
  const auto w = random_values(static_cast<size_t>(out * in), 2);
  float* dx = to_device(x);
  float* dw = to_device(w);
  float* dy = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(rows * out * heads) * sizeof(float)));
  Blas blas(nullptr);
  blas.linear(dx, rows, in, dw, out, dy);
  EXPECT_LE(
      max_relative(to_host(dy, static_cast<size_t>(rows * out)), reference(x, w, rows, in, out)),
      1e-5);
  // Per head h: x columns [h * 100, h * 100 + 100) against w rows [h * 43, h * 43 + 43)
  // ([43, 100] each), into y columns [h * 43, ...) of a [rows, 129] output.
  const int64_t sub_in = 100, sub_out = 43;
  blas.linear_batched(dx, rows, sub_in, in, sub_in, dw, sub_out, sub_out * sub_in, dy, out, sub_out,
                      heads);
  const auto got = to_host(dy, static_cast<size_t>(rows * out));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < sub_out; ++o) {
        double sum = 0.0;
        for (int64_t i = 0; i < sub_in; ++i)
          sum += static_cast<double>(x[r * in + h * sub_in + i]) *
                 w[h * sub_out * sub_in + o * sub_in + i];
        EXPECT_NEAR(got[r * out + h * sub_out + o], sum, 1e-4) << h << " " << r << " " << o;
      }
    }
  }
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
}

TEST(CudaGemm, FloatToBf16RowsRoundsEveryElementToNearestEven) {
  // The vector path (n and the stride multiples of 4) and the scalar one (an
  // odd width, an odd stride), one row and many, against the host's rounding.
  struct Case {
    int64_t rows, n, stride;
  };
  for (const Case c : {Case{1, 2048, 2048}, Case{3, 4, 8}, Case{70000, 12, 16}, Case{5, 517, 521},
                       Case{40, 1024, 1536}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.n) + " stride " +
                 std::to_string(c.stride));
    auto x = random_values(static_cast<size_t>(c.rows * c.stride), 11);
    x[0] = 1.00390625f;  // a tie: 1 + 2^-8 rounds to even (1.0)
    float* dx = to_device(x);
    uint16_t* dy = nullptr;
    MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(c.rows * c.n) * 2));
    float_to_bf16_rows(dx, c.rows, c.n, c.stride, dy, nullptr);
    const auto got = to_host(dy, static_cast<size_t>(c.rows * c.n));
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < c.n; ++i)
        ASSERT_EQ(got[r * c.n + i], float_to_bf16(x[r * c.stride + i])) << r << ", " << i;
    cudaFree(dx);
    cudaFree(dy);
  }
}

TEST(CudaGemm, Bf16LinearMatchesRoundedInputs) {
  const int64_t rows = 20, in = 256, out = 96;
  auto x = random_values(static_cast<size_t>(rows * in), 3);
  auto w = random_values(static_cast<size_t>(out * in), 4);
  const std::vector<uint16_t> xb = round_to_bf16(x), wb = round_to_bf16(w);
  uint16_t* dx = to_device(xb);
  uint16_t* dw = to_device(wb);
  float* dy = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(rows * out) * sizeof(float)));
  Blas blas(nullptr);
  blas.linear_bf16(dx, rows, in, in, dw, out, dy, out, true);
  // Exact products of bf16 inputs, fp32 accumulation.
  EXPECT_LE(
      max_relative(to_host(dy, static_cast<size_t>(rows * out)), reference(x, w, rows, in, out)),
      1e-5);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
}

// The bf16 decode GEMV: every row count it serves, strided x and y, float32
// and bf16 outputs, against double loops; a row's bits do not depend on the
// rows beside it or on the weight prefetch; shapes it does not serve are left
// to the caller. Through Blas with set_bf16_gemv too.
TEST(CudaGemm, Bf16GemvMatchesDoubleLoops) {
  for (const LinearShape shape : kDecodeLinearShapes) {
    const StridedBf16Case c(shape.in, shape.out, kBf16GemvMaxRows, 41);
    std::vector<float> last_row_alone;
    for (int64_t rows = 1; rows <= c.max_rows; ++rows) {
      SCOPED_TRACE("in " + std::to_string(c.in) + ", out " + std::to_string(c.out) + ", rows " +
                   std::to_string(rows));
      for (const bool prefetch : {false, true}) {
        Bf16Gemv g = c.operands<Bf16Gemv>(rows);
        g.prefetch_weights = prefetch;
        ASSERT_TRUE(bf16_gemv(g, nullptr));
        const std::vector<float> got = c.dense_y(rows);
        // Row 0's bits: the same with any rows beside it, prefetch or not.
        c.expect_product(rows, got, last_row_alone);
        g.y_f32 = false;
        ASSERT_TRUE(bf16_gemv(g, nullptr));
        c.expect_bf16_y(rows, got);
      }
    }
    c.expect_declines<Bf16Gemv>([](const Bf16Gemv& g) { return bf16_gemv(g, nullptr); });
    // Through Blas: the same bits as the kernel called directly, at 1 and at
    // kBf16GemvMaxRows rows.
    Blas blas(nullptr);
    blas.set_bf16_gemv(true);
    blas.linear_bf16(c.dx, 1, c.in, c.x_stride, c.dw, c.out, c.dy, c.y_stride, /*y_f32=*/true);
    EXPECT_EQ(to_host(c.dy, static_cast<size_t>(c.out)), last_row_alone);
    blas.linear_bf16(c.dx, c.max_rows, c.in, c.x_stride, c.dw, c.out, c.dy, c.y_stride,
                     /*y_f32=*/true);
    EXPECT_EQ(to_host(c.dy, static_cast<size_t>(c.out)), last_row_alone);
  }
}

// The SwiGLU GEMV (Bf16Gemv::swiglu) against the plain GEMV into bf16 followed
// by silu_mul_bf16: the same bits, at 1..8 rows, with and without the weight
// prefetch; bf16_skinny's SwiGLU form the same way at 1-64 rows and both
// splits; then through Blas::linear_swiglu_bf16 (on and off, GEMV and
// bf16_skinny rows).
TEST(CudaGemm, Bf16GemvSwigluEqualsTheGemvAndSiluMul) {
  struct Shape {
    int64_t in, inter;
  };
  for (const Shape shape : {Shape{2048, 768}, Shape{768, 1000}, Shape{5632, 2048}, Shape{72, 6}}) {
    // The GEMV's rows, then the few-row tensor-core kernel's (bf16_skinny).
    const int64_t in = shape.in, inter = shape.inter, rows_max = kBf16SkinnyMaxRows;
    SCOPED_TRACE("in " + std::to_string(in) + ", inter " + std::to_string(inter));
    auto x = random_values(static_cast<size_t>(rows_max * in), 51);
    // Gate and up rows scaled so that silu sees both signs and large values.
    auto w = random_values(static_cast<size_t>(2 * inter * in), 52);
    for (float& v : w) v *= 4.0f;
    const std::vector<uint16_t> xb = round_to_bf16(x), wb = round_to_bf16(w);
    uint16_t* dx = to_device(xb);
    uint16_t* dw = to_device(wb);
    uint16_t *gate_up = nullptr, *want = nullptr, *got = nullptr;
    const auto bytes = [](int64_t n) { return static_cast<size_t>(n) * sizeof(uint16_t); };
    MEGACTX_CUDA_CHECK(cudaMalloc(&gate_up, bytes(rows_max * 2 * inter)));
    MEGACTX_CUDA_CHECK(cudaMalloc(&want, bytes(rows_max * inter)));
    MEGACTX_CUDA_CHECK(cudaMalloc(&got, bytes(rows_max * inter)));
    // The two-launch reference: gate_up [rows, 2 inter] in bf16, then silu_mul_bf16 into want.
    const auto two_launches = [&](int64_t rows) {
      Bf16Gemv plain;
      plain.x = dx;
      plain.x_stride = in;
      plain.w = dw;
      plain.y = gate_up;
      plain.y_stride = 2 * inter;
      plain.y_f32 = false;
      plain.rows = rows;
      plain.in = in;
      plain.out = 2 * inter;
      EXPECT_TRUE(bf16_gemv(plain, nullptr));
      silu_mul_bf16(gate_up, gate_up + inter, rows, inter, 2 * inter, want, nullptr);
      return plain;
    };
    for (int64_t rows = 1; rows <= kBf16GemvMaxRows; ++rows) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      const Bf16Gemv plain = two_launches(rows);
      const auto expected = to_host(want, static_cast<size_t>(rows * inter));
      // Not a test that passes on zeros: the activations vary.
      int64_t nonzero = 0;
      for (const uint16_t v : expected) nonzero += (v & 0x7fff) != 0;
      EXPECT_GT(nonzero, rows * inter / 2);
      for (const bool prefetch : {false, true}) {
        Bf16Gemv fused = plain;
        fused.y = got;
        fused.y_stride = inter;
        fused.out = inter;
        fused.swiglu = true;
        fused.prefetch_weights = prefetch;
        MEGACTX_CUDA_CHECK(cudaMemset(got, 0xff, bytes(rows_max * inter)));
        ASSERT_TRUE(bf16_gemv(fused, nullptr));
        EXPECT_EQ(to_host(got, static_cast<size_t>(rows * inter)), expected);
      }
    }
    // bf16_skinny's SwiGLU form against its plain form into bf16 and
    // silu_mul_bf16, at each split (0: its own choice, the same for both forms).
    const SkinnyScratch skinny_scratch(2 * inter);
    const auto skinny_two_launches = [&](int64_t rows, int split) {
      Bf16Skinny plain;
      plain.x = dx;
      plain.x_stride = in;
      plain.w = dw;
      plain.y = gate_up;
      plain.y_stride = 2 * inter;
      plain.y_f32 = false;
      plain.rows = rows;
      plain.in = in;
      plain.out = 2 * inter;
      plain.split = split;
      skinny_scratch.attach(plain);
      EXPECT_TRUE(bf16_skinny(plain, nullptr));
      silu_mul_bf16(gate_up, gate_up + inter, rows, inter, 2 * inter, want, nullptr);
      return plain;
    };
    for (const int split : {0, 1, 3, 16}) {
      for (const int64_t rows : {1, 9, 16, 17, 33, 64}) {
        SCOPED_TRACE("bf16_skinny, rows " + std::to_string(rows) + ", split " +
                     std::to_string(split));
        Bf16Skinny fused = skinny_two_launches(rows, split);
        fused.y = got;
        fused.y_stride = inter;
        fused.out = inter;
        fused.swiglu = true;
        MEGACTX_CUDA_CHECK(cudaMemset(got, 0xff, bytes(rows_max * inter)));
        ASSERT_TRUE(bf16_skinny(fused, nullptr));
        EXPECT_EQ(to_host(got, static_cast<size_t>(rows * inter)),
                  to_host(want, static_cast<size_t>(rows * inter)));
      }
    }
    skinny_scratch.expect_counters_clear();
    // Through Blas: float32 x holding bf16 values (so its bf16 copy is xb).
    Blas blas(nullptr);
    blas.set_bf16_gemv(true);
    DeviceMatrix matrix;
    matrix.data = dw;
    matrix.bf16 = true;
    float* dxf = to_device(x);
    const int64_t rows = 3;
    blas.set_bf16_gemv_swiglu(false);
    EXPECT_FALSE(blas.linear_swiglu_bf16(dxf, rows, in, in, matrix, inter, got));
    blas.set_bf16_gemv_swiglu(true);
    MEGACTX_CUDA_CHECK(cudaMemset(got, 0xff, bytes(rows_max * inter)));
    ASSERT_TRUE(blas.linear_swiglu_bf16(dxf, rows, in, in, matrix, inter, got));
    two_launches(rows);
    EXPECT_EQ(to_host(got, static_cast<size_t>(rows * inter)),
              to_host(want, static_cast<size_t>(rows * inter)));
    // Past the GEMV's rows only with bf16_skinny on, on its automatic split.
    EXPECT_FALSE(blas.linear_swiglu_bf16(dxf, 24, in, in, matrix, inter, got));
    blas.set_bf16_skinny(true);
    MEGACTX_CUDA_CHECK(cudaMemset(got, 0xff, bytes(rows_max * inter)));
    ASSERT_TRUE(blas.linear_swiglu_bf16(dxf, 24, in, in, matrix, inter, got));
    skinny_two_launches(24, 0);
    EXPECT_EQ(to_host(got, static_cast<size_t>(24 * inter)),
              to_host(want, static_cast<size_t>(24 * inter)));
    EXPECT_FALSE(blas.linear_swiglu_bf16(dxf, rows_max + 1, in, in, matrix, inter, got));
    cudaFree(dxf);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(gate_up);
    cudaFree(want);
    cudaFree(got);
  }
}

// The few-row tensor-core bf16 linear (bf16_skinny.h) against double loops:
// 1-64 rows (partial column groups), outputs that are not multiples of 16,
// strided x and y, float32 and bf16 outputs, the split along k chosen (0) or
// forced to 1, 3 and 16 parts (within rounding of each other; a row's bits
// independent of its batch at every split, the counters back at zero), four
// stages and the deep pipeline (the same bits),
// shapes it declines, a split without scratch, and the Blas path.
TEST(CudaGemm, Bf16SkinnyMatchesDoubleLoops) {
  for (const LinearShape shape : kDecodeLinearShapes) {
    const StridedBf16Case c(shape.in, shape.out, kBf16SkinnyMaxRows, 61);
    const SkinnyScratch scratch(c.out);
    for (const int split : {0, 1, 3, 16}) {
      std::vector<float> row0_alone;
      for (const int64_t rows : {1, 3, 8, 9, 16, 17, 31, 32, 33, 64}) {
        SCOPED_TRACE("in " + std::to_string(c.in) + ", out " + std::to_string(c.out) + ", rows " +
                     std::to_string(rows) + ", split " + std::to_string(split));
        Bf16Skinny g = c.operands<Bf16Skinny>(rows);
        g.split = split;
        scratch.attach(g);
        // A forced split takes that many parts where `in` has the chunks.
        const int64_t chunks = (c.in + kBf16SkinnyChunk - 1) / kBf16SkinnyChunk;
        if (split > 1 && split <= chunks / 2) {
          EXPECT_GT(bf16_skinny_plan(g).split, 1);
        }
        MEGACTX_CUDA_CHECK(
            cudaMemset(c.dy, 0xff, static_cast<size_t>(c.max_rows * c.y_stride) * sizeof(float)));
        g.pipeline = Bf16SkinnyPipeline::FourStages;
        ASSERT_TRUE(bf16_skinny(g, nullptr));
        const std::vector<float> got = c.dense_y(rows);
        c.expect_product(rows, got, row0_alone);
        // The deeper pipeline stages the same chunks: the same bits.
        g.pipeline = Bf16SkinnyPipeline::Deep;
        ASSERT_TRUE(bf16_skinny(g, nullptr));
        EXPECT_EQ(c.dense_y(rows), got);
        // The padding after row 0 is left alone.
        EXPECT_TRUE(std::isnan(to_host(c.dy, static_cast<size_t>(c.y_stride))[c.y_stride - 1]));
        g.y_f32 = false;
        ASSERT_TRUE(bf16_skinny(g, nullptr));
        c.expect_bf16_y(rows, got);
      }
    }
    scratch.expect_counters_clear();
    c.expect_declines<Bf16Skinny>([](const Bf16Skinny& g) { return bf16_skinny(g, nullptr); });
    Bf16Skinny other = c.operands<Bf16Skinny>(2);
    other.split = kBf16SkinnyMaxSplit + 1;
    EXPECT_FALSE(bf16_skinny(other, nullptr));  // more parts than it takes
    other.split = 2;
    if (bf16_skinny_plan(other).split > 1) {
      EXPECT_THROW(bf16_skinny(other, nullptr), Error);  // a split without scratch
    }
    // Through Blas past the GEMV's rows (its own scratch): within rounding of double loops.
    Blas blas(nullptr);
    blas.set_bf16_gemv(true);
    blas.set_bf16_skinny(true);
    for (const int64_t rows : {int64_t{24}, kBf16SkinnyMaxRows}) {
      blas.linear_bf16(c.dx, rows, c.in, c.x_stride, c.dw, c.out, c.dy, c.out, /*y_f32=*/true);
      EXPECT_LE(max_relative(to_host(c.dy, static_cast<size_t>(rows * c.out)), c.want_rows(rows)),
                1e-5);
    }
  }
}

// Decode sizes (a few rows, a long `in`) on cuBLASLt (Blas's opt-in path,
// its plans autotuned): the same sums as double loops over the bf16 inputs,
// every row count up to Blas::kBf16LtMaxRows on that path, and every
// candidate of each plan (the ones the benchmark and autotuning time) right.
TEST(CudaGemm, Bf16LinearsOfDecodeSizesOnCublasLtMatchDoubleLoops) {
  const int64_t in = 6144, out = 384, max_rows = 80;
  auto x = random_values(static_cast<size_t>(max_rows * in), 31);
  auto w = random_values(static_cast<size_t>(out * in), 32);
  const std::vector<uint16_t> xb = round_to_bf16(x), wb = round_to_bf16(w);
  uint16_t* dx = to_device(xb);
  uint16_t* dw = to_device(wb);
  float* dy = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(max_rows * out) * sizeof(float)));
  void* workspace = nullptr;
  const size_t workspace_bytes = size_t{32} << 20;  // room for split-K's counters
  MEGACTX_CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
  Blas blas(nullptr);
  blas.set_workspace(workspace, workspace_bytes);
  blas.set_bf16_cublaslt(true);  // off by default (measured neutral to mixed)
  blas.set_bf16_gemv(false);     // on by default: it would take the rows up to 8 first
  const auto want = reference(x, w, max_rows, in, out);
  for (const int64_t rows : {1, 3, 8, 16, 33, 64, 80}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const std::vector<double> rows_want(want.begin(), want.begin() + rows * out);
    const int64_t runs = blas.bf16_cublaslt_runs();
    blas.linear_bf16(dx, rows, in, in, dw, out, dy, out, /*y_f32=*/true);
    EXPECT_LE(max_relative(to_host(dy, static_cast<size_t>(rows * out)), rows_want), 1e-5);
    EXPECT_EQ(blas.bf16_cublaslt_runs() - runs, rows <= Blas::kBf16LtMaxRows ? 1 : 0);
    // bf16 output: one rounding of the fp32 sum (2^-9 relative).
    blas.linear_bf16(dx, rows, in, in, dw, out, dy, out, /*y_f32=*/false);
    const auto yb = to_host(reinterpret_cast<const uint16_t*>(dy), static_cast<size_t>(rows * out));
    std::vector<float> y(yb.size());
    for (size_t i = 0; i < yb.size(); ++i) y[i] = bf16_to_float(yb[i]);
    EXPECT_LE(max_relative(y, rows_want), 4e-3);
  }
  // Every candidate the heuristic offers sums right (under both policies, and
  // the union that autotuning times).
  for (const int policy : {0, 1, 2}) {
    LtGemm lt(nullptr);
    lt.set_workspace(workspace, workspace_bytes);
    const LtReduction reduction = policy == 0 ? LtReduction::Any : LtReduction::InKernel;
    lt.set_reduction(reduction, reduction);
    lt.set_autotune(policy == 2);
    Bf16LtGemm g;
    g.x = dx;
    g.x_stride = in;
    g.w = dw;
    g.y = dy;
    g.y_stride = out;
    g.rows = 16;
    g.in = in;
    g.out = out;
    ASSERT_TRUE(lt.supports(g));
    const std::vector<double> rows_want(want.begin(), want.begin() + g.rows * out);
    for (int i = 0; i < lt.candidates(g); ++i) {
      SCOPED_TRACE(lt.describe(g, i));
      lt.choose(g, i);
      MEGACTX_CUDA_CHECK(cudaMemset(dy, 0xff, static_cast<size_t>(g.rows * out) * sizeof(float)));
      lt.run(g);
      EXPECT_LE(max_relative(to_host(dy, static_cast<size_t>(g.rows * out)), rows_want), 1e-5);
    }
  }
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
  cudaFree(workspace);
}

TEST(CudaGemm, SharedInputsWithoutFloatValuesFeedOnlyBf16Linears) {
  // share_input(..., f32_written = false): a bf16 linear of the input (or of
  // a block of its rows) reads the copy; one that would read the float32
  // values (float32 weights, or rows outside the copy) throws.
  const int64_t rows = 8, in = 128, out = 32;
  auto x = random_values(static_cast<size_t>(rows * in), 5);
  auto w = random_values(static_cast<size_t>(out * in), 6);
  const std::vector<uint16_t> xb = round_to_bf16(x), wb = round_to_bf16(w);
  std::vector<float> unwritten(x.size(), std::nanf(""));
  float* dx = to_device(unwritten);  // the float32 values were never written
  uint16_t* dxb = to_device(xb);
  uint16_t* dwb = to_device(wb);
  float* dw = to_device(w);
  float* dy = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(rows * out) * sizeof(float)));
  Blas blas(nullptr);
  blas.share_input(dx, rows, in, in, dxb, /*f32_written=*/false);
  DeviceMatrix matrix;
  matrix.data = dwb;
  matrix.bf16 = true;
  blas.linear(dx + 2 * in, rows - 2, in, in, matrix, out, dy, out);
  std::vector<float> tail(x.begin() + 2 * in, x.end());
  EXPECT_LE(max_relative(to_host(dy, static_cast<size_t>((rows - 2) * out)),
                         reference(tail, w, rows - 2, in, out)),
            1e-5);
  EXPECT_THROW(blas.linear(dx, rows, in, dw, out, dy), Error);
  blas.unshare_input(dx);
  EXPECT_NO_THROW(blas.linear(dx, rows, in, dw, out, dy));
  MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dxb), static_cast<void*>(dwb),
                  static_cast<void*>(dw), static_cast<void*>(dy)})
    cudaFree(p);
}

// The deterministic mode's Blas (batch_invariant_gemm): fp32 and bf16 weights,
// plain, strided and per-head batched, close to double loops, and each row
// bit-identical whether it is alone, among a few or among hundreds, at any
// offset (cuBLAS's results depend on the shape it picks its kernel for).
TEST(CudaGemm, BatchInvariantLinearsGiveEveryRowTheSameBitsInEveryBatch) {
  const int64_t rows = 300, in = 200, out = 136;
  const auto x = random_values(static_cast<size_t>(rows * in), 21);
  const auto w = random_values(static_cast<size_t>(out * in), 22);
  std::vector<uint16_t> wb(w.size());
  std::vector<float> w_rounded(w.size()), x_rounded(x.size());
  for (size_t i = 0; i < w.size(); ++i) w_rounded[i] = bf16_to_float(wb[i] = float_to_bf16(w[i]));
  for (size_t i = 0; i < x.size(); ++i) x_rounded[i] = bf16_to_float(float_to_bf16(x[i]));
  float* dx = to_device(x);
  float* dw = to_device(w);
  uint16_t* dwb = to_device(wb);
  float* dy = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(rows * out) * sizeof(float)));
  Blas blas(nullptr);
  blas.set_batch_invariant(true);
  for (const bool bf16 : {false, true}) {
    DeviceMatrix matrix{bf16 ? static_cast<const void*>(dwb) : dw, bf16};
    blas.linear(dx, rows, in, matrix, out, dy);
    const std::vector<float> all = to_host(dy, static_cast<size_t>(rows * out));
    EXPECT_LT(
        max_relative(all, reference(bf16 ? x_rounded : x, bf16 ? w_rounded : w, rows, in, out)),
        1e-5)
        << (bf16 ? "bf16" : "fp32");
    for (auto [first, count] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {77, 1}, {3, 4}, {31, 33}, {10, 290}}) {
      blas.linear(dx + first * in, count, in, matrix, out, dy);
      const std::vector<float> part = to_host(dy, static_cast<size_t>(count * out));
      for (int64_t i = 0; i < count * out; ++i) {
        ASSERT_EQ(part[i], all[first * out + i])
            << (bf16 ? "bf16" : "fp32") << " row " << first + i / out << " of " << count;
      }
    }
  }
  // Per-head batched (MLA absorption): batch b multiplies x columns [b*16, b*16+16).
  const int64_t heads = 4, head_in = 16, head_out = 24;
  const auto wh = random_values(static_cast<size_t>(heads * head_out * head_in), 23);
  float* dwh = to_device(wh);
  float* dyh = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&dyh, static_cast<size_t>(rows * heads * head_out) * 4));
  blas.linear_batched(dx, rows, head_in, in, head_in, dwh, head_out, head_out * head_in, dyh,
                      heads * head_out, head_out, heads);
  const auto batched = to_host(dyh, static_cast<size_t>(rows * heads * head_out));
  blas.linear_batched(dx + 5 * in, 1, head_in, in, head_in, dwh, head_out, head_out * head_in, dyh,
                      heads * head_out, head_out, heads);
  const auto one = to_host(dyh, static_cast<size_t>(heads * head_out));
  for (int64_t i = 0; i < heads * head_out; ++i)
    EXPECT_EQ(one[i], batched[5 * heads * head_out + i]);
  for (int64_t b = 0; b < heads; ++b) {
    for (int64_t o = 0; o < head_out; ++o) {
      double want = 0.0;
      for (int64_t k = 0; k < head_in; ++k)
        want += double{x[7 * in + b * head_in + k]} * wh[(b * head_out + o) * head_in + k];
      EXPECT_NEAR(batched[(7 * heads + b) * head_out + o], want, 1e-5);
    }
  }
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dw), static_cast<void*>(dwb),
                  static_cast<void*>(dy), static_cast<void*>(dwh), static_cast<void*>(dyh)})
    MEGACTX_CUDA_CHECK(cudaFree(p));
}

TEST(CudaGemm, Fp8BlockScaledWeightsMatchDequantizedReference) {
  // Shapes that are not multiples of the tiles or of the 128 scale blocks.
  const int64_t rows = 70, in = 300, out = 200;
  const int64_t scale_rows = (out + 127) / 128, scale_cols = (in + 127) / 128;
  const auto x = random_values(static_cast<size_t>(rows * in), 5);
  std::mt19937 rng(6);
  std::vector<uint8_t> wq(static_cast<size_t>(out * in));
  for (uint8_t& b : wq) {
    do b = static_cast<uint8_t>(rng() & 0xff);
    while ((b & 0x7f) == 0x7f);  // not NaN
  }
  auto scale = random_values(static_cast<size_t>(scale_rows * scale_cols), 7);
  for (float& s : scale) s = std::fabs(s) * 1e-2f + 1e-3f;
  std::vector<float> w(wq.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i)
      w[o * in + i] = fp8_e4m3_to_float(wq[o * in + i]) * scale[(o / 128) * scale_cols + i / 128];
  float* dx = to_device(x);
  uint8_t* dw = to_device(wq);
  float* ds = to_device(scale);
  float* dy = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&dy, static_cast<size_t>(rows * out) * sizeof(float)));
  Fp8BlockGemm g;
  g.x = dx;
  g.x_stride = in;
  g.w = dw;
  g.scale = ds;
  g.y = dy;
  g.y_stride = out;
  g.rows = rows;
  g.in = in;
  g.out = out;
  fp8_block_gemm(g, nullptr);
  EXPECT_LE(
      max_relative(to_host(dy, static_cast<size_t>(rows * out)), reference(x, w, rows, in, out)),
      1e-5);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(ds);
  cudaFree(dy);
}

}  // namespace
}  // namespace megactx::cuda
