// CudaDsaModel: dense SwiGLU MLP and the group-limited sigmoid MoE, as
// DsaModel::mlp / DsaModel::moe. Routing runs on the device. Up to
// kGroupedMoeMaxRows rows (decode, MTP verification) the routed experts run
// as the grouped device kernels of kernels/cuda/moe: no host sync, so a
// decode step can be captured in a CUDA Graph; float32, bf16 and fp8
// (e4m3 + block scales) stacked experts all qualify. Larger batches
// (prefill; in the deterministic mode they run in fixed chunks instead,
// grouped_moe_rows), experts that are not stacked or options.device_moe = false take
// the host dispatch: the chosen expert ids are read back (one sync per MoE layer) and
// one GEMM chain runs per used expert, reading its weights once for all rows.
#if MEGACTX_HAVE_CUDA
#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/elementwise/elementwise_ops.h"
#include "kernels/cuda/moe/grouped_moe.h"
#include "kernels/cuda/moe/router.h"
#include "model/cuda/cuda_dsa_model.h"

namespace megactx::cuda {

void CudaDsaModel::mlp(const DeviceMlp& w, const float* h, int64_t rows, float* out) {
  const int64_t hidden = config_.hidden_size;
  const int64_t inter = w.intermediate;
  if (bf16_activations(rows, w.gate_up) && w.down.bf16 && !w.down.fp8() && inter % 2 == 0) {
    // gate / up [rows, 2 * inter] and the activation [rows, inter] in bf16
    // only: down reads bf16 anyway (CudaModelOptions::bf16_activations).
    // Decode batches: both in one launch (Blas::linear_swiglu_bf16, the same bits).
    auto* act16 = scratch_.act_bf16.get<uint16_t>(rows * inter);
    if (!blas_->linear_swiglu_bf16(h, rows, hidden, hidden, w.gate_up, inter, act16)) {
      auto* gate_up16 = scratch_.gate_up.get<uint16_t>(rows * 2 * inter);
      blas_->linear_to_bf16(h, rows, hidden, hidden, w.gate_up, 2 * inter, gate_up16, 2 * inter);
      silu_mul_bf16(gate_up16, gate_up16 + inter, rows, inter, 2 * inter, act16, stream_);
    }
    blas_->linear_bf16(act16, rows, inter, inter, w.down.data, hidden, out, hidden,
                       /*y_f32=*/true);
    return;
  }
  float* gate_up = scratch_.gate_up.get<float>(rows * 2 * inter);
  float* act = scratch_.act.get<float>(rows * inter);
  void* act_bf16 = gemm_input_copy(scratch_.act_bf16, rows * inter);
  // down's e4m3 input, when it is fp8 (fp8_copy).
  const Fp8Copy act_fp8 = fp8_copy(scratch_.act_fp8, scratch_.act_fp8_scales, rows, inter,
                                   w.down.fp8(), /*norm=*/false);
  blas_->linear(h, rows, hidden, w.gate_up, 2 * inter, gate_up);
  silu_mul(gate_up, gate_up + inter, rows, inter, 2 * inter, act, stream_, act_bf16, act_fp8);
  blas_->share_input(act, rows, inter, inter, act_bf16);
  blas_->share_fp8_input(act, rows, inter, inter, act_fp8.q, act_fp8.scale_rows,
                         act_fp8.scale_groups);
  blas_->linear(act, rows, inter, w.down, hidden, out);
  blas_->unshare_input(act);
}

CudaDsaModel::GroupedCall CudaDsaModel::grouped_call(const DeviceLayer& w, int64_t rows,
                                                     int64_t top_k) {
  Scratch& sc = scratch_;
  GroupedCall call;
  call.shape = {rows, config_.hidden_size, w.experts.front().intermediate, config_.n_routed_experts,
                top_k > 0 ? top_k : config_.num_experts_per_tok};
  call.shape.bf16 = w.experts_gate_up.bf16;
  call.shape.fp8 = w.experts_gate_up.fp8();
  call.shape.batch_invariant = options_.batch_invariant;
  const GroupedMoeLayout layout = grouped_moe_layout(call.shape);
  call.buffers.plan = sc.moe_plan.get<int32_t>(layout.plan_ints);
  call.buffers.act = sc.moe_act.get<float>(layout.act_floats);
  call.buffers.pair_out = sc.moe_pair_out.get<float>(layout.pair_out_floats);
  call.stacked.gate_up = w.experts_gate_up.data;
  call.stacked.down = w.experts_down.data;
  call.stacked.bf16 = w.experts_gate_up.bf16;
  if (call.shape.fp8) {
    // e4m3 experts as shipped: the kernels quantise their inputs per 1x128
    // group into this workspace, as Blas::linear_fp8 does.
    call.buffers.fp8 = sc.moe_fp8.get<uint8_t>(static_cast<int64_t>(layout.fp8_bytes));
    call.stacked.fp8 = true;
    call.stacked.gate_up_scale = w.experts_gate_up.scale;
    call.stacked.down_scale = w.experts_down.scale;
    call.stacked.gate_up_scale_split = w.experts_gate_up.scale_split;
  }
  return call;
}

void CudaDsaModel::grouped_experts(const DeviceLayer& w, const float* h, const int32_t* ids,
                                   const float* gates, const float* shared, int64_t rows,
                                   float* out, int64_t top_k) {
  GroupedCall call = grouped_call(w, rows, top_k);
  if (call.shape.fp8 && shared_fp8_moe_input()) {
    // The post-attention norm's e4m3 copy of h (written for the shared
    // expert's fp8 linears): the experts read it instead of quantising h.
    const Blas::Fp8Input copy =
        blas_->fp8_copy_of(h, rows, config_.hidden_size, config_.hidden_size);
    if (copy.q != nullptr && aligned16(copy.q)) {
      call.buffers.x_q = copy.q;
      call.buffers.x_scale = copy.scale_rows;
    }
  }
  grouped_moe(h, ids, gates, call.shape, call.stacked, shared, call.buffers, out, stream_);
}

const float* CudaDsaModel::grouped_pair_outputs(const DeviceLayer& w, const float* h,
                                                const int32_t* ids, int64_t rows) {
  const GroupedCall call = grouped_call(w, rows, 0);
  // Pairs the plan leaves out (ids outside [0, E)) are not written: zeros.
  MEGACTX_CUDA_CHECK(cudaMemsetAsync(
      call.buffers.pair_out, 0,
      static_cast<size_t>(grouped_moe_layout(call.shape).pair_out_floats) * sizeof(float),
      stream_));
  check_grouped_moe_inputs(h, call.shape, call.stacked, call.buffers);
  grouped_moe_plan(ids, call.shape, call.buffers.plan, stream_);
  grouped_moe_experts(h, call.shape, call.stacked, call.buffers, stream_);
  return call.buffers.pair_out;
}

void CudaDsaModel::route(const DeviceLayer& w, const float* h, int64_t rows, int32_t** ids_out,
                         float** gates_out) {
  Scratch& sc = scratch_;
  const int64_t hidden = config_.hidden_size;
  const int64_t experts = config_.n_routed_experts;
  const int64_t top_k = config_.num_experts_per_tok;
  timer_.mark("moe router", stream_);
  float* logits = sc.router_logits.get<float>(rows * experts);
  int32_t* ids = sc.route_ids.get<int32_t>(rows * top_k);
  float* gates = sc.route_gates.get<float>(rows * top_k);
  RouteParams params{
      experts, config_.n_group,        config_.topk_group,
      top_k,   config_.norm_topk_prob, static_cast<float>(config_.routed_scaling_factor)};
  // Decode batches: logits and routing in one launch (router.h), outside the
  // deterministic mode, whose router is the batch-invariant GEMM at every
  // row count.
  const bool fused = !blas_->batch_invariant() && fused_router_enabled() &&
                     moe_router_fused(h, rows, hidden, w.router, w.bias, params, logits,
                                      router_done_counts(), ids, gates, stream_);
  if (!fused) {
    blas_->linear(h, rows, hidden, w.router, experts, logits);
    moe_route(logits, w.bias, rows, params, ids, gates, stream_);
  }
  if (routed_ids_ != nullptr) {
    // ids [rows, top_k] -> routed [rows, layers, top_k] at this layer.
    const size_t row_bytes = static_cast<size_t>(top_k) * sizeof(int32_t);
    MEGACTX_CUDA_CHECK(cudaMemcpy2DAsync(routed_ids_ + routed_layer_ * top_k,
                                         row_bytes * static_cast<size_t>(config_.num_hidden_layers),
                                         ids, row_bytes, row_bytes, static_cast<size_t>(rows),
                                         cudaMemcpyDeviceToDevice, stream_));
  }
  *ids_out = ids;
  *gates_out = gates;
}

int32_t* CudaDsaModel::router_done_counts() {
  DeviceBuffer& counts = scratch_.router_done;
  if (counts.bytes() == 0) {
    counts.get<int32_t>(kFusedRouterMaxRows);
    MEGACTX_CUDA_CHECK(
        cudaMemsetAsync(counts.as<void>(), 0, kFusedRouterMaxRows * sizeof(int32_t), stream_));
  }
  return counts.as<int32_t>();
}

void CudaDsaModel::moe(const DeviceLayer& w, const float* h, int64_t rows, float* out) {
  if (plan_.expert_all_to_all) {
    data_parallel_moe(w, h, rows, out);
    return;
  }
  Scratch& sc = scratch_;
  const int64_t hidden = config_.hidden_size;
  const int64_t experts = config_.n_routed_experts;
  const int64_t top_k = config_.num_experts_per_tok;
  int32_t* ids = nullptr;
  float* gates = nullptr;
  route(w, h, rows, &ids, &gates);

  // Expert parallelism over tensor-parallel attention (model_plan.h): this
  // rank holds experts [first_expert, first_expert + local_experts) and
  // applies them to every row; the group's sum after the MoE (the same
  // reduce_partial as the shared expert's width share) completes it. The
  // other ranks' pairs become -1, which both paths below leave out. After the
  // routing record, which keeps the global ids.
  const int64_t local = static_cast<int64_t>(w.experts.size());
  if (plan_.local_experts > 0 && plan_.local_experts < experts)
    localize_expert_ids(ids, rows * top_k, plan_.first_expert, plan_.local_experts, stream_);

  // moe_on_device (model/cuda/dsa_graph_forward.cpp) also decides whether a decode
  // step can be captured: one predicate, so the two cannot drift.
  if (moe_on_device(w, rows)) {
    // Shared expert first: the combine adds it after the routed sum, the
    // order of the host dispatch below. Buffer sizes depend on the shape
    // only (a graph sized once per batch bucket).
    const float* shared = nullptr;
    if (config_.n_shared_experts > 0) {
      timer_.mark("moe shared expert", stream_);
      float* result = sc.expert_out.get<float>(rows * hidden);
      mlp(w.shared, h, rows, result);
      shared = result;
    }
    timer_.mark("moe grouped experts", stream_);
    // One call, or fixed chunks in the deterministic mode (grouped_moe_rows).
    const int64_t chunk = grouped_moe_rows(w, rows);
    for (int64_t first = 0; first < rows; first += chunk) {
      const int64_t n = std::min(chunk, rows - first);
      grouped_experts(w, h + first * hidden, ids + first * top_k, gates + first * top_k,
                      shared != nullptr ? shared + first * hidden : nullptr, n,
                      out + first * hidden);
    }
    return;
  }

  timer_.mark("moe host sync + dispatch", stream_);
  std::vector<int32_t> host_ids(static_cast<size_t>(rows * top_k));
  std::vector<float> host_gates(host_ids.size());
  MEGACTX_CUDA_CHECK(cudaMemcpyAsync(host_ids.data(), ids, host_ids.size() * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, stream_));
  MEGACTX_CUDA_CHECK(cudaMemcpyAsync(host_gates.data(), gates, host_gates.size() * sizeof(float),
                                     cudaMemcpyDeviceToHost, stream_));
  MEGACTX_CUDA_CHECK(cudaStreamSynchronize(stream_));

  // Rows grouped by this rank's experts: starts[e] .. starts[e + 1] in
  // rows_by_expert (-1: another rank's expert).
  std::vector<int64_t> starts(static_cast<size_t>(local + 1), 0);
  for (int32_t e : host_ids) {
    MEGACTX_CHECK(e >= -1 && e < local, "MoE routing produced expert {} of {}", e, local);
    if (e >= 0) ++starts[e + 1];
  }
  for (int64_t e = 0; e < local; ++e) starts[e + 1] += starts[e];
  std::vector<int32_t> rows_by_expert(host_ids.size());
  std::vector<float> gates_by_expert(host_ids.size());
  std::vector<int64_t> fill(starts.begin(), starts.end() - 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int64_t e = host_ids[r * top_k + j];
      if (e < 0) continue;
      rows_by_expert[fill[e]] = static_cast<int32_t>(r);
      gates_by_expert[fill[e]++] = host_gates[r * top_k + j];
    }
  }
  const int32_t* d_rows = upload(sc.expert_rows, rows_by_expert, stream_);
  const float* d_gates = upload(sc.expert_gates, gates_by_expert, stream_);

