// RequestState: everything the engine tracks for one request between submit
// and its final update. Owned by the Engine; the Scheduler holds pointers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "cache/prefix_cache.h"
#include "engine/mtp_drafter.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/stop_strings.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace megactx {

enum class RequestPhase : uint8_t { Waiting, Running, Finished };

// Penalties change the logits token by token from the output so far.
// The temperature a request's logprobs are taken at: its own with
// temp_scaled_logprobs (greedy requests: 1), else 1 (the raw distribution).
inline double logprob_temperature(const GenerationRequest& request) {
  const double t = request.sampling.temperature;
  return request.temp_scaled_logprobs && t >= 1e-5 ? t : 1.0;
}

inline bool uses_penalties(const SamplingParams& params) {
  return params.repetition_penalty != 1.0 || params.frequency_penalty != 0.0 ||
         params.presence_penalty != 0.0;
}

// MTP speculative decoding state of one request (speculator.h).
struct SpeculationState {
  MtpDraftState draft;  // step 0 of the MTP layer at the latest computed row
  uint64_t draws = 0;   // uniforms used so far by sampled drafts and verification
  // Totals reported as spec_verify_ct / spec_draft_token_num / spec_accept_token_num.
  int64_t verify_count = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  // ---- this step ----
  bool verifying = false;             // scheduled as [x_m, d_1..d_k]
  int64_t verify_start = 0;           // m
  std::vector<std::vector<float>> q;  // [k][V] draft distributions (empty rows: greedy)
  VerifyResult result;                // accepted drafts + one target token
  std::vector<SampleResult> emitted;  // result.tokens with their logprobs
  int64_t sample_index = -1;          // row of StepOutputs::samples (plain sampling), else -1
  // Structured output: [k + 1][mask words] grammar masks of rows
  // 0..grammar_drafts (before each draft, then after the last valid one),
  // made while drafting; the matcher holds grammar_drafts accepted drafts
  // until apply_verification rolls them back. The draft after grammar_drafts
  // broke the grammar (it is rejected; later ones are never reached).
  std::vector<uint32_t> masks;
  int64_t grammar_drafts = 0;
};

struct RequestState {
  GenerationRequest request;
  UpdateCallback callback;
  uint64_t arrival = 0;  // submission order

  // ---- sequence and cache (scheduler) ----
  // Prompt then generated tokens. The KV cache holds tokens[0, num_computed);
  // page_table[i] covers positions [i * page_size, (i + 1) * page_size).
  std::vector<int32_t> tokens;
  int64_t prompt_len = 0;
  int64_t num_computed = 0;
  // Speculative decoding: unverified draft tokens at the end of
  // `tokens`. A verification step computes them with the last real token
  // (1 + k new tokens, scheduled as decode); pages holding drafts are never
  // shared, so Scheduler::truncate() can drop rejected ones.
  int64_t num_draft_tokens = 0;
  std::vector<int32_t> page_table;
  PrefixCache::Node* prefix_node = nullptr;  // deepest tree node this request locks; null = none
  // Data-parallel attention: the rank whose pages (and prefix cache) it uses
  // while admitted, chosen at each admission (Scheduler); 0 otherwise.
  int dp_rank = 0;
  // False once the weights changed while it held KV (a weight update with the
  // engine paused in place): its pages are of the old weights, so none of
  // them go into the prefix cache; admission (recompute) sets it again.
  bool shares_pages = true;
  // The live host tier: its full pages were moved to offload pages (latents
  // in host memory, Scheduler::offload_pages). They never go into the prefix
  // cache; a preemption for device pages keeps them (the request resumes
  // from its last offload page instead of recomputing its context).
  bool latents_offloaded = false;
  int64_t max_total_tokens = 0;  // min(context, KV capacity)
  RequestPhase phase = RequestPhase::Waiting;
  int64_t admit_order = 0;  // larger = admitted later = preempted first
  int64_t preemptions = 0;
  // Data-parallel attention: steps in which a later request was admitted
  // while this one fit no rank (since it last entered the queue); at
  // SchedulerConfig::dp_admission_max_skips admission stops at it.
  int64_t admission_skips = 0;

  // ---- output processing (engine) ----
  uint64_t seed = 0;
  std::unordered_map<int32_t, int32_t> output_counts;  // only with penalties
  std::vector<int32_t> prompt_distinct;                // sorted; only with repetition penalty
  std::vector<int32_t> min_tokens_mask;                // eos + stop ids (min_new_tokens)
  std::optional<StreamingDetokenizer> detokenizer;
  StopStringMatcher stop;
  int64_t cached_tokens = 0;  // prefix-cache hit of the first admission
  bool admitted_once = false;
  bool input_logprobs_done = false;
  std::vector<TokenLogprob> input_logprobs;  // collected over prefill chunks
  // return_hidden_states: [positions computed so far, hidden], indexed by
  // position (a recomputed or re-verified position overwrites its row).
  std::vector<float> hidden_states;
  SpeculationState spec;
  // Structured output (sampling.grammar): the automaton state of the output so
  // far and the mask of the next token (plain decoding). The matcher takes
  // the tokens appended in a step at the start of the next step that reads it
  // (grammar_pending, Engine::accept_pending_tokens), while that step's
  // forward runs on a device, instead of one by one in the step that sampled
  // them; grammar_error: why it refused one (the request ends with it).
  std::unique_ptr<grammar::GrammarMatcher> matcher;
  std::vector<uint32_t> grammar_mask;
  std::vector<int32_t> grammar_pending;
  std::string grammar_error;
  RequestUpdate update;  // what this step produced
  bool has_update = false;

  int64_t num_generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  bool wants_input_logprobs() const {
    return request.return_logprob && request.logprob_start_len >= 0 && !input_logprobs_done;
  }
};

}  // namespace megactx
