// The MoE router kernels; see router.h.
#include <cfloat>
#include <cstdint>

#include "kernels/cuda/common/alignment.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.cuh"
#include "kernels/cuda/moe/router.h"

namespace megactx::cuda {
namespace {

constexpr int kThreads = 256;

// The fused router's CTA: kExpertsPerCta experts of one row, each summed by
// kPartsPerExpert warps over a part of hidden.
constexpr int kPartsPerExpert = 4;
constexpr int kExpertsPerCta = kThreads / 32 / kPartsPerExpert;

// True when a ranks above b: larger value, ties to the lower index (the CPU
// reference's topk_indices order).
__device__ bool ranks_above(float va, int64_t a, float vb, int64_t b) {
  return va > vb || (va == vb && a < b);
}

__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

// Routes one row with the whole block: lr [experts] its logits (global or
// shared memory), choice and masked [experts] shared scratch.
__device__ void route_row(const float* lr, const float* bias, const RouteParams& p, float* choice,
                          float* masked, int32_t* out_ids, float* out_w) {
  __shared__ int group_selected[64];
  for (int64_t e = threadIdx.x; e < p.experts; e += blockDim.x)
    choice[e] = sigmoid(lr[e]) + (bias != nullptr ? bias[e] : 0.0f);
  __syncthreads();
  const int64_t group_size = p.experts / p.n_group;
  if (threadIdx.x == 0) {
    float group_score[64];
    for (int64_t g = 0; g < p.n_group; ++g) {
      float best = -FLT_MAX, second = -FLT_MAX;
      for (int64_t e = g * group_size; e < (g + 1) * group_size; ++e) {
        if (choice[e] > best) {
          second = best;
          best = choice[e];
        } else if (choice[e] > second) {
          second = choice[e];
        }
      }
      group_score[g] = best + (group_size > 1 ? second : 0.0f);
    }
    for (int64_t g = 0; g < p.n_group; ++g) {
      int64_t rank = 0;
      for (int64_t o = 0; o < p.n_group; ++o)
        rank += ranks_above(group_score[o], o, group_score[g], g) ? 1 : 0;
      group_selected[g] = rank < p.topk_group ? 1 : 0;
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < p.experts; e += blockDim.x)
    masked[e] = group_selected[e / group_size] ? choice[e] : -INFINITY;
  __syncthreads();
  // flags reuse choice[]: 1 when expert e is among the top_k of masked.
  for (int64_t e = threadIdx.x; e < p.experts; e += blockDim.x) {
    int64_t rank = 0;
    for (int64_t o = 0; o < p.experts && rank < p.top_k; ++o)
      rank += ranks_above(masked[o], o, masked[e], e) ? 1 : 0;
    choice[e] = rank < p.top_k ? 1.0f : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t count = 0;
    double sum = 0.0;
    for (int64_t e = 0; e < p.experts && count < p.top_k; ++e) {
      if (choice[e] != 0.0f) {
        out_ids[count++] = static_cast<int32_t>(e);
        sum += sigmoid(lr[e]);
      }
    }
    for (int64_t i = 0; i < p.top_k; ++i) {
      float w = sigmoid(lr[out_ids[i]]);
      if (p.norm_topk_prob) w = static_cast<float>(w / (sum + 1e-20));
      out_w[i] = w * p.routed_scaling_factor;
    }
  }
}

// One block per row. Shared: choice[experts], masked[experts].
__global__ void moe_route_kernel(const float* logits, const float* bias, RouteParams p,
                                 int32_t* ids, float* weights) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ float smem[];
  route_row(logits + blockIdx.x * p.experts, bias, p, smem, smem + p.experts,
            ids + blockIdx.x * p.top_k, weights + blockIdx.x * p.top_k);
}

// Grid (ceil(experts / kExpertsPerCta), rows). Shared: the row's logits,
// choice and masked [experts] each (the last CTA's routing).
__global__ void __launch_bounds__(kThreads)
    fused_router_kernel(const float* h, int64_t hidden, const float* router, const float* bias,
                        RouteParams p, float* logits, int32_t* done, int32_t* ids, float* weights) {
  grid_dependency_wait();
  grid_dependency_trigger();
  extern __shared__ float smem[];
  __shared__ float parts[kExpertsPerCta][kPartsPerExpert];
  __shared__ bool last;
  const int64_t row = blockIdx.y;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int slot = warp / kPartsPerExpert, part = warp % kPartsPerExpert;
  const int64_t expert = int64_t{blockIdx.x} * kExpertsPerCta + slot;
  // Parts of hidden in whole float4s: [begin, end) of part `part`.
  const int64_t vectors = hidden / 4;
  const int64_t per_part = (vectors + kPartsPerExpert - 1) / kPartsPerExpert;
  const int64_t begin = part * per_part;
  const int64_t end = begin + per_part < vectors ? begin + per_part : vectors;
  float sum = 0.0f;
  if (expert < p.experts) {
    const auto* x = reinterpret_cast<const float4*>(h + row * hidden);
    const auto* w = reinterpret_cast<const float4*>(router + expert * hidden);
#pragma unroll 4
    for (int64_t i = begin + lane; i < end; i += 32) {
      const float4 a = x[i], b = __ldg(w + i);
      sum = fmaf(a.x, b.x, sum);
      sum = fmaf(a.y, b.y, sum);
      sum = fmaf(a.z, b.z, sum);
      sum = fmaf(a.w, b.w, sum);
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) parts[slot][part] = sum;
  __syncthreads();
  if (threadIdx.x < kExpertsPerCta) {
    const int64_t e = int64_t{blockIdx.x} * kExpertsPerCta + threadIdx.x;
    float total = 0.0f;
    for (int k = 0; k < kPartsPerExpert; ++k) total += parts[threadIdx.x][k];
    if (e < p.experts) logits[row * p.experts + e] = total;
  }
  // Publish this CTA's logits, then count it; the row's last CTA sees all.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done + row, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  float* row_logits = smem;  // [experts]
  for (int64_t e = threadIdx.x; e < p.experts; e += blockDim.x)
    row_logits[e] = __ldcg(logits + row * p.experts + e);
  if (threadIdx.x == 0) done[row] = 0;
  __syncthreads();
  route_row(row_logits, bias, p, smem + p.experts, smem + 2 * p.experts, ids + row * p.top_k,
            weights + row * p.top_k);
}

}  // namespace

void moe_route(const float* logits, const float* bias, int64_t rows, const RouteParams& params,
               int32_t* ids, float* weights, cudaStream_t stream) {
  if (rows == 0) return;
  // n_group <= 64 is checked by the caller (cuda model), experts fit in shared memory.
  const size_t shared = 2 * static_cast<size_t>(params.experts) * sizeof(float);
  launch_kernel(moe_route_kernel, static_cast<unsigned>(rows), kThreads, shared, stream, logits,
                bias, params, ids, weights);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
}

bool moe_router_fused(const float* h, int64_t rows, int64_t hidden, const float* router,
                      const float* bias, const RouteParams& params, float* logits, int32_t* done,
                      int32_t* ids, float* weights, cudaStream_t stream) {
  if (rows > kFusedRouterMaxRows || hidden % 4 != 0 || params.n_group > 64 || params.experts <= 0 ||
      !aligned16(h) || !aligned16(router))
    return false;
  if (rows == 0) return true;
  const auto ctas = static_cast<unsigned>((params.experts + kExpertsPerCta - 1) / kExpertsPerCta);
  const size_t shared = 3 * static_cast<size_t>(params.experts) * sizeof(float);
  launch_kernel(fused_router_kernel, dim3(ctas, static_cast<unsigned>(rows)), kThreads, shared,
                stream, h, hidden, router, bias, params, logits, done, ids, weights);
  MEGACTX_CUDA_CHECK(cudaGetLastError());
  return true;
}

}  // namespace megactx::cuda
