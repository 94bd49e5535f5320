// Server metrics in Prometheus text format (exposition format 0.0.4):
// latency histograms observed by the HTTP layer (time to first token, time
// per output token, end to end), token counters, and engine gauges (running
// and waiting requests, KV pages, prefix-cache hit rate, speculative accepted
// length) read from EngineApi::stats() at scrape time.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_api.h"

namespace megactx::server {

class Histogram {
 public:
  // Per-bucket (not cumulative) counts; counts.back() is the +Inf bucket.
  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> counts;
    double sum = 0.0;
    uint64_t count = 0;
  };
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // A consistent copy (the web dashboard's JSON takes percentiles from it).
  Snapshot snapshot() const;
  // "name_bucket{le=...} n" lines, then _sum and _count.
  std::string render(const std::string& name, const std::string& help) const;
  uint64_t count() const;

 private:
  std::vector<double> upper_bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> bucket_counts_;  // cumulative on render, per bucket here
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  Histogram time_to_first_token;    // seconds
  Histogram time_per_output_token;  // seconds, (finish - first token) / (tokens - 1)
  Histogram end_to_end_latency;     // seconds
  std::atomic<uint64_t> prompt_tokens{0};
  std::atomic<uint64_t> generated_tokens{0};
  std::atomic<uint64_t> cached_tokens{0};
  std::atomic<uint64_t> requests_finished{0};
  std::atomic<uint64_t> requests_aborted{0};
  std::atomic<uint64_t> requests_failed{0};  // engine errors

  std::string render(const EngineStats& stats) const;
};

// Times one engine request from submission; feed it every update.
class RequestTimer {
 public:
  explicit RequestTimer(ServerMetrics& metrics);
  void observe(const RequestUpdate& update);

 private:
  using Clock = std::chrono::steady_clock;
  ServerMetrics& metrics_;
  Clock::time_point submitted_;
  Clock::time_point first_token_;
  bool saw_first_token_ = false;
};

}  // namespace megactx::server
