// CudaSampler: the Sampler of sampler.h over device float32 logits
// [rows, vocab] (the CUDA model with CudaModelOptions::logits_on_device).
//
// One kernels/cuda/sampling launch per step samples every row the kernel does
// exactly as the CpuSampler (temperature, top-k, top-p, min-p, logprobs of
// the unmodified logits, the same sampling_uniform draw); only its SampleOut
// rows (token, logprob, top alternatives) come back to the host. A row that
// needs what the kernel does not do -- a penalty that changes its logits, the
// min_new_tokens mask, more top alternatives than the kernel returns -- and
// every score() query copy just their logits rows to the host and go through
// the CpuSampler. Why the host and not penalties applied on the device: the
// logprobs are of the *unmodified* logits, which the kernel computes from the
// logits it samples from. Host logits go to the CpuSampler unchanged.
// Structured-output rows stay on the device: their grammar bitmasks
// ([rows][vocab / 32] words) are uploaded with the row parameters on the
// model's stream and applied inside the sampling kernel, so constrained and
// free rows share the one launch and the decode step's CUDA Graph is untouched
// (the sampler runs after the graph's replay, outside it).
//
// Plain C++ header; CudaSampler exists only in builds with MEGACTX_HAVE_CUDA
// (device_samples_row everywhere, so the split is testable on the CPU).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/cpu_sampler.h"
#include "engine/sampler.h"
#include "model/language_model.h"

namespace megactx {

// Top-logprob alternatives the device kernel returns at most
// (cuda::kMaxTopLogprobs; cuda_sampler.cpp checks they agree).
constexpr int64_t kDeviceMaxTopLogprobs = 20;

// True when the device kernel gives `row` the CpuSampler's result over a
// vocabulary of `vocab`: no penalty that would change a logit, no masked ids
// (a grammar bitmask is fine),
// at most min(kDeviceMaxTopLogprobs, vocab) alternatives, and parameters that
// keep their meaning in the kernel's float32 fields.
bool device_samples_row(const SamplingRow& row, int64_t vocab);

// The sampler of `model`'s logits: a CudaSampler on the model's compute
// stream for a model with one, else the CpuSampler. `host_logprobs` (the
// deterministic mode): every row is sampled by the CpuSampler, so that a
// sampled token's logprob is the one score() computes from the same logits
// (the device kernel's log-softmax sums in another order).
std::unique_ptr<Sampler> make_sampler(const LanguageModel& model, bool host_logprobs = false);

// What the last sample()/score() call did (tests, metrics).
struct CudaSamplerStats {
  int64_t device_rows = 0;        // sampled by the kernel
  int64_t host_rows = 0;          // sampled by the CpuSampler
  int64_t logit_rows_copied = 0;  // logits rows brought to the host
};

class CudaSampler final : public Sampler {
 public:
  // Uses the current CUDA device when device_ordinal < 0. `stream` (a
  // cudaStream_t; null: a stream of its own): run on the model's stream so
  // that sampling is ordered after the forward without a host sync
  // (model/cuda/cuda_model.h cuda_model_stream).
  explicit CudaSampler(int device_ordinal = 0, void* stream = nullptr);
  ~CudaSampler() override;
  CudaSampler(const CudaSampler&) = delete;
  CudaSampler& operator=(const CudaSampler&) = delete;

  void sample(const Tensor& logits, std::span<const SamplingRow> rows,
              std::span<SampleResult> results) override;
  void score(const Tensor& logits, std::span<const LogprobQuery> queries,
             std::span<TokenLogprob> results) override;
  // Device rows copied to the host (the verification operations' rows).
  Tensor rows_on_host(const Tensor& logits, std::span<const int64_t> rows) override;

  const CudaSamplerStats& last_stats() const { return stats_; }
  // Every row through the CpuSampler (make_sampler's host_logprobs).
  void set_host_only(bool on) { host_only_ = on; }

 private:
  struct DeviceState;  // stream, device and pinned buffers (cuda_sampler.cpp)

  // Copies the distinct logits rows `rows` (ascending) of device `logits`
  // into host_logits_ [rows.size(), vocab], enqueued on the stream.
  void enqueue_row_copies(const Tensor& logits, std::span<const int64_t> rows);

  std::unique_ptr<DeviceState> device_;
  CpuSampler cpu_;
  CudaSamplerStats stats_;
  bool host_only_ = false;
  // Per-call scratch, kept for its capacity.
  std::vector<size_t> device_index_, host_index_;
  std::vector<int64_t> copied_rows_;
  std::vector<SamplingRow> host_rows_;
  std::vector<SampleResult> host_results_;
  std::vector<LogprobQuery> host_queries_;
  Tensor host_logits_;
};

}  // namespace megactx
