// Speculator: MTP speculative decoding inside the serving engine.
//
// A step of a speculating request (m = tokens in its cache, x_m = its last
// token, not cached yet):
//   1. append_draft_slots(): k placeholder tokens after x_m
//      (num_draft_tokens = k), so the scheduler plans [x_m, d_1..d_k] as one
//      decode chunk and reserves its pages; requests the step does not run
//      (preempted, or not reached) drop them again.
//   2. draft(): d_1 from the MTP output of row m - 1 (the previous
//      refill), d_2..d_k from draft steps batched over every speculating
//      request (mtp_drafter.h); the drafts overwrite the placeholders.
//   3. one target forward for the whole step (mixed with other requests'
//      prefill chunks and plain decodes), logits of all 1 + k rows, hidden
//      states of every row.
//   4. verify_chunk(): greedy (exact) or rejection sampling with the same
//      transform of p and q; the emitted tokens get their logprobs from the
//      raw logits rows like plain sampling.
//   5. refill(): MTP step 0 over each chunk's rows whose next token is
//      known (the accepted rows m..m+a of a verification; every row of a
//      prefill chunk, the last one with the sampled token), before commit()
//      shares newly full pages.
//   6. apply_verification(): Scheduler::truncate() drops the rejected
//      drafts (their KV and pages), then the Engine appends the accepted
//      drafts and the corrected/bonus token one by one, so eos,
//      stop ids, stop strings and max_new_tokens end the run mid-way exactly
//      as in plain decoding.
//
// Structured output (a grammar): drafts come from the masked draft logits, the
// matcher accepts them while drafting and gives the mask of every target row,
// verification runs over the masked target rows and rejects the first draft
// the grammar does not allow (unmasked drafts, speculative_masked_drafts
// false); the matcher rolls back before the verified tokens are appended
// (append_token accepts each again).
//
// Requests with repetition/frequency/presence penalties or a logit_bias
// decode one token per step (verification compares drafts against the
// unmodified logits; penalties change with every emitted token), and so do
// requests below min_new_tokens (eos and stop ids are masked token by token):
// both keep refilling the MTP layer so they can speculate later.
//
// Prefix cache: the MTP entry of row t depends on token t + 1, which a
// shared page's key does not contain, so the last row of a shared prefix may
// hold the entry another request computed for a different following token
// (prefix pages inserted twice keep the tree's copy: PrefixCache::insert).
// Shortening the reused prefix by a page would not avoid this, because the
// recomputed page is swapped for the tree's copy when it is inserted. We
// reuse the full match and never write into a shared page instead (refills
// run before commit, on rows >= num_computed, which are private). Such an
// entry is one key of the MTP layer's attention: it can only lower the
// acceptance rate. The output never depends on the drafts: greedy
// verification is exact and rejection sampling is lossless for any q.
#include "engine/speculator.h"

#include <algorithm>

#include "core/error.h"
#include "engine/cpu_sampler.h"

