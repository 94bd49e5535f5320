// How a MoE layer of data-parallel attention or context parallelism
// (ModelPlan::expert_all_to_all) reaches the routed experts, sharded over
// the ranks while each rank holds its own rows; written once for the CPU model (DsaModel) and the
// CUDA model (model/cuda/dsa_expert_all_to_all.cpp), which move the rows themselves. Two dispatches
// (ModelPlan::moe_dispatch):
//
// - The all-to-all: each routed (row, slot) pair goes to its expert's rank
//   and its result comes back, both by all_to_all with the exact pair counts
//   (plan_expert_sends, group_by_expert below). Traffic per rank: rows x
//   top_k hidden rows each way. The counts depend on the routing, and NCCL
//   takes its sizes from the host: the host reads the routing every layer,
//   so no CUDA Graph can hold the step.
// - Gathered: every rank pads its rows to R rows that all ranks agree on
//   without a collective (the step's longest share, or the CUDA Graph bucket
//   of the step: ForwardBatch::dp_step; under context parallelism, where
//   the rows are shares of one step every rank holds, the longest share), then
//     1. all_gather of the rows x [S x R, H] and of their routing (ids and
//        gates [S x R, top_k]; padding rows' ids -1),
//     2. every rank applies its own experts to every gathered row: partial
//        [S x R, H] = sum over the row's slots whose expert is local of
//        gate x expert(row), slot order,
//     3. all_to_all of equal chunks: rank q gets the partials of its R rows
//        from every rank and adds them up in rank order.
//   Every size is fixed by R, so a CUDA Graph can hold it; the traffic is S
//   x R hidden rows each way per rank (as much as the all-to-all's when top_k
//   = S and the ranks hold as many rows), and each rank's experts see every
//   row (the padding's too, on the GPU).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/language_model.h"
#include "model/model_plan.h"

namespace megactx {

// The rows every rank pads to when `plan` asks for the gathered dispatch on
// every step (MoeDispatch::gathered): gathered_rows_of the step's longest
// share with data-parallel attention (`batch` a rank's share), of the whole
// step with context parallelism (every rank holds all of `batch`). 0: the all-to-all (another
// dispatch or layout, or not a share). The same on every rank of the step. (The CUDA model also
// takes the gathered dispatch, over the rows of the step's graph bucket, for
// the steps its CUDA Graphs run under MoeDispatch::automatic.)
int64_t gathered_dispatch_rows(const ModelPlan& plan, const ForwardBatch& batch);

// Whether `plan`'s layout can take the gathered dispatch at all: the
// experts sharded over the ranks and reached by the all-to-all
// (data-parallel attention, context parallelism over the whole group).
bool gathered_dispatch_layout(const ModelPlan& plan);

// The rows a rank pads to in a step whose longest share (data-parallel
// attention) or whole (context parallelism) is `rows` rows: the longest
// context share of them, the longest tensor rank's slice of a replica of
// tensor ranks (each sends its slice), or all of them.
int64_t gathered_rows_of(const ModelPlan& plan, int64_t rows);

// Context parallelism: the most rows a rank computes of a step of `rows`
// rows (the first share; all of them when the step has fewer rows than
// ranks, which then runs whole on every rank).
int64_t context_share_rows(const ModelPlan& plan, int64_t rows);

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
