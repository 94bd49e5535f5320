#include "engine/speculation_policy.h"

#include <algorithm>
#include <bit>

namespace megactx {

int SpeculationPolicy::bucket_of(int64_t batch) {
  const auto width = std::bit_width(static_cast<uint64_t>(std::max<int64_t>(batch, 1)));
  return std::min(static_cast<int>(width) - 1, kBuckets - 1);
}

bool SpeculationPolicy::choose(Bucket& bucket) const {
  // Measure drafting first, then plain decode, then the faster way, with the
  // slower one now and then.
  if (!bucket.drafted.ready()) return true;
  if (!bucket.plain.ready()) return false;
  const bool faster = bucket.drafted.rate() >= bucket.plain.rate();
  return bucket.decisions % kRefreshEvery == 0 ? !faster : faster;
}

bool SpeculationPolicy::speculate(int64_t batch) {
  bool drafts = disable_batch_size_ <= 0 || batch < disable_batch_size_;
  if (drafts && adaptive_) {
    Bucket& bucket = buckets_[bucket_of(batch)];
    ++bucket.decisions;
    drafts = choose(bucket);
  }
  if (!drafts) ++off_steps_;
  return drafts;
}

void SpeculationPolicy::record(int64_t batch, bool drafted, double seconds, int64_t tokens) {
  if (!adaptive_ || batch < 1 || seconds <= 0 || tokens < 1) return;
  Measure& m = drafted ? buckets_[bucket_of(batch)].drafted : buckets_[bucket_of(batch)].plain;
  if (m.steps++ == 0) return;  // the first step may have captured CUDA Graphs
  const double t = static_cast<double>(tokens);
  if (m.steps == 2) {
    m.seconds = seconds;
    m.tokens = t;
  } else {
    m.seconds += kDecay * (seconds - m.seconds);
    m.tokens += kDecay * (t - m.tokens);
  }
}

double SpeculationPolicy::tokens_per_second(int64_t batch, bool drafted) const {
  const Bucket& bucket = buckets_[bucket_of(batch)];
  const Measure& m = drafted ? bucket.drafted : bucket.plain;
  return m.steps > 1 ? m.rate() : 0.0;
}

}  // namespace megactx
