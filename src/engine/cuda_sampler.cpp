// CudaSampler (cuda_sampler.h): the row split is plain C++; the sampler itself
// is compiled only in CUDA builds.
#include "engine/cuda_sampler.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

#if MEGACTX_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/sampling/sampling.h"
#include "model/cuda/device_buffer.h"
#endif

namespace megactx {

bool device_samples_row(const SamplingRow& row, int64_t vocab) {
  const SamplingParams& params = *row.params;
  if (!row.masked_tokens.empty() || !params.logit_bias.empty()) return false;
  // The kernel reports the raw distribution's logprobs and its top alternatives only.
  if (!row.logprob_token_ids.empty() || row.logprob_temperature != 1.0) return false;
  // A grammar mask goes up with the row (the kernel applies it), unless it is
  // too short for the vocabulary (the CPU sampler reports that).
  if (!row.allowed.empty() && static_cast<int64_t>(row.allowed.size()) * 32 < vocab) return false;
  if (row.top_logprobs > std::min(kDeviceMaxTopLogprobs, vocab)) return false;
  const bool has_output = row.output_counts != nullptr && !row.output_counts->empty();
  if (params.repetition_penalty != 1.0 && (!row.prompt_tokens.empty() || has_output)) return false;
  if ((params.frequency_penalty != 0.0 || params.presence_penalty != 0.0) && has_output) {
    return false;
  }
  // The kernel holds top_p and min_p as float: a top_p just below 1 that
  // rounds to 1.0f would turn top-p off there but not on the CPU.
  if (params.top_p < 1.0 && static_cast<float>(params.top_p) >= 1.0f) return false;
  if (params.min_p > 0.0 && static_cast<float>(params.min_p) <= 0.0f) return false;
  return true;
}

#if MEGACTX_HAVE_CUDA

static_assert(kDeviceMaxTopLogprobs == cuda::kMaxTopLogprobs);

namespace {

void check_logits(const Tensor& logits) {
  MEGACTX_CHECK(logits.dtype() == DType::F32 && logits.rank() == 2,
                "CUDA sampler needs float32 logits [rows, vocab], got {} {}",
                dtype_name(logits.dtype()), shape_string(logits.shape()));
}

}  // namespace

struct CudaSampler::DeviceState {
  int device = 0;
  cudaStream_t stream = nullptr;
  bool owns_stream = true;
  cuda::DeviceBuffer params;  // [device rows] SampleRowParams
  cuda::DeviceBuffer outs;    // [device rows] SampleOut
  cuda::DeviceBuffer masks;   // [masked rows][mask words] grammar masks
  cuda::PinnedBuffer host_params, host_outs, host_masks;
};

namespace {

// Grows `buffer` to `bytes` in steps of at least 64 rows' worth, doubling: a
// DeviceBuffer growth frees memory, which makes the CUDA model capture its
// decode graphs again (model/cuda/decode_graph.h), so it should happen a
// handful of times, not whenever one more request is constrained.
uint32_t* grow_masks(cuda::DeviceBuffer& buffer, size_t bytes, size_t row_bytes) {
  if (bytes > buffer.bytes()) {
    size_t capacity = std::max<size_t>(64 * row_bytes, buffer.bytes());
    while (capacity < bytes) capacity *= 2;
    buffer.ensure(capacity);
  }
  return buffer.as<uint32_t>();
}

}  // namespace

CudaSampler::CudaSampler(int device_ordinal, void* stream)
    : device_(std::make_unique<DeviceState>()) {
  if (device_ordinal >= 0) {
    MEGACTX_CUDA_CHECK(cudaSetDevice(device_ordinal));
    device_->device = device_ordinal;
  } else {
    MEGACTX_CUDA_CHECK(cudaGetDevice(&device_->device));
  }
  if (stream != nullptr) {
    device_->stream = static_cast<cudaStream_t>(stream);
    device_->owns_stream = false;
  } else {
    MEGACTX_CUDA_CHECK(cudaStreamCreateWithFlags(&device_->stream, cudaStreamNonBlocking));
  }
}

CudaSampler::~CudaSampler() {
  if (device_ && device_->stream != nullptr) {
    cudaStreamSynchronize(device_->stream);
    if (device_->owns_stream) cudaStreamDestroy(device_->stream);
  }
}

void CudaSampler::enqueue_row_copies(const Tensor& logits, std::span<const int64_t> rows) {
  const int64_t vocab = logits.dim(1);
  const auto count = static_cast<int64_t>(rows.size());
  if (host_logits_.rank() != 2 || host_logits_.dim(1) != vocab || host_logits_.dim(0) < count) {
    // Page-locked, so the copies overlap the kernel.
    host_logits_ = Tensor();
    const int64_t capacity = std::max<int64_t>(count, 8);
    void* data = nullptr;
    MEGACTX_CUDA_CHECK(
        cudaMallocHost(&data, static_cast<size_t>(capacity * vocab) * sizeof(float)));
    host_logits_ = Tensor::adopt(data, {capacity, vocab}, DType::F32, Device::CPU,
                                 [](void* pointer) { cudaFreeHost(pointer); });
  }
  const auto row_bytes = static_cast<size_t>(vocab) * sizeof(float);
  const auto* source = logits.data<float>();
  // Consecutive rows travel in one copy (a scoring chunk's rows usually are).
  for (int64_t i = 0; i < count;) {
    int64_t run = 1;
    while (i + run < count &&
           rows[static_cast<size_t>(i + run)] == rows[static_cast<size_t>(i)] + run)
      ++run;
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(
        host_logits_.data<float>() + i * vocab, source + rows[static_cast<size_t>(i)] * vocab,
        static_cast<size_t>(run) * row_bytes, cudaMemcpyDeviceToHost, device_->stream));
    i += run;
  }
  stats_.logit_rows_copied += count;
}

