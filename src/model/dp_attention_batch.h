// Data-parallel attention in a serving group (group_model.h): the engine on
// rank 0 plans one step for every rank, its sequences' pages numbered in one
// space where rank r holds device pages [r * P, (r + 1) * P) (P pages per
// rank, engine/kv_capacity.h) and, with the live host tier, a range of the
// offload pages after them (cache/rank_pages.h). Each rank forwards the
// sequences whose pages it holds, with their page ids made local, in its own
// cache; a rank with none still runs its forward, so that the experts'
// all-to-all of every MoE layer meets. The outputs come back to rank 0 in
// the batch's row order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/rank_pages.h"
#include "model/language_model.h"
#include "parallel/communicator.h"

namespace megactx {

// The numbering of `ranks` ranks' pages, each rank's cache made from `local`
// (its device pages and its offload pages).
inline RankPages rank_pages(const KvCacheSpec& local, int ranks) {
  return {local.num_pages, local.offload_pages, ranks};
}

// The rank whose ranges hold `pages` (sequence `sequence`'s page table, for
// the error): throws megactx::Error when they span two ranks' ranges or lie
// past every rank's.
int page_table_rank(std::span<const int32_t> pages, const RankPages& layout, size_t sequence);

// The rank of each of `batch`'s sequences. Throws megactx::Error when a
// sequence's pages span two ranks' ranges.
std::vector<int> sequence_ranks(const ForwardBatch& batch, const RankPages& layout);

// The shape of a step whose sequence s runs on rank ranks[s], the same on
// every rank (ForwardBatch::dp_step).
ForwardBatch::DataParallelStep data_parallel_step(const ForwardBatch& whole,
                                                  const std::vector<int>& ranks);

// One rank's share of a step: its sequences in batch order, their page
// tables local to its cache (the spans of `batch` point into `pages`), and
// the whole step's shape (data_parallel_step).
struct RankBatch {
  ForwardBatch batch;
  std::vector<std::vector<int32_t>> pages;
};
void rank_share(const ForwardBatch& whole, const std::vector<int>& ranks, int rank,
                const RankPages& layout, RankBatch& out);

// Page copies between caches numbered with ranges per rank (the host KV
// tier's device <-> host pages, the live host tier's device -> offload pages
// within the device cache): the pairs (from_pages[i], to_pages[i]) of rank
// `rank`, made local to its caches. Throws megactx::Error when a pair's
// pages lie on two ranks or past every rank's.
struct RankPagePairs {
  std::vector<int32_t> from, to;
};
RankPagePairs rank_page_pairs(std::span<const int32_t> from_pages,
                              std::span<const int32_t> to_pages, const RankPages& from_layout,
                              const RankPages& to_layout, int rank);

// One output gathered on rank 0: sequence s has `sequence_rows[s]` rows
// (each `row_shape` of `dtype`), computed by rank `ranks[s]`; `own` holds this
// rank's rows, its sequences in order. Rank 0 gets [sum of rows, row_shape]
// in the sequences' order (the others an undefined tensor). Called by every
// rank with the same counts and ranks.
Tensor gather_sequence_rows(std::span<const int64_t> sequence_rows, const std::vector<int>& ranks,
                            const Tensor& own, Shape row_shape, DType dtype,
                            parallel::Communicator& group);

// Every rank's outputs of its share (`own`, logits on the host) to rank 0,
// which gets the whole batch's in its order: logits rows (unless the batch
// leaves them at the ranks: logits_at_ranks), and the hidden states and
// routed experts when the batch asked for them. Called by every rank with the same `whole`
// and `ranks`; the result is rank 0's (empty elsewhere).
ForwardOutput gather_to_leader(const ForwardBatch& whole, const std::vector<int>& ranks,
                               const ForwardOutput& own, const ModelConfig& config,
                               parallel::Communicator& group);

}  // namespace megactx
