// SpeculativeDecoder: MTP speculative decoding of a batch of sequences over a
// DsaModel and its MtpLayer, with its own PagedKvCache (target layers plus the
// MTP layer) and PageAllocator. It is the CPU implementation of the algorithm;
// the serving engine (engine/engine.h) drives the same steps through its
// scheduler, and a CUDA backend plugs in underneath DsaModel/MtpLayer.
//
// One round for every active sequence (m = tokens in both caches, x_m the
// last emitted token, not yet cached):
//   1. drafts: d_1 comes from the MTP output of the previous refill (row m-1);
//      steps j = 1..k-1 run the MTP layer on one row per sequence at position
//      m-1+j with (d_j, hand-off of step j-1): with sharing they write nothing
//      and reuse step 0's KV [0, m) and top-k; without, they write their own
//      entry and run the indexer. Batched across sequences.
//   2. verification: one target forward over [x_m, d_1..d_k] at positions
//      m..m+k for all sequences (batched), logits of every row, hidden states.
//   3. acceptance (rejection_sampler.h), giving a accepted drafts and one new
//      token x'.
//   4. rollback: m' = m + a + 1 (x_m, d_1..d_a); pages past m' + 1 positions
//      go back to the allocator (their contents are overwritten later).
//   5. refill: the MTP layer over rows m..m+a with next tokens
//      [d_1..d_a, x'] and the target hidden states of those rows (step 0 of
//      the next round: writes the MTP cache, gives d_1's logits and top-k).
// steps = 0 decodes without speculation (one target forward per token).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "cache/kv_cache.h"
#include "cache/page_allocator.h"
#include "engine/mtp_drafter.h"
#include "engine/rejection_sampler.h"
#include "engine/request.h"
#include "model/mtp_layer.h"

namespace megactx {

struct SpeculativeOptions {
  int64_t steps = 3;  // k draft tokens per round (0 = no speculation, 1..7)
  bool share = true;  // IndexShare + KVShare across draft steps
  // Greedy is used whenever the sampling params are greedy; otherwise this
  // picks RejectionSampling or TargetOnly.
  VerifyMode sampled_mode = VerifyMode::RejectionSampling;
  KvDType kv_dtype = KvDType::F32;
  int64_t num_pages = 0;  // total KV pages shared by all sequences
};

struct SpeculativeStats {
  int64_t verify_count = 0;     // target verification forwards (rounds) of this sequence
  int64_t draft_tokens = 0;     // drafts proposed
  int64_t accepted_tokens = 0;  // drafts accepted
  // Tokens emitted per verification (accepted + 1): the "accepted length".
  double accepted_length() const {
    return verify_count ? 1.0 + static_cast<double>(accepted_tokens) / verify_count : 0.0;
  }
};

class SpeculativeDecoder {
 public:
  SpeculativeDecoder(DsaModel& target, MtpLayer* mtp, SpeculativeOptions options);

  // Prefills `prompt` (target and MTP layer) and samples the first token.
  // Returns the sequence id. `eos` ids end a sequence (unless ignore_eos).
  int64_t add(std::span<const int32_t> prompt, const SamplingParams& params,
              std::span<const int32_t> eos = {});
  // One round over every unfinished sequence; false when none is left.
  bool step();
  void run_to_completion() {
    while (step()) {
    }
  }

  bool finished(int64_t id) const { return sequences_.at(id).finished; }
  const std::vector<int32_t>& output(int64_t id) const { return sequences_.at(id).output; }
  const SpeculativeStats& stats(int64_t id) const { return sequences_.at(id).stats; }
  // Frees the pages of a finished sequence.
  void release(int64_t id);

  // Throws Error unless every page is held by exactly the sequences whose
  // page tables name it, each live sequence's pages cover its cached
  // positions, and both caches hold the same number of positions.
  void check_integrity() const;
  PagedKvCache& cache() { return *cache_; }
  int64_t cached_length(int64_t id) const { return sequences_.at(id).cached; }

 private:
  struct Sequence {
    std::vector<int32_t> tokens;  // prompt + output
    std::vector<int32_t> output;
    std::vector<int32_t> pages;
    int64_t cached = 0;  // positions in the target and the MTP cache
    SamplingParams params;
    std::vector<int32_t> eos;
    std::mt19937_64 rng;
    bool finished = false;
    bool released = false;
    SpeculativeStats stats;
    // Step 0 of the next round (row cached - 1): d_1's logits, hand-off, top-k.
    MtpDraftState draft;
  };

  void ensure_pages(Sequence& s, int64_t positions);
  void trim_pages(Sequence& s, int64_t positions);
  bool greedy(const Sequence& s) const;
  double uniform(Sequence& s);
  int32_t sample(Sequence& s, std::span<const float> logits);
  void emit(Sequence& s, std::span<const int32_t> tokens);
  bool plain_step(std::span<const int64_t> ids);

  DsaModel& target_;
  MtpLayer* mtp_;
  SpeculativeOptions options_;
  std::unique_ptr<PagedKvCache> cache_;
  PageAllocator allocator_;
  std::vector<Sequence> sequences_;
};

}  // namespace megactx
