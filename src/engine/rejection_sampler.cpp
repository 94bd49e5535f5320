#include "engine/rejection_sampler.h"

#include <algorithm>

#include "core/error.h"
#include "engine/cpu_sampler.h"

namespace megactx {
namespace {

void check_shapes(size_t p_rows, size_t q_rows, size_t drafts) {
  MEGACTX_CHECK(p_rows == drafts + 1, "verify: {} target rows for {} drafts (need k + 1)", p_rows,
                drafts);
  MEGACTX_CHECK(q_rows == drafts, "verify: {} draft distributions for {} drafts", q_rows, drafts);
}

}  // namespace

VerifyMode parse_verify_mode(const std::string& name) {
  if (name == "rejection") return VerifyMode::RejectionSampling;
  if (name == "target-only") return VerifyMode::TargetOnly;
  fail("unknown --spec-verify '{}' (rejection or target-only)", name);
}

int32_t draw_from(std::span<const float> weights, double u) {
  double total = 0.0;
  for (const float w : weights) total += std::max(w, 0.0f);
  MEGACTX_CHECK(total > 0.0, "draw_from: the weights sum to {}", total);
  const double target = u * total;
  double cumulative = 0.0;
  int32_t last = -1;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0.0f) continue;
    last = static_cast<int32_t>(i);
    cumulative += weights[i];
    if (cumulative > target) return last;
  }
  return last;  // rounding left target == total: the last positive weight
}

VerifyResult verify_greedy(std::span<const std::span<const float>> target_logits,
                           std::span<const int32_t> drafts) {
  check_shapes(target_logits.size(), drafts.size(), drafts.size());
  std::vector<int32_t> best;
  for (const auto& row : target_logits) best.push_back(argmax(row));
  return verify_greedy_argmax(best, drafts);
}

VerifyResult verify_greedy_argmax(std::span<const int32_t> target_argmax,
                                  std::span<const int32_t> drafts) {
  check_shapes(target_argmax.size(), drafts.size(), drafts.size());
  VerifyResult result;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    result.tokens.push_back(target_argmax[i]);
    if (i == drafts.size() || target_argmax[i] != drafts[i]) break;
    ++result.accepted;
  }
  return result;
}

int64_t rejection_accepted(std::span<const float> p_at_draft, std::span<const float> q_at_draft,
                           const std::function<double()>& uniform) {
  MEGACTX_CHECK(p_at_draft.size() == q_at_draft.size(),
                "verify: {} target probabilities for {} drafts", p_at_draft.size(),
                q_at_draft.size());
  for (size_t i = 0; i < p_at_draft.size(); ++i) {
    const double qd = q_at_draft[i];
    MEGACTX_CHECK(qd > 0.0, "verify: draft {} has q = 0 (not drawn from q)", i);
    // Accept with probability min(1, p/q): u * q < p.
    if (!(uniform() * qd < p_at_draft[i])) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(p_at_draft.size());
}

int32_t rejection_final_token(std::span<const float> p_row, std::span<const float> q_row,
                              int32_t draft, bool rejected,
                              const std::function<double()>& uniform) {
  if (!rejected) return draw_from(p_row, uniform());  // the bonus token
  const bool one_hot = q_row.empty();
  MEGACTX_CHECK(one_hot || q_row.size() == p_row.size(), "verify: q has {} entries, p {}",
                q_row.size(), p_row.size());
  // Residual norm(max(0, p - q)); draw_from normalizes.
  std::vector<float> residual(p_row.size());
  for (size_t v = 0; v < p_row.size(); ++v) {
    const float qv = one_hot ? (v == static_cast<size_t>(draft) ? 1.0f : 0.0f) : q_row[v];
    residual[v] = std::max(p_row[v] - qv, 0.0f);
  }
  double mass = 0.0;
  for (const float r : residual) mass += r;
  // p == q up to rounding yet rejected (probability ~0): fall back to p.
  return mass > 0.0 ? draw_from(residual, uniform()) : draw_from(p_row, uniform());
}

VerifyResult verify_rejection(std::span<const std::vector<float>> p,
                              std::span<const std::vector<float>> q,
                              std::span<const int32_t> drafts,
                              const std::function<double()>& uniform) {
  check_shapes(p.size(), q.size(), drafts.size());
  const size_t vocab = p.empty() ? 0 : p[0].size();
  for (const auto& row : p)
    MEGACTX_CHECK(row.size() == vocab, "verify: target rows of {} and {} entries", vocab,
                  row.size());
  return verify_rejection_rows(
      vocab, [&](size_t i) -> const std::vector<float>& { return p[i]; }, q, drafts, uniform);
}

VerifyResult verify_rejection_rows(size_t vocab, const TargetRow& p_row,
                                   std::span<const std::vector<float>> q,
                                   std::span<const int32_t> drafts,
                                   const std::function<double()>& uniform) {
  MEGACTX_CHECK(q.size() == drafts.size(), "verify: {} draft distributions for {} drafts", q.size(),
                drafts.size());
  for (size_t i = 0; i < drafts.size(); ++i) {
    MEGACTX_CHECK(drafts[i] >= 0 && static_cast<size_t>(drafts[i]) < vocab,
                  "verify: draft {} outside [0, {})", drafts[i], vocab);
    MEGACTX_CHECK(q[i].empty() || q[i].size() == vocab, "verify: q has {} entries, p {}",
                  q[i].size(), vocab);
  }
  // The accept tests in order, one uniform each (as rejection_accepted): p_i
  // is computed only once d_1..d_{i-1} have passed.
  VerifyResult result;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const std::vector<float>& p = p_row(i);
    const auto d = static_cast<size_t>(drafts[i]);
    const double qd = q[i].empty() ? 1.0 : q[i][d];
    MEGACTX_CHECK(qd > 0.0, "verify: draft {} has q = 0 (not drawn from q)", i);
    if (!(uniform() * qd < p[d])) {
      result.tokens.assign(drafts.begin(), drafts.begin() + static_cast<std::ptrdiff_t>(i));
      result.accepted = static_cast<int64_t>(i);
      result.tokens.push_back(rejection_final_token(p, q[i], drafts[i], true, uniform));
      return result;
    }
  }
  result.accepted = static_cast<int64_t>(drafts.size());
  result.tokens.assign(drafts.begin(), drafts.end());
  result.tokens.push_back(
      rejection_final_token(p_row(drafts.size()), std::span<const float>(), -1, false, uniform));
  return result;
}

VerifyResult verify_target_only(std::span<const std::vector<float>> p,
                                std::span<const int32_t> drafts,
                                const std::function<double()>& uniform) {
  check_shapes(p.size(), drafts.size(), drafts.size());
  return verify_target_only_rows([&](size_t i) -> const std::vector<float>& { return p[i]; },
                                 drafts, uniform);
}

VerifyResult verify_target_only_rows(const TargetRow& p_row, std::span<const int32_t> drafts,
                                     const std::function<double()>& uniform) {
  VerifyResult result;
  for (size_t i = 0; i <= drafts.size(); ++i) {
    const int32_t own = draw_from(p_row(i), uniform());
    result.tokens.push_back(own);
    if (i == drafts.size() || own != drafts[i]) break;
    ++result.accepted;
  }
  return result;
}

}  // namespace megactx
