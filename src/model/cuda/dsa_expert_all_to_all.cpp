// CudaDsaModel::moe_all_to_all, moe_over_tensor_slices and
// forward_no_rows: the MoE layers of
// data-parallel attention on GPUs (ModelPlan::expert_all_to_all), as the CPU
// model's DsaModel::routed_experts_all_to_all. Each rank holds attention,
// the dense MLPs and the shared expert whole and `experts / ranks` routed
// experts; a MoE layer routes this rank's rows, sends every (row, slot) pair
// to the rank of its expert, runs its own experts on the pairs it received,
// sends the results back, and combines them with the gates in slot order.
//
// Every rank makes the same collectives in the same order, whatever its row
// count (zero included: it still answers the pairs the others send it):
//   1. all_to_all of the pair counts (one int64 per rank pair),
//   2. all_to_all of the pairs' hidden rows [pairs, H] float32 and of their
//      experts' local indices [pairs] int32,
//   3. all_to_all of the results [pairs, H] back.
// The routed ids (to size the sends) and the received counts are read on
// the host (one sync each; NCCL takes its sizes from the host), so these
// layers run eagerly, never inside a CUDA Graph; the received pairs run as
// one grouped call planned on the device (grouped_call_on_device; else
// their expert ids are read back too and each expert runs its GEMM chain).
// Why not a fixed-size device dispatch (DeepEP's low-latency mode,
// graph-capturable): NCCL's sizes would then be the capacity, not the
// pairs, for every rank pair and layer.
#if MEGACTX_HAVE_CUDA
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/elementwise/elementwise_ops.h"
#include "kernels/cuda/moe/grouped_moe.h"
#include "model/cuda/cuda_dsa_model.h"
#include "model/expert_dispatch.h"

