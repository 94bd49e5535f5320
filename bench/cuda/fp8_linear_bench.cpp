// The linears of decode (kernels/cuda/gemm/) at the row counts of decode
// batches and MTP verifications. fp8 block-scaled: the CUDA-core GEMV (<= 8
// rows), the few-row tensor-core kernel (<= 64 rows), the 64 x 64
// tensor-core tile kernel and cuBLASLt's block-scaled GEMM (where it takes
// the shape) with its split-K reduction left to the heuristic ("any") and
// kept in the GEMM's kernel ("in-kernel"). bf16 (twice the weight bytes: the
// peer): cuBLAS (cublasGemmEx, what Blas ran before), cuBLASLt's first
// answer under the in-kernel policy (float32 output; a bf16 output sums its
// parts in float32), and the fastest of the heuristic's candidates under
// either policy, timed here, with its split-K parts and reduction (what
// Blas's autotuned plans pick, up to 64 rows). Read-only bandwidth measured in the same run. Each
// timed call reads a different copy of the weight (copies totalling > 4x
// L2), so weights come from HBM as in a decode step. Achieved GB/s counts
// the weight bytes (fp8: 1 per parameter + scales; bf16: 2).
//
//   fp8_linear_bench [--quick]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda/support/bench_args.h"
#include "bench/cuda/support/device_alloc.h"
#include "bench/cuda/support/linear_bench.h"
#include "bench/cuda/support/read_bandwidth.h"
#include "bench/cuda/support/stream_timing.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_info.h"
#include "kernels/cuda/gemm/cublaslt_gemm.h"
#include "kernels/cuda/gemm/fp8_block_gemm.h"
#include "kernels/cuda/gemm/gemm.h"

using namespace megactx::cuda;

