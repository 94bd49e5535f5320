// Host side of the fallback top-k (position_topk.h): the launch plan and the
// parameter checks (formats messages, which .cu files cannot).
#include "kernels/cuda/dsa_fallback/position_topk.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace megactx::cuda {

void check_position_topk(const PositionTopkParams& p, const char* what) {
  constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  MEGACTX_CHECK(p.topk >= 1 && p.topk <= kInt32Max, "{}: topk must be in [1, 2^31), got {}", what,
                p.topk);
  MEGACTX_CHECK(p.rows >= 0 && p.rows <= kInt32Max, "{}: row count {} out of range", what, p.rows);
  MEGACTX_CHECK(p.max_context >= 0 && p.max_context <= kInt32Max, "{}: max_context {} out of range",
                what, p.max_context);
  MEGACTX_CHECK(p.score_stride >= p.max_context, "{}: score_stride {} < max_context {}", what,
                p.score_stride, p.max_context);
  if (p.rows > 0)
    MEGACTX_CHECK(p.scores && p.positions && p.indices && p.counts,
                  "{}: a required pointer is null", what);
}

PositionTopkPlan plan_position_topk(int64_t max_context) {
  PositionTopkPlan plan;
  plan.keys_in_shared = max_context <= kPositionTopkSharedRow;
  // Keys are read four at a time (uint4): round the row up to a multiple of 4.
  plan.shared_bytes = plan.keys_in_shared ? 4 * std::max<int64_t>(4, (max_context + 3) / 4 * 4)
                                          : 4 * kPositionTopkTile;
  return plan;
}

void position_topk(const PositionTopkParams& params, cudaStream_t stream) {
  check_position_topk(params, "position top-k");
  detail::launch_position_topk(params, stream);
}

}  // namespace megactx::cuda
