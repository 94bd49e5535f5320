// Engine: the serving core behind EngineApi. It owns the model, the paged KV
// cache, the page allocator, the prefix cache, the scheduler and the sampler,
// and runs steps (schedule -> one forward over the mixed batch -> sample ->
// stop checks -> updates) on its own thread while there is work. Tests turn
// the thread off (EngineConfig::run_thread = false) and call step().
// With EngineConfig::speculative_steps = k > 0 decoding requests verify k MTP
// drafts per step (engine_speculation.cpp), from the model's own MTP layer.
// The engine knows no device: the model makes its KV pools, the host tier's
// pools and page copies and its MTP layer (LanguageModel's device hooks), and
// make_sampler picks the sampler of its logits (cuda_sampler.h).
// With EngineConfig::host_kv_memory_bytes the prefix cache gets a host tier
// (cache/host_kv_tier.h): evicted pages wait in host memory for a prefix hit.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <variant>

#include "cache/host_kv_tier.h"
#include "cache/page_allocator.h"
#include "cache/prefix_cache.h"
#include "engine/engine_api.h"
#include "engine/engine_config.h"
#include "engine/engine_phase_times.h"
#include "engine/kv_capacity.h"
#include "engine/request_state.h"
#include "engine/routed_experts.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "grammar/grammar_compiler.h"
#include "io/checkpoint.h"
#include "io/weight_update.h"
#include "model/language_model.h"
#include "model/mtp_layer.h"

namespace megactx {

class Engine : public EngineApi {
 public:
  static std::unique_ptr<Engine> create(EngineConfig config, std::unique_ptr<LanguageModel> model,
                                        std::shared_ptr<const Tokenizer> tokenizer,
                                        GenerationDefaults defaults);
  ~Engine() override;

  void submit(GenerationRequest request, UpdateCallback on_update) override;
  bool abort(const std::string& rid) override;
  void abort_all() override;
  bool flush_cache() override;
  EngineStats stats() const override;
  // RL control (engine_control.cpp).
  void pause(PauseMode mode) override;
  void resume() override;
  bool paused() const override;
  WeightUpdateResult update_weights(const WeightUpdateRequest& request) override;
  std::string weight_version() const override;
  void release_memory(const MemoryTags& tags) override;
  void resume_memory(const MemoryTags& tags) override;
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  const ModelConfig& model_config() const override { return model_->config(); }
  int64_t max_context_tokens() const override { return max_total_tokens_; }
  // Built on first use (the vocabulary's byte trie), then shared by every request.
  grammar::GrammarCompiler* grammar_compiler() override;
  bool records_routed_experts() const override { return config_.record_routed_experts; }

  // One step: takes queued submits/aborts, schedules, runs the model, delivers
  // updates (callbacks on the calling thread). Returns false when there was
  // nothing to do. Only without the engine thread.
  bool step();
  // Runs steps until no request is left (tests, the `generate` command).
  void run_until_idle();
  // Throws megactx::Error on a broken cache/scheduler invariant.
  void check_integrity() const;

  const KvCapacityPlan& capacity() const { return capacity_; }
  const GenerationDefaults& generation_defaults() const { return defaults_; }
  int64_t num_preemptions() const;
  // Replaces the sampler (CpuSampler, or CudaSampler for a CUDA model).
  void set_sampler(std::unique_ptr<Sampler> sampler);

  // Tests: the KV pools, and what a live request holds in them (its tokens,
  // page table and the length the cache holds); nullopt once it finished.
  const PagedKvCache& kv_cache() const { return *cache_; }
  struct HeldSequence {
    std::vector<int32_t> tokens;
    std::vector<int32_t> page_table;
    int64_t num_computed = 0;
  };
  std::optional<HeldSequence> held_sequence(const std::string& rid) const;

 private:
  struct Submit {
    GenerationRequest request;
    UpdateCallback callback;
  };
  struct Abort {
    std::string rid;  // empty: abort all
  };
  using Command = std::variant<Submit, Abort>;

  Engine(EngineConfig config, std::unique_ptr<LanguageModel> model,
         std::shared_ptr<const Tokenizer> tokenizer, GenerationDefaults defaults);

  // Empty when the request is valid, else the error text.
  std::string validate(const GenerationRequest& request) const;
  void push_command(Command command);
  void thread_main();
  bool step_locked();
  void process_commands();
  void start_request(Submit submit);
  void abort_request(RequestState& request);
  void check_integrity_locked() const;
  void run_plan();
  // After the forward: input logprobs, samples and verification results of
  // every chunk (no request changes yet).
  void collect_outputs(const Tensor& logits);
  // After commit: tokens appended (or drafts accepted), stops, finishes.
  void apply_outputs();
  void append_token(RequestState& request, const SampleResult& sample);
  // Structured output: the grammar mask of every chunk that samples its next
  // token (before the forward, so a device forward overlaps it); a request
  // whose grammar allows nothing is failed after the step.
  void fill_grammar_masks();
  bool grammar_failed(const RequestState& request) const;
  // Ends a request: last update, pages back (full ones stay in the prefix
  // cache). Text held back for stop strings is released unless a stop string matched.
  void finish(RequestState& request, FinishReason reason, std::string detail = {},
              bool release_held_text = true);
  void deliver_updates();

