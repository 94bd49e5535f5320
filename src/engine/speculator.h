// Speculator: MTP speculative decoding inside the serving engine, one object
// that owns the MTP layer and every per-step piece of speculation (how a step
// runs is described at the top of speculator.cpp). The Engine calls it at
// five points of a step:
//
//   schedule:  append_draft_slots() before Scheduler::schedule(),
//              drop_unscheduled_drafts() after it;
//   forward:   draft() before the target forward;
//   collect:   begin_verification() once, verify_chunk() per verifying chunk;
//   refill:    refill() after collecting, before Scheduler::commit();
//   apply:     apply_verification() per verifying request, whose emitted
//              tokens the Engine then appends like sampled ones.
//
// The KV cache and the sampler are passed per call: the Engine rebuilds the
// pools on resume_memory and tests replace the sampler.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/kv_cache.h"
#include "engine/engine_config.h"
#include "engine/mtp_drafter.h"
#include "engine/request_state.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/speculation_policy.h"
#include "engine/step_outputs.h"
#include "io/checkpoint.h"
#include "model/language_model.h"
#include "model/mtp_layer.h"

namespace megactx {

class Speculator {
 public:
  // Loads the model's MTP layer from config.model_dir; config must outlive
  // the Speculator (the Engine's). Throws for a model without one.
  Speculator(const EngineConfig& config, LanguageModel& model);

  // The MTP layer of `checkpoint` (a weight update, resumed weights), or none
  // (released weights: no step runs until reload()).
  void reload(const Checkpoint& checkpoint);
  void release() { mtp_.reset(); }

  // ---- schedule ----
  // k placeholder drafts on every running request that speculates this step
  // (the scheduler reserves pages for 1 + k tokens).
  void append_draft_slots(std::span<RequestState* const> running);
  // Drafts of requests the step does not run go again.
  void drop_unscheduled_drafts(
      const StepPlan& plan,
      const std::unordered_map<std::string, std::unique_ptr<RequestState>>& requests);
  // Removes a request's drafts (and rolls its grammar back over them).
  static void drop_drafts(RequestState& request);

  // ---- forward ----
  // Runs the MTP draft steps and writes the drafts over the placeholders;
  // verification chunks get logits of every row.
  void draft(StepPlan& plan, PagedKvCache& cache);

  // ---- collect ----
  // Per step, before verify_chunk: device logits, and logits left with the
  // ranks that computed them (`rows_at_ranks`: data-parallel attention, whose
  // `sampler` routes each row to its rank), get the argmax of every greedy
  // verification row in one sampler call.
  void begin_verification(const StepPlan& plan, const Tensor& logits, const StepOutputs& outputs,
                          Sampler& sampler, bool rows_at_ranks = false);
  // Verifies one request's drafts against its k + 1 rows from `first_row`
  // (the tokens and logprobs it will emit wait in request.spec).
  void verify_chunk(RequestState& request, const Tensor& logits, int64_t first_row,
                    Sampler& sampler);

  // ---- refill ----
  // MTP step 0 over every chunk's rows whose next token is known (`samples`:
  // this step's plain samples, StepOutputs::samples).
  void refill(const StepPlan& plan, const Tensor& hidden_states,
              std::span<const SampleResult> samples, PagedKvCache& cache);

  // ---- apply ----
  // Rolls the rejected drafts back; returns the tokens to emit (the accepted
  // drafts and the target's token), valid until the request's next step.
  std::span<const SampleResult> apply_verification(RequestState& request, Scheduler& scheduler);

  // Integrity: a decoding request that may speculate holds step 0 of its
  // last computed row (Error otherwise).
  void check_integrity(const std::string& rid, const RequestState& request) const;

  int64_t accepted_tokens() const { return accepted_total_; }
  int64_t verify_steps() const { return verify_total_; }
  int64_t off_steps() const { return policy_.off_steps(); }
  // After the step: its wall time (from append_draft_slots on) for the
  // speculation policy (pure decode steps only).
  void record_step(const StepPlan& plan, double seconds);

 private:
  // Drafts this request may verify in the coming step (0: plain decode).
  int64_t draft_count(const RequestState& request) const;
  VerifyResult verify_on_host(RequestState& request, const Tensor& logits, int64_t first_row,
                              std::span<const int32_t> drafts);
  // Structured output while drafting: the mask before draft `drafts.size()`
  // (the matcher first accepts the previous draft); null when that draft
  // broke the grammar (then it and every later one are rejected).
  const uint32_t* draft_mask(RequestState& request, std::span<const int32_t> drafts);
  void emit_verified(RequestState& request, const Tensor& logits, int64_t first_row,
                     Sampler& sampler);
  // Whether the refill makes the request's next greedy drafts right away.
  bool greedy_drafts_on_refill(const RequestState& request) const;

  const EngineConfig& config_;
  LanguageModel& model_;
  std::unique_ptr<MtpLayer> mtp_;  // null while the weights are released

  // ---- this step ----
  std::vector<MtpDraftRequest> draft_requests_;
  Tensor logits_host_;  // the step's device logits on the host (sampled verification)
  std::vector<SamplingRow> argmax_rows_;  // greedy verification rows (device logits)
  bool argmax_verification_ = false;      // this step's greedy rows take argmax_ (above)
  // Sampled requests are verified target-only (no draft distribution q):
  // their verification goes through the sampler like greedy's.
  bool target_only_sampled() const {
    return config_.speculative_sampled_mode == VerifyMode::TargetOnly;
  }
  bool rows_at_ranks_ = false;        // this step's logits are not all on rank 0
  std::vector<SampleResult> argmax_;  // their argmax, in row order
  size_t argmax_used_ = 0;
  // Rejection-sampling verification of sampled drafts whose rows stayed with
  // their ranks (begin_verification: Sampler::check_drafts, then the
  // distribution of each rejecting row), one per such request in chunk order.
  struct RankVerification {
    int64_t first_row = 0;
    uint64_t first_draw = 0;
    DraftVerdict verdict;
    std::vector<float> rejecting_row;  // p of the first rejected draft's row
  };
  std::vector<RankVerification> rank_verifications_;
  size_t rank_verifications_used_ = 0;
  void check_drafts_at_ranks(const StepPlan& plan, const Tensor& logits, const StepOutputs& outputs,
                             Sampler& sampler);

  int64_t accepted_total_ = 0;
  int64_t verify_total_ = 0;
  SpeculationPolicy policy_;
  bool step_drafts_ = false;          // the policy's choice for this step
  bool step_verifies_ = false;        // some request verifies drafts this step
  int64_t accepted_at_schedule_ = 0;  // accepted_total_ when the step was planned
};

}  // namespace megactx
