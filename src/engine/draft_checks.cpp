// Sampler's verification operations where the rows are (sampler.h:
// DraftCheck, DistributionQuery): the default implementations, on host rows.
// A data-parallel rank answers them for its own rows (rank_sampler.cpp), so a
// sampled request's verification moves a few numbers, and one row when a
// draft is rejected, instead of its k + 1 logits rows. The arithmetic is the
// host verification's (verify_drafts: the same distributions, uniforms and
// accept tests), so the tokens are the same.
#include <algorithm>
#include <cstring>
#include <functional>

#include "core/error.h"
#include "engine/cpu_sampler.h"
#include "engine/rejection_sampler.h"
#include "engine/sampler.h"

namespace megactx {
namespace {

int64_t mask_words(int64_t vocab) {
  return (vocab + 31) / 32;
}

// sampling_distribution of `logits` after `allowed` (empty: no mask).
std::vector<float> row_distribution(const SamplingParams& params, std::span<const float> logits,
                                    std::span<const uint32_t> allowed) {
  if (allowed.empty()) return sampling_distribution(params, logits);
  std::vector<float> masked(logits.begin(), logits.end());
  apply_token_mask(allowed, masked);
  return sampling_distribution(params, masked);
}

}  // namespace

Tensor Sampler::rows_on_host(const Tensor& logits, std::span<const int64_t> rows) {
  MEGACTX_CHECK(
      logits.device() == Device::CPU && logits.dtype() == DType::F32 && logits.rank() == 2,
      "sampler: host rows of {} logits on a device this sampler does not read",
      shape_string(logits.shape()));
  const int64_t vocab = logits.dim(1);
  Tensor out = Tensor::empty({static_cast<int64_t>(rows.size()), vocab});
  for (size_t i = 0; i < rows.size(); ++i) {
    MEGACTX_CHECK(rows[i] >= 0 && rows[i] < logits.dim(0), "sampler: logits row {} of {}", rows[i],
                  logits.dim(0));
    std::memcpy(out.data<float>() + static_cast<int64_t>(i) * vocab,
                logits.data<float>() + rows[i] * vocab, static_cast<size_t>(vocab) * sizeof(float));
  }
  return out;
}

void Sampler::check_drafts(const Tensor& logits, std::span<const DraftCheck> checks,
                           std::span<DraftVerdict> verdicts) {
  MEGACTX_CHECK(verdicts.size() >= checks.size(), "sampler: {} verdicts for {} checks",
                verdicts.size(), checks.size());
  // Every check's k + 1 rows to the host in one call (a device sampler
  // synchronises once); check c's rows start at first[c].
  std::vector<int64_t> rows, first;
  for (size_t c = 0; c < checks.size(); ++c) {
    const DraftCheck& check = checks[c];
    MEGACTX_CHECK(check.params != nullptr, "sampler: draft check {} has no parameters", c);
    MEGACTX_CHECK(check.q_at_draft.size() == check.drafts.size(),
                  "sampler: {} draft probabilities for {} drafts", check.q_at_draft.size(),
                  check.drafts.size());
    first.push_back(static_cast<int64_t>(rows.size()));
    for (size_t r = 0; r <= check.drafts.size(); ++r)
      rows.push_back(check.logits_row + static_cast<int64_t>(r));
  }
  if (checks.empty()) return;
  const Tensor host = rows_on_host(logits, rows);
  const int64_t vocab = host.dim(1), words = mask_words(vocab);
  for (size_t c = 0; c < checks.size(); ++c) {
    const DraftCheck& check = checks[c];
    const auto k = static_cast<int64_t>(check.drafts.size());
    MEGACTX_CHECK(
        check.allowed.empty() || static_cast<int64_t>(check.allowed.size()) == (k + 1) * words,
        "sampler: {} mask words for {} rows of {} tokens", check.allowed.size(), k + 1, vocab);
    auto distribution = [&](int64_t r) {
      const std::span<const float> logits_row(host.data<float>() + (first[c] + r) * vocab,
                                              static_cast<size_t>(vocab));
      return row_distribution(
          *check.params, logits_row,
          check.allowed.empty()
              ? std::span<const uint32_t>()
              : check.allowed.subspan(static_cast<size_t>(r * words), static_cast<size_t>(words)));
    };
    std::vector<float> p_at_draft;
    for (int64_t i = 0; i < k; ++i) {
      const int32_t draft = check.drafts[static_cast<size_t>(i)];
      MEGACTX_CHECK(draft >= 0 && draft < vocab, "verify: draft {} outside [0, {})", draft, vocab);
      p_at_draft.push_back(distribution(i)[static_cast<size_t>(draft)]);
    }
    uint64_t draw = check.first_draw;
    const std::function<double()> uniform = [&] { return sampling_uniform(check.seed, draw++); };
    DraftVerdict& verdict = verdicts[c];
    verdict.accepted = rejection_accepted(p_at_draft, check.q_at_draft, uniform);
    verdict.bonus =
        verdict.accepted == k ? rejection_final_token(distribution(k), {}, -1, false, uniform) : -1;
  }
}

void Sampler::distributions(const Tensor& logits, std::span<const DistributionQuery> queries,
                            std::span<std::vector<float>> out) {
  MEGACTX_CHECK(out.size() >= queries.size(), "sampler: {} distributions for {} rows", out.size(),
                queries.size());
  if (queries.empty()) return;
  std::vector<int64_t> rows;
  for (size_t q = 0; q < queries.size(); ++q) {
    MEGACTX_CHECK(queries[q].params != nullptr, "sampler: distribution {} has no parameters", q);
    rows.push_back(queries[q].logits_row);
  }
  const Tensor host = rows_on_host(logits, rows);  // one call for every query's row
  const int64_t vocab = host.dim(1);
  for (size_t q = 0; q < queries.size(); ++q) {
    const DistributionQuery& query = queries[q];
    MEGACTX_CHECK(
        query.allowed.empty() || static_cast<int64_t>(query.allowed.size()) == mask_words(vocab),
        "sampler: {} mask words for {} tokens", query.allowed.size(), vocab);
    out[q] = row_distribution(
        *query.params,
        std::span<const float>(host.data<float>() + static_cast<int64_t>(q) * vocab,
                               static_cast<size_t>(vocab)),
        query.allowed);
  }
}

}  // namespace megactx
