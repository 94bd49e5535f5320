// One JSON snapshot of what the server measures, for the web dashboard
// (GET /ui/stats): the engine's gauges and counters (EngineStats), the HTTP
// layer's token and request counters and its latency histograms with their
// per-bucket counts. The page polls it and takes rates and windowed
// percentiles from the differences between snapshots, as Prometheus'
// rate() and histogram_quantile() would from /metrics.
#pragma once

#include <nlohmann/json.hpp>

#include "engine/engine_api.h"
#include "server/metrics.h"

namespace megactx::server {

// `monotonic_ms` (a steady clock) is the time base of the rates;
// `server_info` is ServerConfig::server_info (device, speculative steps, ...).
nlohmann::json server_stats_json(const ServerMetrics& metrics, const EngineStats& stats,
                                 const nlohmann::json& server_info, double monotonic_ms,
                                 double unix_seconds);

nlohmann::json histogram_json(const Histogram::Snapshot& snapshot);

}  // namespace megactx::server
