// Where a CUDA forward pass spends its time, by phase (attention projections,
// indexer, sparse attention, MoE, ...): CUDA events recorded on the model's
// stream around each phase, read after the forward's final synchronisation.
// Off unless MEGACTX_CUDA_PHASE_TIMES=1 (every forward) or =decode (only
// forwards of one new token per sequence); the report goes to stderr when the
// model is destroyed (model_decode_bench, profiling by hand: the GPU machine
// has no Nsight Systems).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace megactx::cuda {

class PhaseTimer {
 public:
  PhaseTimer();
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

  bool enabled() const { return enabled_; }
  bool active() const { return active_; }
  // Called at the start of each forward: whether this one is timed.
  void begin_forward(bool decode_step) { active_ = enabled_ && (decode_step || !decode_only_); }
  // Marks the start of `phase` (and the end of the previous one) on `stream`.
  void mark(const char* phase, cudaStream_t stream);
  // While muted, marks are ignored: a caller times a block (the MTP layer's
  // decoder layer) as one phase although the block marks its own phases.
  void set_muted(bool muted) { muted_ = muted; }
  // Ends the last phase; call after the stream was synchronised.
  void collect(cudaStream_t stream);
  // Milliseconds per phase over every forward so far, largest first.
  std::string report() const;

 private:
  bool enabled_ = false;
  bool decode_only_ = false;
  bool active_ = false;
  bool muted_ = false;
  std::vector<cudaEvent_t> events_;  // pool, reused every forward
  std::vector<const char*> phases_;  // phase of events_[i] (i < used_)
  size_t used_ = 0;
  std::map<std::string, double> total_ms_;
  int64_t forwards_ = 0;
};

}  // namespace megactx::cuda
