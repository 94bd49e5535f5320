// CudaSampler (engine/cuda_sampler.h) against the CpuSampler, which defines
// the semantics: random logits on the device, rows of every kind in one call
// -- greedy, sampled with top-k/top-p/min-p, logprobs with a few or more than
// the kernel's top alternatives, repetition/frequency/presence penalties, the
// min_new_tokens mask -- give the same tokens and logprobs within 1e-4, each
// row going where device_samples_row says; score() equals the CpuSampler's.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <random>
#include <unordered_map>
#include <vector>

#include "engine/cpu_sampler.h"
#include "engine/cuda_sampler.h"
#include "kernels/cuda/common/cuda_check.h"

namespace megactx {
namespace {

Tensor to_device(const Tensor& host) {
  void* data = nullptr;
  MEGACTX_CUDA_CHECK(cudaMalloc(&data, host.nbytes()));
  MEGACTX_CUDA_CHECK(cudaMemcpy(data, host.raw(), host.nbytes(), cudaMemcpyHostToDevice));
  return Tensor::adopt(data, host.shape(), host.dtype(), Device::CUDA,
                       [](void* pointer) { cudaFree(pointer); });
}

Tensor random_logits(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  Tensor logits = Tensor::empty({rows, vocab});
  for (int64_t i = 0; i < rows * vocab; ++i) logits.data<float>()[i] = normal(rng);
  // Exact ties, broken by the lower id on both backends.
  for (int64_t r = 0; r < rows; ++r)
    logits.data<float>()[r * vocab + 11] = logits.data<float>()[r * vocab + 5];
  return logits;
}

void expect_same(const SampleResult& got, const SampleResult& want, const SamplingRow& row,
                 int64_t index) {
  EXPECT_EQ(got.token, want.token) << "row " << index;
  if (row.want_logprob || row.top_logprobs > 0) {
    EXPECT_NEAR(got.logprob, want.logprob, 1e-4) << "row " << index;
  }
  ASSERT_EQ(got.top.size(), want.top.size()) << "row " << index;
  for (size_t j = 0; j < want.top.size(); ++j) {
    EXPECT_EQ(got.top[j].first, want.top[j].first) << "row " << index << " rank " << j;
    EXPECT_NEAR(got.top[j].second, want.top[j].second, 1e-4) << "row " << index << " rank " << j;
  }
}

TEST(CudaSampler, EveryKindOfRowEqualsTheCpuSampler) {
  const int64_t vocab = 3000, kinds = 10, per_kind = 6, rows = kinds * per_kind;
  const Tensor host = random_logits(rows + 3, vocab, 11);  // 3 rows nobody samples
  const Tensor device = to_device(host);
  std::vector<SamplingParams> params(static_cast<size_t>(rows));
  std::vector<SamplingRow> sampling(static_cast<size_t>(rows));
  std::unordered_map<int32_t, int32_t> counts = {{3, 2}, {17, 1}, {250, 4}, {5, 1}};
  const std::vector<int32_t> prompt = {1, 3, 5, 99, 2000};  // sorted, distinct
  const std::vector<int32_t> masked = {5, 42};
  int64_t expected_host_rows = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t kind = r / per_kind;
    SamplingParams& p = params[static_cast<size_t>(r)];
    SamplingRow& row = sampling[static_cast<size_t>(r)];
    // Rows read the logits out of order (and row 0 twice).
    row.logits_row = (r * 7 + 3) % rows;
    if (r == rows - 1) row.logits_row = sampling[0].logits_row;
    row.params = &p;
    row.seed = 77 + static_cast<uint64_t>(r);
    row.draw_index = static_cast<uint64_t>(r % 5);
    p.temperature = 0.9;
    switch (kind) {
      case 0:  // greedy with logprobs
        p.temperature = 0.0;
        row.want_logprob = true;
        row.top_logprobs = 3;
        break;
      case 1:  // plain sampling
        break;
      case 2:  // top-k + top-p
        p.top_k = 40;
        p.top_p = 0.85;
        row.want_logprob = true;
        break;
      case 3:  // min-p, many alternatives (the kernel's most)
        p.min_p = 0.05;
        row.top_logprobs = kDeviceMaxTopLogprobs;
        break;
      case 4:  // more alternatives than the kernel returns: host
        row.want_logprob = true;
        row.top_logprobs = kDeviceMaxTopLogprobs + 5;
        break;
      case 5:  // repetition penalty over prompt and output: host
        p.repetition_penalty = 1.3;
        row.prompt_tokens = prompt;
        row.output_counts = &counts;
        row.want_logprob = true;
        break;
      case 6:  // frequency + presence penalties, greedy: host
        p.temperature = 0.0;
        p.frequency_penalty = 1.5;
        p.presence_penalty = 0.7;
        row.output_counts = &counts;
        row.top_logprobs = 2;
        break;
      case 7:  // min_new_tokens mask: host
        p.top_k = 100;
        row.masked_tokens = masked;
        break;
      case 8:  // a penalty set but no output yet: the kernel (nothing changes)
        p.frequency_penalty = 1.0;
        row.output_counts = nullptr;
        p.top_p = 0.95;
        break;
      case 9:  // top_k beyond the vocabulary and top_k 1 alternating
        p.top_k = r % 2 == 0 ? vocab + 10 : 1;
        row.want_logprob = true;
        break;
    }
    if (!device_samples_row(row, vocab)) ++expected_host_rows;
  }
  EXPECT_EQ(expected_host_rows, 4 * per_kind);  // kinds 4-7

