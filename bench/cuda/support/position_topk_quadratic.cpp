// Host side of position_topk_quadratic (position_topk_quadratic.h): the
// checks (formats messages, which .cu files cannot).
#include "bench/cuda/support/position_topk_quadratic.h"

#include "core/error.h"

namespace megactx::cuda {

void position_topk_quadratic(const PositionTopkParams& params, cudaStream_t stream) {
  check_position_topk(params, "quadratic position top-k");
  MEGACTX_CHECK(params.topk <= 8192, "quadratic position top-k: topk {} > 8192 (shared memory)",
                params.topk);
  detail::launch_position_topk_quadratic(params, stream);
}

}  // namespace megactx::cuda
