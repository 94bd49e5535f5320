// Top-k of the fp32 fallback indexer (kernels/cuda/dsa_fallback/position_topk.h):
// the radix select against the former quadratic kernel on the same random
// scores, for decode rows (1 x 8K, 1 x 64K, 1 x 128K), a batch (128 x 8K) and
// an 8K-token prefill (8192 causal rows), with the default model's top-k
// (128) and GLM's (2048). Each case first checks that both kernels return
// the same indices, then times them (CUDA events, median after warm-up).
// Achieved GB/s counts the scores read once (rows x visible x 4 B), beside
// the read-only bandwidth measured in the same run (bench/cuda/support/read_bandwidth.h).
//
//   fallback_topk_bench [--quick]
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
#include "bench/cuda/support/position_topk_quadratic.h"
#include "bench/cuda/support/read_bandwidth.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/dsa_fallback/position_topk.h"

using namespace megactx::cuda;

namespace {

// Median ms of `body` over enough repetitions for ~budget_ms (3..max_reps).
double median_ms(cudaStream_t stream, const std::function<void()>& body, double budget_ms,
                 int max_reps) {
  cudaEvent_t start, stop;
  MEGACTX_CUDA_CHECK(cudaEventCreate(&start));
  MEGACTX_CUDA_CHECK(cudaEventCreate(&stop));
  auto once = [&] {
    MEGACTX_CUDA_CHECK(cudaEventRecord(start, stream));
    body();
    MEGACTX_CUDA_CHECK(cudaEventRecord(stop, stream));
    MEGACTX_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    MEGACTX_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    return static_cast<double>(ms);
  };
  const double first = once();  // warm-up, and the estimate for the repetition count
  const int reps = std::clamp(static_cast<int>(budget_ms / std::max(first, 1e-3)), 3, max_reps);
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) times.push_back(once());
  std::sort(times.begin(), times.end());
  MEGACTX_CUDA_CHECK(cudaEventDestroy(start));
  MEGACTX_CUDA_CHECK(cudaEventDestroy(stop));
  return times[times.size() / 2];
}

struct Case {
  std::string name;
  int64_t rows, context, topk;
  bool causal;  // row t sees context - rows + t + 1 positions (a prefill chunk)
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = quick_flag(argc, argv, "fallback_topk_bench");
  cudaStream_t stream;
  MEGACTX_CUDA_CHECK(cudaStreamCreate(&stream));
  cudaDeviceProp prop;
  MEGACTX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const ReadBandwidth floor = measure_read_bandwidth(size_t{8} << 30, 10, stream);
  std::printf("# fallback top-k: radix select vs the former quadratic kernel (%s)\n\n", prop.name);
  std::printf(
      "read-only bandwidth: %.0f GB/s (the floor of reading the scores); device-to-device "
      "copy %.0f GB/s (read + write)\n\n",
      floor.read_gbs, floor.copy_gbs);
  std::printf(
      "| rows x context | topk | radix us | quadratic us | speedup | radix GB/s of scores "
      "| of read bw | same indices |\n|---|---|---|---|---|---|---|---|\n");

  std::vector<Case> cases;
  for (const int64_t topk : {int64_t{128}, int64_t{2048}}) {
    cases.push_back({"1 x 8K", 1, 8192, topk, false});
    cases.push_back({"1 x 64K", 1, 65536, topk, false});
    cases.push_back({"1 x 128K", 1, 131072, topk, false});
    cases.push_back({"128 x 8K", 128, 8192, topk, false});
    cases.push_back({"8K prefill (8192 causal rows)", 8192, 8192, topk, true});
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const Case& c : cases) {
    std::vector<float> scores(static_cast<size_t>(c.rows * c.context));
    for (float& s : scores) s = normal(rng);
    std::vector<int32_t> positions(static_cast<size_t>(c.rows));
    int64_t visible_total = 0;
    for (int64_t t = 0; t < c.rows; ++t) {
      positions[t] = static_cast<int32_t>(c.causal ? c.context - c.rows + t : c.context - 1);
      visible_total += positions[t] + 1;
    }
    float* d_scores = device_alloc<float>(scores.size());
    int32_t* d_positions = device_alloc<int32_t>(positions.size());
    int32_t* d_radix = device_alloc<int32_t>(static_cast<size_t>(c.rows * c.topk));
    int32_t* d_quadratic = device_alloc<int32_t>(static_cast<size_t>(c.rows * c.topk));
    int32_t* d_counts = device_alloc<int32_t>(static_cast<size_t>(c.rows));
    MEGACTX_CUDA_CHECK(
        cudaMemcpy(d_scores, scores.data(), scores.size() * 4, cudaMemcpyHostToDevice));
    MEGACTX_CUDA_CHECK(
        cudaMemcpy(d_positions, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice));
    PositionTopkParams p;
    p.scores = d_scores;
    p.score_stride = c.context;
    p.positions = d_positions;
    p.rows = c.rows;
    p.topk = c.topk;
    p.max_context = c.context;
    p.counts = d_counts;
    PositionTopkParams q = p;
    p.indices = d_radix;
    q.indices = d_quadratic;

    const double budget = quick ? 50.0 : 300.0;
    const double radix_ms = median_ms(
        stream, [&] { position_topk(p, stream); }, budget, 200);
    // The quadratic kernel takes seconds on the prefill case: a few repetitions.
    const double quadratic_ms = median_ms(
        stream, [&] { position_topk_quadratic(q, stream); }, budget, quick ? 3 : 20);
    std::vector<int32_t> radix(static_cast<size_t>(c.rows * c.topk)), quadratic(radix.size());
    MEGACTX_CUDA_CHECK(cudaMemcpy(radix.data(), d_radix, radix.size() * 4, cudaMemcpyDeviceToHost));
    MEGACTX_CUDA_CHECK(
        cudaMemcpy(quadratic.data(), d_quadratic, quadratic.size() * 4, cudaMemcpyDeviceToHost));
    const bool same = radix == quadratic;
    const double gbs = static_cast<double>(visible_total) * 4.0 / (radix_ms * 1e6);
    std::printf("| %s | %lld | %.1f | %.1f | %.0fx | %.0f | %.1f%% | %s |\n", c.name.c_str(),
                static_cast<long long>(c.topk), radix_ms * 1e3, quadratic_ms * 1e3,
                quadratic_ms / radix_ms, gbs, 100.0 * gbs / floor.read_gbs, same ? "yes" : "NO");
    std::fflush(stdout);
    for (void* pointer : {static_cast<void*>(d_scores), static_cast<void*>(d_positions),
                          static_cast<void*>(d_radix), static_cast<void*>(d_quadratic),
                          static_cast<void*>(d_counts)})
      MEGACTX_CUDA_CHECK(cudaFree(pointer));
  }
  MEGACTX_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
