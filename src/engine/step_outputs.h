// StepOutputs: what one engine step's forward produced, from the grammar
// masks and collect_outputs (no request changes yet) to apply_outputs (tokens
// appended, stops, finishes). One value per step; the Engine keeps one and
// clears it, so the vectors keep their capacity across steps.
#pragma once

#include <algorithm>
#include <vector>

#include "engine/request_state.h"
#include "engine/sampler.h"

namespace megactx {

struct StepOutputs {
  // Plain sampling: one row per chunk that samples its next token, and its request.
  std::vector<SamplingRow> sampling_rows;
  std::vector<RequestState*> sampling_requests;
  std::vector<SampleResult> samples;  // [sampling_rows]
  // Input logprobs (scoring): one query per scored prompt position.
  std::vector<LogprobQuery> logprob_queries;
  std::vector<RequestState*> logprob_requests;
  std::vector<TokenLogprob> logprob_results;         // [logprob_queries]
  std::vector<RequestState*> scoring_done;           // scoring requests ending this step
  std::vector<RequestState*> scored_through_prompt;  // input logprobs complete this step
  std::vector<RequestState*> verifying;              // MTP verification chunks
  std::vector<RequestState*> grammar_failed;         // grammars that allowed no token

  // Everything but grammar_failed, which the masks fill before collecting.
  void clear_collected() {
    sampling_rows.clear();
    sampling_requests.clear();
    samples.clear();
    logprob_queries.clear();
    logprob_requests.clear();
    logprob_results.clear();
    scoring_done.clear();
    scored_through_prompt.clear();
    verifying.clear();
  }
  bool grammar_failed_for(const RequestState& request) const {
    return request.matcher && std::find(grammar_failed.begin(), grammar_failed.end(), &request) !=
                                  grammar_failed.end();
  }
};

}  // namespace megactx
