// The expert all-to-all's host bookkeeping (model/expert_dispatch.h) on a
// hand-checked case: 3 rows of top-2 over 6 experts on 3 ranks (2 each).
#include "model/expert_dispatch.h"

#include <gtest/gtest.h>

#include "core/error.h"

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

}  // namespace
}  // namespace megactx