  // ---- MTP speculative decoding (engine_speculation.cpp) ----
  void load_mtp_layer();
  // Drafts this request may verify in the coming step (0: plain decode).
  int64_t draft_count(const RequestState& request) const;
  // Before scheduling: k placeholder drafts on every request that speculates
  // (the scheduler reserves pages for 1 + k tokens).
  void append_draft_slots();
  // After scheduling: drafts of requests the step does not run are dropped.
  void drop_unscheduled_drafts();
  static void drop_drafts(RequestState& request);
  // Runs the MTP draft steps and writes the drafts into the tokens.
  void draft_for_plan();
  // Device logits: the argmax of every greedy verification row, one sampler
  // call per step (before the chunks are verified).
  void greedy_verification_argmax(const Tensor& logits);
  // Verifies one request's drafts against its k + 1 rows from `first_row`.
  void verify_chunk(RequestState& request, const Tensor& logits, int64_t first_row);
  VerifyResult verify_on_host(RequestState& request, const Tensor& logits, int64_t first_row,
                              std::span<const int32_t> drafts);
  // Structured output while drafting: the mask before draft `drafts.size()`
  // (the matcher first accepts the previous draft); null when that draft
  // broke the grammar (then it and every later one are rejected).
  const uint32_t* draft_mask(RequestState& request, std::span<const int32_t> drafts);
  // The verified tokens (and their logprobs) as the request's emitted samples.
  void emit_verified(RequestState& request, const Tensor& logits, int64_t first_row);
  // MTP step 0 over every chunk's rows whose next token is known.
  void refill_mtp(const Tensor& hidden_states);
  // Whether the refill makes the request's next greedy drafts right away.
  bool greedy_drafts_on_refill(const RequestState& request) const;
  // Rolls back the rejected drafts and emits the accepted ones + 1.
  void apply_verification(RequestState& request);
  void update_stats();
  // Whether steps may run (not paused, no memory released); inbox_mutex_ held.
  bool may_step() const { return !paused_ && !memory_released_; }
  // The checkpoint weight updates start from (opened on first use).
  const std::shared_ptr<const Checkpoint>& weights_base();
  // The host tier of the prefix cache, host_kv_memory_bytes of host pools.
  void create_host_tier();
  RequestUpdate& update_of(RequestState& request);

  EngineConfig config_;
  std::unique_ptr<LanguageModel> model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  GenerationDefaults defaults_;
  KvCapacityPlan capacity_;
  int64_t max_total_tokens_ = 0;
  int64_t vocab_size_ = 0;

  // ---- engine-thread state (engine_mutex_) ----
  mutable std::mutex engine_mutex_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<HostKvTier> host_tier_;  // host_kv_memory_bytes > 0
  std::unique_ptr<RoutedExpertsTable> routed_;  // record_routed_experts
  std::unique_ptr<PageAllocator> allocator_;
  std::unique_ptr<PrefixCache> prefix_cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Sampler> sampler_;
  std::unordered_map<std::string, std::unique_ptr<RequestState>> requests_;
  std::vector<RequestState*> updated_;                   // requests with an update this step
  std::vector<std::unique_ptr<RequestState>> finished_;  // freed after delivery
  StepPlan plan_;
  ForwardBatch batch_;
  std::vector<SamplingRow> sampling_rows_;
  std::vector<RequestState*> sampling_requests_;
  std::vector<SampleResult> samples_;
  std::vector<LogprobQuery> logprob_queries_;  // input logprobs (scoring)
  std::vector<RequestState*> logprob_requests_;
  std::vector<TokenLogprob> logprob_results_;
  uint64_t next_arrival_ = 0;
  std::vector<RequestState*> scoring_done_;           // scoring requests ending this step
  std::vector<RequestState*> scored_through_prompt_;  // input logprobs complete this step
  std::vector<RequestState*> verifying_;              // verification chunks of this step
  std::vector<RequestState*> grammar_failed_;         // grammars that allowed no token this step
  std::unique_ptr<MtpLayer> mtp_;                     // speculative_steps > 0
  EnginePhaseTimes phase_times_;                      // MEGACTX_ENGINE_TIMES=1
  std::vector<MtpDraftRequest> draft_requests_;
  Tensor verify_logits_host_;  // this step's device logits on the host (sampled verification)
  std::vector<SamplingRow> verify_argmax_rows_;  // greedy verification rows (device logits)
  std::vector<SampleResult> verify_argmax_;      // their argmax, in row order
  size_t verify_argmax_used_ = 0;
  int64_t spec_accepted_total_ = 0;
  int64_t spec_off_steps_ = 0;  // steps speculative_disable_batch_size ran without drafts
  int64_t spec_verify_total_ = 0;
  // Weight updates and released memory (engine_control.cpp).
  std::shared_ptr<const Checkpoint> weights_base_;
  std::shared_ptr<TensorBucket> weights_overlay_;  // tensors sent since the base was loaded
  TensorBucket staged_weights_;                    // buckets not yet committed
  bool weights_released_ = false;
  bool kv_released_ = false;

  // ---- shared with other threads (inbox_mutex_) ----
  mutable std::mutex inbox_mutex_;
  std::condition_variable inbox_cv_;
  std::deque<Command> inbox_;
  std::unordered_set<std::string> live_rids_;  // submitted and not finished
  bool stopping_ = false;
  bool paused_ = false;           // pause(): no step runs
  bool memory_released_ = false;  // release_memory(): no step runs
  std::atomic<uint64_t> rid_counter_{0};

  mutable std::mutex stats_mutex_;
  EngineStats stats_;
  std::string weight_version_ = "default";

  std::once_flag grammar_once_;
  std::unique_ptr<grammar::GrammarCompiler> grammar_compiler_;

  std::thread thread_;
};

}  // namespace megactx
