// The bf16 linears of decode (kernels/cuda/gemm/) at the row counts of decode
// batches and MTP verifications, one kernel at a time: the bf16 GEMV (<= 8
// rows), bf16_skinny with four cp.async stages and with the deep pipeline
// (its own split along k, the parts it chose printed), and cuBLAS
// (cublasGemmEx, what Blas runs past the GEMV's rows: the peer), beside the
// read-only bandwidth measured in the same run. Each timed call reads a
// different copy of the weight (copies totalling > 4x L2), so weights come
// from HBM as in a decode step. GB/s counts the weight bytes (2 per
// parameter); "of floor" is the fastest kernel's share of the read floor.
//
//   bf16_linear_bench [--quick]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/cuda/support/bench_args.h"
#include "bench/cuda/support/device_alloc.h"
#include "bench/cuda/support/linear_bench.h"
#include "bench/cuda/support/read_bandwidth.h"
#include "bench/cuda/support/stream_timing.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemm/bf16_gemv.h"
#include "kernels/cuda/gemm/bf16_skinny.h"
#include "kernels/cuda/gemm/linear_operands.h"

using namespace megactx::cuda;

namespace {

// The kernels decline shapes they do not serve (false): every shape here is served.
void require(bool launched, const char* kernel) {
  if (launched) return;
  std::fprintf(stderr, "bf16_linear_bench: %s declined a shape\n", kernel);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = quick_flag(argc, argv, "bf16_linear_bench");
  const LinearBenchRun run("# bf16 linears at decode row counts");
  cudaStream_t stream = run.stream;
  const ReadBandwidth& floor = run.floor;
  cublasHandle_t handle = run.cublas;

  const std::vector<LinearShape> shapes = {
      {"GLM-5.2 q_a|kv_a 6144->2624", 6144, 2624},
      {"GLM-5.2 indexer wq 2048->4096", 2048, 4096},
      {"GLM-5.2 indexer wk 6144->128", 6144, 128},
      {"GLM-5.2 indexer weights 6144->32", 6144, 32},
      {"GLM-5.2 q_b 2048->16384", 2048, 16384},
      {"GLM-5.2 o_proj 16384->6144", 16384, 6144},
      {"GLM-5.2 attention config MLP gate_up 6144->4096", 6144, 4096},
      {"GLM-5.2 attention config MLP down 2048->6144", 2048, 6144},
      {"glm_1b q_a 2048->768", 2048, 768},
      {"glm_1b q_b 768->3072", 768, 3072},
      {"glm_1b dense MLP down 5632->2048", 5632, 2048},
  };
  const std::vector<int64_t> row_counts =
      quick ? std::vector<int64_t>{1, 16, 64} : std::vector<int64_t>{1, 8, 9, 16, 32, 64};
  const int64_t max_rows = row_counts.back();
  std::printf(
      "| shape | rows | cuBLAS us | GEMV us | skinny us (4 stages) | skinny us (deep) | parts | "
      "best GB/s | of floor | cuBLAS of floor |\n|---|---|---|---|---|---|---|---|---|---|\n");
  for (const LinearShape& s : shapes) {
    const size_t weight_bytes = static_cast<size_t>(s.in * s.out) * 2;
    const int copies = hbm_copies(weight_bytes);
    // Zeros time the same as any values: these kernels' work does not depend on them.
    std::vector<__nv_bfloat16*> w(copies);
    for (auto& copy : w) copy = device_zeros<__nv_bfloat16>(weight_bytes / 2);
    auto* x = device_zeros<__nv_bfloat16>(static_cast<size_t>(max_rows * s.in));
    auto* y = device_zeros<float>(static_cast<size_t>(max_rows * s.out));
    // bf16_skinny's split scratch at the largest plan it can take.
    const int64_t parts_floats = kBf16SkinnyMaxSplit * max_rows * s.out;
    auto* parts = device_zeros<float>(static_cast<size_t>(parts_floats));
    auto* done = device_zeros<int32_t>(static_cast<size_t>(s.out / 64 + 1));
    const int calls = 4 * copies;
    for (const int64_t rows : row_counts) {
      const auto product = [&](auto g, int c) {
        return linear_operands<decltype(g)>(x, s.in, w[c], y, s.out, rows, s.in, s.out);
      };
      const double cublas = cycled_median_us(stream, copies, calls, [&](int c) {
        cublas_bf16_linear(handle, rows, s.in, s.out, w[c], x, y);
      });
      double gemv = -1;
      if (rows <= kBf16GemvMaxRows)
        gemv = cycled_median_us(stream, copies, calls, [&](int c) {
          require(bf16_gemv(product(Bf16Gemv{}, c), stream), "bf16_gemv");
        });
      const auto skinny_of = [&](int c, Bf16SkinnyPipeline pipeline) {
        Bf16Skinny g = product(Bf16Skinny{}, c);
        g.pipeline = pipeline;
        g.parts = parts;
        g.parts_capacity = parts_floats;
        g.done = done;
        g.done_capacity = s.out / 64 + 1;
        return g;
      };
      const double four = cycled_median_us(stream, copies, calls, [&](int c) {
        require(bf16_skinny(skinny_of(c, Bf16SkinnyPipeline::FourStages), stream), "bf16_skinny");
      });
      const double deep = cycled_median_us(stream, copies, calls, [&](int c) {
        require(bf16_skinny(skinny_of(c, Bf16SkinnyPipeline::Deep), stream), "bf16_skinny");
      });
      double best = std::min({cublas, four, deep});
      if (gemv > 0) best = std::min(best, gemv);
      const auto share = [&](double us) {
        return 100.0 * static_cast<double>(weight_bytes) / (us * 1e-6) / 1e9 / floor.read_gbs;
      };
      std::printf("| %s | %lld | %.2f | %s | %.2f | %.2f | %d | %.0f | %.0f%% | %.0f%% |\n", s.name,
                  static_cast<long long>(rows), cublas, us_or_dash(gemv).c_str(), four, deep,
                  bf16_skinny_plan(skinny_of(0, Bf16SkinnyPipeline::FourStages)).split,
                  static_cast<double>(weight_bytes) / (best * 1e-6) / 1e9, share(best),
                  share(cublas));
    }
    for (auto* copy : w) cudaFree(copy);
    cudaFree(x);
    cudaFree(y);
    cudaFree(parts);
    cudaFree(done);
  }
  return 0;
}