void CudaSampler::sample(const Tensor& logits, std::span<const SamplingRow> rows,
                         std::span<SampleResult> results) {
  stats_ = {};
  if (logits.device() == Device::CPU) {
    cpu_.sample(logits, rows, results);
    stats_.host_rows = static_cast<int64_t>(rows.size());
    return;
  }
  check_logits(logits);
  MEGACTX_CHECK(results.size() >= rows.size(), "sampler: {} results for {} rows", results.size(),
                rows.size());
  const int64_t vocab = logits.dim(1);
  device_index_.clear();
  host_index_.clear();
  for (size_t i = 0; i < rows.size(); ++i) {
    const SamplingRow& row = rows[i];
    MEGACTX_CHECK(row.params != nullptr, "sampler: row {} has no parameters", i);
    MEGACTX_CHECK(row.logits_row >= 0 && row.logits_row < logits.dim(0),
                  "sampler: logits row {} of {}", row.logits_row, logits.dim(0));
    (!host_only_ && device_samples_row(row, vocab) ? device_index_ : host_index_).push_back(i);
  }
  if (rows.empty()) return;
  DeviceState& d = *device_;
  MEGACTX_CUDA_CHECK(cudaSetDevice(d.device));

  // Device rows: one launch; the outputs come back on the same stream.
  const size_t device_count = device_index_.size();
  cuda::SampleOut* outs = nullptr;
  if (device_count > 0) {
    // Grammar masks of the device rows, back to back, uploaded with the params.
    const auto mask_words = static_cast<size_t>((vocab + 31) / 32);
    size_t masked = 0;
    for (const size_t i : device_index_) masked += rows[i].allowed.empty() ? 0 : 1;
    uint32_t* host_masks = masked > 0 ? d.host_masks.get<uint32_t>(masked * mask_words) : nullptr;
    uint32_t* device_masks = nullptr;
    size_t next_mask = 0;
    auto* params = d.host_params.get<cuda::SampleRowParams>(device_count);
    for (size_t j = 0; j < device_count; ++j) {
      const SamplingRow& row = rows[device_index_[j]];
      const SamplingParams& p = *row.params;
      cuda::SampleRowParams& out = params[j];
      out = cuda::SampleRowParams{};
      out.logits_row = row.logits_row;
      if (is_greedy(p)) {
        // Decided here in double, as the CPU sampler decides it.
        out.temperature = 0.0f;
        out.top_k = 1;
      } else {
        out.temperature = static_cast<float>(p.temperature);
        // top_k beyond the vocabulary (or int32) is no top-k, as on the CPU.
        out.top_k = p.top_k > 0 && p.top_k < vocab ? static_cast<int32_t>(p.top_k) : 0;
        out.top_p = static_cast<float>(p.top_p);
        out.min_p = static_cast<float>(p.min_p);
        out.uniform = sampling_uniform(row.seed, row.draw_index);
      }
      out.top_logprobs = static_cast<int32_t>(std::max<int64_t>(row.top_logprobs, 0));
      if (!row.allowed.empty()) {
        std::copy_n(row.allowed.begin(), mask_words, host_masks + next_mask * mask_words);
        out.mask_offset = static_cast<int64_t>(next_mask * mask_words);
        ++next_mask;
      }
    }
    if (masked > 0) {
      const size_t bytes = masked * mask_words * sizeof(uint32_t);
      device_masks = grow_masks(d.masks, bytes, mask_words * sizeof(uint32_t));
      MEGACTX_CUDA_CHECK(
          cudaMemcpyAsync(device_masks, host_masks, bytes, cudaMemcpyHostToDevice, d.stream));
    }
    auto* device_params = d.params.get<cuda::SampleRowParams>(static_cast<int64_t>(device_count));
    auto* device_outs = d.outs.get<cuda::SampleOut>(static_cast<int64_t>(device_count));
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(device_params, params,
                                       device_count * sizeof(cuda::SampleRowParams),
                                       cudaMemcpyHostToDevice, d.stream));
    cuda::sample_rows(logits.data<float>(), vocab, device_params,
                      static_cast<int64_t>(device_count), device_masks, device_outs, d.stream);
    outs = d.host_outs.get<cuda::SampleOut>(device_count);
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(outs, device_outs, device_count * sizeof(cuda::SampleOut),
                                       cudaMemcpyDeviceToHost, d.stream));
  }

  // Host rows: their logits rows (distinct, ascending) to the host, while the kernel runs.
  copied_rows_.clear();
  for (const size_t i : host_index_) copied_rows_.push_back(rows[i].logits_row);
  std::sort(copied_rows_.begin(), copied_rows_.end());
  copied_rows_.erase(std::unique(copied_rows_.begin(), copied_rows_.end()), copied_rows_.end());
  if (!copied_rows_.empty()) enqueue_row_copies(logits, copied_rows_);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(d.stream));

  if (!host_index_.empty()) {
    host_rows_.clear();
    for (const size_t i : host_index_) {
      SamplingRow row = rows[i];
      row.logits_row = std::lower_bound(copied_rows_.begin(), copied_rows_.end(), row.logits_row) -
                       copied_rows_.begin();
      host_rows_.push_back(row);
    }
    host_results_.resize(host_rows_.size());
    const Tensor host = host_logits_.slice_rows(0, static_cast<int64_t>(copied_rows_.size()));
    cpu_.sample(host, host_rows_, host_results_);
    for (size_t j = 0; j < host_index_.size(); ++j) {
      results[host_index_[j]] = std::move(host_results_[j]);
    }
  }
  for (size_t j = 0; j < device_count; ++j) {
    const SamplingRow& row = rows[device_index_[j]];
    const cuda::SampleOut& out = outs[j];
    SampleResult& result = results[device_index_[j]];
    result.token = out.token;
    result.logprob = out.logprob;
    result.top.clear();
    for (int64_t k = 0; k < row.top_logprobs; ++k) {
      result.top.emplace_back(out.top_ids[k], out.top_logprobs[k]);
    }
  }
  stats_.device_rows = static_cast<int64_t>(device_count);
  stats_.host_rows = static_cast<int64_t>(host_index_.size());
}

