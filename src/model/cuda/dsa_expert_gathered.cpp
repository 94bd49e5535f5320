// CudaDsaModel::moe_gathered: data-parallel attention's MoE layer by the
// gathered dispatch (model/expert_dispatch.h; DsaModel::routed_experts_gathered
// on the host), the form a CUDA Graph can hold: every size is fixed by the
// rows R all ranks pad to (gathered_rows_), no count is read on the host.
// With S ranks, H hidden, k = top_k:
//   mine [R, H] (this rank's rows, zero padding; graph steps: h itself),
//   routing [2, R * k] (ids, -1 for padding, then gates, as 4-byte words)
//     -> all_gather -> x [S * R, H], every rank's routing [S, 2, R * k]
//   localize_gathered_routing -> local ids (-1: another rank's expert) and
//     gates [S * R, k]
//   one grouped call over the S * R rows (this rank's experts, gate-weighted,
//     slot order) -> partial [S * R, H]
//     -> all_to_all of equal chunks [R, H] -> received [S, R, H]
//   sum_rank_chunks (+ the shared expert) -> out [rows, H].
// The deterministic mode sends every pair's expert output back instead
// ([S, R, k, H]), summed exactly (one rank's is not zero) and combined in
// slot order: one process's bits.
#if MEGACTX_HAVE_CUDA
#include "core/error.h"
#include "kernels/cuda/moe/gathered_dispatch.h"
#include "kernels/cuda/moe/grouped_moe.h"
#include "model/cuda/cuda_dsa_model.h"
#include "model/expert_dispatch.h"

namespace megactx::cuda {

bool CudaDsaModel::gathered_on_device(const DeviceLayer& w, int64_t padded_rows) const {
  if (group_ == nullptr || !gathered_dispatch_layout(plan_)) return false;
  return grouped_call_on_device(w, group_->size() * padded_rows, config_.num_experts_per_tok);
}

void CudaDsaModel::moe_gathered(const DeviceLayer& w, const float* h, int64_t rows, float* out,
                                bool with_shared) {
  Scratch& sc = scratch_;
  const int64_t hidden = config_.hidden_size, top_k = config_.num_experts_per_tok;
  const int64_t padded = gathered_rows_;
  const int64_t size = group_->size();
  MEGACTX_CHECK(rows <= padded && gathered_on_device(w, padded),
                "gathered MoE dispatch: {} rows padded to {} over {} ranks", rows, padded, size);
  const auto word = static_cast<int64_t>(sizeof(float));
  const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(float);

  // This rank's rows and routing, padded.
  const float* mine = h;
  if (rows < padded) {
    float* buffer = sc.gather_mine.get<float>(padded * hidden);
    MEGACTX_CUDA_CHECK(cudaMemsetAsync(buffer + rows * hidden, 0,
                                       static_cast<size_t>(padded - rows) * row_bytes, stream_));
    if (rows > 0) {
      MEGACTX_CUDA_CHECK(cudaMemcpyAsync(buffer, h, static_cast<size_t>(rows) * row_bytes,
                                         cudaMemcpyDeviceToDevice, stream_));
    }
    mine = buffer;
  }
  int32_t* routing = sc.gather_routing.get<int32_t>(2 * padded * top_k);
  const float* shared = nullptr;
  int32_t* ids = nullptr;  // this rank's routing [rows, top_k] (global ids)
  float* gates = nullptr;
  if (rows < padded) {
    // Padding: ids -1 (all bits set), gates 0.
    MEGACTX_CUDA_CHECK(
        cudaMemsetAsync(routing, 0xff, static_cast<size_t>(padded * top_k) * 4, stream_));
    MEGACTX_CUDA_CHECK(cudaMemsetAsync(routing + padded * top_k, 0,
                                       static_cast<size_t>(padded * top_k) * 4, stream_));
  }
  if (rows > 0) {
    route(w, h, rows, &ids, &gates);
    const size_t bytes = static_cast<size_t>(rows * top_k) * 4;
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(routing, ids, bytes, cudaMemcpyDeviceToDevice, stream_));
    MEGACTX_CUDA_CHECK(
        cudaMemcpyAsync(routing + padded * top_k, gates, bytes, cudaMemcpyDeviceToDevice, stream_));
    if (with_shared) shared = shared_expert(w, h, rows);
  }

  // 1. Every rank's rows and routing.
  timer_.mark("moe gathered dispatch", stream_);
  const int64_t all_rows = size * padded;
  float* x = sc.gather_rows.get<float>(all_rows * hidden);
  int32_t* every_routing = sc.gather_every_routing.get<int32_t>(size * 2 * padded * top_k);
  group_->all_gather(mine, x, padded * hidden * word);
  group_->all_gather(routing, every_routing, 2 * padded * top_k * word);
  int32_t* local_ids = sc.gather_local_ids.get<int32_t>(all_rows * top_k);
  float* all_gates = sc.gather_gates.get<float>(all_rows * top_k);
  localize_gathered_routing(every_routing, size, padded * top_k, plan_.first_expert,
                            plan_.local_experts, local_ids, all_gates, stream_);

  if (options_.batch_invariant) {
    // The deterministic mode: one process's bits. Each pair's expert output
    // (zeros where another rank holds the expert) goes back to its row's
    // rank, where exactly one rank's is not zero, so their sum is exact; the
    // combine then runs in slot order with the shared expert last, as one
    // process's does (the same kernels on the same inputs). top_k times the
    // traffic of the partial sums below.
    timer_.mark("moe routed experts", stream_);
    const float* pairs = grouped_pair_outputs(w, x, local_ids, all_rows);
    timer_.mark("moe gathered dispatch", stream_);
    const int64_t pair_floats = padded * top_k * hidden;
    float* received = sc.gather_received.get<float>(size * pair_floats);
    const std::vector<int64_t> chunk(static_cast<size_t>(size), pair_floats * word);
    group_->all_to_all(pairs, chunk, received, chunk);
    if (rows == 0) return;
    float* own_pairs = sc.gather_partial.get<float>(pair_floats);
    sum_rank_chunks(received, size, pair_floats, rows * top_k * hidden, nullptr, own_pairs,
                    stream_);
    GroupedMoeShape shape{rows, hidden, w.experts.front().intermediate, config_.n_routed_experts,
                          top_k};
    grouped_moe_combine(ids, gates, shape, own_pairs, shared, out, stream_);
    return;
  }

  // 2. This rank's experts over every gathered row.
  timer_.mark("moe routed experts", stream_);
  float* partial = sc.gather_partial.get<float>(all_rows * hidden);
  grouped_experts(w, x, local_ids, all_gates, nullptr, all_rows, partial);

  // 3. Each rank's rows' partials back to it, added up in rank order.
  timer_.mark("moe gathered dispatch", stream_);
  float* received = sc.gather_received.get<float>(all_rows * hidden);
  const std::vector<int64_t> chunk(static_cast<size_t>(size), padded * hidden * word);
  group_->all_to_all(partial, chunk, received, chunk);
  if (rows > 0)
    sum_rank_chunks(received, size, padded * hidden, rows * hidden, shared, out, stream_);
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
