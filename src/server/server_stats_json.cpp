#include "server/server_stats_json.h"

namespace megactx::server {

nlohmann::json histogram_json(const Histogram::Snapshot& snapshot) {
  return {{"upper_bounds", snapshot.upper_bounds},
          {"counts", snapshot.counts},
          {"sum", snapshot.sum},
          {"count", snapshot.count}};
}

nlohmann::json server_stats_json(const ServerMetrics& metrics, const EngineStats& stats,
                                 const nlohmann::json& server_info, double monotonic_ms,
                                 double unix_seconds) {
  nlohmann::json engine = {{"running_requests", stats.running_requests},
                           {"waiting_requests", stats.waiting_requests},
                           {"kv_pages_total", stats.kv_pages_total},
                           {"kv_pages_used", stats.kv_pages_used},
                           {"kv_page_size", stats.kv_page_size},
                           {"max_context_tokens", stats.max_context_tokens},
                           {"prefix_cache_queries", stats.prefix_cache_queries},
                           {"prefix_cache_hits", stats.prefix_cache_hits},
                           {"prefix_cache_pages", stats.prefix_cache_pages},
                           {"preemptions", stats.preemptions},
                           {"host_kv_pages_total", stats.host_kv_pages_total},
                           {"host_kv_pages_used", stats.host_kv_pages_used},
                           {"host_kv_saved_pages", stats.host_kv_saved_pages},
                           {"host_kv_loaded_pages", stats.host_kv_loaded_pages},
                           {"prefix_cache_host_hits", stats.prefix_cache_host_hits},
                           {"host_latent_pages_total", stats.host_latent_pages_total},
                           {"host_latent_pages_used", stats.host_latent_pages_used},
                           {"host_latent_moved_pages", stats.host_latent_moved_pages},
                           {"host_latent_selected_entries", stats.host_latent_selected_entries},
                           {"host_latent_hot_hits", stats.host_latent_hot_hits},
                           {"host_latent_copied_bytes", stats.host_latent_copied_bytes},
                           {"host_latent_read_steps", stats.host_latent_read_steps},
                           {"spec_accepted_tokens", stats.spec_accepted_tokens},
                           {"spec_verify_steps", stats.spec_verify_steps},
                           {"dp_gathered_logit_steps", stats.dp_gathered_logit_steps},
                           {"graph_replays", stats.graph_replays},
                           {"graph_eager_steps", stats.graph_eager_steps},
                           {"mtp_graph_replays", stats.mtp_graph_replays},
                           {"mtp_graph_eager_steps", stats.mtp_graph_eager_steps}};
  // Data-parallel attention only (a plain server's JSON keeps its keys).
  for (const DataParallelRankStats& rank : stats.data_parallel_ranks)
    engine["data_parallel_ranks"].push_back(
        {{"running_requests", rank.running_requests},
         {"admissions", rank.admissions},
         {"sampled_rows", rank.sampled_rows},
         {"kv_pages_total", rank.kv_pages_total},
         {"kv_pages_free", rank.kv_pages_free},
         {"prefix_cache_pages", rank.prefix_cache_pages},
         {"host_latent_pages_total", rank.host_latent_pages_total},
         {"host_latent_pages_used", rank.host_latent_pages_used},
         {"host_latent_moved_pages", rank.host_latent_moved_pages}});
  nlohmann::json counters = {{"prompt_tokens", metrics.prompt_tokens.load()},
                             {"generated_tokens", metrics.generated_tokens.load()},
                             {"cached_tokens", metrics.cached_tokens.load()},
                             {"requests_finished", metrics.requests_finished.load()},
                             {"requests_aborted", metrics.requests_aborted.load()},
                             {"requests_failed", metrics.requests_failed.load()}};
  nlohmann::json histograms = {
      {"time_to_first_token", histogram_json(metrics.time_to_first_token.snapshot())},
      {"time_per_output_token", histogram_json(metrics.time_per_output_token.snapshot())},
      {"e2e_request_latency", histogram_json(metrics.end_to_end_latency.snapshot())}};
  nlohmann::json server = nlohmann::json::object();
  for (const char* key : {"device", "kv_dtype", "kv_memory", "host_kv_memory", "host_latent_memory",
                          "max_running_requests", "speculative_steps", "tensor_parallel_size",
                          "expert_parallel_size", "context_parallel_size", "enable_layer_split",
                          "enable_dp_attention", "dp_size", "moe_dispatch"})
    if (server_info.contains(key)) server[key] = server_info[key];
  return {{"monotonic_ms", monotonic_ms},        {"time", unix_seconds},
          {"engine", std::move(engine)},         {"counters", std::move(counters)},
          {"histograms", std::move(histograms)}, {"server", std::move(server)}};
}

}  // namespace megactx::server