  std::vector<SampleResult> want(static_cast<size_t>(rows));
  CpuSampler().sample(host, sampling, want);
  CudaSampler sampler;
  std::vector<SampleResult> got(static_cast<size_t>(rows));
  sampler.sample(device, sampling, got);
  for (int64_t r = 0; r < rows; ++r) {
    expect_same(got[static_cast<size_t>(r)], want[static_cast<size_t>(r)],
                sampling[static_cast<size_t>(r)], r);
  }
  EXPECT_EQ(sampler.last_stats().host_rows, expected_host_rows);
  EXPECT_EQ(sampler.last_stats().device_rows, rows - expected_host_rows);
  // Only the host rows' logits came back (distinct rows).
  EXPECT_LE(sampler.last_stats().logit_rows_copied, expected_host_rows);
  EXPECT_GT(sampler.last_stats().logit_rows_copied, 0);

  // Host logits: the CpuSampler's path, same results.
  std::vector<SampleResult> from_host(static_cast<size_t>(rows));
  sampler.sample(host, sampling, from_host);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(from_host[static_cast<size_t>(r)].token, want[static_cast<size_t>(r)].token);
  }
}

TEST(CudaSampler, AllDeviceRowsCopyNoLogits) {
  const int64_t vocab = 1000, rows = 32;
  const Tensor host = random_logits(rows, vocab, 5);
  const Tensor device = to_device(host);
  SamplingParams p;
  p.temperature = 1.1;
  p.top_p = 0.9;
  std::vector<SamplingRow> sampling(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    sampling[static_cast<size_t>(r)].logits_row = r;
    sampling[static_cast<size_t>(r)].params = &p;
    sampling[static_cast<size_t>(r)].seed = 9;
    sampling[static_cast<size_t>(r)].draw_index = static_cast<uint64_t>(r);
  }
  std::vector<SampleResult> want(static_cast<size_t>(rows)), got(static_cast<size_t>(rows));
  CpuSampler().sample(host, sampling, want);
  CudaSampler sampler;
  sampler.sample(device, sampling, got);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(got[static_cast<size_t>(r)].token, want[static_cast<size_t>(r)].token) << r;
  }
  EXPECT_EQ(sampler.last_stats().device_rows, rows);
  EXPECT_EQ(sampler.last_stats().logit_rows_copied, 0);
}

TEST(CudaSampler, ScoreEqualsTheCpuSampler) {
  const int64_t vocab = 2000, rows = 12;
  const Tensor host = random_logits(rows, vocab, 3);
  const Tensor device = to_device(host);
  std::vector<LogprobQuery> queries;
  for (int64_t r = 0; r < rows; r += 2) queries.push_back({r, static_cast<int32_t>(r * 131), 0, {}, 1.0});
  queries.push_back({5, 7, 30, {}, 1.0});  // more alternatives than the kernel's
  queries.push_back({0, 1999, 3, {}, 1.0});
  std::vector<TokenLogprob> want(queries.size()), got(queries.size());
  CpuSampler().score(host, queries, want);
  CudaSampler sampler;
  sampler.score(device, queries, got);
  for (size_t i = 0; i < queries.size(); ++i) {
    EXPECT_EQ(got[i].token_id, want[i].token_id);
    EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-6) << i;
    ASSERT_EQ(got[i].top.size(), want[i].top.size());
    for (size_t j = 0; j < want[i].top.size(); ++j) EXPECT_EQ(got[i].top[j], want[i].top[j]);
  }
  EXPECT_EQ(sampler.last_stats().logit_rows_copied, 7);  // rows 0, 2, ..., 10 and 5
}

TEST(CudaSampler, BadInputIsAnError) {
  const Tensor device = to_device(random_logits(2, 100, 1));
  SamplingParams p;
  SamplingRow row;
  row.params = &p;
  row.logits_row = 2;
  std::vector<SampleResult> results(1);
  CudaSampler sampler;
  EXPECT_THROW(sampler.sample(device, std::span<const SamplingRow>(&row, 1), results), Error);
  LogprobQuery query{0, 100, 0, {}, 1.0};  // token outside the vocabulary
  std::vector<TokenLogprob> scored(1);
  EXPECT_THROW(sampler.score(device, std::span<const LogprobQuery>(&query, 1), scored), Error);
}

}  // namespace
}  // namespace megactx
