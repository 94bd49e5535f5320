#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/request.h"

namespace megactx::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), bucket_counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  std::lock_guard lock(mutex_);
  ++bucket_counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard lock(mutex_);
  return Snapshot{upper_bounds_, bucket_counts_, sum_, count_};
}

uint64_t Histogram::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

std::string Histogram::render(const std::string& name, const std::string& help) const {
  std::lock_guard lock(mutex_);
  std::string out = fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    cumulative += bucket_counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, upper_bounds_[i], cumulative);
  }
  cumulative += bucket_counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cumulative);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
  return out;
}

ServerMetrics::ServerMetrics()
    : time_to_first_token({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                           2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}),
      time_per_output_token({0.0005, 0.001, 0.0025, 0.005, 0.01,  0.015, 0.02,
                             0.025,  0.03,  0.04,   0.05,  0.075, 0.1,   0.15,
                             0.2,    0.3,   0.4,    0.5,   0.75,  1.0,   2.5}),
      end_to_end_latency({0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0, 120.0,
                          300.0, 600.0}) {}

namespace {

std::string scalar(const std::string& name, const std::string& type, const std::string& help,
                   double value) {
  return fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
}

// Data-parallel attention: one series per rank (label dp_rank) of each
// gauge and counter; nothing without it.
std::string data_parallel_ranks(const std::vector<DataParallelRankStats>& ranks) {
  if (ranks.empty()) return {};
  struct Series {
    const char* name;
    const char* type;
    const char* help;
    int64_t DataParallelRankStats::*field;
  };
  static constexpr Series kSeries[] = {
      {"megactx_dp_rank_running_reqs", "gauge",
       "Running requests of a data-parallel attention rank.",
       &DataParallelRankStats::running_requests},
      {"megactx_dp_rank_admissions_total", "counter",
       "Requests admitted to run on a data-parallel attention rank.",
       &DataParallelRankStats::admissions},
      {"megactx_dp_rank_sampled_rows_total", "counter",
       "Rows a data-parallel attention rank sampled from its own logits (none gathered on rank "
       "0).",
       &DataParallelRankStats::sampled_rows},
      {"megactx_dp_rank_kv_pages_total", "gauge", "KV pages of a data-parallel attention rank.",
       &DataParallelRankStats::kv_pages_total},
      {"megactx_dp_rank_kv_pages_free", "gauge",
       "Free KV pages of a data-parallel attention rank (held by no request or cached prefix).",
       &DataParallelRankStats::kv_pages_free},
      {"megactx_dp_rank_prefix_cache_pages", "gauge",
       "KV pages the prefix cache of a data-parallel attention rank holds.",
       &DataParallelRankStats::prefix_cache_pages},
      {"megactx_dp_rank_host_latent_pages_total", "gauge",
       "Offload pages of the live host tier of a data-parallel attention rank.",
       &DataParallelRankStats::host_latent_pages_total},
      {"megactx_dp_rank_host_latent_pages_used", "gauge",
       "Offload pages of a data-parallel attention rank held by its running and parked "
       "requests.",
       &DataParallelRankStats::host_latent_pages_used},
      {"megactx_dp_rank_host_latent_moved_pages_total", "counter",
       "Device pages of a data-parallel attention rank's requests moved to its offload pages.",
       &DataParallelRankStats::host_latent_moved_pages}};
  std::string out;
  for (const Series& series : kSeries) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", series.name, series.help, series.name,
                       series.type);
    for (size_t rank = 0; rank < ranks.size(); ++rank)
      out += fmt::format("{}{{dp_rank=\"{}\"}} {}\n", series.name, rank, ranks[rank].*series.field);
  }
  return out;
}

// CUDA Graphs: one series per graph family (label graphs: the target's
// decode steps, the MTP layer's runs) of each counter; zeros on the host.
std::string cuda_graphs(const EngineStats& stats) {
  struct Series {
    const char* name;
    const char* help;
    int64_t EngineStats::*target;
    int64_t EngineStats::*mtp;
  };
  static constexpr Series kSeries[] = {
      {"megactx_cuda_graph_replays_total", "Steps run by replaying a captured CUDA Graph.",
       &EngineStats::graph_replays, &EngineStats::mtp_graph_replays},
      {"megactx_cuda_graph_eager_steps_total",
       "Steps of a graph's batch bucket run eagerly (its first step, or a bucket whose capture "
       "failed).",
       &EngineStats::graph_eager_steps, &EngineStats::mtp_graph_eager_steps},
      {"megactx_cuda_graph_captures_total", "CUDA Graphs captured.", &EngineStats::graph_captures,
       &EngineStats::mtp_graph_captures},
      {"megactx_cuda_graph_failed_captures_total",
       "Batch buckets whose capture failed (they run eagerly from then on).",
       &EngineStats::graph_failed_captures, &EngineStats::mtp_graph_failed_captures}};
  std::string out;
  for (const Series& series : kSeries) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n", series.name, series.help, series.name);
    out += fmt::format("{}{{graphs=\"target\"}} {}\n", series.name, stats.*series.target);
    out += fmt::format("{}{{graphs=\"mtp\"}} {}\n", series.name, stats.*series.mtp);
  }
  return out;
}

}  // namespace

