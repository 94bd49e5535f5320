// The gateway's counters in /metrics (Prometheus text): tool calls screened,
// flagged by a rule, confirmed as hacks, intercepted; judge verdicts and
// latency; session turns by how they matched the history; the store.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "gateway/session_store.h"
#include "server/metrics.h"

namespace megactx::gateway {

struct GatewayMetrics {
  GatewayMetrics();
  std::atomic<uint64_t> calls_screened{0};
  std::atomic<uint64_t> calls_flagged{0};
  std::atomic<uint64_t> calls_confirmed{0};
  std::atomic<uint64_t> calls_intercepted{0};
  std::atomic<uint64_t> judge_hack{0}, judge_legitimate{0}, judge_unparseable{0}, judge_failed{0};
  server::Histogram judge_latency;  // seconds
  std::atomic<uint64_t> turns_start{0}, turns_append{0}, turns_realign{0}, turns_fork{0},
      turns_compaction{0};
  std::atomic<uint64_t> turns_failed{0};  // engine errors (nothing recorded)

  void count_turn(const std::string& kind);
  std::string render(const StoreStats& store) const;
};

}  // namespace megactx::gateway
