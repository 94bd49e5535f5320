// The MoE router on the device: group-limited sigmoid routing (DeepSeek-V3
// noaux_tc) of a layer's rows, from the router logits to the chosen experts
// and their gates, as the CPU reference (kernels/reference/sparse_attention.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megactx::cuda {

struct RouteParams {
  int64_t experts = 0, n_group = 1, topk_group = 1, top_k = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
};

// logits [rows, experts] -> ids [rows, top_k] (increasing expert id, as the
// CPU reference), weights [rows, top_k]; one thread block per row. The caller
// checks n_group <= 64.
void moe_route(const float* logits, const float* bias, int64_t rows, const RouteParams& params,
               int32_t* ids, float* weights, cudaStream_t stream);

// Rows up to which moe_router_fused serves a call (decode and MTP
// verification batches): each row's CTAs read the router's weights, which
// stay in L2 from the first row on.
inline constexpr int64_t kFusedRouterMaxRows = 64;

// The router's logits and the routing in one launch, for the small batches of
// decode, where the two launches of a float32 GEMV and the routing launch
// cost more than their work: logits [rows, experts] = h [rows, hidden] .
// router^T ([experts, hidden], float32), then moe_route's choice.
//
// Grid (experts / 2, rows): each CTA takes two experts of one row, four warps
// each splitting hidden in four parts summed in a fixed order, so a row's
// logits (and choice) do not depend on the batch it came in. The last CTA of
// a row to finish (an atomic count in done[row]) routes the row and sets
// done[row] back to 0. `done` [rows] must be zero before the first call.
// Returns false, launching nothing, when the shape does not suit it (rows
// over kFusedRouterMaxRows, hidden not a multiple of 4, h or router not
// 16-byte aligned, n_group over 64):
// the caller then runs the GEMV and moe_route.
//
// Used outside the deterministic mode (whose linears are batch-invariant
// GEMMs at every row count, so that decode and prefill agree) when
// fused_router_enabled(): kFusedRouter, or MEGACTX_FUSED_ROUTER=0 / 1 for A/B
// runs (other values are an error).
bool moe_router_fused(const float* h, int64_t rows, int64_t hidden, const float* router,
                      const float* bias, const RouteParams& params, float* logits, int32_t* done,
                      int32_t* ids, float* weights, cudaStream_t stream);

// On: its tests pass on the H200, and it took glm_1b's decode step from 1.50
// to 1.47 ms (bf16, batch 1), 2.05 to 1.98 (batch 16), 1.21 to 1.18 and 2.08
// to 2.02 ms (fp8 weights) (docs/benchmarks.md).
inline constexpr bool kFusedRouter = true;
bool fused_router_enabled();

}  // namespace megactx::cuda
