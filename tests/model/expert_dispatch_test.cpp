// The expert all-to-all's host bookkeeping (model/expert_dispatch.h) on a
// hand-checked case: 3 rows of top-2 over 6 experts on 3 ranks (2 each).
// The gathered dispatch's choice: the rows every rank pads to come from the
// whole step's shape, which every rank's share carries (a share with no
// sequences too), and only the layouts it serves take it.
#include "model/expert_dispatch.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "hf_fixture.h"
#include "io/model_config.h"
#include "model/dp_attention_batch.h"
#include "model/model_plan.h"

namespace megactx {
namespace {

TEST(ExpertDispatch, PairsGoToTheirExpertsRanksInRankThenPairOrder) {
  // Pairs 0..5: experts 5, 0 | 2, 3 | 0, 4.
  const std::vector<int32_t> ids = {5, 0, 2, 3, 0, 4};
  const ExpertSends sends = plan_expert_sends(ids, /*top_k=*/2, /*experts=*/6, /*ranks=*/3);
  EXPECT_EQ(sends.pairs, (std::vector<int64_t>{2, 2, 2}));
  // Rank 0 gets pairs 1 and 4 (expert 0), rank 1 pairs 2, 3, rank 2 pairs 0, 5.
  EXPECT_EQ(sends.pair_of, (std::vector<int32_t>{1, 4, 2, 3, 0, 5}));
  EXPECT_EQ(sends.rows, (std::vector<int32_t>{0, 2, 1, 1, 0, 2}));
  EXPECT_EQ(sends.experts, (std::vector<int32_t>{0, 0, 0, 1, 1, 0}));
  for (size_t at = 0; at < sends.pair_of.size(); ++at)
    EXPECT_EQ(sends.position[static_cast<size_t>(sends.pair_of[at])], static_cast<int32_t>(at));
  EXPECT_EQ(byte_counts(sends.pairs, 4), (std::vector<int64_t>{8, 8, 8}));
}

TEST(ExpertDispatch, NoRowsSendNothing) {
  const ExpertSends sends = plan_expert_sends({}, 2, 6, 3);
  EXPECT_EQ(sends.pairs, (std::vector<int64_t>{0, 0, 0}));
  EXPECT_TRUE(sends.rows.empty() && sends.position.empty());
  const ExpertGroups groups = group_by_expert({}, 2);
  EXPECT_EQ(groups.starts, (std::vector<int64_t>{0, 0, 0}));
}

TEST(ExpertDispatch, ReceivedPairsGroupByLocalExpertInArrivalOrder) {
  const std::vector<int32_t> local = {1, 0, 1, 1, 0};
  const ExpertGroups groups = group_by_expert(local, 3);
  EXPECT_EQ(groups.starts, (std::vector<int64_t>{0, 2, 5, 5}));
  EXPECT_EQ(groups.order, (std::vector<int32_t>{1, 4, 0, 2, 3}));
}

TEST(ExpertDispatch, RefusesIdsOutsideTheExperts) {
  EXPECT_THROW(plan_expert_sends(std::vector<int32_t>{0, 6}, 2, 6, 3), Error);
  EXPECT_THROW(plan_expert_sends(std::vector<int32_t>{-1, 0}, 2, 6, 3), Error);
  EXPECT_THROW(group_by_expert(std::vector<int32_t>{2}, 2), Error);
  EXPECT_THROW(plan_expert_sends(std::vector<int32_t>{0, 1}, 2, 7, 3), Error);  // 7 over 3
}

// Four sequences on ranks 1, 0, 1, 1 of 3 (rank 2 holds none).
ForwardBatch four_sequences(const std::vector<int32_t>& tokens, std::vector<int64_t> counts,
                            const std::vector<std::vector<int32_t>>& pages) {
  ForwardBatch batch;
  for (size_t s = 0; s < counts.size(); ++s) {
    SequenceInput in;
    in.tokens = std::span<const int32_t>(tokens).first(static_cast<size_t>(counts[s]));
    in.page_table = pages[s];
    batch.sequences.push_back(in);
  }
  return batch;
}

TEST(ExpertDispatch, EveryShareCarriesTheWholeStepsShape) {
  const std::vector<int32_t> tokens(8, 5);
  const std::vector<std::vector<int32_t>> pages = {{4}, {0}, {5}, {6}};  // 4 pages per rank
  const RankPages layout{4, 0, 3};
  const ForwardBatch decode = four_sequences(tokens, {1, 1, 1, 1}, pages);
  const std::vector<int> ranks = sequence_ranks(decode, layout);
  EXPECT_EQ(ranks, (std::vector<int>{1, 0, 1, 1}));
  for (int rank = 0; rank < 3; ++rank) {
    RankBatch share;
    rank_share(decode, ranks, rank, layout, share);
    EXPECT_EQ(share.batch.sequences.size(), rank == 1 ? 3u : rank == 0 ? 1u : 0u);
    EXPECT_EQ(share.batch.dp_step.max_sequences, 3);
    EXPECT_EQ(share.batch.dp_step.max_rows, 3);
    EXPECT_EQ(share.batch.dp_step.tokens_per_sequence, 1);
  }
  // MTP verification rows (4 each), and a ragged step (prefill beside decode).
  const auto verify = data_parallel_step(four_sequences(tokens, {4, 4, 4, 4}, pages), ranks);
  EXPECT_EQ(verify.max_rows, 12);
  EXPECT_EQ(verify.tokens_per_sequence, 4);
  const auto ragged = data_parallel_step(four_sequences(tokens, {1, 8, 2, 1}, pages), ranks);
  EXPECT_EQ(ragged.max_sequences, 3);
  EXPECT_EQ(ragged.max_rows, 8);  // rank 0's prefill of 8 against rank 1's 4 rows
  EXPECT_EQ(ragged.tokens_per_sequence, 0);
}

TEST(ExpertDispatch, TheGatheredDispatchServesTheLayoutsOfTheExpertAllToAll) {
  const ModelConfig config = load_model_config(testing::fixture_dir("glm_schedule"));
  const ModelPlan whole = plan_model(config);
  ForwardBatch share;
  share.dp_step = {.max_sequences = 3, .max_rows = 7, .tokens_per_sequence = 0};
  const auto plan = [&](MoeDispatch dispatch, int size = 2, int replicas = 0) {
    return parallel_plan(whole, config,
                         {.rank = 1,
                          .size = size,
                          .expert_parallel = true,
                          .data_parallel_attention = true,
                          .data_parallel_size = replicas,
                          .moe_dispatch = dispatch});
  };
  EXPECT_EQ(gathered_dispatch_rows(plan(MoeDispatch::gathered), share), 7);
  EXPECT_TRUE(gathered_dispatch_layout(plan(MoeDispatch::automatic)));
  EXPECT_EQ(gathered_dispatch_rows(plan(MoeDispatch::automatic), share), 0);
  EXPECT_EQ(gathered_dispatch_rows(plan(MoeDispatch::all_to_all), share), 0);
  EXPECT_EQ(gathered_dispatch_rows(plan(MoeDispatch::gathered), ForwardBatch{}), 0);
  // Replicas of tensor ranks: each tensor rank sends its slice of the rows,
  // padded to the longest slice of the longest replica's.
  EXPECT_TRUE(gathered_dispatch_layout(plan(MoeDispatch::automatic, 4, 2)));
  EXPECT_EQ(gathered_dispatch_rows(plan(MoeDispatch::gathered, 4, 2), share), 4);
  // Tensor parallelism with the experts split (every rank has every row, the
  // sum adds the experts): a clear error for anything but automatic.
  EXPECT_THROW(
      parallel_plan(
          whole, config,
          {.rank = 0, .size = 2, .expert_parallel = true, .moe_dispatch = MoeDispatch::gathered}),
      Error);
  EXPECT_EQ(parse_moe_dispatch("auto"), MoeDispatch::automatic);
  EXPECT_EQ(parse_moe_dispatch("all-to-all"), MoeDispatch::all_to_all);
  EXPECT_EQ(parse_moe_dispatch("gathered"), MoeDispatch::gathered);
  EXPECT_THROW(parse_moe_dispatch("deepep"), Error);
}

}  // namespace
}  // namespace megactx