  timer_.mark("moe routed experts", stream_);
  MEGACTX_CUDA_CHECK(
      cudaMemsetAsync(out, 0, static_cast<size_t>(rows * hidden) * sizeof(float), stream_));
  // Sized for the busiest expert once, so no buffer grows mid-layer.
  int64_t busiest = 0;
  for (int64_t e = 0; e < local; ++e) busiest = std::max(busiest, starts[e + 1] - starts[e]);
  float* input = sc.expert_in.get<float>(busiest * hidden);
  float* result = sc.expert_out.get<float>(std::max(busiest, rows) * hidden);
  for (int64_t e = 0; e < local; ++e) {
    const int64_t m = starts[e + 1] - starts[e];
    if (m == 0) continue;
    gather_rows(h, d_rows + starts[e], m, hidden, input, stream_);
    mlp(w.experts[e], input, m, result);
    scatter_add_rows(result, d_rows + starts[e], d_gates + starts[e], m, hidden, out, stream_);
  }
  if (config_.n_shared_experts > 0) {
    timer_.mark("moe shared expert", stream_);
    mlp(w.shared, h, rows, result);
    add_into(out, result, rows * hidden, stream_);
  }
}

}  // namespace megactx::cuda
#endif  // MEGACTX_HAVE_CUDA