namespace {

template <typename T>
void fill_random(T* device, size_t count, uint32_t seed,
                 const std::function<T(std::mt19937&)>& make) {
  std::mt19937 rng(seed);
  std::vector<T> host(count);
  for (auto& v : host) v = make(rng);
  MEGACTX_CUDA_CHECK(cudaMemcpy(device, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = quick_flag(argc, argv, "fp8_linear_bench");
  const LinearBenchRun run("# fp8 block-scaled linears at decode row counts");
  cudaStream_t stream = run.stream;
  const ReadBandwidth& floor = run.floor;
  cublasHandle_t handle = run.cublas;
  // Two planners: the heuristic's choice of split-K reduction, and only
  // algorithms that sum in their own kernel.
  LtGemm lt(stream), lt_in_kernel(stream);
  const size_t lt_workspace_bytes = size_t{32} << 20;
  void* lt_workspace = device_alloc<uint8_t>(lt_workspace_bytes);
  lt.set_workspace(lt_workspace, lt_workspace_bytes);
  lt.set_reduction(LtReduction::Any, LtReduction::Any);
  lt_in_kernel.set_workspace(lt_workspace, lt_workspace_bytes);
  lt_in_kernel.set_reduction(LtReduction::InKernel, LtReduction::InKernel);

  const std::vector<LinearShape> shapes = {
      {"glm_1b q_a 2048->768", 2048, 768},
      // glm_1b's other small weights (0.8-3.1M elements): at 33-64 rows fp8_lt_rows (gemm.cpp)
      // keeps them on the few-row kernel, where its fp8 decode at batch 64 trails bf16.
      {"glm_1b kv_a 2048->576", 2048, 576},
      {"glm_1b q_b 768->3072", 768, 3072},
      {"glm_1b shared expert gate_up 2048->1536", 2048, 1536},
      {"glm_1b shared expert down 768->2048", 768, 2048},
      {"glm_1b dense MLP down 5632->2048", 5632, 2048},
      {"GLM-5.2 q_b 2048->16384", 2048, 16384},
      {"GLM-5.2 o_proj 16384->6144", 16384, 6144},
      {"GLM-5.2 kv_a 6144->576", 6144, 576},
      {"GLM-5.2 expert gate_up 6144->4096", 6144, 4096},
      {"GLM-5.2 q_a|kv_a 6144->2624", 6144, 2624},
      {"GLM-5.2 indexer wq_b 2048->4096", 2048, 4096},
      {"GLM-5.2 attention config MLP down 2048->6144", 2048, 6144},
  };
  const std::vector<int64_t> row_counts =
      quick ? std::vector<int64_t>{1, 16, 64} : std::vector<int64_t>{1, 4, 8, 16, 32, 64};
  std::printf(
      "| shape | rows | GEMV us | few-row MMA us | 64x64 MMA us | cuBLASLt us (any / in-kernel) | "
      "best fp8 GB/s | of floor | k split | cuBLAS bf16 us | cuBLASLt bf16 in-kernel us (f32 / "
      "bf16 out) | fastest bf16 candidate us (split, reduction) | bf16 GB/s | of floor |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const LinearShape& s : shapes) {
    const int64_t groups = (s.in + 127) / 128, scale_rows = (s.out + 127) / 128;
    const size_t weight_bytes = static_cast<size_t>(s.in * s.out);
    const int copies = hbm_copies(weight_bytes);
    std::vector<uint8_t*> w(copies);
    std::vector<float*> w_scale(copies);
    std::vector<__nv_bfloat16*> w_bf16(copies);
    for (int c = 0; c < copies; ++c) {
      w[c] = device_alloc<uint8_t>(weight_bytes);
      w_scale[c] = device_alloc<float>(static_cast<size_t>(scale_rows * groups));
      w_bf16[c] = device_alloc<__nv_bfloat16>(weight_bytes);
      // e4m3 codes of moderate magnitude (no NaN: 0x7f / 0xff excluded).
      fill_random<uint8_t>(w[c], weight_bytes, 10 + c, [](std::mt19937& r) {
        return static_cast<uint8_t>((r() % 0x60) | (r() % 2 ? 0x80 : 0));
      });
      fill_random<float>(w_scale[c], static_cast<size_t>(scale_rows * groups), 50 + c,
                         [](std::mt19937& r) { return 1e-3f * static_cast<float>(1 + r() % 7); });
      MEGACTX_CUDA_CHECK(cudaMemset(w_bf16[c], 0, weight_bytes * 2));
    }
    const int64_t max_rows = row_counts.back();
    float* x = device_alloc<float>(static_cast<size_t>(max_rows * s.in));
    fill_random<float>(x, static_cast<size_t>(max_rows * s.in), 7, [](std::mt19937& r) {
      return std::normal_distribution<float>(0.f, 1.f)(r);
    });
    uint8_t* xq = device_alloc<uint8_t>(static_cast<size_t>(max_rows * s.in));
    float* xs = device_alloc<float>(static_cast<size_t>(max_rows * groups));
    float* xs_by_group = device_alloc<float>(static_cast<size_t>(max_rows * groups));
    __nv_bfloat16* xb = device_alloc<__nv_bfloat16>(static_cast<size_t>(max_rows * s.in));
    MEGACTX_CUDA_CHECK(cudaMemset(xb, 0, static_cast<size_t>(max_rows * s.in) * 2));
    float* y = device_alloc<float>(static_cast<size_t>(max_rows * s.out));
    quantize_e4m3_groups(x, max_rows, s.in, s.in, xq, xs, stream);
    for (const int64_t rows : row_counts) {
      auto gemm_of = [&](int c) {
        Fp8BlockGemm g;
        g.x = xq;
        g.x_type = ActType::E4M3;
        g.x_stride = s.in;
        g.x_scale = xs;
        g.w = w[c];
        g.scale = w_scale[c];
        g.y = y;
        g.y_stride = s.out;
        g.rows = rows;
        g.in = s.in;
        g.out = s.out;
        return g;
      };
      const int calls = 4 * copies;
      double gemv = -1, skinny = -1, tiles = -1;
      if (rows <= kFp8GemvMaxRows)
        gemv = cycled_median_us(stream, copies, calls,
                                [&](int c) { fp8_block_gemv(gemm_of(c), stream); });
      skinny = cycled_median_us(stream, copies, calls,
                                [&](int c) { fp8_block_gemm_skinny(gemm_of(c), stream); });
      tiles = cycled_median_us(stream, copies, calls,
                               [&](int c) { fp8_block_gemm_tensor_cores(gemm_of(c), stream); });
      // cuBLASLt reads the activations' scales by group ([groups, rows]).
      double cublaslt = -1;
      quantize_e4m3_groups(x, rows, s.in, s.in, xq, xs_by_group, stream, /*scales_by_group=*/true);
      auto lt_gemm_of = [&](int c) {
        Fp8BlockGemm g = gemm_of(c);
        g.x_scale = xs_by_group;
        return g;
      };
      double cublaslt_in_kernel = -1;
      if (lt.supports(lt_gemm_of(0)))
        cublaslt = cycled_median_us(stream, copies, calls, [&](int c) { lt.run(lt_gemm_of(c)); });
      if (lt_in_kernel.supports(lt_gemm_of(0)))
        cublaslt_in_kernel = cycled_median_us(stream, copies, calls,
                                              [&](int c) { lt_in_kernel.run(lt_gemm_of(c)); });
      const double bf16 = cycled_median_us(stream, copies, calls, [&](int c) {
        cublas_bf16_linear(handle, rows, s.in, s.out, w_bf16[c], xb, y);
      });
      auto bf16_gemm_of = [&](int c) {
        Bf16LtGemm g;
        g.x = xb;
        g.x_stride = s.in;
        g.w = w_bf16[c];
        g.y = y;
        g.y_stride = s.out;
        g.rows = rows;
        g.in = s.in;
        g.out = s.out;
        return g;
      };
      double bf16_in_kernel = -1, bf16_fastest = -1, bf16_out_in_kernel = -1;
      auto bf16_out_gemm_of = [&](int c) {
        Bf16LtGemm g = bf16_gemm_of(c);
        g.y_f32 = false;  // y is large enough for either type
        return g;
      };
      if (lt_in_kernel.supports(bf16_out_gemm_of(0)))
        bf16_out_in_kernel = cycled_median_us(
            stream, copies, calls, [&](int c) { lt_in_kernel.run(bf16_out_gemm_of(c)); });
      std::string fastest_is = "-";
      if (lt_in_kernel.supports(bf16_gemm_of(0)))
        bf16_in_kernel = cycled_median_us(stream, copies, calls,
                                          [&](int c) { lt_in_kernel.run(bf16_gemm_of(c)); });
      for (LtGemm* planner : {&lt, &lt_in_kernel}) {
        if (!planner->supports(bf16_gemm_of(0))) continue;
        for (int i = 0; i < planner->candidates(bf16_gemm_of(0)); ++i) {
          // The plan is per shape and alignment, the same for every copy.
          planner->choose(bf16_gemm_of(0), i);
          const double us = cycled_median_us(stream, copies, calls,
                                             [&](int c) { planner->run(bf16_gemm_of(c)); });
          if (bf16_fastest < 0 || us < bf16_fastest) {
            bf16_fastest = us;
            fastest_is = planner->describe(bf16_gemm_of(0), i);
          }
        }
        planner->choose(bf16_gemm_of(0), 0);
      }
      double best = skinny;
      if (gemv > 0) best = std::min(best, gemv);
      best = std::min(best, tiles);
      if (cublaslt > 0) best = std::min(best, cublaslt);
      if (cublaslt_in_kernel > 0) best = std::min(best, cublaslt_in_kernel);
      const double bytes = static_cast<double>(weight_bytes) + 4.0 * scale_rows * groups;
      const double gbs = bytes / (best * 1e-6) / 1e9;
      double best_bf16 = bf16;
      if (bf16_in_kernel > 0) best_bf16 = std::min(best_bf16, bf16_in_kernel);
      const double bf16_gbs = 2.0 * static_cast<double>(weight_bytes) / (best_bf16 * 1e-6) / 1e9;
      std::printf(
          "| %s | %lld | %s | %.2f | %.2f | %s / %s | %.0f | %.0f%% | %d | %.2f | %s / %s | %s "
          "(%s) "
          "| %.0f | %.0f%% |\n",
          s.name, static_cast<long long>(rows), us_or_dash(gemv).c_str(), skinny, tiles,
          us_or_dash(cublaslt).c_str(), us_or_dash(cublaslt_in_kernel).c_str(), gbs,
          100.0 * gbs / floor.read_gbs,
          fp8_block_gemm_skinny_split(rows, s.in, s.out, current_device_multiprocessors()), bf16,
          us_or_dash(bf16_in_kernel).c_str(), us_or_dash(bf16_out_in_kernel).c_str(),
          us_or_dash(bf16_fastest).c_str(), fastest_is.c_str(), bf16_gbs,
          100.0 * bf16_gbs / floor.read_gbs);
    }
    for (int c = 0; c < copies; ++c) {
      cudaFree(w[c]);
      cudaFree(w_scale[c]);
      cudaFree(w_bf16[c]);
    }
    cudaFree(x);
    cudaFree(xq);
    cudaFree(xs);
    cudaFree(xs_by_group);
    cudaFree(xb);
    cudaFree(y);
  }
  return 0;
}