namespace megactx {
namespace {

// Sampled drafts and verification draw from their own stream per request,
// independent of the plain sampler's sampling_uniform(seed, token index).
constexpr uint64_t kSpeculationSeedSalt = 0x6D74705F73706563ull;  // "mtp_spec"

// Penalties change with every emitted token and a logit_bias is not in the
// verification's target rows: such requests decode one token per step.
bool may_speculate(const SamplingParams& sampling) {
  return !uses_penalties(sampling) && sampling.logit_bias.empty();
}

std::span<const float> logits_row(const Tensor& logits, int64_t row) {
  const int64_t vocab = logits.dim(1);
  return {logits.data<float>() + row * vocab, static_cast<size_t>(vocab)};
}

}  // namespace

Speculator::Speculator(const EngineConfig& config, LanguageModel& model)
    : config_(config),
      model_(model),
      policy_(config.speculative_disable_batch_size, config.speculative_auto) {
  MEGACTX_CHECK(config_.speculative_steps <= 7, "--speculative-steps must be in [0, 7], got {}",
                config_.speculative_steps);
  MEGACTX_CHECK(model_.config().num_nextn_predict_layers > 0,
                "--speculative-steps needs an MTP layer; the model has none "
                "(num_nextn_predict_layers = 0)");
  MEGACTX_CHECK(!config_.model_dir.empty(),
                "speculative decoding needs EngineConfig::model_dir (the checkpoint)");
  MEGACTX_CHECK(config_.speculative_sampled_mode != VerifyMode::Greedy,
                "speculative_sampled_mode must be RejectionSampling or TargetOnly");
  mtp_ = model_.load_mtp_layer(config_.model_dir);
}

void Speculator::reload(const Checkpoint& checkpoint) {
  mtp_ = model_.load_mtp_layer(checkpoint);
}

void Speculator::check_integrity(const std::string& rid, const RequestState& request) const {
  // Drafts live only inside a step.
  MEGACTX_CHECK(request.num_draft_tokens == 0, "integrity: request {} holds {} drafts", rid,
                request.num_draft_tokens);
  MEGACTX_CHECK(!mtp_ || request.phase != RequestPhase::Running ||
                    request.num_computed != static_cast<int64_t>(request.tokens.size()) - 1 ||
                    request.spec.draft.row == request.num_computed - 1,
                "integrity: request {} has MTP state of row {} with {} computed", rid,
                request.spec.draft.row, request.num_computed);
}

int64_t Speculator::draft_count(const RequestState& request) const {
  const SamplingParams& sampling = request.request.sampling;
  const auto size = static_cast<int64_t>(request.tokens.size());
  if (request.phase != RequestPhase::Running || request.num_computed != size - 1 ||
      request.spec.draft.row != request.num_computed - 1) {
    return 0;  // not decoding, or no MTP output for the last computed row
  }
  if (!may_speculate(sampling)) return 0;
  const int64_t generated = request.num_generated();
  if (generated < sampling.min_new_tokens) return 0;
  // No drafts past the context/KV capacity (the drafts occupy positions). Near
  // max_new_tokens a request still verifies k drafts (the Engine stops
  // appending at the limit, as in plain decoding): every verification of a
  // batch then has k + 1 rows, so the step and its refill keep their CUDA
  // Graphs instead of running eagerly for the few steps where one request of
  // the batch ends.
  const int64_t k = std::min(config_.speculative_steps, request.max_total_tokens - size);
  return std::max<int64_t>(k, 0);
}

void Speculator::append_draft_slots(std::span<RequestState* const> running) {
  int64_t decoding = 0;
  for (const RequestState* request : running)
    decoding += request->phase == RequestPhase::Running &&
                request->num_computed == static_cast<int64_t>(request->tokens.size()) - 1;
  step_drafts_ = decoding == 0 || policy_.speculate(decoding);
  accepted_at_schedule_ = accepted_total_;
  const bool off = !step_drafts_;
  for (RequestState* request : running) {
    request->spec.verifying = false;
    if (off) continue;
    const int64_t k = draft_count(*request);
    if (k == 0) continue;
    request->tokens.insert(request->tokens.end(), static_cast<size_t>(k), request->tokens.back());
    request->num_draft_tokens = k;
  }
}

void Speculator::drop_drafts(RequestState& request) {
  if (request.matcher && request.spec.grammar_drafts > 0) {
    request.matcher->rollback(static_cast<int32_t>(request.spec.grammar_drafts));
    request.spec.grammar_drafts = 0;
  }
  if (request.num_draft_tokens == 0) return;
  request.tokens.resize(request.tokens.size() - static_cast<size_t>(request.num_draft_tokens));
  request.num_draft_tokens = 0;
  request.spec.verifying = false;
}

void Speculator::drop_unscheduled_drafts(
    const StepPlan& plan,
    const std::unordered_map<std::string, std::unique_ptr<RequestState>>& requests) {
  for (const ScheduledChunk& chunk : plan.chunks) {
    RequestState& request = *chunk.request;
    request.spec.verifying = request.num_draft_tokens > 0;
    if (request.spec.verifying) {
      MEGACTX_CHECK(chunk.count == 1 + request.num_draft_tokens &&
                        chunk.start + chunk.count == static_cast<int64_t>(request.tokens.size()),
                    "request {}: verification chunk of {} tokens at {} for {} drafts",
                    request.request.rid, chunk.count, chunk.start, request.num_draft_tokens);
    }
  }
  step_verifies_ = false;
  for (const auto& [rid, request] : requests) {
    if (!request->spec.verifying) drop_drafts(*request);
    step_verifies_ = step_verifies_ || request->spec.verifying;
  }
}

void Speculator::record_step(const StepPlan& plan, double seconds) {
  if (plan.prefill_tokens > 0 || plan.decode_tokens == 0) return;  // mixed or empty
  if (step_drafts_ && !step_verifies_) return;  // chose drafts, none was possible
  const auto batch = static_cast<int64_t>(plan.chunks.size());
  // Every decode chunk emits one token of its own, plus the accepted drafts.
  const int64_t tokens = batch + (accepted_total_ - accepted_at_schedule_);
  policy_.record(batch, step_drafts_, seconds, tokens);
}

void Speculator::draft(StepPlan& plan, PagedKvCache& cache) {
  draft_requests_.clear();
  for (ScheduledChunk& chunk : plan.chunks) {
    RequestState& request = *chunk.request;
    if (!request.spec.verifying) continue;
    chunk.logits_from = 0;  // logits of x_m and of every draft
    request.spec.verify_start = chunk.start;
    MtpDraftRequest draft;
    draft.state = &request.spec.draft;
    draft.pages = request.page_table;
    draft.cached = chunk.start;
    draft.steps = request.num_draft_tokens;
    draft.params = &request.request.sampling;
    draft.uniform = [&request] {
      return sampling_uniform(request.seed ^ kSpeculationSeedSalt, request.spec.draws++);
    };
    if (request.matcher) {
      const auto words = static_cast<size_t>(request.matcher->mask_words());
      request.spec.masks.assign(static_cast<size_t>(request.num_draft_tokens + 1) * words, 0);
      request.spec.grammar_drafts = 0;
      if (config_.speculative_masked_drafts) {
        draft.mask = [this, &request](std::span<const int32_t> drafts) {
          return draft_mask(request, drafts);
        };
      }
    }
    draft_requests_.push_back(std::move(draft));
  }
  if (draft_requests_.empty()) return;
  run_mtp_drafts(*mtp_, cache, config_.speculative_share, draft_requests_);
  size_t next = 0;
  for (const ScheduledChunk& chunk : plan.chunks) {
    RequestState& request = *chunk.request;
    if (!request.spec.verifying) continue;
    MtpDraftRequest& draft = draft_requests_[next++];
    std::copy(draft.drafts.begin(), draft.drafts.end(), request.tokens.begin() + chunk.start + 1);
    request.spec.q = std::move(draft.q);
    if (request.matcher) {
      const std::span<const int32_t> drafts(draft.drafts);
      if (config_.speculative_masked_drafts) {
        // The mask of the row after the last draft (the bonus token's).
        draft_mask(request, drafts);
      } else {
        // Unmasked drafts: the automaton takes them until the first it rejects.
        for (size_t j = 0; j <= drafts.size() && draft_mask(request, drafts.first(j)); ++j) {
        }
      }
    }
  }
}

const uint32_t* Speculator::draft_mask(RequestState& request, std::span<const int32_t> drafts) {
  SpeculationState& spec = request.spec;
  grammar::GrammarMatcher& matcher = *request.matcher;
  const auto j = static_cast<int64_t>(drafts.size());
  if (j > 0) {
    // An earlier draft broke the grammar, or this one does: no mask past it.
    if (spec.grammar_drafts != j - 1 || !matcher.accept_token(drafts.back())) return nullptr;
    spec.grammar_drafts = j;
  }
  const auto words = static_cast<size_t>(matcher.mask_words());
  uint32_t* mask = spec.masks.data() + static_cast<size_t>(j) * words;
  matcher.fill_next_token_bitmask(mask);
  if (std::all_of(mask, mask + words, [](uint32_t w) { return w == 0; })) {
    // No token fits here. After a draft: that draft broke the grammar. Before
    // the first: the request fails (the Engine's grammar masks see row 0 empty).
    if (j > 0) {
      matcher.rollback(1);
      spec.grammar_drafts = j - 1;
    }
    return nullptr;
  }
  return mask;
}

namespace {

// Masks of the k + 1 verification rows: rows past the first draft the
// grammar rejects get none (verification stops before them).
std::vector<const uint32_t*> row_masks(const RequestState& request) {
  std::vector<const uint32_t*> masks(static_cast<size_t>(request.num_draft_tokens + 1), nullptr);
  if (!request.matcher) return masks;
  const auto words = static_cast<size_t>(request.matcher->mask_words());
  for (int64_t r = 0; r <= request.spec.grammar_drafts; ++r)
    masks[static_cast<size_t>(r)] = request.spec.masks.data() + static_cast<size_t>(r) * words;
  return masks;
}

}  // namespace

void Speculator::begin_verification(const StepPlan& plan, const Tensor& logits,
                                    const StepOutputs& outputs, Sampler& sampler,
                                    bool rows_at_ranks) {
  logits_host_ = Tensor();
  argmax_rows_.clear();
  argmax_.clear();
  argmax_used_ = 0;
  rank_verifications_.clear();
  rank_verifications_used_ = 0;
  argmax_verification_ = logits.device() != Device::CPU || rows_at_ranks;
  rows_at_ranks_ = rows_at_ranks;
  if (!argmax_verification_) return;
  if (rows_at_ranks_ && !target_only_sampled())
    check_drafts_at_ranks(plan, logits, outputs, sampler);
  // Rows of greedy verifications through the sampler on the device (or on
  // their ranks): the host gets k + 1 token ids per request instead of k + 1
  // logits rows. Target-only verification of sampled drafts likewise: its
  // k + 1 draws of the target's own tokens are the sampler's seeded draws
  // (the speculation stream's seed, draw indices draws .. draws + k: the
  // uniforms verify_target_only would take, in the same inverse CDF).
  static const SamplingParams kGreedy = [] {
    SamplingParams params;
    params.temperature = 0.0;
    return params;
  }();
  int64_t row = 0;
  for (const ScheduledChunk& chunk : plan.chunks) {
    const RequestState& request = *chunk.request;
    const int64_t rows = chunk.logits_rows();
    const bool greedy = is_greedy(request.request.sampling);
    if (request.spec.verifying && (greedy || target_only_sampled()) &&
        !outputs.grammar_failed_for(request)) {
      const std::vector<const uint32_t*> masks = row_masks(request);
      const size_t words = request.matcher ? static_cast<size_t>(request.matcher->mask_words()) : 0;
      for (int64_t r = 0; r < rows; ++r) {
        SamplingRow sampling_row;
        sampling_row.logits_row = row + r;
        sampling_row.params = greedy ? &kGreedy : &request.request.sampling;
        if (!greedy) {
          sampling_row.seed = request.seed ^ kSpeculationSeedSalt;
          sampling_row.draw_index = request.spec.draws + static_cast<uint64_t>(r);
        }
        if (const uint32_t* mask = masks[static_cast<size_t>(r)])
          sampling_row.allowed = {mask, words};
        argmax_rows_.push_back(sampling_row);
      }
    }
    row += rows;
  }
  argmax_.assign(argmax_rows_.size(), SampleResult{});
  if (!argmax_rows_.empty()) sampler.sample(logits, argmax_rows_, argmax_);
}

void Speculator::check_drafts_at_ranks(const StepPlan& plan, const Tensor& logits,
                                       const StepOutputs& outputs, Sampler& sampler) {
  // Sampled requests verified by rejection sampling, their rows with their
  // ranks: each rank runs the accept tests of its requests (the drafts'
  // target probabilities against q_i(d_i), which go with the check), and the
  // bonus draw when every draft passes; the row of a rejected draft comes
  // back as its distribution, whose residual against q (which only rank 0
  // holds) verify_chunk draws. The same uniforms in the same order as
  // verify_on_host: the same tokens.
  std::vector<DraftCheck> checks;
  std::vector<std::vector<float>> q_at_draft;
  std::vector<std::vector<uint32_t>> allowed;
  std::vector<const RequestState*> requests;
  int64_t row = 0;
  for (const ScheduledChunk& chunk : plan.chunks) {
    const RequestState& request = *chunk.request;
    const int64_t rows = chunk.logits_rows();
    if (request.spec.verifying && !is_greedy(request.request.sampling) &&
        !outputs.grammar_failed_for(request)) {
      const SpeculationState& spec = request.spec;
      const int64_t k = request.num_draft_tokens;
      const int64_t verified = request.matcher ? std::min(spec.grammar_drafts + 1, k) : k;
      const std::span<const int32_t> drafts(request.tokens.data() + spec.verify_start + 1,
                                            static_cast<size_t>(verified));
      std::vector<float>& q = q_at_draft.emplace_back();
      for (int64_t i = 0; i < verified; ++i) {
        const std::vector<float>& qi = spec.q[static_cast<size_t>(i)];
        const int32_t draft = drafts[static_cast<size_t>(i)];
        MEGACTX_CHECK(qi.empty() || (draft >= 0 && static_cast<size_t>(draft) < qi.size()),
                      "verify: draft {} outside [0, {})", draft, qi.size());
        q.push_back(qi.empty() ? 1.0f : qi[static_cast<size_t>(draft)]);
      }
      std::vector<uint32_t>& mask = allowed.emplace_back();
      if (request.matcher) {
        // The rows' masks, all-allowed where the grammar gave none (rows past
        // the first rejected draft are never reached).
        const auto words = static_cast<size_t>(request.matcher->mask_words());
        const std::vector<const uint32_t*> masks = row_masks(request);
        for (int64_t r = 0; r <= verified; ++r) {
          const uint32_t* m = masks[static_cast<size_t>(r)];
          if (m != nullptr)
            mask.insert(mask.end(), m, m + words);
          else
            mask.insert(mask.end(), words, ~0u);
        }
      }
      DraftCheck check;
      check.logits_row = row;
      check.params = &request.request.sampling;
      check.drafts = drafts;
      check.seed = request.seed ^ kSpeculationSeedSalt;
      check.first_draw = spec.draws;
      checks.push_back(check);
      requests.push_back(&request);
      RankVerification& v = rank_verifications_.emplace_back();
      v.first_row = row;
      v.first_draw = spec.draws;
    }
    row += rows;
  }
  if (checks.empty()) return;
  // The spans into q_at_draft and allowed are taken once those vectors stopped growing.
  for (size_t i = 0; i < checks.size(); ++i) {
    checks[i].q_at_draft = q_at_draft[i];
    checks[i].allowed = allowed[i];
  }
  std::vector<DraftVerdict> verdicts(checks.size());
  sampler.check_drafts(logits, checks, verdicts);
  std::vector<DistributionQuery> queries;
  std::vector<size_t> rejecting;
  for (size_t i = 0; i < checks.size(); ++i) {
    rank_verifications_[i].verdict = verdicts[i];
    const auto k = static_cast<int64_t>(checks[i].drafts.size());
    if (verdicts[i].accepted >= k) continue;
    DistributionQuery query;
    query.logits_row = checks[i].logits_row + verdicts[i].accepted;
    query.params = checks[i].params;
    if (!allowed[i].empty()) {
      const size_t words = allowed[i].size() / static_cast<size_t>(k + 1);
      query.allowed = std::span<const uint32_t>(allowed[i])
                          .subspan(static_cast<size_t>(verdicts[i].accepted) * words, words);
    }
    queries.push_back(query);
    rejecting.push_back(i);
  }
  if (queries.empty()) return;
  std::vector<std::vector<float>> rows(queries.size());
  sampler.distributions(logits, queries, rows);
  for (size_t j = 0; j < rejecting.size(); ++j)
    rank_verifications_[rejecting[j]].rejecting_row = std::move(rows[j]);
}

void Speculator::verify_chunk(RequestState& request, const Tensor& logits, int64_t first_row,
                              Sampler& sampler) {
  SpeculationState& spec = request.spec;
  const int64_t k = request.num_draft_tokens;
  // Structured output: the drafts the grammar accepted and the first one it
  // rejects (if any), which the masked target row gives probability 0, so it
  // is rejected and the token there is drawn from the residual of that row,
  // as rejection sampling needs to stay lossless (drawing it from the target
  // row alone would not be: whether a draft breaks the grammar depends on
  // the draft). Rows past it are never reached.
  const int64_t verified = request.matcher ? std::min(spec.grammar_drafts + 1, k) : k;
  const std::span<const int32_t> drafts(request.tokens.data() + spec.verify_start + 1,
                                        static_cast<size_t>(verified));
  const bool greedy = is_greedy(request.request.sampling);
  if (argmax_verification_ && (greedy || target_only_sampled())) {
    // Greedy or target-only on device (or ranks') logits: the rows
    // begin_verification made (verifying requests in chunk order, k + 1
    // rows each) gave the target's k + 1 tokens (its argmax, or its own
    // draws), and a draft is accepted while it equals the target's token.
    std::vector<int32_t> target;
    for (int64_t r = 0; r <= k; ++r) {
      MEGACTX_CHECK(argmax_used_ < argmax_.size() &&
                        argmax_rows_[argmax_used_].logits_row == first_row + r &&
                        (greedy || argmax_rows_[argmax_used_].draw_index ==
                                       spec.draws + static_cast<uint64_t>(r)),
                    "engine: verification rows out of step");
      target.push_back(argmax_[argmax_used_++].token);
    }
    target.resize(static_cast<size_t>(verified + 1));
    spec.result = verify_greedy_argmax(target, drafts);
    // The uniforms verify_target_only would have used: one per examined row.
    if (!greedy) spec.draws += spec.result.tokens.size();
  } else if (rows_at_ranks_) {
    // Rejection sampling checked at the ranks (check_drafts_at_ranks).
    MEGACTX_CHECK(rank_verifications_used_ < rank_verifications_.size() &&
                      rank_verifications_[rank_verifications_used_].first_row == first_row,
                  "engine: verification rows out of step");
    const RankVerification& checked = rank_verifications_[rank_verifications_used_++];
    const int64_t accepted = checked.verdict.accepted;
    MEGACTX_CHECK(accepted >= 0 && accepted <= verified, "engine: {} of {} drafts accepted",
                  accepted, verified);
    VerifyResult result;
    result.accepted = accepted;
    result.tokens.assign(drafts.begin(), drafts.begin() + accepted);
    // The uniforms: one per accept test, then the final draw's.
    if (accepted == verified) {
      result.tokens.push_back(checked.verdict.bonus);
      spec.draws = checked.first_draw + static_cast<uint64_t>(verified + 1);
    } else {
      uint64_t draw = checked.first_draw + static_cast<uint64_t>(accepted + 1);
      const std::vector<float>& q = spec.q[static_cast<size_t>(accepted)];
      result.tokens.push_back(rejection_final_token(
          checked.rejecting_row, q, drafts[static_cast<size_t>(accepted)], true,
          [&] { return sampling_uniform(request.seed ^ kSpeculationSeedSalt, draw++); }));
      spec.draws = draw;
    }
    spec.result = std::move(result);
  } else {
    spec.result = verify_on_host(request, logits, first_row, drafts);
  }
  emit_verified(request, logits, first_row, sampler);
}

VerifyResult Speculator::verify_on_host(RequestState& request, const Tensor& logits,
                                        int64_t first_row, std::span<const int32_t> drafts) {
  SpeculationState& spec = request.spec;
  const auto verified = static_cast<int64_t>(drafts.size());  // k, or the grammar's valid drafts
  MEGACTX_CHECK(!rows_at_ranks_,
                "engine: a sampled verification in a step whose logits stayed with their ranks");
  // The k + 1 rows on the host: device logits are copied once per step for
  // every verifying request (logits_host_, reset by begin_verification).
  if (logits.device() != Device::CPU && !logits_host_.defined()) {
    logits_host_ = model_.to_host(logits);
  }
  const Tensor& host = logits.device() == Device::CPU ? logits : logits_host_;
  std::vector<std::span<const float>> rows;
  for (int64_t r = 0; r <= verified; ++r) rows.push_back(logits_row(host, first_row + r));
  std::vector<const uint32_t*> masks = row_masks(request);
  masks.resize(static_cast<size_t>(verified + 1));
  const std::span<const std::vector<float>> q(spec.q.data(), static_cast<size_t>(verified));
  return verify_drafts(
      request.request.sampling, config_.speculative_sampled_mode, rows, drafts, q,
      [&request] {
        return sampling_uniform(request.seed ^ kSpeculationSeedSalt, request.spec.draws++);
      },
      masks);
}

void Speculator::emit_verified(RequestState& request, const Tensor& logits, int64_t first_row,
                               Sampler& sampler) {
  SpeculationState& spec = request.spec;
  // Emitted token i comes from row i; logprobs of the raw logits as the
  // plain sampler reports them.
  const size_t emitted = spec.result.tokens.size();
  spec.emitted.assign(emitted, SampleResult{});
  for (size_t i = 0; i < emitted; ++i) spec.emitted[i].token = spec.result.tokens[i];
  if (!request.request.return_logprob) return;
  std::vector<LogprobQuery> queries;
  for (size_t i = 0; i < emitted; ++i) {
    queries.push_back(LogprobQuery{first_row + static_cast<int64_t>(i), spec.result.tokens[i],
                                   request.request.top_logprobs_num,
                                   request.request.token_ids_logprob,
                                   logprob_temperature(request.request)});
  }
  std::vector<TokenLogprob> results(emitted);
  sampler.score(logits, queries, results);
  for (size_t i = 0; i < emitted; ++i) {
    spec.emitted[i].logprob = results[i].logprob;
    spec.emitted[i].top = std::move(results[i].top);
    spec.emitted[i].token_ids = std::move(results[i].token_ids);
  }
}

void Speculator::refill(const StepPlan& plan, const Tensor& hidden_states,
                        std::span<const SampleResult> samples, PagedKvCache& cache) {
  const int64_t H = mtp_->hidden_size();
  std::vector<std::vector<int32_t>> next(plan.chunks.size());
  std::vector<MtpRefill> refills;
  int64_t hidden_row = 0;  // hidden_states rows: every new token, chunk by chunk
  for (size_t c = 0; c < plan.chunks.size(); ++c) {
    const ScheduledChunk& chunk = plan.chunks[c];
    RequestState& request = *chunk.request;
    const int64_t end = chunk.start + chunk.count;
    std::vector<int32_t>& tokens = next[c];
    const auto known = [&](int64_t from, int64_t to) {
      tokens.assign(request.tokens.begin() + from, request.tokens.begin() + to);
    };
    int64_t output_row = -1;
    bool drafts_follow = false;  // the state's row is the next step's draft row
    if (request.spec.verifying) {
      tokens = request.spec.result.tokens;  // rows m..m+a read d_1..d_a, x'
      drafts_follow = true;
      if (mtp_->prefers_uniform_rows()) {
        // Rows m+a+1..m+k as placeholders (their hidden states exist), so
        // every verification refills k + 1 rows.
        output_row = static_cast<int64_t>(tokens.size()) - 1;
        tokens.resize(static_cast<size_t>(chunk.count), tokens.back());
      }
    } else if (request.spec.sample_index >= 0) {
      known(chunk.start + 1, end);
      tokens.push_back(samples[static_cast<size_t>(request.spec.sample_index)].token);
      drafts_follow = true;
    } else if (end < static_cast<int64_t>(request.tokens.size())) {
      known(chunk.start + 1, end + 1);  // a prefill chunk: the next token is in the prompt
    } else {
      known(chunk.start + 1, end);  // nothing follows the last row (scoring)
    }
    if (!tokens.empty()) {
      MtpRefill refill{&request.spec.draft, chunk.start, request.page_table, tokens,
                       hidden_states.data<float>() + hidden_row * H};
      refill.output_row = output_row;
      if (drafts_follow && greedy_drafts_on_refill(request)) {
        refill.greedy_drafts = config_.speculative_steps;
        refill.want_logits = false;
      }
      refills.push_back(refill);
    }
    hidden_row += chunk.count;
  }
  run_mtp_refill(*mtp_, cache, refills);
}

bool Speculator::greedy_drafts_on_refill(const RequestState& request) const {
  // Drafts that depend on nothing but the refill's state: greedy, no grammar
  // mask (it depends on the drafts before), IndexShare + KVShare (draft rows
  // write no cache entry, so they need no pages of the next step), and a
  // request that may speculate at all (draft_count).
  const SamplingParams& sampling = request.request.sampling;
  return config_.speculative_share && is_greedy(sampling) && !request.matcher &&
         may_speculate(sampling);
}

std::span<const SampleResult> Speculator::apply_verification(RequestState& request,
                                                             Scheduler& scheduler) {
  SpeculationState& spec = request.spec;
  const int64_t k = request.num_draft_tokens;
  // Drafts accepted past max_new_tokens are never emitted: they do not count
  // (request.tokens still ends with the k drafts here).
  const int64_t room = request.request.sampling.max_new_tokens - (request.num_generated() - k);
  const int64_t accepted = std::min(spec.result.accepted, std::max<int64_t>(room - 1, 0));
  spec.verify_count += 1;
  spec.draft_tokens += k;
  spec.accepted_tokens += accepted;
  verify_total_ += 1;
  accepted_total_ += accepted;
  const int64_t m = spec.verify_start;
  // Keep the KV of x_m, d_1..d_a; the rejected drafts' positions and pages go.
  scheduler.truncate(request, m + 1 + accepted);
  // The accepted drafts are emitted again by the Engine's normal path; the
  // cache keeps them computed (num_computed = m + 1 + a stays ahead of the
  // tokens until they are re-appended).
  request.tokens.resize(static_cast<size_t>(m + 1));
  request.num_draft_tokens = 0;
  spec.verifying = false;
  spec.q.clear();
  // The matcher accepted the valid drafts while drafting; it takes the
  // emitted tokens again one by one when the Engine appends them.
  if (request.matcher && spec.grammar_drafts > 0) {
    request.matcher->rollback(static_cast<int32_t>(spec.grammar_drafts));
    spec.grammar_drafts = 0;
  }
  return spec.emitted;
}

}  // namespace megactx
