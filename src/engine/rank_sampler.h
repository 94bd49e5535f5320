// Sampling where the rows are (data-parallel attention over a group,
// model/group_model.h's RankRows): after a forward that left each logits row
// with the rank that computed it, rank 0 sends every other rank the sampling
// rows of its own logits rows (parameters, penalty counts, grammar masks,
// seeds, logprob options: a few KiB against the row's vocab x 4 bytes of
// logits), each rank samples them with its own sampler (the same semantics,
// engine/sampler.h) while rank 0 samples its own, and the results come back
// to rank 0 in the rows' order. Seeded draws are a hash of (seed, draw
// index), so a row gives the same token on any rank. Input logprobs
// (scoring) go the same way (RankSampler::score): a query each, a few bytes
// of result, where gathering a scored prompt's rows would move prompt x
// vocab x 4 bytes (5 GB for 8K tokens of GLM-5.2).
//
// One command (RankRows::run) carries every rank's rows in its payload
// (encode: [n] the ranks named, [n] int64 the bytes of each one's rows, then
// the rows' bytes packed into int64 words; one broadcast where the payload
// fits the command header), and the results come back in two collectives
// over the whole group, made by rank 0 (RankSampler::sample or score) and
// every worker (serve_own_rows) in the same order:
//   all_gather [size] int64: the bytes of each rank's results
//   all_to_all: each rank -> rank 0 its results
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "engine/sampler.h"
#include "parallel/communicator.h"

namespace megactx {

class RankRows;  // model/group_model.h

class RankSampler {
 public:
  explicit RankSampler(RankRows& rank_rows) : rank_rows_(rank_rows) {}

  // `own_logits` [rank 0's rows, vocab] (ForwardOutput::logits) and
  // `row_ranks` [rows] (ForwardOutput::logits_ranks): rows[i].logits_row
  // indexes row_ranks; results[i] for rows[i]. `local` samples rank 0's rows.
  // Adds the rows each data-parallel rank sampled to `sampled_per_rank`
  // (resized to the ranks seen; nothing when the call fails).
  void sample(Sampler& local, const Tensor& own_logits, std::span<const int> row_ranks,
              std::span<const SamplingRow> rows, std::span<SampleResult> results,
              std::vector<int64_t>& sampled_per_rank);
  // Sampler::score of `queries` (logits_row indexes row_ranks) the same way.
  void score(Sampler& local, const Tensor& own_logits, std::span<const int> row_ranks,
             std::span<const LogprobQuery> queries, std::span<TokenLogprob> results);
  // Sampler::check_drafts and distributions the same way (a check's k + 1
  // rows are on one rank: the request's); rejection-sampling verification
  // then moves a verdict per request, and one distribution row per rejected
  // draft, instead of every row.
  void check_drafts(Sampler& local, const Tensor& own_logits, std::span<const int> row_ranks,
                    std::span<const DraftCheck> checks, std::span<DraftVerdict> verdicts);
  void distributions(Sampler& local, const Tensor& own_logits, std::span<const int> row_ranks,
                     std::span<const DistributionQuery> queries, std::span<std::vector<float>> out);

 private:
  RankRows& rank_rows_;
  std::vector<SamplingRow> own_rows_;  // rank 0's rows, logits_row made local
  std::vector<SampleResult> own_results_;
  std::vector<LogprobQuery> own_queries_;  // likewise for score
  std::vector<TokenLogprob> own_scores_;
  std::vector<DraftCheck> own_checks_;  // likewise for check_drafts and distributions
  std::vector<DraftVerdict> own_verdicts_;
  std::vector<DistributionQuery> own_distribution_queries_;
  std::vector<std::vector<float>> own_distributions_;
};

// One step's Sampler over logits left with their ranks: sample and score
// route each row through `ranks` (rank 0's own rows to `local`), so code
// written against a Sampler (the engine's collection, the speculator's
// greedy verification and logprobs) runs unchanged. `own_logits` passed to
// its calls is rank 0's rows (ForwardOutput::logits); `row_ranks` stays the
// caller's.
class StepRankSampler final : public Sampler {
 public:
  StepRankSampler(RankSampler& ranks, Sampler& local, std::span<const int> row_ranks,
                  std::vector<int64_t>& sampled_per_rank)
      : ranks_(ranks), local_(local), row_ranks_(row_ranks), sampled_per_rank_(sampled_per_rank) {}
  void sample(const Tensor& own_logits, std::span<const SamplingRow> rows,
              std::span<SampleResult> results) override {
    ranks_.sample(local_, own_logits, row_ranks_, rows, results, sampled_per_rank_);
  }
  void score(const Tensor& own_logits, std::span<const LogprobQuery> queries,
             std::span<TokenLogprob> results) override {
    ranks_.score(local_, own_logits, row_ranks_, queries, results);
  }
  void check_drafts(const Tensor& own_logits, std::span<const DraftCheck> checks,
                    std::span<DraftVerdict> verdicts) override {
    ranks_.check_drafts(local_, own_logits, row_ranks_, checks, verdicts);
  }
  void distributions(const Tensor& own_logits, std::span<const DistributionQuery> queries,
                     std::span<std::vector<float>> out) override {
    ranks_.distributions(local_, own_logits, row_ranks_, queries, out);
  }

 private:
  RankSampler& ranks_;
  Sampler& local_;
  std::span<const int> row_ranks_;
  std::vector<int64_t>& sampled_per_rank_;
};

// A worker's side of RankSampler::sample and score (RankRowsHandler): samples
// or scores the rows rank 0 sends it from `own_logits` with `local`, and
// sends the results back. Rows it cannot answer (they do not decode, name a
// logits row it does not hold, or the sampler fails) are reported to rank 0,
// which fails the step with the reason; the group stays in step.
// `command` is the RankRows command's payload.
void serve_own_rows(const Tensor& own_logits, std::span<const int64_t> command, Sampler& local,
                    parallel::Communicator& group);

}  // namespace megactx