std::string ServerMetrics::render(const EngineStats& stats) const {
  std::string out;
  out += time_to_first_token.render("megactx_time_to_first_token_seconds",
                                    "Time from request arrival to its first output token.");
  out += time_per_output_token.render("megactx_time_per_output_token_seconds",
                                      "Mean time between output tokens of a finished request.");
  out += end_to_end_latency.render("megactx_e2e_request_latency_seconds",
                                   "Time from request arrival to its last update.");
  out += scalar("megactx_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
                static_cast<double>(prompt_tokens.load()));
  out += scalar("megactx_generation_tokens_total", "counter", "Generated tokens.",
                static_cast<double>(generated_tokens.load()));
  out += scalar("megactx_cached_tokens_total", "counter",
                "Prompt tokens served from the prefix cache.",
                static_cast<double>(cached_tokens.load()));
  out += scalar("megactx_requests_finished_total", "counter", "Requests that finished normally.",
                static_cast<double>(requests_finished.load()));
  out += scalar("megactx_requests_aborted_total", "counter",
                "Requests aborted (client gone or /abort_request).",
                static_cast<double>(requests_aborted.load()));
  out += scalar("megactx_requests_failed_total", "counter", "Requests the engine rejected.",
                static_cast<double>(requests_failed.load()));
  out += scalar("megactx_num_running_reqs", "gauge", "Requests in the running batch.",
                static_cast<double>(stats.running_requests));
  out += scalar("megactx_num_waiting_reqs", "gauge", "Requests waiting for admission.",
                static_cast<double>(stats.waiting_requests));
  out += scalar("megactx_kv_pages_used", "gauge", "KV cache pages in use (64 tokens each).",
                static_cast<double>(stats.kv_pages_used));
  out += scalar("megactx_kv_pages_total", "gauge", "KV cache pages in the pool.",
                static_cast<double>(stats.kv_pages_total));
  out += scalar("megactx_kv_usage_ratio", "gauge", "Fraction of KV pages in use.",
                stats.kv_pages_total > 0 ? static_cast<double>(stats.kv_pages_used) /
                                               static_cast<double>(stats.kv_pages_total)
                                         : 0.0);
  out += scalar("megactx_max_context_tokens", "gauge", "Longest context a request may have.",
                static_cast<double>(stats.max_context_tokens));
  out += scalar("megactx_prefix_cache_query_tokens_total", "counter",
                "Prompt tokens looked up in the prefix cache.",
                static_cast<double>(stats.prefix_cache_queries));
  out += scalar("megactx_prefix_cache_hit_tokens_total", "counter",
                "Prompt tokens found in the prefix cache.",
                static_cast<double>(stats.prefix_cache_hits));
  out += scalar("megactx_prefix_cache_hit_rate", "gauge",
                "Prefix-cache hit tokens / query tokens since start.",
                stats.prefix_cache_queries > 0 ? static_cast<double>(stats.prefix_cache_hits) /
                                                     static_cast<double>(stats.prefix_cache_queries)
                                               : 0.0);
  out += scalar("megactx_host_kv_pages_used", "gauge",
                "Pages of the host KV tier holding evicted prefix-cache pages.",
                static_cast<double>(stats.host_kv_pages_used));
  out += scalar("megactx_host_kv_pages_total", "gauge",
                "Pages of the host KV tier (0: no tier, --host-kv-memory).",
                static_cast<double>(stats.host_kv_pages_total));
  out += scalar("megactx_host_kv_saved_pages_total", "counter",
                "Evicted KV pages copied to the host tier.",
                static_cast<double>(stats.host_kv_saved_pages));
  out += scalar("megactx_host_kv_loaded_pages_total", "counter",
                "KV pages copied back from the host tier for prefix hits.",
                static_cast<double>(stats.host_kv_loaded_pages));
  out += scalar("megactx_host_latent_pages_used", "gauge",
                "Offload pages (latents in host memory) held by running requests.",
                static_cast<double>(stats.host_latent_pages_used));
  out += scalar("megactx_host_latent_pages_total", "gauge",
                "Offload pages of the live host tier (0: none, --host-latent-memory).",
                static_cast<double>(stats.host_latent_pages_total));
  out += scalar("megactx_host_latent_moved_pages_total", "counter",
                "KV pages of running requests moved to the live host tier.",
                static_cast<double>(stats.host_latent_moved_pages));
  out += scalar("megactx_host_latent_moved_bytes_total", "counter",
                "Bytes of those moves (latents to host memory, indexer keys within the pools).",
                static_cast<double>(stats.host_latent_moved_bytes));
  out += scalar("megactx_host_latent_selected_entries_total", "counter",
                "Offload entries the decode steps' top-k selected (CUDA; 0 on the CPU, which "
                "reads them in place).",
                static_cast<double>(stats.host_latent_selected_entries));
  out += scalar("megactx_host_latent_hot_hits_total", "counter",
                "Of those, entries read from the GPU hot cache without a copy (hit rate: this "
                "over selected).",
                static_cast<double>(stats.host_latent_hot_hits));
  out += scalar("megactx_host_latent_copied_bytes_total", "counter",
                "Bytes of offload entries copied host -> GPU for attention (every layer).",
                static_cast<double>(stats.host_latent_copied_bytes));
  out += scalar("megactx_host_latent_read_steps_total", "counter",
                "Forwards that read offload entries (bytes per step: copied over this).",
                static_cast<double>(stats.host_latent_read_steps));
  out += scalar("megactx_prefix_cache_host_hit_tokens_total", "counter",
                "Prompt tokens found in the host tier (part of the prefix-cache hits).",
                static_cast<double>(stats.prefix_cache_host_hits));
  out += scalar("megactx_engine_steps_total", "counter", "Engine steps run (one forward each).",
                static_cast<double>(stats.steps));
  out += scalar("megactx_engine_step_tokens_total", "counter",
                "Tokens those steps forwarded (prefill and decode rows; tokens per step: this "
                "over the steps).",
                static_cast<double>(stats.step_tokens));
  out += scalar("megactx_engine_step_seconds_total", "counter",
                "Wall time of those steps, scheduling to the last output applied.",
                static_cast<double>(stats.step_microseconds) * 1e-6);
  out += scalar("megactx_spec_accepted_tokens_total", "counter",
                "Draft tokens accepted by speculative verification.",
                static_cast<double>(stats.spec_accepted_tokens));
  out += scalar("megactx_spec_verify_steps_total", "counter", "Speculative verification steps.",
                static_cast<double>(stats.spec_verify_steps));
  out += scalar("megactx_dp_gathered_logit_steps_total", "counter",
                "Data-parallel attention: steps whose logits were gathered on rank 0 (sampled "
                "verification of MTP drafts) instead of sampled on their ranks.",
                static_cast<double>(stats.dp_gathered_logit_steps));
  out += scalar("megactx_spec_off_steps_total", "counter",
                "Engine steps run without drafts: the decode batch reached "
                "--speculative-disable-batch-size, or --speculative-auto measured plain "
                "decode faster at its size.",
                static_cast<double>(stats.spec_off_steps));
  // Tokens committed per verification step: the accepted drafts plus the one
  // token every step produces itself (0 without speculative decoding).
  out +=
      scalar("megactx_spec_accept_length", "gauge",
             "Mean tokens per speculative verification step (accepted drafts + 1).",
             stats.spec_verify_steps > 0 ? 1.0 + static_cast<double>(stats.spec_accepted_tokens) /
                                                     static_cast<double>(stats.spec_verify_steps)
                                         : 0.0);
  out += cuda_graphs(stats);
  out += data_parallel_ranks(stats.data_parallel_ranks);
  return out;
}