void CudaSampler::score(const Tensor& logits, std::span<const LogprobQuery> queries,
                        std::span<TokenLogprob> results) {
  stats_ = {};
  if (logits.device() == Device::CPU) {
    cpu_.score(logits, queries, results);
    return;
  }
  check_logits(logits);
  MEGACTX_CHECK(results.size() >= queries.size(), "sampler: {} results for {} queries",
                results.size(), queries.size());
  copied_rows_.clear();
  for (const LogprobQuery& query : queries) {
    MEGACTX_CHECK(query.logits_row >= 0 && query.logits_row < logits.dim(0),
                  "sampler: logprob query for row {} of {}", query.logits_row, logits.dim(0));
    copied_rows_.push_back(query.logits_row);
  }
  if (queries.empty()) return;
  std::sort(copied_rows_.begin(), copied_rows_.end());
  copied_rows_.erase(std::unique(copied_rows_.begin(), copied_rows_.end()), copied_rows_.end());
  MEGACTX_CUDA_CHECK(cudaSetDevice(device_->device));
  enqueue_row_copies(logits, copied_rows_);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(device_->stream));
  host_queries_.assign(queries.begin(), queries.end());
  for (LogprobQuery& query : host_queries_) {
    query.logits_row =
        std::lower_bound(copied_rows_.begin(), copied_rows_.end(), query.logits_row) -
        copied_rows_.begin();
  }
  // The CpuSampler checks the token ids against the vocabulary.
  cpu_.score(host_logits_.slice_rows(0, static_cast<int64_t>(copied_rows_.size())), host_queries_,
             results);
}

