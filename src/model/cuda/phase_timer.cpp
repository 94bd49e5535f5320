#if MEGACTX_HAVE_CUDA
#include "model/cuda/phase_timer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/cuda/common/cuda_check.h"

namespace megactx::cuda {

PhaseTimer::PhaseTimer() {
  const char* flag = std::getenv("MEGACTX_CUDA_PHASE_TIMES");
  decode_only_ = flag != nullptr && std::strcmp(flag, "decode") == 0;
  enabled_ = decode_only_ || (flag != nullptr && std::strcmp(flag, "1") == 0);
}

PhaseTimer::~PhaseTimer() {
  for (cudaEvent_t event : events_) cudaEventDestroy(event);
}

void PhaseTimer::mark(const char* phase, cudaStream_t stream) {
  if (!active_ || muted_) return;
  if (used_ == events_.size()) {
    cudaEvent_t event = nullptr;
    MEGACTX_CUDA_CHECK(cudaEventCreate(&event));
    events_.push_back(event);
    phases_.push_back(nullptr);
  }
  MEGACTX_CUDA_CHECK(cudaEventRecord(events_[used_], stream));
  phases_[used_++] = phase;
}

void PhaseTimer::collect(cudaStream_t stream) {
  if (!active_ || used_ == 0) return;
  mark("end", stream);
  MEGACTX_CUDA_CHECK(cudaEventSynchronize(events_[used_ - 1]));
  for (size_t i = 0; i + 1 < used_; ++i) {
    float ms = 0.0f;
    MEGACTX_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    total_ms_[phases_[i]] += ms;
  }
  used_ = 0;
  ++forwards_;
}

std::string PhaseTimer::report() const {
  std::vector<std::pair<double, std::string>> rows;
  double total = 0.0;
  for (const auto& [phase, ms] : total_ms_) {
    rows.emplace_back(ms, phase);
    total += ms;
  }
  std::sort(rows.rbegin(), rows.rend());
  std::string out =
      fmt::format("CUDA phase times over {} forwards ({:.2f} ms in all):\n", forwards_, total);
  for (const auto& [ms, phase] : rows) {
    out += fmt::format("  {:<22} {:10.3f} ms  {:5.1f}%\n", phase, ms, 100.0 * ms / total);
  }
  return out;
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
