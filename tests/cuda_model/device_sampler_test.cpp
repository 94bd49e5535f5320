// The device sampler (kernels/cuda/sampling) against the CPU sampler
// (engine/cpu_sampler.h), which defines the semantics: same logits, same
// parameters and the same uniform give the same token, and the same logprobs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/cpu_sampler.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/sampling/sampling.h"

namespace megactx {
namespace {

struct Case {
  double temperature;
  int64_t top_k;
  double top_p;
  double min_p;
};

TEST(DeviceSampler, SameTokensAndLogprobsAsCpuSampler) {
  const int64_t vocab = 5000, rows_per_case = 16;
  const std::vector<Case> cases = {
      {0.0, -1, 1.0, 0.0}, {1.0, -1, 1.0, 0.0},  {0.7, 50, 1.0, 0.0},    {1.0, -1, 0.9, 0.0},
      {0.8, 40, 0.8, 0.0}, {1.0, -1, 1.0, 0.05}, {1.3, 100, 0.95, 0.02}, {1.0, 1, 1.0, 0.0}};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t rows = rows_per_case * static_cast<int64_t>(cases.size());
  Tensor logits = Tensor::empty({rows, vocab});
  for (int64_t i = 0; i < rows * vocab; ++i) logits.data<float>()[i] = normal(rng);
  // A few exact ties, which the order (prob desc, id asc) must break by id.
  for (int64_t r = 0; r < rows; ++r)
    logits.data<float>()[r * vocab + 17] = logits.data<float>()[r * vocab + 3];

  std::vector<SamplingParams> params(static_cast<size_t>(rows));
  std::vector<SamplingRow> cpu_rows(static_cast<size_t>(rows));
  std::vector<cuda::SampleRowParams> device_rows(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const Case& c = cases[static_cast<size_t>(r / rows_per_case)];
    SamplingParams& p = params[static_cast<size_t>(r)];
    p.temperature = c.temperature;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    SamplingRow& row = cpu_rows[static_cast<size_t>(r)];
    row.logits_row = r;
    row.params = &p;
    row.seed = 1234;
    row.draw_index = static_cast<uint64_t>(r);
    row.want_logprob = true;
    row.top_logprobs = 5;
    cuda::SampleRowParams& d = device_rows[static_cast<size_t>(r)];
    d.logits_row = r;
    d.temperature = static_cast<float>(c.temperature);
    d.top_k = static_cast<int32_t>(c.top_k);
    d.top_p = static_cast<float>(c.top_p);
    d.min_p = static_cast<float>(c.min_p);
    d.uniform = sampling_uniform(row.seed, row.draw_index);
    d.top_logprobs = 5;
  }
  std::vector<SampleResult> want(static_cast<size_t>(rows));
  CpuSampler().sample(logits, cpu_rows, want);

  float* d_logits = nullptr;
  cuda::SampleRowParams* d_rows = nullptr;
  cuda::SampleOut* d_out = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&d_logits, logits.nbytes()));
  MEGACTX_CUDA_CHECK(cudaMalloc(&d_rows, device_rows.size() * sizeof(cuda::SampleRowParams)));
  MEGACTX_CUDA_CHECK(cudaMalloc(&d_out, device_rows.size() * sizeof(cuda::SampleOut)));
  MEGACTX_CUDA_CHECK(cudaMemcpy(d_logits, logits.raw(), logits.nbytes(), cudaMemcpyHostToDevice));
  MEGACTX_CUDA_CHECK(cudaMemcpy(d_rows, device_rows.data(),
                                device_rows.size() * sizeof(cuda::SampleRowParams),
                                cudaMemcpyHostToDevice));
  cuda::sample_rows(d_logits, vocab, d_rows, rows, nullptr, d_out, nullptr);
  std::vector<cuda::SampleOut> got(static_cast<size_t>(rows));
  MEGACTX_CUDA_CHECK(
      cudaMemcpy(got.data(), d_out, got.size() * sizeof(cuda::SampleOut), cudaMemcpyDeviceToHost));
  cudaFree(d_logits);
  cudaFree(d_rows);
  cudaFree(d_out);

  for (int64_t r = 0; r < rows; ++r) {
    const SampleResult& w = want[static_cast<size_t>(r)];
    const cuda::SampleOut& g = got[static_cast<size_t>(r)];
    EXPECT_EQ(g.token, w.token) << "row " << r;
    EXPECT_NEAR(g.logprob, w.logprob, 1e-4) << "row " << r;
    ASSERT_EQ(w.top.size(), 5u);
    for (size_t j = 0; j < 5; ++j) {
      EXPECT_EQ(g.top_ids[j], w.top[j].first) << "row " << r << " rank " << j;
      EXPECT_NEAR(g.top_logprobs[j], w.top[j].second, 1e-4) << "row " << r << " rank " << j;
    }
  }
}

}  // namespace
}  // namespace megactx