Tensor CudaSampler::rows_on_host(const Tensor& logits, std::span<const int64_t> rows) {
  if (logits.device() == Device::CPU) return Sampler::rows_on_host(logits, rows);
  // enqueue_row_copies wants distinct rows in ascending order; the answer
  // keeps the caller's order.
  copied_rows_.assign(rows.begin(), rows.end());
  for (const int64_t row : copied_rows_)
    MEGACTX_CHECK(row >= 0 && row < logits.dim(0), "sampler: logits row {} of {}", row,
                  logits.dim(0));
  std::sort(copied_rows_.begin(), copied_rows_.end());
  copied_rows_.erase(std::unique(copied_rows_.begin(), copied_rows_.end()), copied_rows_.end());
  MEGACTX_CUDA_CHECK(cudaSetDevice(device_->device));
  enqueue_row_copies(logits, copied_rows_);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(device_->stream));
  const int64_t vocab = logits.dim(1);
  Tensor out = Tensor::empty({static_cast<int64_t>(rows.size()), vocab});
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto at =
        std::lower_bound(copied_rows_.begin(), copied_rows_.end(), rows[i]) - copied_rows_.begin();
    std::memcpy(out.data<float>() + static_cast<int64_t>(i) * vocab,
                host_logits_.data<float>() + at * vocab,
                static_cast<size_t>(vocab) * sizeof(float));
  }
  return out;
}

#endif  // MEGACTX_HAVE_CUDA

std::unique_ptr<Sampler> make_sampler(const LanguageModel& model, bool host_logprobs) {
#if MEGACTX_HAVE_CUDA
  if (void* stream = model.compute_stream()) {
    auto sampler = std::make_unique<CudaSampler>(-1, stream);
    sampler->set_host_only(host_logprobs);
    return sampler;
  }
#else
  (void)host_logprobs;
#endif
  MEGACTX_CHECK(model.device() == Device::CPU,
                "engine: a device model in a build without its device's sampler");
  return std::make_unique<CpuSampler>();
}

}  // namespace megactx
