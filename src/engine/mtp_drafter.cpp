#include "engine/mtp_drafter.h"

#include <algorithm>

#include "core/error.h"
#include "engine/cpu_sampler.h"

namespace megactx {
namespace {

std::span<const float> row_of(const Tensor& t, int64_t row) {
  const int64_t width = t.shape().back();
  return {t.data<float>() + row * width, static_cast<size_t>(width)};
}

// `logits` with the grammar mask applied (a copy in `scratch`), or as they are.
std::span<const float> masked(std::span<const float> logits, const uint32_t* mask,
                              std::vector<float>& scratch) {
  if (mask == nullptr) return logits;
  scratch.assign(logits.begin(), logits.end());
  apply_token_mask({mask, (logits.size() + 31) / 32}, scratch);
  return scratch;
}

// One draft from `logits`: argmax when greedy (q stays empty = one-hot),
// else a draw from q = the sampling transform of the logits; both after the
// grammar mask of the request's structured output, if any.
int32_t draft_token(const MtpDraftRequest& request, std::span<const float> logits,
                    std::vector<float>& q) {
  std::vector<float> scratch;
  if (request.mask) logits = masked(logits, request.mask(request.drafts), scratch);
  if (is_greedy(*request.params)) {
    q.clear();
    return argmax(logits);
  }
  q = sampling_distribution(*request.params, logits);
  return draw_from(q, request.uniform());
}

}  // namespace

void run_mtp_refill(MtpLayer& mtp, PagedKvCache& cache, std::span<const MtpRefill> refills) {
  if (refills.empty()) return;
  std::vector<MtpLayer::Rows> rows(refills.size());
  for (size_t i = 0; i < refills.size(); ++i) {
    const MtpRefill& refill = refills[i];
    MtpLayer::Rows& r = rows[i];
    r.start = refill.start;
    r.count = static_cast<int64_t>(refill.next_tokens.size());
    r.pages = refill.pages;
    r.next_tokens = refill.next_tokens;
    r.hidden = refill.hidden;
    r.target_hidden = true;
    r.output_row = refill.output_row;
    r.greedy_drafts = refill.greedy_drafts;
    r.want_logits = refill.want_logits;
  }
  MtpLayer::Output out = mtp.run(rows, cache);
  for (size_t i = 0; i < refills.size(); ++i) {
    MtpDraftState& state = *refills[i].state;
    const auto hand = row_of(out.hand_off, static_cast<int64_t>(i));
    state.row = rows[i].start + rows[i].last_row();
    if (refills[i].want_logits) {
      const auto logits = row_of(out.logits, static_cast<int64_t>(i));
      state.logits.assign(logits.begin(), logits.end());
    } else {
      state.logits.clear();
    }
    state.hand_off.assign(hand.begin(), hand.end());
    state.topk = out.last_topk[i];
    state.topk_count = out.last_count[i];
    state.drafts = i < out.drafts.size() ? std::move(out.drafts[i]) : std::vector<int32_t>{};
  }
}

void run_mtp_drafts(MtpLayer& mtp, PagedKvCache& cache, bool share,
                    std::span<MtpDraftRequest> requests) {
  int64_t max_steps = 0;
  // hand[i]: [H] hand-off of the last step of request i.
  std::vector<std::vector<float>> hand(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    MtpDraftRequest& r = requests[i];
    MEGACTX_CHECK(r.state != nullptr && r.state->row == r.cached - 1 && r.steps >= 1,
                  "MTP drafts: state of row {} for {} cached positions, {} steps",
                  r.state ? r.state->row : -1, r.cached, r.steps);
    r.drafts.clear();
    if (is_greedy(*r.params) && !r.mask &&
        static_cast<int64_t>(r.state->drafts.size()) >= r.steps) {
      // Made on the device by the refill (one-hot q).
      r.drafts.assign(r.state->drafts.begin(), r.state->drafts.begin() + r.steps);
      r.q.assign(static_cast<size_t>(r.steps), {});
      continue;
    }
    MEGACTX_CHECK(!r.state->logits.empty(),
                  "MTP drafts: the refill of row {} kept neither logits nor {} greedy drafts",
                  r.state->row, r.steps);
    r.q.assign(1, {});
    const int32_t first = draft_token(r, r.state->logits, r.q[0]);
    r.drafts.push_back(first);
    hand[i] = r.state->hand_off;
    max_steps = std::max(max_steps, r.steps);
  }
  // Step j: one row per request that wants more than j drafts, at m - 1 + j.
  std::vector<MtpLayer::Rows> rows;
  std::vector<size_t> owners;
  for (int64_t j = 1; j < max_steps; ++j) {
    rows.clear();
    owners.clear();
    for (size_t i = 0; i < requests.size(); ++i) {
      const MtpDraftRequest& request = requests[i];
      if (static_cast<int64_t>(request.drafts.size()) != j || request.steps <= j) continue;
      MtpLayer::Rows r;
      r.start = request.cached - 1 + j;
      r.count = 1;
      r.pages = request.pages;
      r.next_tokens = std::span<const int32_t>(&request.drafts.back(), 1);
      r.hidden = hand[i].data();
      r.target_hidden = false;
      if (share) {
        r.shared = true;
        r.shared_context = request.cached;
        r.shared_topk = request.state->topk;
        r.shared_count = request.state->topk_count;
      }
      rows.push_back(r);
      owners.push_back(i);
    }
    const MtpLayer::Output out = mtp.run(rows, cache);
    for (size_t o = 0; o < owners.size(); ++o) {
      MtpDraftRequest& request = requests[owners[o]];
      const auto h = row_of(out.hand_off, static_cast<int64_t>(o));
      hand[owners[o]].assign(h.begin(), h.end());
      request.q.emplace_back();
      const int32_t draft =
          draft_token(request, row_of(out.logits, static_cast<int64_t>(o)), request.q.back());
      request.drafts.push_back(draft);
    }
  }
}

VerifyResult verify_drafts(const SamplingParams& params, VerifyMode sampled_mode,
                           std::span<const std::span<const float>> target_logits,
                           std::span<const int32_t> drafts, std::span<const std::vector<float>> q,
                           const std::function<double()>& uniform,
                           std::span<const uint32_t* const> masks) {
  std::vector<std::vector<float>> scratch(target_logits.size());
  std::vector<std::span<const float>> rows(target_logits.begin(), target_logits.end());
  for (size_t i = 0; i < masks.size() && i < rows.size(); ++i)
    rows[i] = masked(rows[i], masks[i], scratch[i]);
  if (is_greedy(params)) return verify_greedy(rows, drafts);
  MEGACTX_CHECK(rows.size() == drafts.size() + 1,
                "verify: {} target rows for {} drafts (need k + 1)", rows.size(), drafts.size());
  // Each target row is transformed (softmax, top-k / top-p) only when the
  // verification reaches it: rows after the first rejection are never read.
  std::vector<float> p;
  const TargetRow p_row = [&](size_t i) -> const std::vector<float>& {
    p = sampling_distribution(params, rows[i]);
    return p;
  };
  return sampled_mode == VerifyMode::TargetOnly
             ? verify_target_only_rows(p_row, drafts, uniform)
             : verify_rejection_rows(rows[0].size(), p_row, q, drafts, uniform);
}

}  // namespace megactx
