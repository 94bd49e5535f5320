// The op table of the CUDA model's element-wise and row-wise kernels
// (kernels/cuda/elementwise/elementwise_ops.h), in the manner of llama.cpp's
// test-backend-ops: every op on random inputs of several shapes (odd sizes,
// strides, aliasing) against the reference loops of kernels/reference (the
// CPU backend's oracle) or, where the reference has no such op, the plain loop
// that defines it. A new op gets a row here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/elementwise/elementwise_ops.h"
#include "kernels/cuda/moe/router.h"
#include "kernels/reference/dense_ops.h"
#include "kernels/reference/sparse_attention.h"
#include "model/rope.h"

namespace megactx::cuda {
namespace {

template <typename T>
struct DeviceArray {
  explicit DeviceArray(const std::vector<T>& host) : count(host.size()) {
    MEGACTX_CUDA_CHECK(cudaMalloc(&data, std::max<size_t>(count, 1) * sizeof(T)));
    MEGACTX_CUDA_CHECK(cudaMemcpy(data, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit DeviceArray(size_t n) : DeviceArray(std::vector<T>(n)) {}
  ~DeviceArray() { cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  std::vector<T> host() const {
    MEGACTX_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> out(count);
    MEGACTX_CUDA_CHECK(cudaMemcpy(out.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
  T* data = nullptr;
  size_t count = 0;
};

std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

// Largest |a - b| / max(1, |b|).
double max_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst =
        std::max(worst, std::fabs(double{a[i]} - b[i]) / std::max(1.0, std::fabs(double{b[i]})));
  }
  return worst;
}

constexpr double kTolerance = 2e-6;  // fp32 kernels, other summation orders

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1}, {3, 7}, {17, 129}, {64, 1000}};

TEST(CudaOps, EmbedGatherAndGatherRowsCopyTheirRows) {
  for (auto [n, hidden] : kShapes) {
    const int64_t table_rows = 50;
    const auto table = random_values(static_cast<size_t>(table_rows * hidden), 1);
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((i * 37 + 11) % table_rows);
    DeviceArray<float> d_table(table), d_out(static_cast<size_t>(n * hidden));
    DeviceArray<int32_t> d_ids(ids);
    embed_gather(d_table.data, d_ids.data, n, hidden, d_out.data, nullptr);
    std::vector<float> want(static_cast<size_t>(n * hidden));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(table.begin() + ids[i] * hidden, hidden, want.begin() + i * hidden);
    EXPECT_EQ(d_out.host(), want);
    gather_rows(d_table.data, d_ids.data, n, hidden, d_out.data, nullptr);
    EXPECT_EQ(d_out.host(), want);
    std::vector<int32_t> int_table(table.size());
    std::iota(int_table.begin(), int_table.end(), -5);
    DeviceArray<int32_t> d_int_table(int_table), d_int_out(static_cast<size_t>(n * hidden));
    gather_rows(d_int_table.data, d_ids.data, n, hidden, d_int_out.data, nullptr);
    std::vector<int32_t> int_want(static_cast<size_t>(n * hidden));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(int_table.begin() + ids[i] * hidden, hidden, int_want.begin() + i * hidden);
    EXPECT_EQ(d_int_out.host(), int_want);
  }
}

TEST(CudaOps, NormsMatchTheReferenceWithStridesAndInPlace) {
  for (auto [rows, n] : kShapes) {
    const int64_t stride = n + 3;
    const auto x = random_values(static_cast<size_t>(rows * stride), 2, 3.0f);
    const auto weight = random_values(static_cast<size_t>(n), 3);
    const auto bias = random_values(static_cast<size_t>(n), 4);
    std::vector<float> want(static_cast<size_t>(rows * stride), 0.0f);
    reference::rmsnorm(x.data(), rows, n, stride, weight.data(), 1e-6f, want.data(), stride);
    DeviceArray<float> d_x(x), d_w(weight), d_b(bias), d_y(std::vector<float>(want.size(), 0.0f));
    rmsnorm(d_x.data, rows, n, stride, d_w.data, 1e-6f, d_y.data, stride, nullptr);
    EXPECT_LT(max_error(d_y.host(), want), kTolerance) << rows << "x" << n;
    // x and y alias (the model normalises in place).
    std::vector<float> in_place_want = x;
    reference::rmsnorm(in_place_want.data(), rows, n, stride, weight.data(), 1e-6f,
                       in_place_want.data(), stride);
    rmsnorm(d_x.data, rows, n, stride, d_w.data, 1e-6f, d_x.data, stride, nullptr);
    EXPECT_LT(max_error(d_x.host(), in_place_want), kTolerance);

    const auto dense = random_values(static_cast<size_t>(rows * n), 5, 2.0f);
    std::vector<float> ln_want(dense.size());
    reference::layernorm(dense.data(), rows, n, weight.data(), bias.data(), 1e-5f, ln_want.data());
    DeviceArray<float> d_dense(dense), d_ln(dense.size());
    layernorm(d_dense.data, rows, n, d_w.data, d_b.data, 1e-5f, d_ln.data, nullptr);
    EXPECT_LT(max_error(d_ln.host(), ln_want), kTolerance);
  }
}

TEST(CudaOps, AddRmsnormWithoutFloatOutputWritesTheSameBf16Copy) {
  // Prefill layers whose norm feeds only bf16 linears skip the float32 y:
  // x's update and the bf16 copy are the bits of the full launch. Rows wider
  // than the cached path (6144: GLM-5.2's hidden) and narrower ones.
  for (int64_t n : {7, 2048, 6144, 9000}) {
    const int64_t rows = 5;
    const auto x = random_values(static_cast<size_t>(rows * n), 21, 2.0f);
    const auto branch = random_values(x.size(), 22);
    const auto weight = random_values(static_cast<size_t>(n), 23);
    DeviceArray<float> x_full(x), x_copy(x), d_branch(branch), d_w(weight), d_y(x.size());
    DeviceArray<uint16_t> bf16_full(x.size()), bf16_copy(x.size());
    add_rmsnorm(x_full.data, d_branch.data, rows, n, d_w.data, 1e-6f, d_y.data, nullptr,
                bf16_full.data);
    add_rmsnorm(x_copy.data, d_branch.data, rows, n, d_w.data, 1e-6f, nullptr, nullptr,
                bf16_copy.data);
    EXPECT_EQ(x_copy.host(), x_full.host()) << n;
    EXPECT_EQ(bf16_copy.host(), bf16_full.host()) << n;
    const auto y = d_y.host();
    const auto copy = bf16_copy.host();
    for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(copy[i], float_to_bf16(y[i])) << n << " " << i;
  }
}

TEST(CudaOps, RopeMatchesTheReferenceInBothLayouts) {
  for (const bool interleaved : {false, true}) {
    for (auto [rows, heads] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {5, 3}, {33, 8}}) {
      const int64_t dim = 64, head_stride = 96, row_stride = heads * head_stride + 5;
      auto x = random_values(static_cast<size_t>(rows * row_stride), 6);
      std::vector<float> cos(static_cast<size_t>(rows * dim / 2)), sin(cos.size());
      for (size_t i = 0; i < cos.size(); ++i) {
        cos[i] = std::cos(0.1f * static_cast<float>(i));
        sin[i] = std::sin(0.1f * static_cast<float>(i));
      }
      DeviceArray<float> d_x(x), d_cos(cos), d_sin(sin);
      rope(d_x.data, rows, heads, row_stride, head_stride, dim, d_cos.data, d_sin.data, interleaved,
           nullptr);
      reference::rope(x.data(), rows, heads, row_stride, head_stride, dim, cos.data(), sin.data(),
                      interleaved);
      EXPECT_LT(max_error(d_x.host(), x), kTolerance) << (interleaved ? "interleaved" : "halves");
    }
  }
}

TEST(CudaOps, RopeTablesAreTheHostTablesBitForBit) {
  // The prefill's tables on the device against RopeTable::fill, for the
  // default and the YaRN frequencies, at positions up to past 1M (the angles
  // there reach ~1e6 radians: where a float sin/cos would differ).
  ModelConfig config;
  config.qk_rope_head_dim = 64;
  config.rope.rope_theta = 8e6;
  std::vector<int32_t> positions;
  for (int32_t p = 0; p < 4096; ++p) positions.push_back(p);
  std::mt19937 rng(3);
  for (int i = 0; i < 4096; ++i) positions.push_back(static_cast<int32_t>(rng() % 1100000));
  const std::vector<int64_t> positions64(positions.begin(), positions.end());
  for (const char* type : {"default", "yarn"}) {
    SCOPED_TRACE(type);
    config.rope.rope_type = type;
    config.rope.factor = 40.0;
    config.rope.original_max_position_embeddings = 4096;
    config.rope.mscale = 1.0;
    config.rope.mscale_all_dim = 0.707;
    const RopeTable table = make_rope_table(config);
    const int64_t count = static_cast<int64_t>(positions.size()), half = table.dim / 2;
    std::vector<float> cos(static_cast<size_t>(count * half)), sin(cos.size());
    table.fill(positions64.data(), count, cos.data(), sin.data());
    DeviceArray<int32_t> d_positions(positions);
    DeviceArray<float> d_inv_freq(table.inv_freq), d_cos(cos.size()), d_sin(sin.size());
    rope_tables(d_positions.data, count, d_inv_freq.data, half, table.attention_factor, d_cos.data,
                d_sin.data, nullptr);
    EXPECT_EQ(d_cos.host(), cos);
    EXPECT_EQ(d_sin.host(), sin);
  }
}

TEST(CudaOps, ElementwiseOpsMatchTheirDefinitions) {
  for (auto [rows, n] : kShapes) {
    const int64_t stride = 2 * n;  // gate and up side by side, as the MLP's fused GEMM writes them
    const auto gate_up = random_values(static_cast<size_t>(rows * stride), 7, 2.0f);
    std::vector<float> want(static_cast<size_t>(rows * n));
    reference::silu_mul(gate_up.data(), gate_up.data() + n, rows, n, stride, want.data());
    DeviceArray<float> d_gu(gate_up), d_out(want.size());
    silu_mul(d_gu.data, d_gu.data + n, rows, n, stride, d_out.data, nullptr);
    EXPECT_LT(max_error(d_out.host(), want), kTolerance);

    const auto a = random_values(static_cast<size_t>(rows * n), 8);
    const auto b = random_values(a.size(), 9);
    DeviceArray<float> d_a(a), d_b(b);
    add_into(d_a.data, d_b.data, static_cast<int64_t>(a.size()), nullptr);
    std::vector<float> sum(a.size());
    for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
    EXPECT_EQ(d_a.host(), sum);
    scale(d_a.data, -0.5f, static_cast<int64_t>(a.size()), nullptr);
    for (float& v : sum) v *= -0.5f;
    EXPECT_EQ(d_a.host(), sum);
  }
}

TEST(CudaOps, SiluMulOnBf16MatchesTheFloatReferenceRounded) {
  // The bf16 MLP of prefill blocks: bf16 gate / up in, bf16 out, float32
  // arithmetic between. Against the float reference on the same bf16 values,
  // rounded once: within one bf16 step (expf's last bit may differ).
  for (auto [rows, n] :
       std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {3, 8}, {17, 130}, {70000, 64}}) {
    const int64_t stride = 2 * n;
    auto gate_up = random_values(static_cast<size_t>(rows * stride), 11, 3.0f);
    std::vector<uint16_t> bits(gate_up.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      bits[i] = float_to_bf16(gate_up[i]);
      gate_up[i] = bf16_to_float(bits[i]);
    }
    std::vector<float> want(static_cast<size_t>(rows * n));
    reference::silu_mul(gate_up.data(), gate_up.data() + n, rows, n, stride, want.data());
    DeviceArray<uint16_t> d_gu(bits), d_out(want.size());
    silu_mul_bf16(d_gu.data, d_gu.data + n, rows, n, stride, d_out.data, nullptr);
    const auto got = d_out.host();
    for (size_t i = 0; i < want.size(); ++i) {
      const float value = bf16_to_float(got[i]);
      ASSERT_LE(std::abs(value - want[i]), std::abs(want[i]) * 0x1p-7f + 1e-30f)
          << "rows " << rows << " n " << n << " at " << i;
    }
  }
}

TEST(CudaOps, ArgmaxTakesTheLowestIndexOnTies) {
  for (auto [rows, n] : kShapes) {
    auto x = random_values(static_cast<size_t>(rows * n), 10);
    for (int64_t r = 0; r < rows; r += 2) {
      // A tie at the maximum: the lower index wins (the CPU sampler's argmax).
      const float top = 100.0f + static_cast<float>(r);
      x[r * n + (n - 1)] = top;
      x[r * n + (n - 1) / 2] = top;
    }
    DeviceArray<float> d_x(x);
    DeviceArray<int32_t> d_out(static_cast<size_t>(rows * 2));
    argmax_rows(d_x.data, rows, n, d_out.data, 2, nullptr);
    const auto got = d_out.host();
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = x.begin() + r * n;
      const auto want = static_cast<int32_t>(std::max_element(row, row + n) - row);  // first max
      EXPECT_EQ(got[r * 2], want) << "row " << r;
    }
  }
}

TEST(CudaOps, ScatterAddRowsAddsGatedRows) {
  const int64_t hidden = 130, out_rows = 20, n = 9;
  const auto y = random_values(static_cast<size_t>(n * hidden), 11);
  const auto base = random_values(static_cast<size_t>(out_rows * hidden), 12);
  const std::vector<int32_t> rows = {3, 0, 19, 7, 4, 11, 2, 8, 15};
  const auto gates = random_values(static_cast<size_t>(n), 13);
  DeviceArray<float> d_y(y), d_out(base), d_gates(gates);
  DeviceArray<int32_t> d_rows(rows);
  scatter_add_rows(d_y.data, d_rows.data, d_gates.data, n, hidden, d_out.data, nullptr);
  std::vector<float> want = base;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t d = 0; d < hidden; ++d) want[rows[i] * hidden + d] += gates[i] * y[i * hidden + d];
  EXPECT_LT(max_error(d_out.host(), want), kTolerance);
}

TEST(CudaOps, MoeRouteMatchesTheReferenceRouter) {
  struct Case {
    int64_t experts, n_group, topk_group, top_k;
    bool norm;
    float scaling;
  };
  for (const Case c : {Case{8, 1, 1, 2, true, 1.0f}, Case{64, 8, 4, 6, true, 2.5f},
                       Case{256, 8, 4, 8, true, 2.5f}, Case{16, 1, 1, 4, false, 1.0f}}) {
    const int64_t rows = 37;
    const auto logits = random_values(static_cast<size_t>(rows * c.experts), 14, 2.0f);
    const auto bias = random_values(static_cast<size_t>(c.experts), 15, 0.1f);
    DeviceArray<float> d_logits(logits), d_bias(bias),
        d_weights(static_cast<size_t>(rows * c.top_k));
    DeviceArray<int32_t> d_ids(static_cast<size_t>(rows * c.top_k));
    RouteParams params{c.experts, c.n_group, c.topk_group, c.top_k, c.norm, c.scaling};
    moe_route(d_logits.data, d_bias.data, rows, params, d_ids.data, d_weights.data, nullptr);
    const auto ids = d_ids.host();
    const auto weights = d_weights.host();
    reference::RouterSpec spec{c.experts, c.n_group, c.topk_group, c.top_k, c.norm, c.scaling};
    std::vector<int32_t> want_ids(static_cast<size_t>(c.top_k));
    std::vector<float> want_weights(static_cast<size_t>(c.top_k));
    for (int64_t r = 0; r < rows; ++r) {
      reference::moe_route(logits.data() + r * c.experts, bias.data(), spec, want_ids.data(),
                           want_weights.data());
      for (int64_t j = 0; j < c.top_k; ++j) {
        EXPECT_EQ(ids[r * c.top_k + j], want_ids[j]) << c.experts << " experts, row " << r;
        EXPECT_NEAR(weights[r * c.top_k + j], want_weights[j], 1e-6);
      }
    }
  }
}

// The fused router: its logits match a float64 product, its choice is the
// reference router's on those logits, a row's logits do not depend on its
// batch (bit for bit), and the per-row counts are back at zero after each
// launch (the second launch routes as the first).
TEST(CudaOps, FusedRouterMatchesTheProductAndTheReferenceRouter) {
  struct Case {
    int64_t experts, hidden, n_group, topk_group, top_k, rows;
  };
  for (const Case c : {Case{16, 2048, 1, 1, 4, 5}, Case{256, 6144, 8, 4, 8, 16},
                       Case{64, 132, 8, 4, 6, 64}, Case{7, 12, 1, 1, 2, 3}}) {
    const auto h = random_values(static_cast<size_t>(c.rows * c.hidden), 21);
    const auto router = random_values(static_cast<size_t>(c.experts * c.hidden), 22, 0.05f);
    const auto bias = random_values(static_cast<size_t>(c.experts), 23, 0.1f);
    DeviceArray<float> d_h(h), d_router(router), d_bias(bias),
        d_logits(static_cast<size_t>(c.rows * c.experts)),
        d_weights(static_cast<size_t>(c.rows * c.top_k));
    DeviceArray<int32_t> d_ids(static_cast<size_t>(c.rows * c.top_k)),
        d_done(static_cast<size_t>(kFusedRouterMaxRows));
    const RouteParams params{c.experts, c.n_group, c.topk_group, c.top_k, true, 2.5f};
    ASSERT_TRUE(moe_router_fused(d_h.data, c.rows, c.hidden, d_router.data, d_bias.data, params,
                                 d_logits.data, d_done.data, d_ids.data, d_weights.data, nullptr));
    const auto logits = d_logits.host();
    const auto ids = d_ids.host();
    const auto weights = d_weights.host();
    std::vector<float> want_logits(logits.size());
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t e = 0; e < c.experts; ++e) {
        double sum = 0.0;
        for (int64_t k = 0; k < c.hidden; ++k)
          sum += double{h[r * c.hidden + k]} * router[e * c.hidden + k];
        want_logits[r * c.experts + e] = static_cast<float>(sum);
      }
    EXPECT_LT(max_error(logits, want_logits), 1e-5) << c.experts << " experts";
    const reference::RouterSpec spec{c.experts, c.n_group, c.topk_group, c.top_k, true, 2.5f};
    std::vector<int32_t> want_ids(static_cast<size_t>(c.top_k));
    std::vector<float> want_weights(static_cast<size_t>(c.top_k));
    for (int64_t r = 0; r < c.rows; ++r) {
      reference::moe_route(logits.data() + r * c.experts, bias.data(), spec, want_ids.data(),
                           want_weights.data());
      for (int64_t j = 0; j < c.top_k; ++j) {
        EXPECT_EQ(ids[r * c.top_k + j], want_ids[j]) << c.experts << " experts, row " << r;
        EXPECT_NEAR(weights[r * c.top_k + j], want_weights[j], 1e-6);
      }
    }
    EXPECT_EQ(d_done.host(), std::vector<int32_t>(d_done.count, 0));
    // The last row alone: the same bits as in the batch, and the same choice.
    const int64_t last = c.rows - 1;
    ASSERT_TRUE(moe_router_fused(d_h.data + last * c.hidden, 1, c.hidden, d_router.data,
                                 d_bias.data, params, d_logits.data, d_done.data, d_ids.data,
                                 d_weights.data, nullptr));
    const auto alone = d_logits.host();
    const auto alone_ids = d_ids.host();
    for (int64_t e = 0; e < c.experts; ++e)
      EXPECT_EQ(alone[e], logits[last * c.experts + e]) << c.experts << " experts, expert " << e;
    for (int64_t j = 0; j < c.top_k; ++j) EXPECT_EQ(alone_ids[j], ids[last * c.top_k + j]);
  }
}

TEST(CudaOps, FusedRouterLeavesShapesItDoesNotServe) {
  DeviceArray<float> d_h(std::vector<float>(130 * 80, 1.0f)), d_router(std::vector<float>(8 * 130));
  DeviceArray<float> d_logits(std::vector<float>(80 * 8)), d_weights(std::vector<float>(80 * 2));
  DeviceArray<int32_t> d_ids(std::vector<int32_t>(80 * 2)), d_done(std::vector<int32_t>(80));
  const RouteParams params{8, 1, 1, 2, true, 1.0f};
  // hidden not a multiple of 4; more rows than decode batches.
  EXPECT_FALSE(moe_router_fused(d_h.data, 1, 130, d_router.data, nullptr, params, d_logits.data,
                                d_done.data, d_ids.data, d_weights.data, nullptr));
  EXPECT_FALSE(moe_router_fused(d_h.data, kFusedRouterMaxRows + 1, 128, d_router.data, nullptr,
                                params, d_logits.data, d_done.data, d_ids.data, d_weights.data,
                                nullptr));
}

}  // namespace
}  // namespace megactx::cuda
