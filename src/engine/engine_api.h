// EngineApi: the engine as the HTTP server sees it. Thread-safe: any thread
// may submit or abort; callbacks arrive on the engine's own thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "engine/request.h"

namespace megactx {

class TensorBucket;  // io/weight_update.h
class Tokenizer;
struct ModelConfig;
namespace grammar {
class GrammarCompiler;
}

// Data-parallel attention: one rank's share of the engine (EngineStats).
struct DataParallelRankStats {
  int64_t running_requests = 0;
  int64_t admissions = 0;  // requests admitted to run on this rank so far
  // Rows this rank sampled from its own logits so far (engine/rank_sampler.h).
  int64_t sampled_rows = 0;
  int64_t kv_pages_total = 0;
  int64_t kv_pages_free = 0;       // not held by a request or the prefix cache
  int64_t prefix_cache_pages = 0;  // its prefix cache's pages
  // The live host tier: its offload pages (0 without the tier), and those
  // held by its running and parked requests.
  int64_t host_latent_pages_total = 0;
  int64_t host_latent_pages_used = 0;
  int64_t host_latent_moved_pages = 0;  // its device pages moved to its offload pages so far
};

struct EngineStats {
  int64_t running_requests = 0;
  int64_t waiting_requests = 0;
  int64_t kv_pages_total = 0;
  int64_t kv_pages_used = 0;
  int64_t max_context_tokens = 0;
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // prompt tokens found cached
  // Engine steps run so far (a forward each), the tokens they forwarded
  // (prefill and decode rows, drafts included) and their host wall time.
  int64_t steps = 0;
  int64_t step_tokens = 0;
  int64_t step_microseconds = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t spec_verify_steps = 0;
  int64_t spec_off_steps = 0;  // steps run without drafts (disable batch size, speculative_auto)
  int64_t kv_page_size = 0;    // tokens per page (max tokens = pages x this)
  int64_t prefix_cache_pages = 0;  // pages the prefix cache holds (shared or evictable)
  int64_t preemptions = 0;         // requests preempted (recomputed) so far
  // Data-parallel attention: steps whose logits were gathered on rank 0
  // (sampled verification of MTP drafts) rather than sampled on their ranks.
  int64_t dp_gathered_logit_steps = 0;
  // CUDA Graphs (LanguageModel::graph_stats; 0 on the host): the target's
  // decode steps and the MTP layer's runs, each replayed, run eagerly (a
  // batch bucket's first step, or one that cannot be captured: data-parallel
  // attention's MoE, context parallelism, LayerSplit), captured, and keys
  // whose capture failed.
  int64_t graph_replays = 0;
  int64_t graph_eager_steps = 0;
  int64_t graph_captures = 0;
  int64_t graph_failed_captures = 0;
  int64_t mtp_graph_replays = 0;
  int64_t mtp_graph_eager_steps = 0;
  int64_t mtp_graph_captures = 0;
  int64_t mtp_graph_failed_captures = 0;
  // The host tier of the prefix cache (all 0 without one).
  int64_t host_kv_pages_total = 0;
  int64_t host_kv_pages_used = 0;
  int64_t host_kv_saved_pages = 0;     // evicted pages copied to the host so far
  int64_t host_kv_loaded_pages = 0;    // pages copied back for prefix hits so far
  int64_t prefix_cache_host_hits = 0;  // prompt tokens of those hits (in prefix_cache_hits too)
  // The live host tier: offload pages (latents of running requests in host
  // memory; all 0 without one).
  int64_t host_latent_pages_total = 0;
  int64_t host_latent_pages_used = 0;
  int64_t host_latent_moved_pages = 0;  // device pages moved to offload pages so far
  int64_t host_latent_moved_bytes = 0;  // their bytes (latents and indexer keys)
  int64_t host_latent_parked = 0;       // preemptions that kept a request's offload pages
  int64_t host_latent_dropped = 0;      // parked requests whose offload pages a running one took
  // Reading them on a device (LanguageModel::offload_read_stats; 0 on the host).
  int64_t host_latent_selected_entries = 0;
  int64_t host_latent_hot_hits = 0;
  int64_t host_latent_copied_bytes = 0;
  int64_t host_latent_read_steps = 0;
  // Data-parallel attention: rank by rank (empty without it).
  std::vector<DataParallelRankStats> data_parallel_ranks;
};

// What the RL control routes ask of the engine (docs: README "Driving
// megactx from an RL trainer").
enum class PauseMode {
  Abort,    // in-flight requests end now (FinishReason::Abort, partial output)
  Retract,  // running requests go back to the queue (their KV freed, full pages cached)
  InPlace,  // requests keep their KV and resume where they stopped
};

// A weight update (/update_weights_from_disk, /update_weights_from_safetensors).
struct WeightUpdateRequest {
  // Non-empty: every weight from this Hugging Face directory (same architecture).
  std::string model_path;
  // Else: named tensors in the checkpoint's names (a bucket); staged until a
  // request with commit = true applies everything staged at once.
  std::shared_ptr<const TensorBucket> bucket;
  bool commit = true;
  std::string weight_version;  // the version after a successful commit (empty: keep)
  // Retire the prefix cache (its KV is of the old weights); false keeps it.
  bool flush_cache = true;
};

struct WeightUpdateResult {
  std::string weight_version;
  int64_t tensors = 0;  // applied (commit) or staged so far (no commit)
  bool committed = false;
};

// release_memory_occupation / resume_memory_occupation tags.
struct MemoryTags {
  bool weights = false;
  bool kv_cache = false;
};

class EngineApi {
 public:
  virtual ~EngineApi() = default;
  // Queues a request. Errors known before any work (prompt longer than the
  // context, empty prompt) arrive as an immediate update with FinishReason::Error.
  virtual void submit(GenerationRequest request, UpdateCallback on_update) = 0;
  // Aborts one request (its last update has FinishReason::Abort and whatever it
  // generated so far); false when the rid is unknown or already finished.
  virtual bool abort(const std::string& rid) = 0;
  virtual void abort_all() = 0;
  // Drops every unreferenced prefix-cache page; false when requests are running.
  virtual bool flush_cache() = 0;
  virtual EngineStats stats() const = 0;
  virtual const Tokenizer& tokenizer() const = 0;
  virtual const ModelConfig& model_config() const = 0;
  virtual int64_t max_context_tokens() const = 0;

