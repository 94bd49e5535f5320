// Engine: the serving core behind EngineApi. It owns the model, the paged KV
// cache, the page allocator, the prefix cache, the scheduler and the sampler,
// and runs steps (schedule -> one forward over the mixed batch -> sample ->
// stop checks -> updates) on its own thread while there is work. Tests turn
// the thread off (EngineConfig::run_thread = false) and call step().
// A step: schedule -> forward -> StepOutputs (collect_outputs: samples,
// scores, verifications; no request changes) -> commit -> apply_outputs.
// With EngineConfig::speculative_steps = k > 0 decoding requests verify k MTP
// drafts per step (the Speculator, speculator.h), from the model's own MTP layer.
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
#include "engine/rank_sampler.h"
#include "engine/request_state.h"
#include "engine/routed_experts.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculator.h"
#include "engine/step_outputs.h"
#include "engine/weight_store.h"
#include "grammar/grammar_compiler.h"
#include "model/language_model.h"

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
  void set_weight_version(const std::string& version) override;
  Tensor weight_by_name(const std::string& name) override;
  void release_memory(const MemoryTags& tags) override;
  void resume_memory(const MemoryTags& tags) override;
  const Tokenizer& tokenizer() const override { return *tokenizer_; }
  const ModelConfig& model_config() const override { return model_->config(); }
  int64_t max_context_tokens() const override { return max_total_tokens_; }
  // Built on first use (the vocabulary's byte trie), then shared by every request.
  grammar::GrammarCompiler* grammar_compiler() override;
  bool records_routed_experts() const override { return config_.record_routed_experts; }
  bool records_hidden_states() const override { return config_.record_hidden_states; }

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
  // The target forward of the plan (and the routed experts and final hidden
  // states it recorded).
  ForwardOutput forward_plan();
  // return_hidden_states: the final-normed hidden states of `chunk`'s rows
  // (hidden [n, H] from `row`) into its request, position by position.
  void record_hidden_states(const ScheduledChunk& chunk, const Tensor& hidden, int64_t row);
  // After the forward: input logprobs, samples and verification results of
  // every chunk into outputs_ (no request changes yet).
  void collect_outputs(const ForwardOutput& output);
  // After commit: tokens appended (or drafts accepted), stops, finishes.
  void apply_outputs();
  void append_token(RequestState& request, const SampleResult& sample);
  // Structured output: the grammar mask of every chunk that samples its next
  // token, its matcher first taking the tokens of the last step (both after
  // the forward's launch, so a device forward overlaps them); a request whose
  // grammar allows nothing, or refused a sampled token, is failed after the
  // step (outputs_.grammar_failed).
  void fill_grammar_masks();
  // One chunk's part of fill_grammar_masks: false when its request fails.
  bool fill_grammar_mask(const ScheduledChunk& chunk);
  // The matcher takes request.grammar_pending; false (grammar_error set) when
  // it refuses one, or refused one before.
  bool accept_pending_tokens(RequestState& request);
  std::vector<const ScheduledChunk*> grammar_chunks_;  // this step's constrained chunks
  std::vector<uint8_t> grammar_allowed_;               // their masks allow a token
  // Ends a request: last update, pages back (full ones stay in the prefix
  // cache). Text held back for stop strings is released unless a stop string matched.
  void finish(RequestState& request, FinishReason reason, std::string detail = {},
              bool release_held_text = true);
  void deliver_updates();

  void update_stats();
  // Whether steps may run (not paused, no memory released); inbox_mutex_ held.
  bool may_step() const { return !paused_ && !memory_released_; }
  // The host tier of the prefix cache, host_kv_memory_bytes of host pools.
  void create_host_tier();
  // The live host tier: offload pages out of the KV budget (indexer keys)
  // and host_latent_memory_bytes (latents), into capacity_.spec.
  void plan_offload_pages();
  // End of a step: moves the full pages of decoding requests whose context
  // reaches host_latent_min_tokens to offload pages (one copy for all).
  void offload_latents();
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
  std::unique_ptr<HostKvTier> host_tier_;   // host_kv_memory_bytes > 0
  std::vector<int64_t> offloaded_by_rank_;  // pages moved to offload pages so far, per rank
  int64_t steps_run_ = 0, step_tokens_ = 0, step_microseconds_ = 0;  // EngineStats::steps...
  KvPageCopy offload_copy_;                     // the model's page copy (offload pages on)
  std::unique_ptr<RoutedExpertsTable> routed_;  // record_routed_experts
  std::unique_ptr<PageAllocator> allocator_;
  std::vector<std::unique_ptr<PrefixCache>> prefix_caches_;  // one per data-parallel rank
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<Sampler> sampler_;
  // Data-parallel attention over a group: each rank samples its own rows
  // when the step needs no logits on rank 0 (forward_plan).
  std::unique_ptr<RankSampler> rank_sampler_;
  std::vector<int64_t> sampled_by_rank_;  // rows each data-parallel rank sampled so far
  int64_t gathered_logit_steps_ = 0;      // EngineStats::dp_gathered_logit_steps
  std::unordered_map<std::string, std::unique_ptr<RequestState>> requests_;
  std::vector<RequestState*> updated_;                   // requests with an update this step
  std::vector<std::unique_ptr<RequestState>> finished_;  // freed after delivery
  std::unique_ptr<Speculator> speculator_;               // speculative_steps > 0
  uint64_t next_arrival_ = 0;
  // ---- this step (buffers reused across steps) ----
  StepPlan plan_;
  ForwardBatch batch_;
  StepOutputs outputs_;
  EnginePhaseTimes phase_times_;  // MEGACTX_ENGINE_TIMES=1
  // Weight updates and released memory (engine_control.cpp).
  WeightStore weights_;  // base checkpoint + overlay + staged buckets
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