namespace megactx::cuda {
namespace {

template <typename T>
std::vector<T> download(const T* device, int64_t count, cudaStream_t stream) {
  std::vector<T> host(static_cast<size_t>(count));
  if (count > 0) {
    MEGACTX_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, host.size() * sizeof(T),
                                       cudaMemcpyDeviceToHost, stream));
  }
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace

void CudaDsaModel::moe_all_to_all(const DeviceLayer& w, const float* h, int64_t rows, float* out,
                                  bool with_shared) {
  MEGACTX_CHECK(group_ != nullptr && plan_.local_experts > 0,
                "CUDA model: the expert all-to-all needs a group and a share of the experts");
  Scratch& sc = scratch_;
  const int64_t hidden = config_.hidden_size;
  const int64_t top_k = config_.num_experts_per_tok;
  const int64_t per_rank = plan_.local_experts;
  const int size = group_->size();
  const auto row_bytes = static_cast<int64_t>(hidden * sizeof(float));

  // This rank's pairs: routed, their global expert ids read back.
  int32_t* ids = nullptr;
  float* gates = nullptr;
  const float* shared = nullptr;
  std::vector<int32_t> host_ids;
  if (rows > 0) {
    route(w, h, rows, &ids, &gates);
    if (with_shared) shared = shared_expert(w, h, rows);
    timer_.mark("moe all-to-all", stream_);
    host_ids = download(ids, rows * top_k, stream_);
  }

  // Pairs (row * top_k + slot) by the rank of their expert (expert_dispatch.h).
  const ExpertSends sends = plan_expert_sends(host_ids, top_k, config_.n_routed_experts, size);

  // 1. Pair counts both ways.
  const std::vector<int64_t> one_count(static_cast<size_t>(size), sizeof(int64_t));
  int64_t* d_send_counts = upload(sc.a2a_counts, sends.pairs, stream_);
  int64_t* d_recv_counts = sc.a2a_recv_counts.get<int64_t>(size);
  group_->all_to_all(d_send_counts, one_count, d_recv_counts, one_count);
  const std::vector<int64_t> recv_pairs = download(d_recv_counts, size, stream_);
  int64_t received = 0;
  for (const int64_t c : recv_pairs) {
    MEGACTX_CHECK(c >= 0 && c <= int64_t{1} << 31, "expert all-to-all: {} pairs received", c);
    received += c;
  }

  // 2. The pairs' rows and local expert ids to their experts' ranks.
  const auto sent = static_cast<int64_t>(sends.rows.size());
  float* send_buffer = sc.a2a_send.get<float>(sent * hidden);
  if (sent > 0) {
    gather_rows(h, upload(sc.a2a_index, sends.rows, stream_), sent, hidden, send_buffer, stream_);
  }
  int32_t* d_send_experts = upload(sc.a2a_send_ids, sends.experts, stream_);
  float* recv_buffer = sc.a2a_recv.get<float>(received * hidden);
  int32_t* d_recv_experts = sc.a2a_recv_ids.get<int32_t>(received);
  group_->all_to_all(send_buffer, byte_counts(sends.pairs, row_bytes), recv_buffer,
                     byte_counts(recv_pairs, row_bytes));
  group_->all_to_all(d_send_experts, byte_counts(sends.pairs, sizeof(int32_t)), d_recv_experts,
                     byte_counts(recv_pairs, sizeof(int32_t)));

  // This rank's experts on the pairs it received: one grouped call (each
  // pair a row of one expert, gate 1; the plan is made on the device from
  // the received ids, no third host sync), or one GEMM chain per expert
  // over its rows (gathered, then scattered back in place with gate 1).
  float* results = sc.a2a_results.get<float>(received * hidden);
  if (received > 0 && grouped_call_on_device(w, received, /*top_k=*/1)) {
    timer_.mark("moe routed experts", stream_);
    const float* d_ones =
        upload(sc.a2a_ones, std::vector<float>(static_cast<size_t>(received), 1.0f), stream_);
    grouped_experts(w, recv_buffer, d_recv_experts, d_ones, nullptr, received, results,
                    /*top_k=*/1);
  } else if (received > 0) {
    const ExpertGroups groups =
        group_by_expert(download(d_recv_experts, received, stream_), per_rank);
    MEGACTX_CUDA_CHECK(cudaMemsetAsync(
        results, 0, static_cast<size_t>(received * hidden) * sizeof(float), stream_));
    const int32_t* d_by_expert = upload(sc.expert_rows, groups.order, stream_);
    const float* d_ones =
        upload(sc.a2a_ones, std::vector<float>(static_cast<size_t>(received), 1.0f), stream_);
    int64_t busiest = 0;
    for (int64_t e = 0; e < per_rank; ++e)
      busiest = std::max(busiest, groups.starts[e + 1] - groups.starts[e]);
    float* input = sc.expert_in.get<float>(busiest * hidden);
    float* result = sc.expert_out.get<float>(busiest * hidden);
    timer_.mark("moe routed experts", stream_);
    for (int64_t e = 0; e < per_rank; ++e) {
      const int64_t first = groups.starts[e], m = groups.starts[e + 1] - first;
      if (m == 0) continue;
      gather_rows(recv_buffer, d_by_expert + first, m, hidden, input, stream_);
      mlp(w.experts[static_cast<size_t>(e)], input, m, result);
      scatter_add_rows(result, d_by_expert + first, d_ones, m, hidden, results, stream_);
    }
  }

  // 3. The results back to the ranks that sent the pairs.
  timer_.mark("moe all-to-all", stream_);
  float* back = sc.a2a_back.get<float>(sent * hidden);
  group_->all_to_all(results, byte_counts(recv_pairs, row_bytes), back,
                     byte_counts(sends.pairs, row_bytes));
  if (rows == 0) return;
  // In pair order [rows, top_k, H], then gate-weighted in slot order with
  // the shared expert last (the grouped path's combine).
  float* pair_out = sc.moe_pair_out.get<float>(rows * top_k * hidden);
  gather_rows(back, upload(sc.a2a_index, sends.position, stream_), rows * top_k, hidden, pair_out,
              stream_);
  GroupedMoeShape shape{rows, hidden, config_.moe_intermediate_size, config_.n_routed_experts,
                        top_k};
  grouped_moe_combine(ids, gates, shape, pair_out, shared, out, stream_);
}

const float* CudaDsaModel::shared_expert(const DeviceLayer& w, const float* h, int64_t rows) {
  if (config_.n_shared_experts == 0) return nullptr;
  timer_.mark("moe shared expert", stream_);
  float* result = scratch_.a2a_shared.get<float>(rows * config_.hidden_size);
  mlp(w.shared, h, rows, result);
  return result;
}

void CudaDsaModel::data_parallel_moe(const DeviceLayer& w, const float* h, int64_t rows,
                                     float* out) {
  // Replicas of tensor ranks send slices (gathered or all-to-all inside).
  if (moe_over_slices())
    moe_over_tensor_slices(w, h, rows, out);
  else if (gathered_rows_ > 0)
    moe_gathered(w, h, rows, out);
  else
    moe_all_to_all(w, h, rows, out);
}

void CudaDsaModel::moe_over_tensor_slices(const DeviceLayer& w, const float* h, int64_t rows,
                                          float* out) {
  Scratch& sc = scratch_;
  const int64_t hidden = config_.hidden_size, top_k = config_.num_experts_per_tok;
  const int tensor = plan_.tensor_parallel_size;
  const auto [first, last] = share_rows(rows, plan_.tensor_parallel_rank, tensor);
  const int64_t slice = last - first;
  const int64_t longest = share_rows(rows, 0, tensor).second;  // tensor rank 0's is a longest
  // This rank's slice through the routed experts (every rank of the group
  // takes part in the all-to-all, a slice of no rows too), its routing
  // recorded at its rows; padded to the longest slice for the gather.
  float* routed = sc.a2a_slice.get<float>(longest * hidden);
  if (longest > 0) {
    MEGACTX_CUDA_CHECK(
        cudaMemsetAsync(routed, 0, static_cast<size_t>(longest * hidden) * sizeof(float), stream_));
  }
  int32_t* const capture = routed_ids_;
  const int64_t words = config_.num_hidden_layers * top_k;  // a capture row
  if (capture != nullptr) routed_ids_ = capture + first * words;
  const float* mine = h != nullptr ? h + first * hidden : nullptr;
  if (gathered_rows_ > 0)
    moe_gathered(w, mine, slice, routed, /*with_shared=*/false);
  else
    moe_all_to_all(w, mine, slice, routed, /*with_shared=*/false);
  routed_ids_ = capture;
  if (longest == 0) return;  // the replica has no rows: every tensor rank of it stops here
  // The replica's rows back from its tensor ranks' slices.
  float* all = sc.a2a_slices.get<float>(tensor * longest * hidden);
  tensor_group_->all_gather(routed, all, longest * hidden * static_cast<int64_t>(sizeof(float)));
  for (int r = 0; r < tensor; ++r) {
    const auto [from, to] = share_rows(rows, r, tensor);
    if (to > from) {
      MEGACTX_CUDA_CHECK(cudaMemcpyAsync(out + from * hidden, all + r * longest * hidden,
                                         static_cast<size_t>((to - from) * hidden) * sizeof(float),
                                         cudaMemcpyDeviceToDevice, stream_));
    }
  }
  if (capture != nullptr) {
    // The recorded routing of this layer likewise: this slice's [slice,
    // top_k] out of the capture rows, gathered, and every slice's written back.
    const size_t row_bytes = static_cast<size_t>(top_k) * sizeof(int32_t);
    const size_t pitch = static_cast<size_t>(words) * sizeof(int32_t);
    auto* mine = sc.a2a_slice_ids.get<int32_t>(longest * top_k);
    auto* every = sc.a2a_slices_ids.get<int32_t>(tensor * longest * top_k);
    int32_t* layer_column = capture + routed_layer_ * top_k;
    if (slice > 0) {
      MEGACTX_CUDA_CHECK(cudaMemcpy2DAsync(mine, row_bytes, layer_column + first * words, pitch,
                                           row_bytes, static_cast<size_t>(slice),
                                           cudaMemcpyDeviceToDevice, stream_));
    }
    tensor_group_->all_gather(mine, every, longest * top_k * static_cast<int64_t>(sizeof(int32_t)));
    for (int r = 0; r < tensor; ++r) {
      const auto [from, to] = share_rows(rows, r, tensor);
      if (to == from) continue;
      MEGACTX_CUDA_CHECK(cudaMemcpy2DAsync(
          layer_column + from * words, pitch, every + r * longest * top_k, row_bytes, row_bytes,
          static_cast<size_t>(to - from), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  if (config_.n_shared_experts > 0) {
    // The shared experts' width is split over the replica's tensor ranks.
    float* shared = sc.a2a_shared.get<float>(rows * hidden);
    mlp(w.shared, h, rows, shared);
    tensor_group_->all_reduce(shared, rows * hidden, parallel::ReduceOp::Sum);
    add_into(out, shared, rows * hidden, stream_);
  }
}

ForwardOutput CudaDsaModel::forward_no_rows() {
  MEGACTX_CHECK(weights_ != nullptr,
                "the model's weights are released (resume_memory_occupation brings them back)");
  blas_->clear_shared_inputs();
  for (const DeviceLayer& w : weights_->layers)
    if (w.is_moe) data_parallel_moe(w, nullptr, 0, nullptr);
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return no_rows_output(config_);  // on the host: the group gathers them
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
