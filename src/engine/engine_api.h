// EngineApi: the engine as the HTTP server sees it. Thread-safe: any thread
// may submit or abort; callbacks arrive on the engine's own thread.
#pragma once

#include <memory>
#include <string>

#include "engine/request.h"

namespace megactx {

class Tokenizer;
struct ModelConfig;
namespace grammar {
class GrammarCompiler;
}

struct EngineStats {
  int64_t running_requests = 0;
  int64_t waiting_requests = 0;
  int64_t kv_pages_total = 0;
  int64_t kv_pages_used = 0;
  int64_t max_context_tokens = 0;
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // prompt tokens found cached
  int64_t spec_accepted_tokens = 0;
  int64_t spec_verify_steps = 0;
  int64_t kv_page_size = 0;        // tokens per page (max tokens = pages x this)
  int64_t prefix_cache_pages = 0;  // pages the prefix cache holds (shared or evictable)
  int64_t preemptions = 0;         // requests preempted (recomputed) so far
  // The host tier of the prefix cache (all 0 without one).
  int64_t host_kv_pages_total = 0;
  int64_t host_kv_pages_used = 0;
  int64_t host_kv_saved_pages = 0;     // evicted pages copied to the host so far
  int64_t host_kv_loaded_pages = 0;    // pages copied back for prefix hits so far
  int64_t prefix_cache_host_hits = 0;  // prompt tokens of those hits (in prefix_cache_hits too)
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
  // Compiles structured-output grammars (SamplingParams::grammar) over this
  // engine's vocabulary: the model's logits, its eos ids as the stop tokens.
  // Thread-safe; null when the engine cannot constrain its output (the server
  // then answers structured-output requests with 400).
  virtual grammar::GrammarCompiler* grammar_compiler() { return nullptr; }
};

}  // namespace megactx
