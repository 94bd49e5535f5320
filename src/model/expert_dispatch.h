// The host bookkeeping of one MoE layer's expert all-to-all (data-parallel
// attention, ModelPlan::expert_all_to_all): which of this rank's (row, slot)
// pairs go to which rank and in what order, and how the pairs a rank
// received group by its local experts. Written once for the CPU model
// (DsaModel::routed_experts_all_to_all) and the CUDA model
// (CudaDsaModel::moe_all_to_all), which move the rows themselves.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace megactx {

// Pairs are numbered row * top_k + slot. The sends go to rank 0 first, each
// rank's in pair order; results come back in the same order.
struct ExpertSends {
  std::vector<int64_t> pairs;     // [ranks] pairs sent to each rank
  std::vector<int32_t> rows;      // [sent] the row of each sent pair
  std::vector<int32_t> experts;   // [sent] its expert's index on the owning rank
  std::vector<int32_t> pair_of;   // [sent] the pair each send carries
  std::vector<int32_t> position;  // [rows * top_k] the send that carries each pair
};

// From ids [rows * top_k] (global expert indices in [0, experts)), experts
// sharded as `experts / ranks` consecutive ones per rank. megactx::Error on
// an id outside [0, experts).
ExpertSends plan_expert_sends(std::span<const int32_t> ids, int64_t top_k, int64_t experts,
                              int ranks);

// The received pairs (their local expert ids [received], each in [0,
// experts_per_rank)) by expert: order[starts[e] .. starts[e + 1]) are the
// indices of expert e's pairs, ascending. megactx::Error on an id outside.
struct ExpertGroups {
  std::vector<int64_t> starts;  // [experts_per_rank + 1]
  std::vector<int32_t> order;   // [received]
};
ExpertGroups group_by_expert(std::span<const int32_t> local_ids, int64_t experts_per_rank);

// Byte counts per rank: counts[q] * per_item.
std::vector<int64_t> byte_counts(const std::vector<int64_t>& counts, int64_t per_item);

}  // namespace megactx
