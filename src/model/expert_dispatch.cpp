#include "model/expert_dispatch.h"

#include "core/error.h"

namespace megactx {

bool gathered_dispatch_layout(const ModelPlan& plan) {
  return plan.expert_all_to_all && plan.local_experts > 0;
}

int64_t context_share_rows(const ModelPlan& plan, int64_t rows) {
  const int size = plan.context_parallel_size;
  return rows >= size ? share_rows(rows, 0, size).second : rows;
}

int64_t gathered_rows_of(const ModelPlan& plan, int64_t rows) {
  if (plan.context_parallel_size > 1) return context_share_rows(plan, rows);
  // Replicas of tensor ranks: each tensor rank sends its slice of the rows.
  if (plan.tensor_parallel_size > 1) return share_rows(rows, 0, plan.tensor_parallel_size).second;
  return rows;
}

int64_t gathered_dispatch_rows(const ModelPlan& plan, const ForwardBatch& batch) {
  if (plan.moe_dispatch != MoeDispatch::gathered || !gathered_dispatch_layout(plan)) return 0;
  if (plan.context_parallel_size > 1) {
    int64_t rows = 0;  // every rank has the whole step
    for (const SequenceInput& in : batch.sequences) rows += static_cast<int64_t>(in.tokens.size());
    return gathered_rows_of(plan, rows);
  }
  return gathered_rows_of(plan, batch.dp_step.max_rows);
}

ExpertSends plan_expert_sends(std::span<const int32_t> ids, int64_t top_k, int64_t experts,
                              int ranks) {
  MEGACTX_CHECK(ranks >= 1 && experts % ranks == 0 && top_k >= 1 &&
                    static_cast<int64_t>(ids.size()) % top_k == 0,
                "expert all-to-all: {} experts over {} ranks, {} ids of top-{}", experts, ranks,
                ids.size(), top_k);
  const int64_t per_rank = experts / ranks;
  ExpertSends sends;
  sends.pairs.assign(static_cast<size_t>(ranks), 0);
  for (const int32_t e : ids) {
    MEGACTX_CHECK(e >= 0 && e < experts, "MoE routing produced expert {} of {}", e, experts);
    ++sends.pairs[static_cast<size_t>(e / per_rank)];
  }
  // Each rank's first send, then the pairs placed in pair order.
  std::vector<int64_t> next(static_cast<size_t>(ranks), 0);
  for (int q = 1; q < ranks; ++q) next[q] = next[q - 1] + sends.pairs[q - 1];
  const auto total = static_cast<int64_t>(ids.size());
  sends.rows.resize(static_cast<size_t>(total));
  sends.experts.resize(sends.rows.size());
  sends.pair_of.resize(sends.rows.size());
  sends.position.resize(sends.rows.size());
  for (int64_t pair = 0; pair < total; ++pair) {
    const int32_t e = ids[static_cast<size_t>(pair)];
    const int64_t at = next[static_cast<size_t>(e / per_rank)]++;
    sends.rows[static_cast<size_t>(at)] = static_cast<int32_t>(pair / top_k);
    sends.experts[static_cast<size_t>(at)] = static_cast<int32_t>(e % per_rank);
    sends.pair_of[static_cast<size_t>(at)] = static_cast<int32_t>(pair);
    sends.position[static_cast<size_t>(pair)] = static_cast<int32_t>(at);
  }
  return sends;
}

ExpertGroups group_by_expert(std::span<const int32_t> local_ids, int64_t experts_per_rank) {
  ExpertGroups groups;
  groups.starts.assign(static_cast<size_t>(experts_per_rank + 1), 0);
  for (const int32_t e : local_ids) {
    MEGACTX_CHECK(e >= 0 && e < experts_per_rank,
                  "expert all-to-all: local expert {} of {} received", e, experts_per_rank);
    ++groups.starts[static_cast<size_t>(e) + 1];
  }
  for (int64_t e = 0; e < experts_per_rank; ++e) groups.starts[e + 1] += groups.starts[e];
  std::vector<int64_t> fill(groups.starts.begin(), groups.starts.end() - 1);
  groups.order.resize(local_ids.size());
  for (size_t i = 0; i < local_ids.size(); ++i)
    groups.order[static_cast<size_t>(fill[static_cast<size_t>(local_ids[i])]++)] =
        static_cast<int32_t>(i);
  return groups;
}

std::vector<int64_t> byte_counts(const std::vector<int64_t>& counts, int64_t per_item) {
  std::vector<int64_t> bytes(counts.size());
  for (size_t q = 0; q < counts.size(); ++q) bytes[q] = counts[q] * per_item;
  return bytes;
}

}  // namespace megactx
