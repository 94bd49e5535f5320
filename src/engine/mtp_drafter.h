// The three pieces of MTP speculative decoding the serving engine runs
// (speculator.h):
//
//  * refill: step 0 of the MTP layer over accepted rows [start, start + n)
//    (row t reads the target's hidden state h_t and token_{t+1}); writes the
//    MTP layer's latent and indexer-key entries of those rows and keeps the
//    last row's output (d_1's logits, the hand-off, the step-0 top-k) in an
//    MtpDraftState for the next round;
//  * drafts: d_1 from that state, then steps j = 1..k-1 (one row per sequence
//    at position m - 1 + j, m = positions in both caches), batched over
//    sequences with different k; with IndexShare + KVShare the draft rows
//    write nothing and attend over step 0's entries [0, m) through step 0's
//    top-k (model/mtp_layer.h);
//  * verification of the drafts against k + 1 target logits rows
//    (rejection_sampler.h), greedy when the request is greedy, else with the
//    same temperature/top-k/top-p/min-p transform (sampling_distribution) of
//    the target and the draft logits.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "cache/kv_cache.h"
#include "engine/rejection_sampler.h"
#include "engine/request.h"
#include "model/mtp_layer.h"

namespace megactx {

// Output of the latest refill of one sequence: step 0 at row `row`.
struct MtpDraftState {
  int64_t row = -1;             // position of that row; -1: none yet
  std::vector<float> logits;    // [V] d_1's draft logits (empty when not wanted)
  std::vector<float> hand_off;  // [H] input of draft step 1
  std::vector<int32_t> topk;    // [index_topk] step-0 selection (IndexShare)
  int64_t topk_count = 0;       // valid entries of topk
  // Greedy drafts d_1.. made right after the refill (MtpRefill::greedy_drafts):
  // a greedy request's drafts need nothing but this state, so the MTP layer
  // chains them on the device in the refill's own launch.
  std::vector<int32_t> drafts;
};

struct MtpRefill {
  MtpDraftState* state = nullptr;
  int64_t start = 0;                     // position of the first row
  std::span<const int32_t> pages;        // page table covering the rows
  std::span<const int32_t> next_tokens;  // [rows] token_{t+1} of each row
  const float* hidden = nullptr;         // [rows, H] target hidden states (before model.norm)
  // The row the state keeps (-1: the last); later rows are placeholders
  // (MtpLayer::Rows::output_row).
  int64_t output_row = -1;
  int64_t greedy_drafts = 0;  // greedy drafts to make now (IndexShare + KVShare)
  bool want_logits = true;    // keep d_1's logits (sampled or masked drafts)
};

// One batched MTP step 0 over every refill; updates each state.
void run_mtp_refill(MtpLayer& mtp, PagedKvCache& cache, std::span<const MtpRefill> refills);

struct MtpDraftRequest {
  const MtpDraftState* state = nullptr;  // state->row == cached - 1
  std::span<const int32_t> pages;        // covers positions [0, cached + steps)
  int64_t cached = 0;                    // m: positions in the target and the MTP cache
  int64_t steps = 0;                     // k >= 1 drafts
  const SamplingParams* params = nullptr;
  std::function<double()> uniform;  // draws for sampled drafts
  // Structured output: the grammar mask ([vocab / 32] words) for the draft
  // after `drafts` (called once per draft, in order); null or an empty
  // function: that draft is unconstrained. Drafts then come from the masked
  // draft logits, and q is the masked distribution they were drawn from.
  std::function<const uint32_t*(std::span<const int32_t> drafts)> mask;
  // Out: [k] drafts and, for sampled requests, [k][V] draft distributions q
  // (empty rows for greedy requests: one-hot).
  std::vector<int32_t> drafts;
  std::vector<std::vector<float>> q;
};

// Drafts for every request (batched per draft step). `share`: IndexShare +
// KVShare; without it draft rows write their own entries at m - 1 + j (later
// refills overwrite them). A greedy request without a mask whose state holds
// enough greedy drafts takes them and runs no step.
void run_mtp_drafts(MtpLayer& mtp, PagedKvCache& cache, bool share,
                    std::span<MtpDraftRequest> requests);

// Verification of `drafts` (q as run_mtp_drafts made them) against k + 1
// rows of raw target logits. Structured output: masks[i] (empty or null
// entries: none) is the grammar mask of target row i, applied before the
// sampling transform (and the argmax of greedy verification).
VerifyResult verify_drafts(const SamplingParams& params, VerifyMode sampled_mode,
                           std::span<const std::span<const float>> target_logits,
                           std::span<const int32_t> drafts, std::span<const std::vector<float>> q,
                           const std::function<double()>& uniform,
                           std::span<const uint32_t* const> masks = {});

}  // namespace megactx