  // ---- RL control: what a trainer drives between rollouts ----
  // While paused no step runs and new requests wait in the queue.
  virtual void pause(PauseMode mode) = 0;
  virtual void resume() = 0;
  virtual bool paused() const = 0;
  // Waits for the step in flight, then replaces the weights between steps;
  // a failure (megactx::Error naming the tensor or the difference) leaves the
  // engine serving the old weights, with nothing staged.
  virtual WeightUpdateResult update_weights(const WeightUpdateRequest& request) = 0;
  virtual std::string weight_version() const = 0;
  // /update_weight_version: names the weights now served (a trainer that
  // changed them by other means); the weights themselves stay.
  virtual void set_weight_version(const std::string& version) = 0;
  // /get_weights_by_name: the served tensor under its checkpoint name, as
  // float32 (the checkpoint's tensor with every committed update in front;
  // an e4m3 matrix as its codes' values, its scales a tensor of their own).
  // Throws megactx::Error naming an unknown tensor.
  virtual Tensor weight_by_name(const std::string& name) = 0;
  // Frees the device memory of the weights and/or the KV pools (a colocated
  // trainer borrows it) and brings it back; the KV cache can be released
  // only while no request is live, and nothing runs in between.
  virtual void release_memory(const MemoryTags& tags) = 0;
  virtual void resume_memory(const MemoryTags& tags) = 0;
  // Compiles structured-output grammars (SamplingParams::grammar) over this
  // engine's vocabulary: the model's logits, its eos ids as the stop tokens.
  // Thread-safe; null when the engine cannot constrain its output (the server
  // then answers structured-output requests with 400).
  virtual grammar::GrammarCompiler* grammar_compiler() { return nullptr; }
  // Whether requests may ask for return_routed_experts (the server flag
  // --enable-return-routed-experts: EngineConfig::record_routed_experts).
  virtual bool records_routed_experts() const { return false; }
  // Whether requests may ask for return_hidden_states (the server flag
  // --enable-return-hidden-states: EngineConfig::record_hidden_states).
  virtual bool records_hidden_states() const { return false; }
};

}  // namespace megactx