RequestTimer::RequestTimer(ServerMetrics& metrics) : metrics_(metrics), submitted_(Clock::now()) {}

void RequestTimer::observe(const RequestUpdate& update) {
  auto now = Clock::now();
  auto seconds = [](Clock::duration duration) {
    return std::chrono::duration<double>(duration).count();
  };
  if (!saw_first_token_ && !update.new_token_ids.empty()) {
    saw_first_token_ = true;
    first_token_ = now;
    metrics_.time_to_first_token.observe(seconds(now - submitted_));
  }
  metrics_.generated_tokens += update.new_token_ids.size();
  if (update.finish == FinishReason::None) return;
  metrics_.end_to_end_latency.observe(seconds(now - submitted_));
  if (saw_first_token_ && update.completion_tokens >= 2)
    metrics_.time_per_output_token.observe(seconds(now - first_token_) /
                                           static_cast<double>(update.completion_tokens - 1));
  metrics_.prompt_tokens += static_cast<uint64_t>(std::max<int64_t>(0, update.prompt_tokens));
  metrics_.cached_tokens += static_cast<uint64_t>(std::max<int64_t>(0, update.cached_tokens));
  switch (update.finish) {
    case FinishReason::Abort:
      ++metrics_.requests_aborted;
      break;
    case FinishReason::Error:
      ++metrics_.requests_failed;
      break;
    default:
      ++metrics_.requests_finished;
  }
}

}  // namespace megactx::server
