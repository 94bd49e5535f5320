// SpeculationPolicy: whether a decode step drafts, chosen per decode batch.
//
// MTP pays off where a target decode step is expensive per token (small
// batches: the step reads every weight for a few tokens) and can lose where
// it is cheap (large batches: the verification forward of (1 + k) x batch rows
// costs more than the accepted drafts save). Two rules:
//   - a fixed threshold (--speculative-disable-batch-size N): no drafts in a
//     step that decodes N or more requests;
//   - measured (--speculative-auto): per batch-size bucket (1, 2-3, 4-7,
//     8-15, ...) the output tokens per second of pure decode steps with and
//     without drafts (moving averages of the steps' wall time and tokens);
//     a bucket drafts when drafting has been faster. Each way is measured a
//     few times first (the first step of each is left out: it may capture
//     CUDA Graphs), and the slower way runs again every kRefreshEvery steps
//     of the bucket, so that a change in acceptance (other prompts, other
//     sampling) turns the choice around.
// Both are lossless: verification emits the target's tokens either way.
#pragma once

#include <array>
#include <cstdint>

namespace megactx {

class SpeculationPolicy {
 public:
  static constexpr int kBuckets = 16;           // batches up to 2^16
  static constexpr int64_t kWarmup = 3;         // measured steps of each way before choosing
  static constexpr int64_t kRefreshEvery = 32;  // a step of the slower way every this many
  static constexpr double kDecay = 0.2;         // weight of a new step in the averages

  SpeculationPolicy(int64_t disable_batch_size, bool adaptive)
      : disable_batch_size_(disable_batch_size), adaptive_(adaptive) {}

  // Whether a step that decodes `batch` requests drafts (counts the steps
  // that do not in off_steps()).
  bool speculate(int64_t batch);
  // A finished step that decoded `batch` requests and prefilled nothing: it
  // drafted or not, took `seconds` of wall time and emitted `tokens`.
  void record(int64_t batch, bool drafted, double seconds, int64_t tokens);

  int64_t off_steps() const { return off_steps_; }
  // Output tokens per second measured for a bucket's batches (0: not yet).
  double tokens_per_second(int64_t batch, bool drafted) const;

 private:
  struct Measure {
    int64_t steps = 0;               // recorded, the left-out first one included
    double seconds = 0, tokens = 0;  // moving averages per step
    bool ready() const { return steps > kWarmup; }
    double rate() const { return seconds > 0 ? tokens / seconds : 0.0; }
  };
  struct Bucket {
    Measure plain, drafted;
    int64_t decisions = 0;
  };
  static int bucket_of(int64_t batch);
  bool choose(Bucket& bucket) const;

  int64_t disable_batch_size_;
  bool adaptive_;
  std::array<Bucket, kBuckets> buckets_{};
  int64_t off_steps_ = 0;
};

}  // namespace megactx
